"""Options more than one command takes, declared once: the window (``--since``, ``--until``),
which series a diagnosis reads (``--model``, ``--instance``, ``--job``, ``--match``), how it
reads them (``--lookback``, ``--baseline``, ``--recorded-rules``), the listener's
address (``--listen``) and what what-if must be told of the servers (``--preset``, ``--gpu``,
the scheduler limits)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from diagnoser.cli.options import F, fail, with_options
from diagnoser.cli.params import DURATION, HOST_PORT, TIMESTAMP, Duration, bounded
from diagnoser.hardware.presets import MODEL_ALIASES, SERVED_DTYPES
from diagnoser.request import Scope, ScopeError
from diagnoser.whatif.setup import SETUP_LIMITS, SetupOptions


def since_option(what: str) -> Callable[[F], F]:
    """``--since DURATION`` (default 1h); ``what`` says what the command does with it."""
    return click.option(
        "--since",
        "since",
        type=DURATION,
        default="1h",
        show_default=True,
        metavar="DURATION",
        help=what,
    )


until_option = click.option(
    "--until",
    "until",
    type=TIMESTAMP,
    default=None,
    metavar="TIME",
    help="End of the window: RFC 3339 or Unix seconds (default: now).",
)


def listen_option(default: str | None, what: str) -> Callable[[F], F]:
    """``--listen HOST:PORT`` (required without a default)."""
    return click.option(
        "--listen",
        type=HOST_PORT,
        default=default,
        required=default is None,
        show_default=default is not None,
        metavar="HOST:PORT",
        help=what,
    )


def _baseline(ctx: click.Context, param: click.Parameter, value: str) -> float | None:
    if value == "before":
        return None
    return Duration().convert(value, param, ctx)


_LOOKBACK = click.option(
    "--lookback",
    "lookback",
    type=Duration(zero=True),
    default="24h",
    show_default=True,
    metavar="DURATION",
    help="When a model is unhealthy and the window explains nothing, look this far "
    "back for when it began (0 turns it off).",
)
_BASELINE = click.option(
    "--baseline",
    "baseline",
    default="before",
    show_default=True,
    callback=_baseline,
    help="Reference period: 'before' (as long as the window, just before it) or a "
    "duration such as 1d (the same hours that long ago).",
)
_RECORDED_RULES = click.option(
    "--recorded-rules",
    "recorded_rules",
    is_flag=True,
    help="Read each signal from the site's recording rules (servediag generate's) where "
    "they cover the window and the scope: one series per model, not every instance's "
    "buckets; much faster on a large fleet. The rest is read as without it.",
)


_SCOPE = [
    click.option("--model", default=None, help="Only this model_name."),
    click.option("--instance", default=None, help="Only this instance."),
    click.option("--job", default=None, help="Only this job."),
    click.option(
        "--match",
        "match",
        multiple=True,
        metavar='LABEL="VALUE"',
        help="Any further label matcher (repeatable).",
    ),
]


def scope_options(fn: F) -> F:
    """``--model``, ``--instance``, ``--job`` and ``--match``: the series a diagnosis reads, as
    diagnose and watch take them (``scope`` makes them one ``Scope``)."""
    return with_options(fn, _SCOPE)  # type: ignore[no-any-return]


def scope(
    model: str | None, instance: str | None, job: str | None, match: tuple[str, ...]
) -> Scope:
    """The scope the options name, or exit 2 naming the option that is malformed."""
    try:
        return Scope(model=model, instance=instance, job=job, match=match)
    except ScopeError as exc:
        fail(f"--{exc}")


def history_options(fn: F) -> F:
    """``--lookback`` and ``--baseline`` (handed on as seconds, or None for 'before'): how far
    back a diagnosis reads, as diagnose, the webhook and watch do."""
    return with_options(fn, [_LOOKBACK, _BASELINE])  # type: ignore[no-any-return]


def reading_options(fn: F) -> F:
    """``history_options`` and ``--recorded-rules``: how a diagnosis reads the store, as
    diagnose and the webhook do (watch reads the rules wherever they are, always)."""
    return with_options(fn, [_LOOKBACK, _BASELINE, _RECORDED_RULES])  # type: ignore[no-any-return]


_SETUP_PARAMS = tuple(f.name for f in dataclasses.fields(SetupOptions))


def setup_options(fn: F) -> F:
    """``--preset``, ``--model-config``, ``--gpu``, the scheduler limits and ``--tp``, handed to
    the command as one ``setup: SetupOptions`` argument (what-if's, and diagnose --what-if's)."""
    options = [
        click.option(
            "--preset",
            default=None,
            metavar="NAME",
            help=f"The model's shape from a preset ({', '.join(MODEL_ALIASES)}).",
        ),
        click.option(
            "--model-config",
            type=click.Path(path_type=Path),
            default=None,
            metavar="CONFIG",
            help="The model's shape from its Hugging Face config.json (or its directory).",
        ),
        click.option(
            "--gpu",
            "gpu_name",
            default=None,
            help="GPU preset, or CPU for vLLM's CPU build (default: the GPU DCGM reports; "
            "required without DCGM).",
        ),
        click.option(
            "--max-num-seqs",
            type=bounded(SETUP_LIMITS["max_num_seqs"]),
            default=None,
            help="The servers' --max-num-seqs (default: vLLM's for the GPU).",
        ),
        click.option(
            "--max-num-batched-tokens",
            type=bounded(SETUP_LIMITS["max_num_batched_tokens"]),
            default=None,
            help="The servers' --max-num-batched-tokens (default: vLLM's for the GPU).",
        ),
        click.option(
            "--max-model-len",
            type=bounded(SETUP_LIMITS["max_model_len"]),
            default=None,
            help="The servers' --max-model-len (default: the model's, within the KV cache).",
        ),
        click.option(
            "--tensor-parallel-size",
            "--tp",
            "tensor_parallel",
            type=bounded(SETUP_LIMITS["tensor_parallel"]),
            default=1,
            show_default=True,
            help="GPUs each engine is split across.",
        ),
        click.option(
            "--dtype",
            type=click.Choice(SERVED_DTYPES),
            default="auto",
            show_default=True,
            help="The servers' --dtype (auto: the config's, float32 served as bfloat16).",
        ),
    ]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        setup = SetupOptions(*(kwargs.pop(name) for name in _SETUP_PARAMS))
        if setup.preset is not None and setup.model_config is not None:
            fail("give --preset or --model-config, not both")
        return fn(*args, setup=setup, **kwargs)

    return with_options(wrapper, options)  # type: ignore[no-any-return]
