"""servediag in a notebook: the Python API, the diagnosis as pandas tables and as CSV, and
the worked postmortem (examples/postmortem.py) run headless against a real Prometheus."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import diagnoser
from diagnoser.diagnosis.rows import NUMBER_COLUMNS, SERIES_COLUMNS, finding_columns
from diagnoser.plumbing.source import SourceError
from diagnoser.report.csv import to_csv
from lab.promserver import free_port
from lab.replay import Replay

ROOT = Path(__file__).resolve().parent.parent
ANSWERS = ROOT / "tests" / "data" / "answers"
END = 1793534400.0  # the recordings' end (tests/test_replay.py)


@pytest.fixture(scope="module")
def launch():
    """The retrieval launch, diagnosed from its recorded answers through the API."""
    return diagnoser.diagnose(Replay(ANSWERS / "retrieval-launch.json.gz"), since="1h", until=END)


@pytest.fixture(scope="module")
def quiet():
    return diagnoser.diagnose(Replay(ANSWERS / "healthy-steady.json.gz"), since="1h", until=END)


def test_the_api_gives_the_diagnosis_the_command_line_gives(launch):
    want = json.loads((ANSWERS / "retrieval-launch.expected.json").read_text())
    got = launch.to_json()
    got.pop("stats")
    assert got == want
    assert launch.findings[0].playbook.id == "prompt-length-shift"


def test_the_api_takes_times_as_text_numbers_or_datetimes(launch):
    from datetime import datetime, timezone

    source = Replay(ANSWERS / "retrieval-launch.json.gz")
    for until in ("2026-11-01T12:00:00Z", END, int(END), datetime.fromtimestamp(END, timezone.utc)):
        d = diagnoser.diagnose(source, since=3600, until=until)
        assert d.window.end == END and [m.playbook.id for m in d.findings] == [
            m.playbook.id for m in launch.findings
        ]


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"since": "an hour"}, "since: 'an hour' is not a duration"),
        ({"since": "99999999999d"}, "since: '99999999999d' is longer than 3650 days"),
        ({"until": "yesterday"}, "until: "),
        ({"lookback": "-1h"}, "lookback: "),
        ({"match": ['job="x"} or up{']}, "is not a label matcher"),
        ({"timeout": float("nan")}, "timeout: nan"),
    ],
)
def test_bad_arguments_raise_one_value_error_naming_the_argument(kwargs, says):
    with pytest.raises(ValueError, match=None) as info:
        diagnoser.diagnose(Replay(ANSWERS / "healthy-steady.json.gz"), **kwargs)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_a_dead_url_raises_the_sources_one_error():
    url = f"http://user:s3cret@127.0.0.1:{free_port()}"
    with pytest.raises(SourceError) as info:
        diagnoser.diagnose(url, timeout=2)
    text = str(info.value)
    assert "connection refused" in text and "s3cret" not in text and "\n" not in text
    with pytest.raises(ValueError, match="is not an http"):
        diagnoser.diagnose("ftp://prometheus:9090")
    with pytest.raises(ValueError, match="Port out of range") as info:
        diagnoser.diagnose("http://u:s3cret@prometheus:99999")
    assert "s3cret" not in str(info.value)


def test_the_series_frame_is_long_and_names_the_evidence(launch):
    frame = launch.to_frame()
    assert list(frame.columns) == ["model_name", *SERIES_COLUMNS]
    assert str(frame["time"].dt.tz) == "UTC"
    assert set(frame["period"]) == {"window", "baseline"}
    first = launch.findings[0]
    cited = {r.condition.signal for r in first.shown()}
    rows = frame[frame["evidence_for"].str.split(",").apply(lambda ids: first.playbook.id in ids)]
    assert set(rows["signal"]) == cited
    # Every point of a series the diagnosis read, once.
    data = launch.data_for(first)
    ttft = data.series["ttft_p95"]
    mine = rows[(rows["signal"] == "ttft_p95") & (rows["model_name"] == first.scope["model_name"])]
    assert len(mine) == len(ttft.t) and mine["value"].tolist() == ttft.v.tolist()
    assert set(mine["unit"]) == {"s"}


def test_the_findings_frame_carries_the_numbers_the_report_prints(launch):
    frame = launch.findings_frame()
    first = frame[frame["rank"] == 1]
    assert set(first["id"]) == {"prompt-length-shift"}
    row = first[first["signal"] == "prompt_tokens_p50"].iloc[0]
    assert row["holds"] and row["ratio"] > 1.5 and row["now"] > row["baseline"]
    assert row["evidence"] == launch.evidence_text(
        next(r for r in launch.findings[0].shown() if r.condition.signal == "prompt_tokens_p50")
    )
    assert str(frame["onset"].dt.tz) == "UTC"


def test_every_number_a_verdict_reports_has_a_column():
    """The recorded diagnoses' evidence names no number the table would drop."""
    seen: set[str] = set()
    for path in ANSWERS.glob("*.expected.json"):
        doc = json.loads(path.read_text())
        for f in doc["findings"]:
            for e in f["evidence"]:
                seen |= set(e) - {"signal", "over", "condition", "group", "holds"}
    assert seen and seen <= set(NUMBER_COLUMNS), seen - set(NUMBER_COLUMNS)


def test_no_finding_and_no_data_give_empty_frames_with_the_columns(quiet):
    assert not quiet.findings
    empty = quiet.findings_frame()
    assert empty.empty and list(empty.columns) == finding_columns(quiet)
    nothing = diagnoser.diagnose(Replay(ANSWERS / "healthy-steady.json.gz"), until=END)
    nothing.data.clear()
    frame = nothing.to_frame()
    assert frame.empty and list(frame.columns) == ["model_name", *SERIES_COLUMNS]


def test_csv_is_the_findings_table_and_defuses_formulas(launch, quiet):
    read = list(csv.DictReader(io.StringIO(to_csv(launch))))
    assert read and read[0]["id"] == "prompt-length-shift" and read[0]["rank"] == "1"
    assert len(read) == len(launch.findings_frame())
    header = to_csv(quiet).splitlines()
    assert header == [",".join(finding_columns(quiet))]
    mine = diagnoser.diagnose(Replay(ANSWERS / "retrieval-launch.json.gz"), until=END)
    m = mine.findings[0]
    m.scope = {**m.scope, "model_name": '=HYPERLINK("http://x")'}
    cell = next(iter(csv.DictReader(io.StringIO(to_csv(mine)))))["model_name"]
    assert cell == '\'=HYPERLINK("http://x")'


def test_importing_diagnoser_and_diagnose_help_leave_pandas_out():
    code = (
        "import sys, diagnoser, diagnoser.cli; from click.testing import CliRunner; "
        "r = CliRunner().invoke(diagnoser.cli.main, ['diagnose', '--help']); "
        "assert r.exit_code == 0, r.output; print('pandas' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_diagnose_without_pandas_leaves_it_out(prometheus_for, scenario_library):
    prom = prometheus_for("healthy-steady")
    code = (
        "import sys; from diagnoser.cli import main; "
        f"main(['diagnose', '--prometheus-url', '{prom.url}', '--until', "
        f"'{scenario_library['healthy-steady'].end}', '--format', 'csv'], standalone_mode=False); "
        "print('pandas' in sys.modules, file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr.strip().splitlines()[-1] == "False"
    assert out.stdout.startswith("rank,id,title,")


def test_the_postmortem_notebook_runs_against_the_demo_in_a_real_prometheus(
    prometheus_for, scenario_library, tmp_path
):
    """examples/postmortem.py, every cell, headless, as a script (a failing cell fails it)."""
    prom = prometheus_for("retrieval-launch")
    env = {
        **os.environ,
        "PROMETHEUS_URL": prom.url,
        "POSTMORTEM_UNTIL": str(scenario_library["retrieval-launch"].end),
        "MPLBACKEND": "Agg",
    }
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "postmortem.py")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "prompt-length-shift" in out.stdout
    print(f"the notebook ran in {time.monotonic() - started:.1f} s")
    # The KV budget from Python: the plan, and each live engine read at the incident's end.
    end = scenario_library["retrieval-launch"].end
    plan, live = diagnoser.kv_budget("llama-3.1-8b", source=prom.url, at=end, max_model_len=8192)
    assert plan is not None and plan.max_model_len == 8192
    assert live is not None and live.engines and live.at == end
    assert all(e.num_gpu_blocks and e.block_size for e in live.engines)


def test_kv_budget_from_python_plans_without_a_source_and_names_bad_input():
    plan, live = diagnoser.kv_budget("llama-3.1-8b", max_model_len=8192, users=4)
    assert live is None and plan is not None and plan.users == 4
    with pytest.raises(ValueError, match="give a model"):
        diagnoser.kv_budget()
    with pytest.raises(diagnoser.UserError):
        diagnoser.kv_budget("no-such-model")
    with pytest.raises(SourceError, match="connection refused"):
        diagnoser.kv_budget(source=f"http://127.0.0.1:{free_port()}", timeout=2)


# --- a PrometheusConnect the user configured, on loopback servers ---------------------------

EMPTY = {"status": "success", "data": {"resultType": "matrix", "result": []}}


def _connect(url: str, **kw):
    from prometheus_api_client import PrometheusConnect

    return PrometheusConnect(url=url, **kw)


def _source(pc, timeout: float = 5.0):
    return diagnoser.connect(pc, timeout=timeout).operation()


def test_its_headers_auth_and_session_go_with_every_query():
    from loopback import answer, serve

    with serve(lambda h, f: answer(h, EMPTY)) as srv:
        pc = _connect(srv.url, headers={"X-Scope-OrgID": "team-a"}, auth=("alice", "pw123456"))
        pc._session.headers["X-From-Session"] = "yes"
        _source(pc).query_range("up", END - 600, END, 60)
    sent = srv.seen[0].headers
    assert sent["X-Scope-OrgID"] == "team-a" and sent["X-From-Session"] == "yes"
    assert sent["Authorization"].startswith("Basic ")
    assert srv.seen[0].path.startswith("/api/v1/query_range?query=up&")


def test_a_partial_answer_keeps_its_warnings():
    from loopback import answer, serve

    partial = {**EMPTY, "warnings": ["store gateway unreachable: partial response"]}
    with serve(lambda h, f: answer(h, partial)) as srv:
        src = _source(_connect(srv.url))
        src.query_range("up", END - 600, END, 60)
    assert src.warnings == ["store gateway unreachable: partial response"]


def test_an_error_is_one_line_without_the_credentials_it_echoes():
    from loopback import answer, serve

    def echo(h, f):
        said = h.headers.get("Authorization", "")
        answer(h, {"status": "error", "errorType": "bad_data", "error": f"rejected {said}"}, 400)

    with serve(echo) as srv:
        pc = _connect(srv.url, headers={"Authorization": "Bearer tok-9876543210"})
        with pytest.raises(SourceError) as info:
            _source(pc).query_range("up", END - 600, END, 60)
    text = str(info.value)
    assert "HTTP 400" in text and "tok-9876543210" not in text and "\n" not in text


def test_a_long_query_goes_as_a_post_form_and_an_encoded_echo_is_blanked_out():
    """As the command line's client: a query too long for a URL is a POST form, and a
    credential the server echoes URL-encoded is not shown."""
    from urllib.parse import parse_qs, quote

    from loopback import answer, serve

    def echo(h, f):
        said = quote(h.headers.get("Authorization", ""), safe="")
        answer(h, {"status": "error", "errorType": "bad_data", "error": f"rejected {said}"}, 400)

    expr = "up{" + ",".join(f'l{i}="{"v" * 40}"' for i in range(200)) + "}"
    with serve(echo) as srv:
        pc = _connect(srv.url, headers={"Authorization": "Bearer tok/98765+43210"})
        with pytest.raises(SourceError) as info:
            _source(pc).query_range(expr, END - 600, END, 60)
    seen = srv.seen[0]
    assert seen.method == "POST" and seen.path == "/api/v1/query_range"
    assert parse_qs(seen.body.decode())["query"] == [expr]
    text = str(info.value)
    assert "HTTP 400" in text and "98765" not in text, text


def test_retry_after_is_not_slept_past_the_deadline():
    """The library's own adapter would retry three times and sleep each Retry-After."""
    from loopback import answer, serve

    with serve(lambda h, f: answer(h, b"busy", 503, {"Retry-After": "30"})) as srv:
        started = time.monotonic()
        with pytest.raises(SourceError) as info:
            _source(_connect(srv.url), timeout=2).query_range("up", END - 600, END, 60)
    assert time.monotonic() - started < 10
    assert "503" in str(info.value) and "retry after 30" in str(info.value)
    assert len(srv.seen) == 1


def test_an_answer_past_the_size_limit_stops_there():
    from loopback import serve

    def huge(h, f):
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.end_headers()
        with contextlib.suppress(OSError):
            for _ in range(64):
                h.wfile.write(b" " * (1 << 20))

    with serve(huge) as srv:
        src = diagnoser.connect(_connect(srv.url), timeout=10, max_response_mb=2).operation()
        with pytest.raises(SourceError, match="more than 2 MiB"):
            src.query_range("up", END - 600, END, 60)


def test_a_redirect_elsewhere_goes_without_the_credentials():
    from loopback import answer, serve

    with serve(lambda h, f: answer(h, EMPTY)) as other:

        def away(h, f):
            h.send_response(302)
            h.send_header("Location", other.url.replace("127.0.0.1", "localhost") + h.path)
            h.end_headers()

        with serve(away) as srv:
            pc = _connect(srv.url, headers={"Authorization": "Bearer tok-9876543210"})
            _source(pc).query_range("up", END - 600, END, 60)
    assert "Authorization" in srv.seen[0].headers
    assert "Authorization" not in other.seen[0].headers


def test_a_dead_prometheusconnect_gives_the_clis_error():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(SourceError) as info:
        diagnoser.diagnose(_connect(url), timeout=3)
    assert str(info.value) == f"cannot reach {url}: connection refused"
    from prometheus_api_client import PrometheusConnect

    class SiteConnect(PrometheusConnect):  # a site's own wrapper is still one
        pass

    with pytest.raises(SourceError, match="connection refused"):
        diagnoser.diagnose(SiteConnect(url=url), timeout=3)


def test_importing_diagnoser_imports_nothing_else_until_a_name_is_used():
    code = (
        "import sys; before = set(sys.modules); import diagnoser; "
        "print(sorted(set(sys.modules) - before)); diagnoser.diagnose; "
        "print('diagnoser.api' in sys.modules, 'pandas' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    first, second = out.stdout.splitlines()
    assert first == "['__future__', 'diagnoser']" and second == "True False"


def test_a_group_label_named_like_a_column_shadows_none(tmp_path):
    """A site's group labels named like every column of the tables (and ``label_class``, the
    name ``class`` would take): each is its own ``label_`` column in both frames and the CSV,
    with the scope's value, and every column keeps its own."""
    from loopback import fleet, serve

    from diagnoser.diagnosis.rows import FINDING_HEAD, FINDING_TAIL

    fixed = {*SERIES_COLUMNS, *FINDING_HEAD, *FINDING_TAIL}
    names = [*sorted(fixed), "label_class"]
    config = tmp_path / "site.yaml"
    config.write_text(f"group_labels: [{', '.join(names)}]\n")
    column = {n: f"label_{n}" for n in fixed} | {"label_class": "label_class"}
    column["class"] = "label_label_class"
    values = {n: f"v-{n}" for n in names}
    with serve(fleet(1, labels=values)) as api:
        d = diagnoser.diagnose(api.url, since="1h", until=END, config=str(config), lookback=0)
    assert d.findings
    series, findings, table = d.to_frame(), d.findings_frame(), to_csv(d)
    header = table.splitlines()[0].split(",")
    rows = list(csv.DictReader(io.StringIO(table)))
    for frame, what in ((series, "series"), (findings, "findings"), (header, "csv")):
        cols = list(getattr(frame, "columns", frame))
        assert len(cols) == len(set(cols)), what
        assert {column[n] for n in names} <= set(cols), what
    for n in names:  # (a target's own series, read without the model's scope, have none)
        assert set(series[column[n]]) == {values[n], ""}, n
        assert set(findings[column[n]]) == {r[column[n]] for r in rows} == {values[n]}, n
    # The tables' own columns hold their own values.
    assert set(series["period"]) <= {"window", "baseline", "before"}
    assert not {"v-class", "v-time", "v-signal"} & {*series["class"], *series["signal"]}
    assert set(findings["group"]) == {r["group"] for r in rows} <= {"all", "any", "supporting"}
    assert list(findings["id"]) == [r["id"] for r in rows]
