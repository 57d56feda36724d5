"""The simulator's /metrics against a real vLLM server's, as recorded (``tests/data/real``).

``tests/test_conformance.py`` holds the simulator to vLLM's metric code read from the wheel;
this holds it to what a running server (vLLM's CPU build 0.32, one API-server process)
actually wrote: every family, its type, its label names, its bucket bounds at the server's
``--max-model-len``, the values of its enumerated labels, and which series exist only after
the first request. Each difference is listed below with its reason; a new one fails, and so
does a listed one that no longer holds.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lab.real.replayed import provenance, recorded
from tests.test_conformance import exposition, parsed

RECORDINGS = [d for d in recorded() if (d / "metrics-load.txt").is_file()]

# Families the real server writes and the simulator does not, with why that is right.
REAL_ONLY = {
    r".*_created": "prometheus_client writes a _created gauge beside every counter and "
    "histogram series in the text format; no signal reads one",
    r"process_(max_fds|open_fds|resident_memory_bytes|virtual_memory_bytes)": "prometheus_client's "
    "process collector; the simulator writes the two the signals read (CPU seconds, start time)",
    r"python_(gc_\w+|info)": "prometheus_client's platform and garbage-collector collectors",
}
# (family, label) whose names differ, with why.
LABEL_NAMES = {
    ("vllm:cache_config_info", "simple_cpu_offload_num_blocks"): "a CacheConfig field vLLM 0.33 "
    "added; the simulator's profile is 0.33, the recording 0.32",
}
# (family, label): the values only the simulator writes, with why.
LABEL_VALUES = {
    ("http_requests", "status"): (
        {"4xx"},
        "the simulated workload's longest prompts pass max_model_len and are refused with a "
        "400 (the recorded load's never were): the series of answers that happened, each born "
        "at its first (test_status_series_are_born_at_their_first_answer)",
    ),
}
# The series a real server creates at its first request (per handler, method, status).
BORN_ON_FIRST_REQUEST = {
    "http_request_duration_seconds",
    "http_request_size_bytes",
    "http_requests",
    "http_response_size_bytes",
}
# Which endpoint the traffic used, which adapters it named: the load's, not the server's.
WORKLOAD_LABELS = {"handler", "running_lora_adapters", "waiting_lora_adapters"}
# vLLM's one family with no child until its stats are first logged with LoRA on.
BORN_WITH_LORA = {"vllm:lora_requests_info"}


def _max_model_len(directory: Path) -> int:
    args = provenance(directory)["vllm_args"]
    return int(args[args.index("--max-model-len") + 1])


def _speculative_tokens(directory: Path) -> int:
    """The recorded server's draft tokens a step (0: no --speculative-config)."""
    args = provenance(directory)["vllm_args"]
    if "--speculative-config" not in args:
        return 0
    return int(json.loads(args[args.index("--speculative-config") + 1])["num_speculative_tokens"])


def _max_loras(directory: Path) -> int:
    """The recorded server's --max-loras (0: no --enable-lora; vLLM's default is 1)."""
    args = provenance(directory)["vllm_args"]
    if "--enable-lora" not in args:
        return 0
    return int(args[args.index("--max-loras") + 1]) if "--max-loras" in args else 1


def _values(text: str) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name.endswith(("_created", "cache_config_info")) or fam.name.startswith("python_"):
            continue
        for s in fam.samples:
            for k, v in s.labels.items():
                if k not in ("le", "model_name", "engine", *WORKLOAD_LABELS):
                    out.setdefault((fam.name, k), set()).add(v)
    return out


def _listed(name: str) -> bool:
    return any(re.fullmatch(p, name) for p in REAL_ONLY)


@pytest.fixture(scope="module", params=[d.name for d in RECORDINGS])
def pair(request, tmp_path_factory):
    directory = next(d for d in RECORDINGS if d.name == request.param)
    real = (directory / "metrics-load.txt").read_text()
    sim = exposition(
        tmp_path_factory.mktemp("sim"),
        "0.33",
        1,
        _max_model_len(directory),
        _speculative_tokens(directory),
        _max_loras(directory),
    )
    return real, sim


def test_there_is_a_real_exposition_to_compare_with():
    assert RECORDINGS, "no recording with metrics-load.txt under tests/data/real"


def test_the_same_families_with_the_same_types_labels_and_buckets(pair):
    real, sim = (parsed(t) for t in pair)
    assert sorted(n for n in set(real) - set(sim) if not _listed(n)) == []
    assert sorted(set(sim) - set(real)) == []
    for pattern in REAL_ONLY:
        assert any(re.fullmatch(pattern, n) for n in real), f"{pattern}: no longer differs"
    for name in sorted(set(real) & set(sim)):
        (rtype, rlabels, rbounds), (stype, slabels, sbounds) = real[name], sim[name]
        assert rtype == stype, name
        assert rbounds == sbounds, name
        known = {label for fam, label in LABEL_NAMES if fam == name}
        assert {ls - known for ls in rlabels} == {ls - known for ls in slabels}, name
    for fam, label in LABEL_NAMES:
        assert any(label in ls for ls in sim[fam][1]) != any(label in ls for ls in real[fam][1])


def test_enumerated_label_values_are_vllms(pair):
    real, sim = (_values(t) for t in pair)
    for key in sorted(set(real) | set(sim)):
        extra, _why = LABEL_VALUES.get(key, (set(), ""))
        got, want = sim.get(key, set()), real.get(key, set())
        # Every value the server wrote; beyond them, only the listed ones (a real server writes
        # those once they happen, as the 4xx of a run with rejections).
        assert want <= got and got - want <= extra, key
        assert extra <= got, f"{key}: no longer differs"


def test_status_series_are_born_at_their_first_answer(pair):
    """As the API server's instrumentator does, the simulator writes a (handler, status)
    series only once an answer of that status happened: none at zero, so a server that never
    failed has no 5xx series (and diagnose reads the absent child of a scraped family as 0)."""
    real, sim = pair
    for text in (real, sim):
        counts = [
            s.value
            for f in text_string_to_metric_families(text)
            if f.name == "http_requests"
            for s in f.samples
            if s.name == "http_requests_total"
        ]
        assert counts and min(counts) > 0


@pytest.mark.parametrize("directory", RECORDINGS, ids=[d.name for d in RECORDINGS])
def test_what_a_real_server_creates_only_at_its_first_request(directory):
    def names(text: str) -> set[str]:
        return {f.name for f in text_string_to_metric_families(text) if f.samples}

    idle = names((directory / "metrics-idle.txt").read_text())
    load = names((directory / "metrics-load.txt").read_text())
    born = {n for n in load - idle if not n.endswith("_created")}
    lora = BORN_WITH_LORA if _max_loras(directory) else set()
    assert born == BORN_ON_FIRST_REQUEST | lora
    # Every other vllm: family is there, at zero, before the first request.
    assert not {n for n in born - lora if n.startswith("vllm:")}
