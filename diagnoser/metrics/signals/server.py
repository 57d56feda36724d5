"""Signals of the server around the engine: restarts, the API server's HTTP traffic and CPU,
and scrape health. API-server series carry no model label; they are joined to the models of
their target on (job, instance)."""

from __future__ import annotations

from diagnoser.metrics import engines as registry
from diagnoser.metrics import exporters
from diagnoser.metrics import families as F
from diagnoser.metrics import families_sglang as SG
from diagnoser.metrics import promql as q
from diagnoser.metrics import promql_series as rs
from diagnoser.metrics import promql_sglang as sg
from diagnoser.metrics.engines import Gap
from diagnoser.metrics.exporters import INFERENCE_HANDLERS
from diagnoser.metrics.signals.base import TARGET, Signal, everywhere, on
from diagnoser.plumbing.durations import parse_seconds


def api_requests(status: str | None) -> q.Expr:
    """Inference requests per second (of one status class), by target, joined to models."""

    def inner(matchers: tuple[str, ...], window: str, keep: tuple[str, ...]) -> str:
        extra = (INFERENCE_HANDLERS,) + ((f'status="{status}"',) if status else ())
        sel = q.selector(exporters.HTTP_REQUESTS.name, matchers, *extra)
        return f"sum by ({', '.join(('job', 'instance', *keep))}) (rate({sel}[{window}]))"

    return q.on_targets(inner)


def _answered(status: str) -> q.Expr:
    """Inference requests per second answered with ``status``; 0 where the API server's
    family is scraped but no such answer happened yet (its series is born at the first)."""
    return rs.zero_where(api_requests(status), api_requests(None))


def _per_target(family: str) -> q.TargetExpr:
    """The rate of an API-server counter (or histogram part) per target, keeping ``keep``."""

    def inner(matchers: tuple[str, ...], window: str, keep: tuple[str, ...]) -> str:
        rate = f"rate({q.selector(family, matchers)}[{window}])"
        return f"sum by ({', '.join(('job', 'instance', *keep))}) ({rate})"

    return inner


def _api_cpu(matchers: tuple[str, ...], window: str, keep: tuple[str, ...]) -> str:
    return f"rate({q.selector(exporters.PROCESS_CPU.name, matchers)}[{window}])"


def _api_restarts(matchers: tuple[str, ...], window: str, keep: tuple[str, ...]) -> str:
    return f"changes({q.selector(exporters.PROCESS_START.name, matchers)}[{window}])"


def restarts() -> list[Signal]:
    return [
        Signal(
            "engine_restarts",
            "restarts",
            "Restarts of the model's most restarted server over the rate window, five minutes "
            "at least (its API "
            "server's start time changed, or its counters reset): a loop counts up on one "
            "server, a rolling deploy counts one per server at a time.",
            on(
                vllm=q.either(
                    q.on_targets(_api_restarts, "max"), q.counter_resets(F.SUCCESS.name, "max")
                ),
                sglang=sg.counter_resets(SG.REALTIME_TOKENS, "max"),
            ),
            ("vllm_restarts", "changes"),
            per_instance=True,
            least_window=300.0,
        )
    ]


_BY = ("handler",)
_BY_STATUS = ("handler", "status")


def api_server() -> list[Signal]:
    s = Signal
    return [
        s(
            "http_request_rate",
            "req/s",
            "HTTP requests per second on the completion handlers.",
            on(vllm=api_requests(None), sglang=sg.http_responses(None)),
            ("vllm_http_requests", "rate"),
        ),
        s(
            "http_4xx_share",
            "ratio",
            "Share of completion requests answered 4xx (e.g. too long).",
            on(
                vllm=q.ratio(_answered("4xx"), api_requests(None)),
                sglang=q.ratio(sg.or_zero(sg.http_responses("4")), sg.http_responses(None)),
            ),
            ("vllm_http_requests_4xx", "share"),
        ),
        s(
            "http_5xx_share",
            "ratio",
            "Share of completion requests answered 5xx.",
            on(
                vllm=q.ratio(_answered("5xx"), api_requests(None)),
                sglang=q.ratio(sg.or_zero(sg.http_responses("5")), sg.http_responses(None)),
            ),
            ("vllm_http_requests_5xx", "share"),
        ),
        s(
            "http_requests_by_handler_status",
            "req/s",
            "HTTP requests per second by handler and status class, every handler (the API "
            "server's /metrics, /health and /ping are not counted).",
            on(
                vllm=q.on_targets(_per_target(exporters.HTTP_REQUESTS.name), extra_by=_BY_STATUS),
                sglang=Gap(
                    "reads the vLLM API server's http_* families (SGLang's are sglang:http_*)"
                ),
            ),
            ("vllm_http_requests_by_handler_status", "rate"),
        ),
        s(
            "http_duration_mean_by_handler",
            "s",
            "HTTP request duration by handler, mean: for a streamed answer, the whole stream.",
            on(
                vllm=q.ratio(
                    q.on_targets(_per_target(f"{exporters.HTTP_DURATION.name}_sum"), extra_by=_BY),
                    q.on_targets(
                        _per_target(f"{exporters.HTTP_DURATION.name}_count"), extra_by=_BY
                    ),
                ),
                sglang=Gap(
                    "reads the vLLM API server's http_* families (SGLang's are sglang:http_*)"
                ),
            ),
            ("vllm_http_request_duration_seconds_by_handler", "mean"),
        ),
        s(
            "api_server_cpu",
            "cores",
            "API-server CPU in cores, the busiest server; near 1 a single process is saturated.",
            on(vllm=q.on_targets(_api_cpu, fn="max"), sglang=sg.tokenizer_cpu()),
            ("vllm_api_server_cpu", "max"),
            per_instance=True,
        ),
    ]


# How long a target that went down still counts as serving the model it served last.
TARGET_MEMORY = "1h"
# How long every scrape of a target must have failed before the availability SLI counts it
# as down, and how many scrapes at least: two or more within the minute at 30 s or less, two
# minutes of silence at 60 s (a minute holds one scrape there). One failed scrape among good
# ones is more often a scrape that timed out on a busy server than an outage, at any scrape
# interval; the page for a target that is down is VllmTargetDown's, not the SLI's.
DOWN_HELD = "1m"
DOWN_SCRAPES = 2


def _held_down(scope: q.Scope, held: str) -> str:
    """1 for a target whose every scrape over ``held`` failed, ``DOWN_SCRAPES`` of them or
    more: counted over ``held``, or, where ``held`` holds fewer (a slow scrape interval), over
    ``DOWN_SCRAPES`` times ``held``, every scrape of which failed too; 0 for any other target
    scraped within ``held``."""
    seconds = int(parse_seconds(held) * DOWN_SCRAPES)
    longer = f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"

    def failed(window: str) -> str:
        return f"({q.up(scope, window)} == bool 0)"

    def enough(window: str) -> str:
        return f"({q.up(scope, window, 'count_over_time')} >= bool {DOWN_SCRAPES})"

    either = f"{enough(held)} + {failed(longer)} * {enough(longer)}"
    return f"({failed(held)} * clamp_max({either}, 1))"


def _targets(down: bool, held: str = "") -> q.Expr:
    """Per model, its scrape targets (those that served it within TARGET_MEMORY), or those of
    them that are down now (with ``held``: ``_held_down`` over that window)."""

    def build(scope: q.Scope) -> str:
        up = q.up(scope)
        each = f"({up} == bool 0)" if down else f"({up} >= bool 0)"
        if held:
            each = _held_down(scope, held)
        keep = scope.group_labels()
        keys = ", ".join(("job", "instance", *keep))
        joined = f"{each} * on ({keys}) group_left (model_name) {q.model_map(scope, TARGET_MEMORY)}"
        return q.agg("sum", scope, joined)

    return build


def attributed() -> list[Signal]:
    """Scrape health by model: a target belongs to the model it served last."""
    return [
        Signal(
            "targets_down",
            "targets",
            f"The model's targets that are down (scrape failing); a target belongs to the "
            f"model it served within the last {TARGET_MEMORY} (diagnose remembers the lookback).",
            everywhere(_targets(down=True)),
            ("up_down", "sum"),
            attributed=True,
        ),
        Signal(
            "targets_total",
            "targets",
            "The model's targets, up or down.",
            everywhere(_targets(down=False)),
            ("up_targets", "sum"),
            attributed=True,
        ),
    ]


def targets_held_down(scope: q.Scope) -> str:
    """Per model, its targets whose every scrape over ``DOWN_HELD`` failed, ``DOWN_SCRAPES``
    of them or more (``_held_down``)."""
    return _targets(down=True, held=DOWN_HELD)(scope)


def _servers(running: str) -> q.Expr:
    def build(scope: q.Scope) -> str:
        keys = ", ".join((*scope.by, *(x for x in ("job", "instance") if x not in scope.by)))
        one = f"group by ({keys}) ({q.selector(running, scope.matchers)})"
        return q.agg("sum", scope, one)

    return build


def servers_of(engine: str) -> str:
    """The signal counting a model's servers of ``engine`` (not the reference engine)."""
    return f"{engine}_servers"


def target_up_of(engine: str) -> str:
    """The signal of the scrape health of ``engine``'s targets."""
    return "target_up" if engine == registry.reference().name else f"{engine}_target_up"


def engines() -> list[Signal]:
    """Which engine serves a model, one signal per engine but the reference: diagnose says
    what that engine cannot tell, and why."""
    ref = registry.reference().title
    return [
        Signal(
            servers_of(e.name),
            "servers",
            f"The model's {e.title} servers (scrape targets exporting {e.running}); "
            f"none where only {ref} serves it.",
            {e.name: _servers(e.running)},
            (f"{e.name}_servers", "sum"),
        )
        for e in registry.others()
    ]


# The reference engine's targets are judged; the others' only watched.
NOT_JUDGED = Gap(
    "only vLLM's targets are judged: the check stands for vLLM's refusal to start when one "
    "max_model_len sequence does not fit the KV cache"
)


def targets() -> list[Signal]:
    return [
        Signal(
            "target_up",
            "ratio",
            "Scrape health of each vLLM target (1 up, 0 down).",
            on(vllm=_target_up, sglang=NOT_JUDGED),
            ("up", "max"),
            by=TARGET,
        ),
        Signal(
            "target_served",
            "targets",
            "1 where the vLLM target has exported vLLM's series within the lookback (it came up "
            "at least once), 0 where it never has: a server that never started, not one that "
            "served and then went down.",
            on(vllm=_target_served, sglang=NOT_JUDGED),
            ("up_served", "max"),
            by=TARGET,
            attributed=True,
        ),
        *(
            Signal(
                target_up_of(e.name),
                "ratio",
                f"Scrape health of each {e.title} target (1 up, 0 down).",
                {e.name: _target_up},
                (f"{e.name}_up", "max"),
                by=TARGET,
            )
            for e in registry.others()
        ),
    ]


def _target_served(scope: q.Scope) -> str:
    """The same from Prometheus alone, remembering TARGET_MEMORY (diagnose remembers the
    lookback): 1 where vLLM's running gauge was seen, else 0 for every scraped target."""
    seen = q.selector(registry.reference().running, scope.target_matchers())
    up = q.selector(exporters.UP.name, scope.target_matchers())
    return (
        f"group by (job, instance) (last_over_time({seen}[{TARGET_MEMORY}])) "
        f"or (max by (job, instance) ({up}) * 0)"
    )


def _target_up(scope: q.Scope) -> str:
    return f"max by (job, instance) ({q.selector(exporters.UP.name, scope.target_matchers())})"
