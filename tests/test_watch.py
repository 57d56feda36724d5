"""``servediag watch``: the cycles stepped through a backfilled incident on a real Prometheus
(hysteresis, onset, rank, health), its errors (Prometheus down, answering garbage, too slow, a
bug), its /metrics over real HTTP, and the command as a process of its own (SIGTERM, bad
arguments)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from clitest import ROOT, cli, proc_one_line
from loopback import answer, serve
from prometheus_client.parser import text_string_to_metric_families

from diagnoser.diagnosis.model import to_json
from diagnoser.plumbing.source import PrometheusSource
from diagnoser.site import Site
from diagnoser.watch.http import listen
from diagnoser.watch.loop import Watch
from lab.promserver import free_port

INCIDENT = "batch-slot-limit-recovered"  # 2h: the slot limit binds from 1h20m to 1h45m
DURATION, BEGINS, ENDS = 7200.0, 4800.0, 6300.0
STEP = 300.0  # seconds between two cycles of the tests
CLEAR = 300.0  # --clear-after of the tests


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The exposition parsed as Prometheus parses it: each family's samples, by name."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def finding(text: str, playbook: str, name: str = "servediag_finding") -> float | None:
    values = [v for labels, v in samples(text).get(name, []) if labels["playbook"] == playbook]
    assert len(values) <= 1
    return values[0] if values else None


def value(text: str, name: str, **labels: str) -> float:
    (v,) = [v for got, v in samples(text)[name] if all(got.get(k) == x for k, x in labels.items())]
    return v


@pytest.fixture(scope="module")
def incident(scenario_library, prometheus_for):
    """The incident's Prometheus and the Unix time its simulation began."""
    return prometheus_for(INCIDENT), scenario_library[INCIDENT].end - DURATION


def watch_of(url: str, **kw) -> Watch:
    kw = {"every": STEP, "clear_after": CLEAR, "lookback": 0.0, "timeout": 20.0, **kw}
    return Watch(PrometheusSource(url), Site.load(None), 1800.0, **kw)


def test_a_finding_enters_after_two_cycles_and_leaves_clear_after_its_end(incident):
    prom, start = incident
    watch = watch_of(prom.url)
    named, served, texts = [], [], []
    for at in range(int(start + 4500), int(start + DURATION) + 1, int(STEP)):
        assert watch.cycle(float(at)).kind == "ok"
        current = [m.playbook.id for m in watch.latest.findings]
        named.append("batch-slot-limit" in current)
        texts.append(watch.render(now=float(at)))
        served.append(finding(texts[-1], "batch-slot-limit") is not None)
    first, last = named.index(True), len(named) - 1 - named[::-1].index(True)
    assert not any(served[: first + 1])  # not on the first cycle that names it
    assert all(served[first + 1 : last + 1])  # from the second, through the incident
    gone = next(i for i in range(last + 1, len(served)) if not served[i])
    assert (gone - last - 1) * STEP >= CLEAR > (gone - last - 2) * STEP  # absent --clear-after
    during = texts[last]
    onset = finding(during, "batch-slot-limit", "servediag_finding_onset_timestamp_seconds")
    assert start + BEGINS <= onset <= start + BEGINS + 300
    assert finding(during, "batch-slot-limit", "servediag_finding_rank") == 1
    ranks = [v for _, v in samples(during)["servediag_finding_rank"]]
    assert sorted(ranks) == list(range(1, len(ranks) + 1))  # one likely cause, then 2, ...
    assert 0 < finding(during, "batch-slot-limit") <= 1
    ((scope, _),) = samples(during)["servediag_health"]
    assert scope == {"model_name": "llama-3.1-8b-instruct", "verdict": "unhealthy"}
    assert value(texts[-1], "servediag_health", verdict="healthy") == 1
    assert value(during, "servediag_stale") == 0
    assert value(during, "servediag_cycles_total", outcome="ok") == last + 1
    assert value(during, "servediag_queries_total") > 0
    assert value(during, "servediag_samples_read_total") > 1000
    info = [labels for labels, _ in samples(during)["servediag_playbook_info"]]
    assert {"playbook": "batch-slot-limit", "severity": "warning"}.items() <= info[0].items()

    # The same over real HTTP, through the hardened listener.
    server = listen(watch, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = resp.read().decode()
        assert value(text, "servediag_cycles_total", outcome="ok") == len(named)
        with urllib.request.urlopen(base + "/healthz", timeout=10) as resp:
            assert resp.status == 200 and "was good" in resp.read().decode()
    finally:
        server.shutdown()
        server.server_close()


def test_prometheus_down_is_counted_and_the_service_goes_on():
    watch = watch_of(f"http://127.0.0.1:{free_port()}")
    for at in (1000.0, 1300.0):
        assert watch.cycle(at).kind == "source"
    text = watch.render(now=1300.0)
    assert value(text, "servediag_errors_total", kind="source") == 2
    assert value(text, "servediag_cycles_total", outcome="error") == 2
    assert value(text, "servediag_stale") == 1
    assert "failed (source)" in watch.health()


def test_garbage_keeps_the_last_findings_stale_until_prometheus_is_back(incident, caplog):
    prom, start = incident
    mode = {"now": "forward"}

    def respond(h, f):
        if mode["now"] == "junk":
            answer(h, b"<html>not prometheus</html>\x1b[31m")
            return
        if mode["now"] == "slow":
            f.release.wait(3)
            return
        req = urllib.request.Request(
            prom.url + h.path,
            data=h.request_body or None,
            headers={"Content-Type": h.headers.get("Content-Type", "")},
        )
        with urllib.request.urlopen(req, timeout=20) as resp:
            answer(h, resp.read())

    with serve(respond) as proxy:
        watch = watch_of(proxy.url)
        at = start + 5700
        for t in (at, at + STEP):
            assert watch.cycle(t).kind == "ok" or pytest.fail(watch.last.message)
        before = watch.render(now=at + STEP)
        assert finding(before, "batch-slot-limit") is not None
        assert watch.source.reuse.entries  # the last answers, for the next cycle
        mode["now"] = "junk"
        with caplog.at_level(logging.ERROR, "servediag.watch"):
            assert watch.cycle(at + 2 * STEP).kind == "source"
        assert watch.source.reuse.entries == {}  # the next good cycle reads everything
        stale = watch.render(now=at + 2 * STEP)
        assert value(stale, "servediag_stale") == 1
        assert value(stale, "servediag_errors_total", kind="source") == 1
        assert finding(stale, "batch-slot-limit") == finding(before, "batch-slot-limit")
        assert samples(stale)["servediag_health"] == samples(before)["servediag_health"]
        assert value(stale, "servediag_last_success_timestamp_seconds") == at + STEP
        assert value(stale, "servediag_last_success_age_seconds") == STEP
        mode["now"] = "forward"
        assert watch.cycle(at + 3 * STEP).kind == "ok"
        back = watch.render(now=at + 3 * STEP)
        assert value(back, "servediag_stale") == 0
        assert value(back, "servediag_cycles_total", outcome="error") == 1
        mode["now"] = "slow"  # a cycle past its deadline: a timeout
        slow = watch_of(proxy.url, timeout=1.0)
        assert slow.cycle(at).kind == "timeout"
        assert value(slow.render(now=at), "servediag_errors_total", kind="timeout") == 1
    assert any("failed (source)" in r.getMessage() for r in caplog.records)


def test_a_bug_in_a_cycle_is_logged_and_counted_as_internal(monkeypatch, caplog):
    def boom(*args, **kwargs):
        raise RuntimeError("line one\nforged line")

    monkeypatch.setattr("diagnoser.watch.loop.run", boom)
    watch = watch_of("http://127.0.0.1:9")
    with caplog.at_level(logging.ERROR, "servediag.watch"):
        assert watch.cycle(1000.0).kind == "internal"
    assert value(watch.render(now=1000.0), "servediag_errors_total", kind="internal") == 1
    (record,) = caplog.records
    assert record.exc_info is not None and "RuntimeError" in record.getMessage()


def environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PROMETHEUS_URL", "SERVEDIAG_CONFIG")}


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.status, resp.read().decode()


def test_the_command_serves_and_ends_on_sigterm(incident, tmp_path):
    """With --alerts, the listener also takes Alertmanager's notifications: one JSON line on
    stdout for each alert, the receiver's counters on /metrics."""
    prom, _ = incident
    port, log = free_port(), (tmp_path / "stderr").open("w+")
    out = (tmp_path / "stdout").open("w+")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "diagnoser",
            "watch",
            "--prometheus-url",
            prom.url,
            "--since",
            "30m",
            "--every",
            "10s",
            "--listen",
            f"127.0.0.1:{port}",
            "--lookback",
            "0",
            "--alerts",
        ],
        stdout=out,
        stderr=log,
        cwd=ROOT,
        env={**environ(), "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline, text = time.monotonic() + 20, ""
        while time.monotonic() < deadline:
            try:
                _, text = _get(f"http://127.0.0.1:{port}/metrics")
                if "\nservediag_last_success_timestamp_seconds " in text:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        assert value(text, "servediag_cycles_total", outcome="ok") >= 1, (
            log.seek(0),
            log.read()[-3000:],
        )
        assert value(text, "servediag_stale") == 0
        status, body = _get(f"http://127.0.0.1:{port}/healthz")
        assert status == 200 and "serving" in body
        labels = {"alertname": "VllmTtftSlo", "model_name": "llama-3.1-8b-instruct"}
        notification = {"alerts": [{"status": "firing", "labels": labels}]}
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/alerts", json.dumps(notification).encode()
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.status == 200
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not out.tell():
            time.sleep(0.2)
            out.seek(0, os.SEEK_END)
        out.seek(0)
        (record,) = [json.loads(line) for line in out.read().splitlines()]
        assert record["alert"] == "VllmTtftSlo" and "from_cycle" in record
        _, text = _get(f"http://127.0.0.1:{port}/metrics")
        assert value(text, "servediag_webhook_alerts_total", outcome="queued") == 1
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=5)  # within its grace
    finally:
        proc.kill()
        proc.wait()
        log.seek(0)
        err = log.read()
        log.close()
        out.close()
    assert proc.returncode == 0, err[-2000:]
    assert "stopped on SIGTERM" in err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--every", "5s"), "--every 5s is too short"),
        (("--clear-after", "soon"), "--clear-after"),
        (("--listen", "nowhere"), "--listen"),
        (("--match", "not a matcher"), "--match"),
        (("--max-connections", "0"), "--max-connections"),
    ],
)
def test_bad_arguments_exit_2_in_one_line(args, says):
    proc_one_line(cli("watch", "--prometheus-url", "http://127.0.0.1:9", *args), says)


def comparable(watch: Watch) -> dict:
    """A cycle's diagnosis as JSON, without the time its queries took."""
    out = to_json(watch.latest)
    out["stats"].pop("query_seconds")
    return out


def test_a_cycle_reads_its_new_steps_only_and_diagnoses_as_a_full_read(incident):
    """Cycles a minute apart through the incident's onset, at times off the grid of steps:
    the one that reuses the last cycle's answers names, scores, dates and judges exactly
    what one reading everything names, and reads a fraction of the samples."""
    prom, start = incident
    kw = {"every": 60.0, "lookback": 86400.0}
    reusing, fresh = watch_of(prom.url, **kw), watch_of(prom.url, reuse=False, **kw)
    read: list[tuple[int, int]] = []
    again: list[str] = []  # spans the last cycle read and this one read whole again
    for at in range(int(start + BEGINS) + 7, int(start + BEGINS + 720), 60):
        before = (reusing.source.tally.samples, fresh.source.tally.samples)
        kept = set(reusing.source.reuse.entries)
        for w in (reusing, fresh):
            assert w.cycle(float(at)).kind == "ok" or pytest.fail(w.last.message)
        assert comparable(reusing) == comparable(fresh)
        read.append(
            (reusing.source.tally.samples - before[0], fresh.source.tally.samples - before[1])
        )
        again += [
            expr
            for (expr, _), e in reusing.source.reuse.entries.items()
            if (expr, _) in kept and e.start < e.end == e.full_end
        ]
    assert any(m.playbook.id == "batch-slot-limit" for m in reusing.latest.findings)
    assert read[0][0] == read[0][1]  # the first cycle reads everything
    later = sum(r for r, _ in read[1:]) / sum(f for _, f in read[1:])
    assert later < 0.15, read
    assert reusing.source.reuse.counts.partial > 0
    # A later cycle reads whole only what it asks for the first time (the onset's lookback
    # once the model turns sick): the day's map of targets to models, too, is read from its
    # last steps, although its coarse steps do not fall on the window's.
    assert again == []
    text = reusing.render(now=float(at))
    counts = reusing.source.reuse.counts
    assert value(text, "servediag_range_queries_total", read="partial") == counts.partial
    assert value(text, "servediag_range_queries_total", read="full") == counts.full
    assert value(text, "servediag_points_reused_total") == counts.reused > 0
    assert value(fresh.render(now=float(at)), "servediag_range_queries_total", read="partial") == 0
