"""What reaches PromQL, a runbook link, a Markdown report or a chat message from a config, an
alert or a label value cannot become code there: ``sglang_targets`` is label matchers or
refused (as ``vllm_targets`` is); ``runbook_url`` holds no field but ``{id}`` and is an
http(s) URL, or every command that loads it refuses it in one line; a link is only ever
http(s); and a label value or an alert's text cannot mention a channel, make a link or an
image, or carry raw HTML into Markdown (Mattermost and Rocket.Chat render it)."""

from __future__ import annotations

import json
import re

import pytest
from clitest import cli, diagnose_answered, proc_one_line, run

from lab.promserver import free_port

EVIL = (
    "@channel @all [click](https://evil.example/x) ![i](http://evil.example/p.png) "
    "<img src=x onerror=alert(1)> www.evil.example"
)
# What a renderer would read as a mention, a link, an image, raw HTML or a bare URL.
DANGER = [
    re.compile(r"@(channel|all|here)\b"),
    re.compile(r"\]\("),
    re.compile(r"https?://evil"),
    re.compile(r"(?i)\bwww\.evil"),
    re.compile(r"<img"),
]


def harmless(text: str, html: bool = True) -> None:
    """Nothing in ``text`` a renderer would act on (raw HTML only when ``html``)."""
    for pattern in DANGER if html else DANGER[:-1]:
        assert not pattern.search(text), (pattern.pattern, text[:2000])


# --- the site config ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", ['"', 'job="sglang"} or vector(1) or up{a="', "job=sglang", 'job="x"}[5m]']
)
def test_sglang_targets_must_be_label_matchers(tmp_path, value):
    cfg = tmp_path / "site.yaml"
    cfg.write_text(f"sglang_targets: {json.dumps(value)}\n")
    res = run("generate", "--config", str(cfg), "--out", str(tmp_path / "out"))
    assert res.exit_code == 2, res.stderr[-2000:]
    (line,) = res.stderr.splitlines()
    assert f"{cfg}: sglang_targets:" in line and "is not label matchers" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.prometheus
def test_sglang_targets_that_are_matchers_reach_the_rules(tmp_path):
    cfg = tmp_path / "site.yaml"
    cfg.write_text('sglang_targets: \' job="sglang-prod", cluster=~"a|b" \'\n')
    res = run("generate", "--config", str(cfg), "--out", str(tmp_path / "out"))
    assert res.exit_code == 0, res.stderr[-2000:]
    alerts = (tmp_path / "out" / "rules" / "alerts.rules.yaml").read_text()
    assert 'up{job="sglang-prod", cluster=~"a|b"}' in alerts


BAD_RUNBOOK_URLS = [
    ("https://rb.example/{id}/{other}", "{other} is not a field it can hold"),
    ("https://rb.example/{id.__class__}/{id}", "{id.__class__} is not a field it can hold"),
    ("https://rb.example/{id!r}", "{id!r} is not a field it can hold"),
    ("https://rb.example/{id:>900}", "{id:>900} is not a field it can hold"),
    ("https://rb.example/{}{id}", "{} is not a field it can hold"),
    ("https://rb.example/{id}{", "Single '{' encountered"),
    ("https://rb.example/{id}}", "Single '}' encountered"),
    ("javascript:alert(1)//{id}", "is not an http:// or https:// URL"),
    ("JavaScript:alert(document.domain)//{id}", "is not an http:// or https:// URL"),
    ("/runbooks/{id}.md", "is not an http:// or https:// URL"),
    ("https://rb.example/page", "must contain {id}"),
]


@pytest.mark.parametrize(("url", "says"), BAD_RUNBOOK_URLS)
def test_a_runbook_url_with_another_field_or_scheme_is_refused(tmp_path, url, says):
    cfg = tmp_path / "site.yaml"
    cfg.write_text(f"runbook_url: {json.dumps(url)}\n")
    res = run("generate", "--config", str(cfg), "--out", str(tmp_path / "out"))
    assert res.exit_code == 2, res.stderr[-2000:]
    (line,) = res.stderr.splitlines()
    assert f"{cfg}: runbook_url: " in line and says in line, line


@pytest.mark.parametrize("command", ["runbook", "generate", "diagnose", "webhook"])
def test_every_command_that_loads_a_bad_runbook_url_refuses_it(tmp_path, command):
    cfg = tmp_path / "site.yaml"
    cfg.write_text('runbook_url: "https://rb.example/{id}/{other}"\n')
    prom = ["--prometheus-url", "http://127.0.0.1:9"]
    args = {
        "runbook": ["runbook", "kv-cache-pressure"],
        "generate": ["generate", "--out", str(tmp_path / "out")],
        "diagnose": ["diagnose", *prom],
        # Before, the webhook started, answered every alert 200 and wrote no record.
        "webhook": ["webhook", "--listen", f"127.0.0.1:{free_port()}", *prom],
    }[command]
    proc = cli(*args, "--config", str(cfg), timeout=30)
    proc_one_line(proc, f"{cfg}: runbook_url: {{other}} is not a field it can hold")


def test_a_good_runbook_url_fills_in_the_id_with_braces_of_its_own(tmp_path):
    from diagnoser.site.config import load_config

    cfg = tmp_path / "site.yaml"
    cfg.write_text('runbook_url: "https://rb.example/{{team}}/{id}.html"\n')
    assert load_config(cfg).runbook_for("x") == "https://rb.example/{team}/x.html"


# --- links in reports and chat --------------------------------------------------------------


def test_the_html_report_links_a_runbook_only_over_http():
    from diagnoser.report.html import runbook_link

    assert runbook_link("https://rb.example/x") and runbook_link("HTTP://rb.example/x")
    for url in ("javascript:alert(1)", " javascript:alert(1)", "java\tscript:alert(1)"):
        assert not runbook_link(url), url


def _record(**extra: object) -> dict:
    record = {
        "alert": "VllmKvCachePressure",
        "severity": "warning",
        "summary": EVIL,
        "playbook": "kv-cache-pressure",
        "runbook_url": "https://rb.example/kv-cache-pressure",
        "scope": {"model_name": EVIL},
        "since_seconds": 3600.0,
        "playbook_rank": None,
        "diagnosis": {"findings": []},
        "error": f"the server said: {EVIL}",
    }
    record.update(extra)
    return record


def test_the_chat_message_cannot_mention_link_or_embed_from_an_alert(site):
    from diagnoser.report.chat import message

    text = message(_record(), None, site)
    harmless(text)
    assert "&lt;img" in text  # shown, as text
    assert "<https://rb.example/kv-cache-pressure|kv-cache-pressure>" in text  # ours stays


def test_a_runbook_url_an_alert_brings_is_a_link_only_over_http(site):
    from diagnoser.report.chat import message

    text = message(_record(runbook_url="javascript:alert(1)"), None, site)
    assert "<javascript:" not in text and "|kv-cache-pressure>" not in text
    assert "javascript:alert(1)" in text  # said, not linked


def _answer_with_model(name: str) -> bytes:
    labels = {"model_name": name, "instance": "i:8000", "job": "vllm"}
    values = [[1700000000 - 15 * i, "1"] for i in range(480)]
    series = {"metric": labels, "values": values}
    return json.dumps(
        {"status": "success", "data": {"resultType": "matrix", "result": [series]}}
    ).encode()


def test_the_markdown_report_shows_a_label_value_as_text_only():
    body = _answer_with_model(EVIL)
    res = diagnose_answered(body, "--until", "1700000000", "--format", "markdown")
    assert res.exit_code == 0, res.stderr[-2000:]
    assert "model_name=" in res.stdout
    harmless(res.stdout)
    assert "&lt;img src=x onerror=alert(1)&gt;" in res.stdout


def test_defang_keeps_what_the_reader_sees():
    from diagnoser.plumbing.printable import JOINER, defang

    shown = defang(EVIL)
    harmless(shown, html=False)  # raw HTML is each format's own escaping
    assert shown.replace(JOINER, "") == EVIL
    assert defang("llama-3.1-8b-instruct") == "llama-3.1-8b-instruct"
