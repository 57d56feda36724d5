"""The real-vLLM lab's parts that run without vLLM: incident files, the load generator against
a loopback server, the tiny model's tokenizer, and the failure paths of ``make real`` (a CPU
without AVX2, a server that exits at start-up): one line naming the step, exit status 1, and
nothing left running."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from lab.real import host, model
from lab.real import incident as incidents
from lab.real.incident import IncidentError
from lab.real.load import Load, LoadSpec
from lab.real.record import fetch_text
from lab.real.server import VllmServer
from lab.real.venv import STAMP, TORCH, VLLM, LabError, check_cpu
from tests.loopback import answer, serve

ROOT = Path(__file__).resolve().parent.parent


def test_every_incident_file_loads_and_says_what_it_must_produce(catalog):
    names = incidents.names()
    assert len(names) >= 8
    for name in names:
        inc = incidents.find(name)
        assert inc.description, name
        assert inc.expect is None or inc.expect in catalog, (name, inc.expect)
        assert inc.expect is not None or inc.health != "any", f"{name}: no finding, no verdict"
        assert len(inc.phases) >= 2 and inc.baseline.action is None, name
        # Bounded: every incident ends within 20 minutes of load.
        assert inc.duration <= 20 * 60, name


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("expect: x\nphases: []\n", "phases: must list a baseline phase and the incident phase"),
        (
            "expect: x\nphases: [{duration: 1m}, {duration: soon}]\n",
            "phases[1].duration: 'soon' is not a duration",
        ),
        (
            "expect: x\nphases: [{duration: 1m, load: {rate: -1}}, {duration: 1m}]\n",
            "phases[0].load.rate: must be a number >= 0",
        ),
        (
            "expect: x\nphases: [{duration: 1m, load: {qps: 1}}, {duration: 1m}]\n",
            "phases[0].load.qps: unknown",
        ),
        (
            "expect: x\nphases: [{duration: 1m}, {duration: 1m, action: reboot}]\n",
            "phases[1].action: must be one of restart, kill, crash_loop, freeze, replace",
        ),
        (
            "expect: x\nphases: [{duration: 1m}, {duration: 1m, action: crash_loop}]\n",
            "phases[1].every: a crash loop needs 'every'",
        ),
        ("phases: [{duration: 1m}, {duration: 1m}]\n", "expect: must name a playbook"),
        (
            "expect: x\nadapters: 1\n"
            "phases: [{duration: 1m, load: {adapters: 3}}, {duration: 1m}]\n",
            "adapters: the load names 3 adapters, the server has 1",
        ),
        (
            "expect: x\nreplicas: 9\nphases: [{duration: 1m}, {duration: 1m}]\n",
            "replicas: must be a whole number from 1 to 4",
        ),
        (
            "expect: x\nmemory_headroom: -1\nphases: [{duration: 1m}, {duration: 1m}]\n",
            "memory_headroom: must be a whole number of MiB, 0 to 65536",
        ),
        (
            "expect: x\nnode_exporter: yes please\nphases: [{duration: 1m}, {duration: 1m}]\n",
            "node_exporter: must be true or false",
        ),
        ("- a list\n", "an incident must be a YAML mapping"),
    ],
)
def test_a_bad_incident_file_is_one_line_naming_the_field(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(IncidentError) as err:
        incidents.load(path)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_phases_inherit_the_load_they_do_not_change(tmp_path):
    path = tmp_path / "i.yaml"
    path.write_text(
        "expect: none\nhealth: healthy\nphases:\n"
        "  - {duration: 1m, load: {rate: 2, prompt: 150, output: 60}}\n"
        "  - {duration: 2m, load: {prompt: 2000}}\n"
    )
    inc = incidents.load(path)
    assert inc.incident.load == LoadSpec(rate=2.0, prompt=2000, output=60)
    assert inc.duration == 60 + 60 + 120


def test_draws_follow_the_medians_and_the_long_share():
    rng = random.Random(3)
    spec = LoadSpec(rate=1, prompt=2000, output=60, sigma=0.2)
    words, outs = zip(*(spec.draw(rng) for _ in range(2000)), strict=True)
    assert sorted(words)[1000] == pytest.approx(1999, rel=0.05)  # n words, n + 1 tokens
    assert sorted(outs)[1000] == pytest.approx(60, rel=0.05)
    long = LoadSpec(rate=1, prompt=150, long_share=0.1, long_prompt=6000)
    share = sum(long.draw(rng)[0] == 5999 for _ in range(4000)) / 4000
    assert share == pytest.approx(0.1, abs=0.02)


def test_a_shared_system_prompt_is_one_text_and_a_unique_head_breaks_it():
    load = Load("http://127.0.0.1:9", "m", seed=5)
    shared = LoadSpec(rate=1, prompt=10, shared_prefix=300)
    a, b = (load.text(shared, 9).split() for _ in range(2))
    assert len(a) == len(b) == 309 and a[:300] == b[:300] and a[300:] != b[300:]
    # Another seed, another phase: the same system prompt, so the cache keeps hitting.
    assert Load("http://127.0.0.1:9", "m", seed=6).text(shared, 9).split()[:300] == a[:300]
    unique = replace(shared, unique_head=12)
    c, d = (load.text(unique, 9).split() for _ in range(2))
    assert len(c) == 321 and c[12:312] == a[:300] and c[:12] != d[:12]


def test_the_tiny_models_tokenizer_counts_one_token_per_word_after_bos(tmp_path):
    from tokenizers import Tokenizer

    d = model.make(tmp_path / "m", 8192)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["max_position_embeddings"] == 8192
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    text = model.prompt(499, random.Random(1))
    ids = tok.encode(text).ids
    assert len(ids) == 500 and ids[0] == model.BOS and model.EOS not in ids
    assert tok.decode(ids[1:4]) == " ".join(text.split()[:3])


def test_the_load_is_open_loop_bounded_and_asks_vllm_for_exact_lengths():
    with serve(lambda h, f: answer(h, {"choices": [{"finish_reason": "stop"}]})) as srv:
        load = Load(srv.url, "m", seed=1, max_in_flight=4)
        load.start(LoadSpec(rate=40, prompt=20, output=30, max_tokens=25, sigma=0.0))
        time.sleep(1.0)
        load.stop(drain=5)
    sent = [json.loads(s.body) for s in srv.seen]
    assert 20 <= len(sent) <= 70  # about 40 in the second
    assert all(s["path"] == "/v1/completions" for s in (vars(x) for x in srv.seen))
    body = sent[0]
    assert body["max_tokens"] == 25 and body["min_tokens"] == 25  # answer capped: "length"
    assert body["logit_bias"] == {str(model.EOS): 100}
    assert len(body["prompt"].split()) == 19
    assert load.outcomes["http_2xx"] == len(sent)


def test_the_load_counts_refusals_and_a_dead_server():
    with serve(lambda h, f: answer(h, {"error": "too long"}, status=400)) as srv:
        load = Load(srv.url, "m", seed=1)
        load.start(LoadSpec(rate=30))
        time.sleep(0.5)
        load.stop(drain=5)
    assert load.outcomes["http_4xx"] > 0 and set(load.outcomes) == {"http_4xx"}
    dead = Load(srv.url, "m", seed=1)  # the server is gone: connection refused
    dead.start(LoadSpec(rate=30))
    time.sleep(0.5)
    dead.stop(drain=5)
    assert dead.outcomes["connection_error"] > 0


def test_the_running_count_is_read_from_the_real_exposition(tmp_path):
    """What ``freeze_engine`` waits on, read from a real server's /metrics under load (two
    data-parallel engines' worth: the sum); an unreachable or garbled /metrics reads 0."""
    real = (Path(__file__).parent / "data/real/engine-hang/metrics-load.txt").read_text()
    line = next(x for x in real.splitlines() if x.startswith("vllm:num_requests_running{"))
    other = line.replace('engine="0"', 'engine="1"')
    two = real.replace(line, f"{line}\n{other}")
    each = float(line.rsplit(" ", 1)[1])
    for text, expected in ((real, each), (two, 2 * each), ("garbage {{{", 0.0)):
        with serve(
            lambda h, f, t=text: answer(h, t.encode(), headers={"Content-Type": "text/plain"})
        ) as srv:
            port = int(srv.url.rsplit(":", 1)[1])
            server = VllmServer(tmp_path, tmp_path / "m", port, [], tmp_path / "log")
            assert server.running() == expected
    assert VllmServer(tmp_path, tmp_path / "m", 9, [], tmp_path / "log").running() == 0.0


def test_a_cpu_without_avx2_is_refused_in_one_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor : 0\nflags : fpu sse sse2 avx\n")
    with pytest.raises(LabError, match="no AVX2") as err:
        check_cpu(info)
    assert "\n" not in str(err.value)


def _fake_venv(tmp_path: Path, script: str) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text("#!/bin/sh\n" + textwrap.dedent(script))
    py.chmod(0o755)
    (venv / STAMP).write_text(json.dumps({"vllm": VLLM, "torch": TORCH}))
    return venv


def test_a_server_that_exits_at_start_is_named_with_its_last_log_lines(tmp_path):
    venv = _fake_venv(tmp_path, "echo 'INFO loading'; echo 'ValueError: no memory' >&2; exit 3\n")
    srv = VllmServer(venv, tmp_path / "model", 1, [], tmp_path / "vllm.log")
    with pytest.raises(LabError) as err:
        srv.start(timeout=30)
    assert str(err.value) == "the vLLM server exited with status 3: ValueError: no memory"
    assert srv.proc is None


def test_a_server_that_never_answers_is_stopped_with_its_children(tmp_path):
    # The "server" forks a child (as the engine core is) and never listens.
    venv = _fake_venv(tmp_path, 'sleep 300 &\necho $! > "$0.child"\nsleep 300\n')
    srv = VllmServer(venv, tmp_path / "model", 1, [], tmp_path / "vllm.log")
    with pytest.raises(LabError, match=r"did not answer /health in 2 s"):
        srv.start(timeout=2)
    child = int((venv / "bin" / "python.child").read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text()


def test_make_real_names_the_failed_step_and_exits_1(tmp_path):
    venv = _fake_venv(
        tmp_path, "echo 'RuntimeError: Engine core initialization failed' >&2\nexit 1\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-m", "lab.real", "crash", "--venv", str(venv)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == (
        "real: incident crash failed: the vLLM server exited with status 1: "
        "RuntimeError: Engine core initialization failed"
    )
    assert lines[-1] == "real: nothing was left running"


def test_an_unknown_incident_is_bad_usage():
    proc = subprocess.run(
        [sys.executable, "-m", "lab.real", "no-such-thing"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("real: no-such-thing: no such incident (known: ")


def test_a_replacement_that_never_starts_is_a_new_target_started_again_with_back_off(
    tmp_path, monkeypatch
):
    from lab.real import run as lab_run

    venv = _fake_venv(tmp_path, "echo 'ValueError: To serve at least one request' >&2; exit 1\n")
    inc = incidents.find("kv-cannot-fit-max-model-len")
    phase = replace(inc.incident, duration=8.0)
    r = lab_run.Run(replace(inc, phases=(inc.phases[0], phase)), venv, tmp_path, lambda _: None)
    r.targets()
    old = json.loads((tmp_path / "targets.json").read_text())
    monkeypatch.setattr(lab_run, "BACKOFF", 0.5)
    said: list[str] = []
    r.say = said.append
    r.times.append({"name": phase.name})
    try:
        r._replace(phase, time.monotonic() + phase.duration)
    finally:
        r.close()
    new = json.loads((tmp_path / "targets.json").read_text())
    assert old != new == [{"targets": [f"127.0.0.1:{r.port}"]}]  # the old target left
    assert r.server.args[-4:] == ["--max-model-len", "8192", "--kv-cache-memory-bytes", "4194304"]
    starts = r.times[-1]["starts"]
    assert starts >= 2 and len(said) == starts  # 0.5 s, then 1 s: the back-off doubles
    assert all("To serve at least one request" in line for line in said)
    assert r.server.proc is None


def test_the_load_names_adapters_and_sends_a_hot_share_to_the_first_replica():
    bodies: dict[str, list[dict]] = {"a": [], "b": []}
    with (
        serve(lambda h, f: answer(h, {"choices": []})) as a,
        serve(lambda h, f: answer(h, {"choices": []})) as b,
    ):
        load = Load(a.url, "m", seed=3, max_in_flight=64)
        load.replicas = [b.url]
        load.start(LoadSpec(rate=200, prompt=5, output=5, sigma=0.0, adapters=3, hot_share=0.8))
        time.sleep(1.0)
        load.stop(drain=5)
        bodies = {k: [json.loads(x.body) for x in srv.seen] for k, srv in (("a", a), ("b", b))}
    n = len(bodies["a"]) + len(bodies["b"])
    assert n > 100 and 0.7 < len(bodies["a"]) / n < 0.9
    names = {x["model"] for xs in bodies.values() for x in xs}
    assert names == {"lora-00", "lora-01", "lora-02"}


def test_the_adapters_are_peft_files_vllm_can_read(tmp_path):
    import struct

    made = model.make_adapters(tmp_path / "adapters", 2)
    assert sorted(made) == ["lora-00", "lora-01"]
    config = json.loads((made["lora-00"] / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == model.ADAPTER_RANK
    raw = (made["lora-00"] / "adapter_model.safetensors").read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    key = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"
    assert header[key]["shape"] == [model.CONFIG["hidden_size"], model.ADAPTER_RANK]
    end = max(t["data_offsets"][1] for t in header.values())
    assert len(raw) == 8 + size + end  # every tensor's bytes, and nothing after them


def test_replicas_get_cores_of_their_own(monkeypatch):
    """Engines that share cores share one speed: a server given a tenth of the requests ran
    each as slowly as the busy one. Each replica gets an even share of the cores."""
    from lab.real import run as real_run

    monkeypatch.setattr(real_run.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert real_run.replica_cores(1) == [()]
    assert real_run.replica_cores(2) == [(0, 1), (2, 3)]
    assert real_run.replica_cores(3) == [(0,), (1,), (2,)]
    assert real_run.replica_cores(5) == [(), (), (), (), ()]  # fewer cores than replicas


def test_a_pinned_server_runs_on_its_cores_and_binds_its_engine_threads_there(tmp_path):
    """The server's process is started on its cores, and vLLM's CPU build is told to bind
    the engine's threads to them (it binds its own, to every core, unless told)."""
    seen = tmp_path / "seen"
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = venv / "bin" / "python"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$VLLM_CPU_OMP_THREADS_BIND" > {seen}\n'
        f"grep Cpus_allowed_list /proc/self/status >> {seen}\n"
        "exit 3\n"
    )
    fake.chmod(0o755)
    (tmp_path / "model").mkdir()
    core = min(os.sched_getaffinity(0))
    server = VllmServer(venv, tmp_path / "model", 1, [], tmp_path / "log", (core,))
    with pytest.raises(LabError, match="exited with status 3"):
        server.start(timeout=30)
    bind, allowed = seen.read_text().splitlines()
    assert bind == str(core)
    assert allowed.split()[-1] == str(core)


@pytest.mark.parametrize(
    ("meminfo", "share"),
    [
        ("Node 0 MemTotal:        8742728 kB\nNode 0 MemFree: 8265516 kB\n", 0.36),
        ("Node 0 MemTotal:       65536000 kB\n", 0.1),
        ("Node 0 MemFree: 1 kB\n", 0.1),
        (None, 0.1),
    ],
)
def test_the_workers_memory_is_a_tenth_of_the_node_and_enough_on_a_small_one(
    tmp_path, meminfo, share
):
    """vLLM's CPU build gives the KV cache the node's share less what the worker already holds;
    on an 8 GiB node a tenth would be less than the worker's weights, and vLLM would refuse."""
    from lab.real.server import RESERVED, base_args, memory_share

    path = tmp_path / "meminfo"
    if meminfo is not None:
        path.write_text(meminfo)
    got = memory_share(path)
    assert got == share
    if meminfo and "MemTotal" in meminfo:
        total = int(meminfo.split("MemTotal:")[1].split()[0]) * 1024
        assert got * total >= min(RESERVED, 0.9 * total)
    args = base_args()
    assert args[args.index("--gpu-memory-utilization") + 1] == f"{memory_share():g}"


@pytest.mark.skipif(
    not os.access(host.MEMCG_ROOT, os.W_OK), reason="no writable cgroup v1 memory controller"
)
def test_a_process_past_its_cgroups_limit_is_killed_by_the_oom_killer_as_the_host_counts():
    """What the oom-killed incident relies on: a process started in the lab's memory cgroup
    is charged there, and past its limit the kernel's OOM killer kills it (SIGKILL), counted
    in the cgroup and in the host's /proc/vmstat, which node-exporter reads."""
    cgroup = host.MemoryCgroup(f"servediag-test-{os.getpid()}")
    try:
        cgroup.set_limit(64 * 2**20)
        before = host.host_oom_kills()
        grow = "x = bytearray(256 * 2**20)"  # zeroed: every page touched
        proc = subprocess.run(
            [sys.executable, "-c", grow], preexec_fn=lambda: host.join(cgroup.procs), check=False
        )
        assert proc.returncode == -9
        assert cgroup.oom_kills() == 1 and cgroup.peak() <= 64 * 2**20
        assert host.host_oom_kills() >= before + 1
    finally:
        cgroup.close()
    assert not cgroup.path.exists()


def test_a_cgroup_that_cannot_be_made_is_one_line(tmp_path):
    with pytest.raises(LabError, match=r"^cannot make the memory cgroup .*cgroup v1's memory"):
        host.MemoryCgroup("x", root=tmp_path / "no-cgroups")


@pytest.mark.skipif(shutil.which(host.NODE_EXPORTER) is None, reason="no node-exporter")
def test_the_hosts_node_exporter_serves_its_memory_and_oom_kills(tmp_path):
    node = host.NodeExporter(tmp_path / "node.log")
    try:
        node.start()
        page = fetch_text(f"http://{node.target}/metrics")
    finally:
        node.stop()
    names = {line.split("{")[0].split()[0] for line in page.splitlines() if line[:1] != "#"}
    assert {"node_vmstat_oom_kill", "node_memory_MemAvailable_bytes"} <= names
    assert not any(n.startswith(("go_", "process_", "node_cpu")) for n in names)
    assert node.target.startswith("127.0.0.1:")  # the server's host: joined by it


def test_a_server_that_dies_on_its_own_is_started_again_after_the_kubelets_back_off(
    tmp_path, monkeypatch
):
    """restart_on_exit: a server that answers /health and then exits (as vLLM's API server
    does once the OOM killer has killed its worker) is started again after each exit, the
    back-off doubling, and each exit is recorded with its status."""
    from lab.real import run as lab_run

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = venv / "bin" / "python"
    script = tmp_path / "serve_then_exit.py"
    script.write_text(
        textwrap.dedent(
            """
            import http.server, sys, threading
            class Health(http.server.BaseHTTPRequestHandler):
                def do_GET(self):  # answers once, then dies
                    self.send_response(200)
                    self.end_headers()
                    threading.Timer(0.3, s.shutdown).start()
                def log_message(self, *args):
                    pass
            port = int(sys.argv[sys.argv.index("--port") + 1])
            s = http.server.HTTPServer(("127.0.0.1", port), Health)
            s.serve_forever()
            """
        )
    )
    fake.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    fake.chmod(0o755)
    (tmp_path / "model").mkdir()
    inc = incidents.find("oom-killed")
    inc = replace(inc, memory_headroom=0, node_exporter=False)
    r = lab_run.Run(inc, venv, tmp_path, lambda _: None)
    monkeypatch.setattr(lab_run, "BACKOFF", 0.3)
    monkeypatch.setattr(lab_run, "LAST_START", 0.5)
    said: list[str] = []
    r.say = said.append
    r.times.append({"name": inc.incident.name})
    try:
        r.start_server()
        r._restart_on_exit(time.monotonic() + 4.0)
    finally:
        r.close()
    exits = r.times[-1]["exits"]
    assert len(exits) >= 2 and all(e["status"] == 0 for e in exits), said
    assert len(r.startups) == len(exits) or len(r.startups) == len(exits) + 1
    assert r.server.proc is None
