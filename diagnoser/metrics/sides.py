"""The two sides of a disaggregated deployment, the prefill and the decode servers of one
model: which servers are on each, and a signal read over one side only.

A server is on a side (vLLM's --kv-transfer-config) when it runs a KV connector:
NixlConnector registers its families on every instance, whatever its kv_role (kv_producer,
kv_consumer or kv_both). vLLM's cache_config_info carries no kv_role, so the side is read from
the traffic: the proxy sends each request to the prefill side with max_tokens=1 (it ends there
with finished_reason="length" after one token) and to the decode side with the client's
max_tokens. A site whose series cannot tell (another connector, another proxy) names its
servers of each side (``prefill_targets``, ``decode_targets``). A server on neither side (not
disaggregated) counts on both.
"""

from __future__ import annotations

from dataclasses import replace

from diagnoser.metrics import families as F
from diagnoser.metrics.promql import Expr, Scope, agg, selector, serving

CONNECTOR_FAMILY = F.NIXL_XFER_TIME.name + "_count"
SIDES = ("decode", "prefill")
_KEYS = "job, instance"


def servers_on(scope: Scope, side: str) -> str:
    """The (job, instance) of the scope's servers on ``side``: a KV connector's servers whose
    requests ask for one token (prefill) or more (decode), and those the site names."""
    per_server = [
        f"sum by ({_KEYS}) (rate({selector(F.MAX_TOKENS.name + part, scope.matchers)}"
        f"[{scope.window}]))"
        for part in ("_sum", "_count")
    ]
    asked = f"{per_server[0]} / ({per_server[1]} > 0)"
    one = "<= 1" if side == "prefill" else "> 1"
    connector = f"group by ({_KEYS}) ({selector(CONNECTOR_FAMILY, scope.matchers)})"
    found = f"({asked} {one}) and on ({_KEYS}) {connector}"
    named = dict(zip(("prefill", "decode"), scope.roles, strict=True))[side]
    if named:
        found += f" or {serving((*scope.matchers, named))}"
    return f"group by ({_KEYS}) ({found})"


def on_side(side: str, inner: Expr) -> Expr:
    """``inner`` over one side (``SIDES``): what a signal is about happens there (finish
    reasons and answers on the decode side, the prompt's compute on the prefill side), and
    the other side's series would mix in what it does by design. A scope that names its own
    side (a dashboard's panel of each side) keeps it."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {', '.join(SIDES)} (got {side!r})")

    def build(scope: Scope) -> str:
        mine = scope.side or side
        other = SIDES[1 - SIDES.index(mine)]
        return inner(replace(scope, side=mine, exclude=servers_on(scope, other)))

    return build


def within_each_side(inner: Expr) -> Expr:
    """``inner`` over each side apart, the larger of the two per model: a comparison among a
    model's servers (the busiest replica against the mean one) is made between servers of one
    role. A prefill server and a decode server do different work by design (a prefill server's
    queue, a decode server's batch), so setting one against the other would find an imbalance
    in every healthy disaggregated deployment. A server on neither side is on both, so a model
    served whole reads the same on each; a scope that names its side keeps it."""

    def build(scope: Scope) -> str:
        if scope.side:
            return on_side(scope.side, inner)(scope)
        each = (
            f'label_replace({on_side(side, inner)(scope)}, "side", "{side}", "", "")'
            for side in SIDES
        )
        return agg("max", scope, " or ".join(each))

    return build
