"""Every argument, drawn at random: the Python API's ``diagnose()``, ``kv_budget()`` and
``connect()`` either take it or raise one ``ValueError`` (or ``TypeError``) whose one line names
the argument, before any query; the command line either takes the same value for the same
option or exits 2 with one line naming the option, never a traceback. And the two agree: one
``Limit`` or one duration parser decides each, so a value one takes the other takes."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import diagnoser
from diagnoser.cli import main
from diagnoser.kvbudget.budget import PLAN_LIMITS, PlanInputs
from diagnoser.plumbing.errors import UserError
from diagnoser.plumbing.limits import MAX_RESPONSE_MB, TIMEOUT, Limit
from diagnoser.whatif.setup import SETUP_LIMITS, SetupOptions

SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


# The API as a caller who passes anything sees it (the point here is to pass the wrong thing).
diagnose: Any = diagnoser.diagnose
kv_budget: Any = diagnoser.kv_budget
connect: Any = diagnoser.connect
setup_options: Any = SetupOptions
plan_inputs: Any = PlanInputs


class Reached(Exception):
    """A call got as far as querying its source: every argument it was given was taken."""


class Refuses:
    """A metric source whose queries say the call got that far, and nothing else."""

    def query_range(self, *args: Any, **kwargs: Any) -> Any:
        raise Reached

    def query(self, *args: Any, **kwargs: Any) -> Any:
        raise Reached


NUMBERS = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.integers(min_value=-5, max_value=700),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-1, max_value=2000),
    st.sampled_from([0, -1, 1, 0.5, 1e10, 1e300, math.nan, math.inf, -math.inf]),
)
TEXT = st.one_of(
    st.text(max_size=20),
    st.sampled_from(
        [
            "",
            " ",
            "30",
            "30s",
            "1h",
            "0",
            "0s",
            "-5",
            "nan",
            "inf",
            "1e10",
            "10y",
            "1h30m",
            "3651d",
            "1e-300",
            "16",
            "16.5",
            "0x10",
            "1_000",
        ]
    ),
    NUMBERS.map(str),
)
WRONG = st.sampled_from([None, True, False, [], ["a", "b"], {}, {"a": 1}, object(), b"1h", 3j])
ANYTHING = st.one_of(NUMBERS, TEXT, WRONG)


def refusal(exc: BaseException, name: str) -> None:
    """``exc`` is a ValueError or TypeError whose message is one line naming ``name``."""
    assert isinstance(exc, (ValueError, TypeError)), repr(exc)
    message = str(exc)
    assert "\n" not in message and "\r" not in message, message
    assert name in message, message
    assert len(message) < 400, message


def api_outcome(call: Any, name: str) -> bool:
    """True when ``call()`` took its arguments (it returned, or reached its source); False
    when it refused the argument ``name`` as a refusal must."""
    try:
        call()
    except Reached:
        return True
    except (ValueError, TypeError) as exc:
        refusal(exc, name)
        return False
    return True


def cli(*args: str) -> Any:
    runner = CliRunner(env={"PROMETHEUS_URL": None, "SERVEDIAG_CONFIG": None})
    return runner.invoke(main, list(args))


def cli_outcome(res: Any, option: str) -> bool:
    """True when the command took ``option``'s value; False when it exited 2 with one line
    naming the option. Never a traceback."""
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exc_info
    assert "Traceback" not in res.output, res.output
    lines = res.stderr.splitlines()
    names = re.escape(option) + r"( / --[a-z-]+)*: "  # click names each of an option's names
    if res.exit_code == 2 and lines and re.match(f"servediag: error: {names}", lines[0]):
        assert len(lines) == 1, res.stderr
        return False
    return True


def diagnose_cli(option: str, value: str) -> bool:
    """``diagnose --OPTION=VALUE`` with an ``--output`` in no directory: a value taken ends
    there (exit 2, before the site is loaded or anything queried), a value refused at its
    option."""
    res = cli(
        "diagnose",
        "--prometheus-url",
        "http://127.0.0.1:9",
        f"{option}={value}",
        "--output",
        "/no-such-directory/report.txt",
    )
    took = cli_outcome(res, option)
    if took:
        assert res.exit_code == 2 and "/no-such-directory is not a directory" in res.stderr, (
            res.stderr
        )
    return took


def as_option(value: Any) -> str:
    return (
        value if isinstance(value, str) else repr(value) if isinstance(value, float) else str(value)
    )


# -- the Python API ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "option"),
    [
        ("since", "--since"),
        ("lookback", "--lookback"),
        ("baseline", "--baseline"),
        ("until", "--until"),
        ("timeout", "--timeout"),
    ],
)
@SETTINGS
@given(value=st.one_of(NUMBERS, TEXT))
def test_diagnose_takes_a_value_when_the_command_line_does(name: str, option: str, value: Any):
    took = api_outcome(lambda: diagnose(Refuses(), **{name: value}), name)
    if name == "baseline" and value == "before":
        return  # the command line's word for the default, which the API writes None
    assert took == diagnose_cli(option, as_option(value)), (name, value)


@pytest.mark.parametrize(
    "name",
    [
        "since",
        "until",
        "model",
        "lookback",
        "match",
        "baseline",
        "timeout",
        "config",
        "catalog",
        "recorded_rules",
        "what_if",
    ],
)
@SETTINGS
@given(value=ANYTHING)
def test_diagnose_refuses_a_bad_argument_naming_it_before_any_query(name: str, value: Any):
    def call() -> Any:
        try:
            return diagnose(Refuses(), **{name: value})
        except UserError as exc:  # a site config or catalog that cannot be read, as documented
            assert name in ("config", "catalog") and "\n" not in str(exc), exc
            return None

    api_outcome(call, name)


@pytest.mark.parametrize(
    ("name", "limit"), [("timeout", TIMEOUT), ("max_response_mb", MAX_RESPONSE_MB)]
)
@SETTINGS
@given(value=ANYTHING)
def test_connect_takes_what_its_limit_takes(name: str, limit: Limit, value: Any):
    took = api_outcome(lambda: connect("http://127.0.0.1:9", **{name: value}), name)
    try:
        limit.convert(value)
    except ValueError:
        assert not took
    else:
        assert took
    option = "--" + name.replace("_", "-")
    if not isinstance(value, (int, float, str)) or isinstance(value, bool):
        return
    assert took == diagnose_cli(option, as_option(value)), (name, value)


@pytest.mark.parametrize("name", [*sorted(PLAN_LIMITS), "kv_cache_dtype", "dtype", "gpu"])
@SETTINGS
@given(value=ANYTHING)
def test_kv_budget_takes_a_value_when_the_command_line_does(name: str, value: Any):
    def plan() -> Any:
        try:
            return kv_budget("llama-3.1-8b", **{name: value})
        except UserError:  # taken, but what it asks cannot be planned (said in one line)
            return None

    took = api_outcome(plan, name)
    if not isinstance(value, (int, float, str)) or isinstance(value, bool) or name == "gpu":
        return
    option = {"tensor_parallel": "--tensor-parallel-size"}.get(name, "--" + name.replace("_", "-"))
    res = cli("kv-budget", "--model", "llama-3.1-8b", f"{option}={as_option(value)}")
    assert took == cli_outcome(res, option), (name, value, res.stderr)


@pytest.mark.parametrize("name", ["at", "timeout", "model"])
@SETTINGS
@given(value=ANYTHING)
def test_kv_budget_refuses_a_bad_argument_naming_it(name: str, value: Any):
    def plan() -> Any:
        try:
            return kv_budget(**{"source": Refuses(), name: value})
        except UserError:
            return None

    api_outcome(plan, name)


@pytest.mark.parametrize("name", [*sorted(SETUP_LIMITS), "dtype", "preset", "gpu_name"])
@SETTINGS
@given(value=ANYTHING)
def test_what_if_setup_refuses_a_bad_field_naming_it(name: str, value: Any):
    api_outcome(lambda: setup_options(**{name: value}), name)


# -- the cases as they were reported -------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"since": 0}, "since: 0 must be longer than zero"),
        ({"since": -60}, "since: -60 must be longer than zero"),
        ({"timeout": "30s"}, "timeout: '30s' is not a number"),
        ({"timeout": 1e10}, "timeout: 1e+10 is not in the range 1<=x<=600"),
        ({"timeout": math.nan}, "timeout: nan is not a finite number"),
        ({"model": ["a", "b"]}, "model: ['a', 'b'] is not text"),
        ({"lookback": -1}, "lookback: -1 must not be negative"),
        ({"match": 5}, "match: 5 is not a label matcher"),
        ({"until": True}, "until: True is neither RFC 3339 nor a Unix timestamp"),
        ({"catalog": 5}, "catalog: 5 is not a directory"),
    ],
)
def test_diagnose_names_the_bad_argument(kwargs: dict[str, Any], says: str):
    with pytest.raises(ValueError) as caught:
        diagnose(Refuses(), **kwargs)
    assert says in str(caught.value)


def test_diagnose_takes_the_timeout_as_the_command_line_writes_it():
    with pytest.raises(Reached):
        diagnose(Refuses(), since="30", timeout="30")


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"block_size": 0}, "block_size: 0 is not in the range 1<=x<=1048576"),
        ({"gpu_memory_utilization": math.nan}, "gpu_memory_utilization: nan is not a finite"),
        ({"tensor_parallel": 0}, "tensor_parallel: 0 is not in the range 1<=x<=4096"),
        ({"block_size": 16.5}, "block_size: 16.5 is not a whole number"),
        ({"kv_cache_dtype": "fp4"}, "kv_cache_dtype: 'fp4' is not one of auto"),
    ],
)
def test_kv_budget_names_the_bad_argument(kwargs: dict[str, Any], says: str):
    with pytest.raises(ValueError) as caught:
        kv_budget("llama-3.1-8b", **kwargs)
    assert says in str(caught.value)


def test_plan_inputs_keep_the_numbers_as_numbers():
    asked = plan_inputs("llama-3.1-8b", block_size="32", gpu_memory_utilization="0.8")
    assert (asked.block_size, asked.gpu_memory_utilization) == (32, 0.8)


def test_an_integer_beyond_any_float_is_refused_naming_the_argument():
    huge = 10**5000
    for name in ("since", "lookback", "baseline", "until", "timeout"):
        with pytest.raises(ValueError, match=f"^{name}: "):
            diagnose(Refuses(), **{name: huge})
    with pytest.raises(ValueError, match=r"^block_size: a number of over 4000 digits is not in"):
        kv_budget("llama-3.1-8b", block_size=huge)
