#!/usr/bin/env python3
"""A Prometheus API on loopback that answers every query at once with a fleet of models or
with answers of a given size, to measure ``diagnose`` at scale (tests/test_scale.py holds the
same properties to bounds in seconds).

    .venv/bin/python scripts/fleet-prometheus.py --models 2000 --sick --port 19090
    .venv/bin/python scripts/fleet-prometheus.py --answer-mb 60 --port 19090
    /usr/bin/time -f '%e s, %M KB' .venv/bin/python -m diagnoser diagnose \\
        --prometheus-url http://127.0.0.1:19090 --until 1800000000 --timeout 600

--models N: one series per model (each served by one target) at every step of each query's
range; with --sick every other model's values jump fivefold halfway through, so that every
model is unhealthy and diagnosed at length (its lookback too).
--answer-mb M: every answer a valid matrix of about M MB, of series with no model_name (a
diagnosis drops them once read, so what is measured is the answers in flight).
"""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

MAX_LINE = 1 << 20


def fleet(models: int, sick: bool, start: float, end: float, step: float) -> bytes:
    times = [start + k * step for k in range(int((end - start) // step) + 1)]
    mid = times[len(times) // 2]
    result = []
    for i in range(models):
        labels = {
            "model_name": f"model-{i:05d}",
            "job": "vllm",
            "instance": f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:8000",
        }
        values = [[t, "5" if sick and i % 2 and t >= mid else "1"] for t in times]
        result.append({"metric": labels, "values": values})
    doc = {"status": "success", "data": {"resultType": "matrix", "result": result}}
    return json.dumps(doc, separators=(",", ":")).encode()


def sized(megabytes: float) -> bytes:
    """A matrix of about ``megabytes`` MB: series of 481 points (two hours at 15 s)."""
    start = 1_799_992_800
    one = {
        "metric": {"__name__": "vllm:num_requests_running", "pod": "pod-000000"},
        "values": [[start + 15 * k, f"{k % 97 / 7:.6g}"] for k in range(481)],
    }
    each = len(json.dumps(one, separators=(",", ":")))
    result = []
    for i in range(max(1, int(megabytes * 1e6 / each))):
        metric = {"__name__": "vllm:num_requests_running", "pod": f"pod-{i:06d}"}
        result.append({"metric": metric, "values": one["values"]})
    doc = {"status": "success", "data": {"resultType": "matrix", "result": result}}
    return json.dumps(doc, separators=(",", ":")).encode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=19090)
    ap.add_argument("--models", type=int, default=0)
    ap.add_argument("--sick", action="store_true")
    ap.add_argument("--answer-mb", type=float, default=0.0)
    args = ap.parse_args()
    made: dict[tuple[str, str, str], bytes] = {}
    lock = threading.Lock()
    fixed = sized(args.answer_mb) if args.answer_mb else None

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def handle_one_request(self) -> None:
            """As http.server's, with request lines of up to 1 MiB, as Prometheus takes them
            (Go's MaxHeaderBytes), where http.server refuses more than 64 KiB."""
            self.raw_requestline = self.rfile.readline(MAX_LINE + 1)
            if len(self.raw_requestline) > MAX_LINE:
                self.send_error(414)
                return
            if not self.raw_requestline or not self.parse_request():
                self.close_connection = True
                return
            method = getattr(self, f"do_{self.command}", None)
            if method is None:
                self.send_error(501)
                return
            method()
            self.wfile.flush()

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            form = parts.query
            if self.command == "POST":  # a long query (servediag sends it as a form)
                form = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
            q = {k: v[0] for k, v in parse_qs(form).items()}
            key = (q.get("start", ""), q.get("end", q.get("time", "")), q.get("step", "15s"))
            if fixed is not None:
                data = fixed
            else:
                with lock:
                    if key not in made:
                        end = float(key[1])
                        start = float(key[0]) if key[0] else end
                        step = float(key[2].rstrip("s"))
                        made[key] = fleet(args.models, args.sick, start, end, step)
                    data = made[key]
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_POST = do_GET

        def log_message(self, format: str, *a: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(f"http://127.0.0.1:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
