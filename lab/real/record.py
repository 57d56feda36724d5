"""What a real run leaves for the tests (``tests/data/real/<incident>/``).

- ``incident.json.gz``, ``baseline.json.gz``: the ``query_range`` answers ``diagnose`` asked
  for over the incident's last phase and over its baseline (``lab.replay``), so the
  default test run diagnoses them again in milliseconds;
- ``raw.om.gz``: every sample Prometheus scraped from the server (and the probe, and the
  host's node-exporter), as
  OpenMetrics, so the answers can be made again for new queries without a server
  (``python -m lab.real rerecord``; samples a scrape failure ended live linger for
  Prometheus's lookback there, since OpenMetrics has no staleness marker);
- ``metrics-idle.txt``, ``metrics-load.txt``: the server's ``/metrics`` before its first
  request and under load;
- ``provenance.json``: vLLM's version, the flags, each phase's load and UTC times, the client's
  outcomes, and what ``diagnose`` said live.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from diagnoser.metrics.exposition import escape, number
from lab.promserver import Prometheus, backfill

DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "real"
RAW_JOBS = ("vllm", "probe", "node")


def fetch_text(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return str(resp.read().decode("utf-8", errors="replace"))


def raw_samples(prom: Prometheus, start: float, end: float) -> list[dict[str, Any]]:
    """Every scraped sample of the lab's jobs in ``[start, end]``, as Prometheus keeps them
    (a range selector read at ``end``: raw timestamps, nothing evaluated)."""
    seconds = int(end - start) + 1
    jobs = "|".join(RAW_JOBS)
    params = {"query": f'{{job=~"{jobs}",__name__!~".*_created"}}[{seconds}s]', "time": f"{end}"}
    url = f"{prom.url}/api/v1/query?{urllib.parse.urlencode(params)}"
    body = json.loads(fetch_text(url, timeout=120))
    return list(body["data"]["result"])


def openmetrics(series: list[dict[str, Any]]) -> str:
    """The samples as OpenMetrics for ``promtool tsdb create-blocks-from openmetrics``: each
    name a family of type unknown (a backfill keeps series, not types)."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for s in series:
        by_name.setdefault(s["metric"]["__name__"], []).append(s)
    out = io.StringIO()
    for name in sorted(by_name):
        out.write(f"# TYPE {name} unknown\n")
        for s in sorted(by_name[name], key=lambda s: sorted(s["metric"].items())):
            labels = sorted((k, v) for k, v in s["metric"].items() if k != "__name__")
            body = ",".join(f'{k}="{escape(v)}"' for k, v in labels)
            head = f"{name}{{{body}}}" if body else name
            for t, v in s["values"]:
                out.write(f"{head} {number(float(v))} {float(t):.3f}\n")
    out.write("# EOF\n")
    return out.getvalue()


def write(directory: Path, files: dict[str, str | bytes], provenance: dict[str, Any]) -> None:
    """Write one recording; the directory's earlier files are replaced only once every new
    one is written (a failed run leaves the old recording whole)."""
    directory.mkdir(parents=True, exist_ok=True)
    staged = []
    files = {**files, "provenance.json": json.dumps(provenance, indent=1) + "\n"}
    for name, content in files.items():
        tmp = directory / f".{name}.tmp"
        data = content.encode() if isinstance(content, str) else content
        if name.endswith(".gz") and isinstance(content, str):
            data = gzip.compress(data, mtime=0)
        tmp.write_bytes(data)
        staged.append((tmp, directory / name))
    for tmp, final in staged:
        tmp.replace(final)


@contextlib.contextmanager
def raw_prometheus(
    directory: Path, work: Path, lookback: str | None = None
) -> Iterator[Prometheus]:
    """A Prometheus serving a recording's raw samples (``raw.om.gz``), backfilled into
    ``work``, with ``lookback`` as its query lookback where given; stopped on leaving."""
    om = work / "raw.om"
    om.write_bytes(gzip.decompress((directory / "raw.om.gz").read_bytes()))
    backfill(om, work / "tsdb")
    with Prometheus(work / "tsdb", lookback=lookback or "5m") as prom:
        yield prom
