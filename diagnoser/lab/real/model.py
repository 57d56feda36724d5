"""The tiny Llama-shaped model the lab serves: a ``config.json``, a generation config and a
word-level tokenizer, made locally. vLLM serves it with ``--load-format dummy`` (random
weights), so nothing is downloaded.

The tokenizer maps each word ``w0``..``wN`` to one token and adds ``<s>`` in front, so a
prompt of n words is n + 1 prompt tokens: the load generator sets prompt lengths exactly.
Token 2 (``</s>``) ends a turn.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

VOCAB = 1024
SPECIAL = ("<unk>", "<s>", "</s>")
BOS, EOS = 1, 2
WORDS = VOCAB - len(SPECIAL)

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "vocab_size": VOCAB,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}


def tokenizer_json() -> dict[str, object]:
    """A Hugging Face ``tokenizer.json``: WordLevel over whitespace, ``<s>`` prepended."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(SPECIAL)}
    vocab.update({f"w{i}": len(SPECIAL) + i for i in range(WORDS)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", BOS)]
    )
    doc: dict[str, object] = json.loads(tok.to_str())
    return doc


def make(directory: Path, max_model_len: int) -> Path:
    """Write the model's files into ``directory`` (made if need be); return it."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {**CONFIG, "max_position_embeddings": max_model_len}
    files = {
        "config.json": config,
        "generation_config.json": {"bos_token_id": BOS, "eos_token_id": EOS},
        "tokenizer.json": tokenizer_json(),
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": SPECIAL[BOS],
            "eos_token": SPECIAL[EOS],
            "unk_token": SPECIAL[0],
            "model_max_length": max_model_len,
        },
    }
    for name, doc in files.items():
        (directory / name).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return directory


def prompt(words: int, rng: random.Random) -> str:
    """``words`` random words: ``words`` + 1 prompt tokens with ``<s>``. Random, so two
    prompts share no cached prefix block (of 16 or more tokens) but by a vanishing chance."""
    return " ".join(f"w{n}" for n in rng.choices(range(WORDS), k=words))
