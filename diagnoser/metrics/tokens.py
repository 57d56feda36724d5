"""Token counts without a tokenizer: the approximation the probe builds its prompts with and
the simulator counts requests with, and the words those prompts are drawn from.

Each word of :data:`WORDS` is one token, with a leading space, in the vocabularies this was
checked on (GPT-4's cl100k, Mistral's SentencePiece v1 and v3, Tekken), so a prompt of N of
them is N tokens there and :func:`approx_tokens` counts it exactly.
"""

from __future__ import annotations

import re

_WORD_TEXT = """
the of and to in is that for it as was with be by on not he this are or his from at which but
have an they you were their one all we can her has there been if more when will would who so no
time people year way day man world life hand part child eye woman place work week case point
number group problem fact water room mother area money story month lot right study book job word
business issue side kind head house service friend father power hour game line end member law
car city community name president team minute idea kid body information back parent face others
level office door health person art war history party result change morning reason research girl
guy moment air teacher force education foot boy age policy process music market sense nation plan
college interest death experience effect use class control care field development role effort
rate heart drug show leader light voice wife police mind price report decision son view
relationship town road arm difference value building action model season society tax director
position player record paper space ground form event official matter center couple site project
activity star table need court oil situation cost industry figure street image phase stock
picture evidence color land bank garden river ocean tree stone bread window train summer winter
spring island bridge forest mountain village letter question answer simple small large early
young great little old long good new high different important public able bad real best better
sure free strong true whole clear recent certain personal open red difficult available likely
short single medical current wrong private past foreign fine common poor natural significant
similar hot dead central happy serious ready left physical general environmental financial blue
democratic dark various entire close legal religious cold final main green nice huge popular
traditional cultural
"""
WORDS = tuple(_WORD_TEXT.split())

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


def approx_tokens(text: str) -> int:
    """Tokens in ``text`` by the approximation: one per word and one per punctuation mark.

    Exact for the probe's prompts; ordinary English text has 10-30% more tokens than this
    on the common tokenizers (longer and rarer words split into pieces).
    """
    return len(_TOKEN_RE.findall(text))
