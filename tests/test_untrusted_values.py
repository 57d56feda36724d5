"""Values from outside, in a real Prometheus: scope options that try to widen or break the
query select nothing more than their literal value; label values that hold terminal escapes,
line breaks and odd numbers are printed inert and never crash a report; a window of a year
still finds the data at its end; a window that ends in the future says so."""

from __future__ import annotations

import json

import pytest
from clitest import run
from loopback import answer, serve

from diagnoser.metrics.exposition import write_openmetrics
from diagnoser.sim.run import simulate
from diagnoser.sim.scenario import load_scenario
from lab.promserver import Prometheus, backfill

END = 1_800_000_000.0
EVIL = "evil\x1b]0;pwned\x07\nFORGED LINE"

SCENARIO = """\
description: Two small models, one with a name no exporter should give but any label can hold.
duration: 2h
scrape_interval: 15s
seed: 7
labels: {window: 1h, expect: [], absent: []}
models:
  - name: plain-model
    preset: llama-3.1-8b
    workload:
      rate: {mean: 2}
      prompt: {median: 400, sigma: 0.4}
      output: {median: 100, sigma: 0.4}
  - name: "evil\\e]0;pwned\\a\\nFORGED LINE"
    preset: llama-3.1-8b
    workload:
      rate: {mean: 2}
      prompt: {median: 400, sigma: 0.4}
      output: {median: 100, sigma: 0.4}
"""

# A cache-config series no vLLM writes, but a broken or hostile exporter could.
ODD_CACHE_INFO = """\
# TYPE vllm:cache_config_info gauge
{series}
# EOF
"""


def _odd_series() -> str:
    labels = [
        'block_size="-100000",num_gpu_blocks="1' + "0" * 5000 + '"',
        'block_size="abc",num_gpu_blocks="nan",kv_cache_size_tokens="-1"',
        'block_size="0",num_gpu_blocks="1e308",cache_dtype="\x1b[2J"',
    ]
    out = []
    for i, extra in enumerate(labels):
        for t in range(int(END) - 600, int(END) + 1, 15):
            out.append(
                f'vllm:cache_config_info{{job="odd",instance="odd-{i}:8000",engine="0",{extra}}}'
                f" 1 {t}"
            )
    return "\n".join(out)


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    work = tmp_path_factory.mktemp("untrusted")
    path = work / "untrusted.yaml"
    path.write_text(SCENARIO)
    om = work / "untrusted.om"
    with om.open("w", encoding="utf-8") as fh:
        write_openmetrics(simulate(load_scenario(path), END), fh)
    odd = work / "odd.om"
    odd.write_text(ODD_CACHE_INFO.format(series=_odd_series()))
    data = work / "tsdb"
    backfill(om, data)
    backfill(odd, data)
    with Prometheus(data) as server:
        yield server


def diagnose_json(prom, *args: str, since: str = "1h") -> dict:
    res = run(
        "diagnose",
        "--prometheus-url",
        prom.url,
        "--until",
        str(END),
        "--since",
        since,
        "--format",
        "json",
        *args,
    )
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def models(doc: dict) -> list[str]:
    return sorted(s["model_name"] for s in doc["scopes"])


# --- scope options select, never widen or break ---------------------------------------------


@pytest.mark.prometheus
def test_the_scope_options_select_their_literal_value(prom):
    assert models(diagnose_json(prom)) == sorted(["plain-model", EVIL])
    assert models(diagnose_json(prom, "--model", "plain-model")) == ["plain-model"]
    assert models(diagnose_json(prom, "--model", EVIL)) == [EVIL]
    assert models(diagnose_json(prom, "--instance", "plain-model-0:8000")) == ["plain-model"]
    assert models(diagnose_json(prom, "--job", "vllm", "--model", "plain-model")) == ["plain-model"]


@pytest.mark.prometheus
@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--model", 'x"} or vector(1) or {a="'),
        ("--model", 'plain-model",model_name=~".*'),
        ("--model", "plain-model\\"),
        ("--model", "plain.*"),
        ("--instance", 'x", instance=~".+'),
        ("--job", 'vllm"} or up{job="vllm'),
    ],
)
def test_a_value_that_would_widen_or_break_the_query_selects_nothing(prom, option, value):
    doc = diagnose_json(prom, option, value)
    assert doc["scopes"] == [] and doc["findings"] == []


# --- label values are printed inert ---------------------------------------------------------


@pytest.mark.prometheus
@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_terminal_escapes_in_label_values_are_printed_as_escapes(prom, fmt):
    res = run("diagnose", "--prometheus-url", prom.url, "--until", str(END), "--format", fmt)
    assert res.exit_code == 0, res.output
    for raw in ("\x1b", "\x07", "\nFORGED LINE"):
        assert raw not in res.stdout
    assert "evil\\x1b]0;pwned\\x07\\nFORGED LINE" in res.stdout


@pytest.mark.prometheus
def test_json_keeps_label_values_as_they_are(prom):
    doc = diagnose_json(prom, "--model", EVIL)
    assert doc["scopes"] == [{"model_name": EVIL}]


@pytest.mark.prometheus
def test_html_escapes_label_values(prom, tmp_path):
    out = tmp_path / "r.html"
    res = run(
        "diagnose",
        "--prometheus-url",
        prom.url,
        "--until",
        str(END),
        "--format",
        "html",
        "--output",
        str(out),
    )
    assert res.exit_code == 0, res.output
    page = out.read_text()
    assert "\x1b" not in page and "evil\\x1b]0;pwned\\x07\\nFORGED LINE" in page


@pytest.mark.prometheus
def test_the_live_kv_capacity_prints_odd_labels_inert_and_survives_odd_numbers(prom):
    res = run("kv-budget", "--prometheus-url", prom.url, "--at", str(END))
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.stdout and "\\x1b[2J" in res.stdout
    assert "evil\\x1b]0;pwned\\x07\\nFORGED LINE" in res.stdout
    res = run("kv-budget", "--prometheus-url", prom.url, "--at", str(END), "--format", "json")
    odd = [e for e in json.loads(res.stdout)["live"]["engines"] if e["job"] == "odd"]
    assert len(odd) == 3
    assert all(e["block_size"] is None and e["capacity_tokens"] is None for e in odd), odd
    assert all(e["num_gpu_blocks"] is None for e in odd), odd


# --- windows --------------------------------------------------------------------------------


@pytest.mark.prometheus
def test_a_year_long_window_still_finds_the_data_at_its_end(prom):
    doc = diagnose_json(prom, since="365d")
    assert models(doc) == sorted(["plain-model", EVIL])
    assert {h["verdict"] for h in doc["health"]} <= {"healthy", "unknown"}
    assert all(h["request_rate"] for h in doc["health"])
    assert doc["window"]["step_seconds"] * 11000 > 2 * 365 * 86400  # under Prometheus's cap


def test_a_window_ending_in_the_future_gets_a_note():
    from lab.promserver import free_port

    url = f"http://127.0.0.1:{free_port()}"
    res = run("diagnose", "--prometheus-url", url, "--until", "2999-01-01T00:00:00Z")
    assert res.exit_code == 3  # nothing listens there: the note came before the query
    note, error = res.stderr.splitlines()
    assert note.startswith("servediag: note: --until 2999-01-01T00:00:00Z is ")
    assert "in the future" in note and "connection refused" in error
    res = run("diagnose", "--prometheus-url", url, "--until", "2024-01-01T00:00:00Z")
    assert "note" not in res.stderr


# --- every path to the terminal -------------------------------------------------------------


def test_printable_writes_every_control_and_direction_character_as_an_escape():
    from diagnoser.plumbing.printable import printable

    assert printable("a\x1b]0;t\x07b\nc\td\r\x00\x9b\u202e\u2028") == (
        "a\\x1b]0;t\\x07b\\nc\\td\\r\\x00\\x9b\\u202e\\u2028"
    )
    assert printable("llama-3.1-8b é 模型") == "llama-3.1-8b é 模型"


def test_inert_keeps_the_layout_and_only_the_reports_own_colours():
    from diagnoser.plumbing.printable import inert

    text = "\x1b[31;1mUNHEALTHY\x1b[0m\tm\x1b]0;x\x07\n\x1b[2J next"
    assert inert(text) == "\\x1b[31;1mUNHEALTHY\\x1b[0m\tm\\x1b]0;x\\x07\n\\x1b[2J next"
    assert inert(text, sgr=True) == "\x1b[31;1mUNHEALTHY\x1b[0m\tm\\x1b]0;x\\x07\n\\x1b[2J next"


def test_the_chat_message_prints_an_alerts_values_inert(site):
    from diagnoser.report.chat import message

    record = {
        "alert": "VllmKvCachePressure\x1b]0;pwned\x07",
        "severity": "warning",
        "summary": "full\nFORGED: line",
        "playbook": "kv-cache-pressure",
        "runbook_url": "https://rb/kv\x1b[2J",
        "scope": {"model_name": EVIL},
        "since_seconds": 3600.0,
        "playbook_rank": None,
        "diagnosis": {"findings": []},
        "error": "boom\x1b[2J",
    }
    text = message(record, None, site)
    assert "\x1b" not in text and "\x07" not in text
    assert "\nFORGED" not in text and "full\\nFORGED: line" in text
    assert "evil\\x1b]0;pwned\\x07\\nFORGED LINE" in text


def test_an_error_quoting_what_a_server_said_is_one_inert_line(tmp_path):
    body = b"upstream says no\x1b]0;pwned\x07\nFORGED: line"  # not even JSON
    text = {"Content-Type": "text/plain"}
    with serve(lambda h, f: answer(h, body, 400, text)) as server:
        res = run("diagnose", "--prometheus-url", server.url, "--until", "1700000000")
    assert res.exit_code == 3
    assert len(res.stderr.splitlines()) == 1, res.stderr
    assert "\x1b" not in res.stderr and "\x07" not in res.stderr


@pytest.mark.prometheus
def test_explain_prints_label_values_inert(prom):
    res = run(
        "diagnose",
        "--prometheus-url",
        prom.url,
        "--until",
        str(END),
        "--explain",
        "kv-cache-pressure",
    )
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.stdout and "evil\\x1b]0;pwned\\x07\\nFORGED LINE" in res.stdout


def test_a_scope_value_is_quoted_by_the_one_promql_helper():
    from diagnoser.request import Scope
    from diagnoser.site.slo import Matcher

    scope = Scope(model='x"} or vector(1) or {a="', instance="i\\", job="j\nk")
    assert scope.matchers() == (
        'model_name="x\\"} or vector(1) or {a=\\""',
        'instance="i\\\\"',
        'job="j\\nk"',
    )
    assert str(Matcher("model_name", "=", 'a"b')) == 'model_name="a\\"b"'


def test_a_pipe_in_a_value_stays_inside_its_markdown_table_cell():
    from diagnoser.report.markdown import cell

    row = f"| {cell('model_name=a|b')} | ok |"
    # Markdown splits a row at every unescaped pipe: two cells, as the table has.
    assert len([c for c in row.replace("\\|", "").split("|")[1:-1]]) == 2
    assert "a\\|b" in row


def test_the_chat_message_cannot_mention_a_channel_or_forge_a_link(site):
    from diagnoser.report.chat import message

    record = {
        "alert": "VllmKvCachePressure",
        "severity": "warning",
        "summary": "<!channel> see <https://evil.example|the runbook> & more",
        "playbook": "kv-cache-pressure",
        "runbook_url": "https://rb/kv?a=1|b>",
        "scope": {"model_name": "m<@U123>"},
        "since_seconds": 3600.0,
        "playbook_rank": None,
        "diagnosis": {"findings": []},
        "error": None,
    }
    text = message(record, None, site)
    assert "<!channel>" not in text and "<https://evil" not in text and "<@U123>" not in text
    # The URL is not even a bare link for Mattermost or Rocket.Chat (a word joiner after ":").
    assert "&lt;!channel&gt; see &lt;https:\u2060//evil.example|the runbook&gt; &amp; more" in text
    # The runbook link stays a link, its URL unable to end it early.
    assert "*Runbook:* <https://rb/kv?a=1%7Cb&gt;|kv-cache-pressure>" in text


def test_the_webhooks_log_writes_a_labels_direction_and_control_characters_as_escapes():
    """A real ``servediag webhook`` logs an alert whose label holds a right-to-left override,
    a line break and an escape: each is written as an escape, on the lines that name it."""
    import signal

    from loopback import EMPTY, post_alerts
    from notifications import alert, notification
    from webhooks import start

    model = "m\u202eevil\u2066x\nFORGED LINE\x1b]0;pwned\x07\u061c"
    with serve(lambda h, f: answer(h, EMPTY)) as api:
        proc, url = start(api.url, "--lookback", "0")
        try:
            assert post_alerts(url, notification(alert(model), group="g\u202e"))[0] == 200
            proc.stdout.readline()  # the record: diagnosed and logged
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
    named = [line for line in err.splitlines() if "model_name=" in line]
    assert named and all("m\\u202eevil\\u2066x\\nFORGED LINE\\x1b]0;pwned" in ln for ln in named)
    assert not any(c in err for c in "\u202e\u2066\u061c\x1b\x07"), err
    assert not any(line.startswith("FORGED") for line in err.splitlines())
