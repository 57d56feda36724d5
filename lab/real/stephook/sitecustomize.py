"""Loaded by a traced lab server's Python processes (its directory is their ``PYTHONPATH``):
once vLLM V1's scheduler module is imported, every engine step is written as one JSON line
to ``$SERVEDIAG_STEP_TRACE.<pid>``.

A line: ``t0`` and ``t1`` (when the step was scheduled and when its output was taken in,
Unix seconds), ``reqs`` (per request scheduled: its id's tail, the tokens scheduled, its
tokens computed once the step has run, prompt tokens, output tokens before the step: a decode
has computed = prompt + output), the requests it scheduled ``new`` and
``resumed``, those it ``preempted``, and after scheduling the requests ``running`` and
``waiting`` and the KV cache's ``kv`` usage (0-1).

This file runs inside vLLM's processes, never in servediag's: it uses only the standard
library and vLLM's own objects, and does nothing unless ``SERVEDIAG_STEP_TRACE`` is set.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys
import time
from typing import Any

TARGET = "vllm.v1.core.sched.scheduler"


def _patch(module: Any, path: str) -> None:
    cls = module.Scheduler
    try:
        out = open(f"{path}.{os.getpid()}", "a", buffering=1)  # noqa: SIM115 (the process's life)
    except OSError as exc:  # the server runs on, untraced
        print(f"servediag step trace: not traced: {exc}", file=sys.stderr)
        return
    schedule, update = cls.schedule, cls.update_from_output

    def traced_schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.time()
        so = schedule(self, *args, **kwargs)
        reqs = []
        for rid, n in so.num_scheduled_tokens.items():
            r = self.requests.get(rid)
            if r is not None:
                reqs.append(
                    [rid[-8:], n, r.num_computed_tokens, r.num_prompt_tokens, r.num_output_tokens]
                )
        self._servediag_step = {
            "t0": t0,
            "reqs": reqs,
            "new": len(so.scheduled_new_reqs),
            "resumed": len(getattr(so.scheduled_cached_reqs, "resumed_req_ids", ()) or ()),
            "preempted": len(getattr(so, "preempted_req_ids", None) or ()),
            "running": len(self.running),
            "waiting": len(self.waiting),
            "kv": round(float(self.kv_cache_manager.usage), 4),
        }
        return so

    def traced_update(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = update(self, *args, **kwargs)
        step = getattr(self, "_servediag_step", None)
        if step is not None:
            step["t1"] = time.time()
            out.write(json.dumps(step) + "\n")
            self._servediag_step = None
        return result

    cls.schedule, cls.update_from_output = traced_schedule, traced_update


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the scheduler module as Python would, and patches it once it has run."""

    def __init__(self, path: str):
        self.path = path

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module
        trace = self.path

        def exec_module(module: Any) -> None:
            run(module)
            _patch(module, trace)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if os.environ.get("SERVEDIAG_STEP_TRACE"):
    sys.meta_path.insert(0, _Finder(os.environ["SERVEDIAG_STEP_TRACE"]))
