"""``servediag webhook`` as a process, stopped by real signals and run with stdout closed:
every alert answered 200 ends with a record, diagnosed, failed or undone with its reason,
whatever signal arrives, in whatever order and however often, and it is posted to chat even
when stdout cannot be written."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import loopback
import pytest
import yaml
from loopback import EMPTY, Faulty, answer, serve
from loopback import post_alerts as post
from notifications import alert, notification
from webhooks import health, start

from diagnoser.cli.webhook import webhook_cmd
from diagnoser.webhook.stop import stop_signals

ROOT = Path(__file__).resolve().parent.parent


def wait_for(what: Callable[[], Any], timeout: float = 30.0) -> Any:
    return loopback.wait_for(what, timeout)


def held(h: Any, f: Faulty) -> None:
    """A Prometheus whose queries answer only when the test ends: diagnoses never finish."""
    if not f.release.wait(120):
        answer(h, EMPTY)


def slow(h: Any, f: Faulty) -> None:
    """A Prometheus that takes 0.2 s a query: a diagnosis takes seconds."""
    if not f.release.wait(0.2):
        answer(h, EMPTY)


@contextlib.contextmanager
def webhook(
    prom_url: str,
    *args: str,
    stdout: int | IO[Any] = subprocess.PIPE,
    preexec: Callable[[], None] | None = None,
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A real ``servediag webhook`` process on a free loopback port, once it answers."""
    proc, url = start(prom_url, "--timeout", "300", *args, stdout=stdout, preexec=preexec)
    try:
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)


def records(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def accept(url: str, models: list[str]) -> None:
    for m in models:
        code, answered = post(url, notification(alert(m), group=m))
        assert code == 200, answered


# --- one signal: a drain, then exit 0 -----------------------------------------------------


@pytest.mark.parametrize(
    ("sig", "name"),
    [
        (signal.SIGTERM, "SIGTERM"),
        (signal.SIGINT, "SIGINT"),
        (signal.SIGHUP, "SIGHUP"),
        (signal.SIGQUIT, "SIGQUIT"),
        (signal.SIGUSR1, "SIGUSR1"),
        (signal.SIGUSR2, "SIGUSR2"),
        (signal.SIGRTMIN + 3, "SIGRTMIN+3"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_any_signal_that_would_end_the_process_drains_it_first(sig, name):
    """SIGHUP (a closed terminal), SIGQUIT, SIGUSR1 and the rest used to end the process on
    the spot, losing every alert it had answered 200."""
    models = [f"m-{i}" for i in range(3)]
    with (
        serve(slow) as api,
        webhook(api.url, "--workers", "1", "--drain-timeout", "2s") as (
            proc,
            url,
        ),
    ):
        accept(url, models)
        os.kill(proc.pid, sig)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    got = records(out)
    assert sorted(r["scope"]["model_name"] for r in got) == models
    undone = [r for r in got if r["outcome"] == "undone"]
    assert undone, "a 2 s drain cannot diagnose three alerts at 0.2 s a query"
    for r in undone:
        assert f"stopped on {name}" in r["error"] and "--drain-timeout" in r["error"], r["error"]
    assert f"stopping on {name}" in err


def test_the_drain_ends_the_process_when_its_time_is_up_even_with_diagnoses_held():
    """The drain gave up on the diagnoses still waiting on their queries, then the process
    waited for those queries (up to --timeout, here 300 s) before exiting: past any
    container's grace period, so SIGKILL came first."""
    models = [f"m-{i}" for i in range(3)]
    with serve(held) as api, webhook(api.url, "--drain-timeout", "2s") as (proc, url):
        accept(url, models)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    assert proc.returncode == 0, err
    assert took < 6, took
    got = records(out)
    assert sorted(r["scope"]["model_name"] for r in got) == models
    assert {r["outcome"] for r in got} == {"undone"}
    assert "2 alert(s) being diagnosed and 1 waiting" in err


# --- a second signal: the drain ends at once, every alert recorded, exit 128 + signal -------


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (signal.SIGINT, signal.SIGINT),  # Ctrl-C twice
        (signal.SIGTERM, signal.SIGINT),
        (signal.SIGTERM, signal.SIGTERM),
        (signal.SIGHUP, signal.SIGQUIT),
    ],
    ids=lambda s: signal.Signals(s).name,
)
def test_a_second_signal_ends_the_drain_at_once_and_every_alert_is_recorded(first, second):
    """A second Ctrl-C during the drain used to exit 0 with no record of the queue."""
    models = [f"m-{i}" for i in range(4)]
    with serve(held) as api, webhook(api.url, "--drain-timeout", "60s") as (proc, url):
        accept(url, models)
        os.kill(proc.pid, first)
        wait_for(lambda: health(url) == 503)  # draining: the diagnoses are held
        t0 = time.monotonic()
        os.kill(proc.pid, second)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    assert proc.returncode == 128 + second, err
    assert took < 10, "the second signal must not wait for the 60 s drain"
    assert "Traceback" not in err
    got = records(out)
    assert sorted(r["scope"]["model_name"] for r in got) == models
    assert {r["outcome"] for r in got} == {"undone"}
    for r in got:
        assert f"a second signal ({signal.Signals(second).name})" in r["error"], r["error"]
    assert "4 alert(s) not diagnosed" in err


def test_a_burst_of_signals_of_every_kind_still_records_every_alert():
    models = [f"m-{i}" for i in range(5)]
    burst = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGQUIT] * 4
    with serve(held) as api, webhook(api.url, "--drain-timeout", "60s") as (proc, url):
        accept(url, models)
        for sig in burst:
            os.kill(proc.pid, sig)
        out, err = proc.communicate(timeout=60)
    # The second signal handled ends the drain (which one: pending signals are handled in
    # the order of their numbers, not of their sending).
    assert proc.returncode in {128 + s for s in burst}, err
    assert "Traceback" not in err
    got = records(out)
    assert sorted(r["scope"]["model_name"] for r in got) == models
    assert {r["outcome"] for r in got} == {"undone"}


def test_the_signals_caught_are_those_whose_default_would_end_the_process():
    caught = set(stop_signals())
    assert {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT} <= caught
    assert {signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGXCPU} <= caught
    assert signal.SIGRTMIN in caught and signal.SIGRTMAX in caught
    # Not: a crash (SIGSEGV...), a stop of the terminal's (SIGTSTP), one Python ignores
    # already (SIGPIPE: a closed pipe is an error on the write), nor one ignored by default.
    for sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGTSTP, signal.SIGPIPE, signal.SIGCHLD):
        assert sig not in caught


# --- Docker: the drain fits in the time before SIGKILL ------------------------------------


def test_the_drain_ends_before_docker_kills_the_receiver():
    """``docker stop`` sends SIGTERM, then SIGKILL after the container's grace period (10 s
    unless the compose file says otherwise): a drain longer than that is cut by SIGKILL,
    and the alerts it would have recorded as undone are lost without a trace."""
    default = next(p for p in webhook_cmd.params if p.name == "drain_timeout").default
    assert default == "8s"  # Docker's and Podman's default grace is 10 s
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    hook = compose["services"]["webhook"]
    command = hook["command"]
    drain = command[command.index("--drain-timeout") + 1]
    grace = hook["stop_grace_period"]
    assert drain.endswith("s") and grace.endswith("s")
    assert int(grace[:-1]) >= int(drain[:-1]) + 5  # time left to print the undone and exit
    # A diagnosis begun just before the stop has the time of its --timeout to end.
    timeout = next(p for p in webhook_cmd.params if p.name == "timeout").default
    if "--timeout" in command:
        timeout = command[command.index("--timeout") + 1]
    assert int(drain[:-1]) >= float(timeout)


# --- stdout closed -------------------------------------------------------------------------


def _close_stdout() -> None:
    os.close(1)


@pytest.mark.parametrize("case", ["reader gone", "closed", "disk full"])
def test_with_stdout_unwritable_every_alert_still_gets_its_record_and_its_chat_post(case):
    """Records that cannot be printed go to the log (stderr), each as its JSON, and the chat
    post is still sent: before, a failing print lost both."""
    chat: list[dict[str, Any]] = []

    def chat_ok(h, f):
        chat.append(json.loads(f.seen[-1].body))
        answer(h, b"ok", 200, {"Content-Type": "text/plain"})

    models = ["m-0", "m-1"]
    stdout: Any = subprocess.PIPE
    preexec = None
    full = None
    if case == "closed":
        stdout, preexec = subprocess.DEVNULL, _close_stdout
    elif case == "disk full":
        full = stdout = open("/dev/full", "w")  # noqa: SIM115
    with contextlib.ExitStack() as stack:
        api = stack.enter_context(serve(lambda h, f: answer(h, EMPTY)))
        hooks = stack.enter_context(serve(chat_ok))
        env_url = hooks.url + "/hooks/T/B/secret"
        proc, url = stack.enter_context(
            webhook(api.url, "--slack-url", env_url, stdout=stdout, preexec=preexec)
        )
        if full is not None:
            full.close()
        if case == "reader gone":
            assert proc.stdout is not None
            proc.stdout.close()
            proc.stdout = None
        accept(url, models)
        wait_for(lambda: len(chat) == 2)
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Exception ignored" not in err
    logged = [
        json.loads(line.split("instead: ", 1)[1])
        for line in err.splitlines()
        if "instead: " in line
    ]
    assert sorted(r["scope"]["model_name"] for r in logged) == models
    assert {r["outcome"] for r in logged} == {"diagnosed"}
    assert sorted(m for m in models for c in chat if m in c["text"]) == models
    assert 'servediag_webhook_records_total{outcome="logged"} 2' in metrics
