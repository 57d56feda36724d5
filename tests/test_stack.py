"""The docker-compose stack, checked without a Docker engine.

The compose file's structure (pinned images, health checks, named volumes, every mounted path
present, every command's config file mounted), docker-compose's own validation, and the
configs it mounts checked by the real tools: ``promtool check config`` and ``amtool
check-config``, with the severity routes tested by ``amtool config routes test``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from diagnoser.sim import library

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
SERVICES = {"simulator", "webhook", "watch", "prometheus", "alertmanager", "grafana"}
# Where each service listens inside the stack's network.
PORTS = {
    "simulator": 8000,
    "webhook": 9095,
    "watch": 9466,
    "prometheus": 9090,
    "alertmanager": 9093,
}
INTERPOLATION = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)(?::-([^}]*))?\}")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def _binds(service: dict[str, Any]) -> list[tuple[Path, PurePosixPath]]:
    """(repository path, container path) of each bind mount."""
    out = []
    for vol in service.get("volumes", []):
        source, target = vol.split(":")[:2]
        if source.startswith((".", "/")):
            out.append(((ROOT / source).resolve(), PurePosixPath(target)))
    return out


def _in_repo(service: dict[str, Any], container_path: str) -> Path | None:
    """The repository file a container path of ``service`` comes from, if it is bind-mounted."""
    path = PurePosixPath(container_path)
    for source, target in _binds(service):
        if path == target or target in path.parents:
            return source / path.relative_to(target)
    return None


def _defaults(text: str) -> str:
    """``${VAR:-default}`` -> ``default``, as compose does with VAR unset."""
    return INTERPOLATION.sub(lambda m: m.group(2) or "", text)


def test_the_stack_has_its_services(compose):
    assert set(compose["services"]) == SERVICES


def test_images_are_pinned_and_ours_is_built_from_a_pinned_base(compose):
    for name, svc in compose["services"].items():
        image = svc["image"]
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest", (name, image)
        if "build" in svc:
            assert svc["build"] == "." and (ROOT / "Dockerfile").is_file()
        else:
            assert re.fullmatch(r"v?\d+\.\d+\.\d+", tag), (name, image)
    base = re.search(r"^FROM (\S+)", (ROOT / "Dockerfile").read_text(), re.M)
    assert base and re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+", base.group(1))


def test_every_file_the_dockerfile_copies_exists():
    copies = re.findall(r"^COPY (.+) \S+$", (ROOT / "Dockerfile").read_text(), re.M)
    sources = [s for line in copies for s in line.split()]
    assert {"pyproject.toml", "diagnoser", "playbooks", "fixtures/scenarios"} <= set(sources)
    for source in sources:
        assert (ROOT / source).exists(), source


def test_every_service_has_a_healthcheck(compose):
    for name, svc in compose["services"].items():
        check = svc.get("healthcheck", {})
        assert check.get("test") and check["test"][0] == "CMD", name
        assert {"interval", "timeout", "retries", "start_period"} <= set(check), name


def test_data_lives_in_named_volumes_and_bind_mounts_exist(compose):
    declared = set(compose.get("volumes") or {})
    named = set()
    for name, svc in compose["services"].items():
        for vol in svc.get("volumes", []):
            source = vol.split(":")[0]
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), (name, source)
                assert vol.endswith(":ro"), (name, vol)
            else:
                assert source in declared, (name, source)
                named.add(source)
    assert named == declared
    assert {"prometheus-data", "alertmanager-data", "grafana-data"} <= named


def test_each_command_names_files_that_are_mounted(compose):
    services = compose["services"]
    for name in ("prometheus", "alertmanager"):
        svc = services[name]
        config = next(a.split("=", 1)[1] for a in svc["command"] if a.startswith("--config.file"))
        source = _in_repo(svc, config)
        assert source is not None and source.is_file(), (name, config)
        assert source.parent == ROOT / "deploy"
    sim = [_defaults(a) for a in services["simulator"]["command"]]
    assert sim[0] == "simulate" and sim[1] in library.names()
    assert float(sim[sim.index("--speed") + 1]) > 0
    hook = services["webhook"]["command"]
    assert hook[0] == "webhook" and hook[hook.index("--listen") + 1].endswith(":9095")
    watch = services["watch"]["command"]
    assert watch[0] == "watch" and watch[watch.index("--listen") + 1] == "0.0.0.0:9466"
    assert watch[watch.index("--prometheus-url") + 1] == "http://prometheus:9090"
    assert services["watch"]["image"] == services["webhook"]["image"]


def test_prometheus_scrapes_the_watch_as_job_servediag():
    doc = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    (job,) = [j for j in doc["scrape_configs"] if j["job_name"] == "servediag"]
    assert job["static_configs"] == [{"targets": ["watch:9466"]}]
    assert job["honor_labels"] is True


def test_every_address_in_the_stack_names_a_service_and_its_port(compose):
    services = compose["services"]
    texts = [
        COMPOSE.read_text(),
        (ROOT / "deploy" / "prometheus.yml").read_text(),
        (ROOT / "deploy" / "alertmanager.yml").read_text(),
        (ROOT / "deploy" / "grafana" / "datasources.yaml").read_text(),
    ]
    found = set()
    for text in texts:
        live = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
        for host, port in re.findall(r"\b([a-z][a-z0-9-]*):(\d{4})\b", live):
            if host in ("localhost", "http", "https"):
                continue
            assert host in services and PORTS[host] == int(port), (host, port)
            found.add(host)
    assert found == set(PORTS)


def test_grafana_provisioning_points_at_the_mounted_dashboards(compose):
    grafana = compose["services"]["grafana"]
    provider = yaml.safe_load((ROOT / "dashboards" / "provisioning.yaml").read_text())
    (entry,) = provider["providers"]
    source = _in_repo(grafana, entry["options"]["path"])
    assert source == ROOT / "dashboards"
    assert len(list(source.glob("*.json"))) >= 5
    # The provisioning files sit where Grafana reads them.
    targets = {str(t): s for s, t in _binds(grafana)}
    assert targets["/etc/grafana/provisioning/dashboards/servediag.yaml"] == (
        ROOT / "dashboards" / "provisioning.yaml"
    )
    datasources = targets["/etc/grafana/provisioning/datasources/servediag.yaml"]
    doc = yaml.safe_load(datasources.read_text())
    (default,) = [d for d in doc["datasources"] if d.get("isDefault")]
    assert default["type"] == "prometheus" and default["url"] == "http://prometheus:9090"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert _in_repo(grafana, home) == ROOT / "dashboards" / "overview.json"
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ENABLED"] == "true"


def test_the_commented_real_vllm_service_is_valid_when_uncommented():
    lines = COMPOSE.read_text().splitlines()
    start = lines.index("  # vllm:")
    block = []
    for line in lines[start:]:
        if not line.startswith("  # "):
            break
        block.append(line[len("  # ") :])
    svc = yaml.safe_load("\n".join(block))["vllm"]
    assert re.fullmatch(r"vllm/vllm-openai:v\d+\.\d+\.\d+", svc["image"])
    assert "--served-model-name" in svc["command"] and svc["healthcheck"]["test"]
    (device,) = svc["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert "  # hf-cache: {}" in lines
    assert '    #   - targets: ["vllm:8000"]' in (ROOT / "deploy" / "prometheus.yml").read_text()


def _tool(name: str, package: str) -> str:
    exe = shutil.which(name)
    if exe is None:
        pytest.fail(f"{name} not found: run scripts/install-deps (Debian package {package})")
    return exe


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, check=False, cwd=ROOT)


def test_docker_compose_validates_the_file():
    proc = _run(_tool("docker-compose", "docker-compose"), "-f", str(COMPOSE), "config", "-q")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.promtool
def test_promtool_checks_the_prometheus_config_and_its_rules(promtool_bin):
    proc = _run(promtool_bin, "check", "config", "deploy/prometheus.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert "2 rule files found" in out
    assert "rules/recording.rules.yaml" in out and "rules/alerts.rules.yaml" in out


@pytest.mark.prometheus
def test_amtool_checks_the_alertmanager_config():
    proc = _run(
        _tool("amtool", "prometheus-alertmanager"), "check-config", "deploy/alertmanager.yml"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


@pytest.mark.prometheus
@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        # Symptoms page when critical; a cause makes a ticket whatever its severity.
        (
            [
                "alertname=VllmAvailabilityBudgetBurn",
                "symptom=slo-availability",
                "severity=critical",
            ],
            "page",
        ),
        (["alertname=VllmTargetDown", "symptom=target-down", "severity=critical"], "page"),
        (["alertname=VllmTargetDown", "symptom=target-down", "severity=warning"], "ticket"),
        (
            ["alertname=VllmKvCachePressure", "playbook=kv-cache-pressure", "severity=warning"],
            "ticket",
        ),
        (
            [
                "alertname=VllmServerNotStarting",
                "playbook=kv-cannot-fit-max-model-len",
                "severity=critical",
            ],
            "ticket",
        ),
        (["alertname=Other", "severity=info"], "discard"),
        # servediag watch's cause alert is a cause: a ticket, even for a critical playbook.
        (
            [
                "alertname=ServediagLikelyCause",
                "playbook=engine-hang",
                "severity=critical",
                "source=servediag-watch",
            ],
            "ticket",
        ),
        (
            [
                "alertname=ServediagLikelyCause",
                "playbook=kv-cache-pressure",
                "severity=warning",
                "source=servediag-watch",
            ],
            "ticket",
        ),
        # The watch's own health: tickets, not pages.
        (["alertname=ServediagStale", "severity=warning", "source=servediag-watch"], "ticket"),
        (["alertname=ServediagDown", "severity=warning", "source=servediag-watch"], "ticket"),
    ],
)
def test_symptoms_page_and_causes_make_tickets(labels, receiver):
    proc = _run(
        _tool("amtool", "prometheus-alertmanager"),
        "config",
        "routes",
        "test",
        "--config.file=deploy/alertmanager.yml",
        *labels,
        "model_name=m",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [receiver]


def _cause(playbook: str, severity: str, model: str = "m") -> dict[str, str]:
    return {
        "alertname": "ServediagLikelyCause",
        "playbook": playbook,
        "severity": severity,
        "source": "servediag-watch",
        "model_name": model,
    }


@pytest.mark.prometheus
def test_one_incident_pages_once_and_tickets_its_cause_once(tmp_path):
    """On a real Alertmanager with deploy/alertmanager.yml's inhibitions: while a page fires
    for a model, its cause alert is held back (the page carries the cause); the playbook's
    own alert holds back the cause alert of the same playbook and model; anything else of
    another model, or another playbook, goes through."""
    import json
    import urllib.request

    from lab.promserver import Alertmanager

    doc = yaml.safe_load((ROOT / "deploy" / "alertmanager.yml").read_text())
    for receiver in doc["receivers"]:
        receiver.pop("webhook_configs", None)  # nothing is sent anywhere
    page = {
        "alertname": "VllmTtftBudgetBurn",
        "symptom": "slo-ttft",
        "severity": "critical",
        "model_name": "paged",
    }
    own = {"alertname": "VllmEngineHang", "playbook": "engine-hang", "severity": "critical"}
    oom = {
        "alertname": "VllmContainerOOMKilled",
        "playbook": "container-oom-killed",
        "severity": "critical",
    }
    loop = {
        "alertname": "VllmRestartLoop",
        "playbook": "gpu-memory-contention",
        "severity": "critical",
        "instance": "10.0.0.7:8000",
    }
    alerts = {
        "page": page,
        "cause of the paged model": _cause("engine-hang", "critical", "paged"),
        "own alert": {**own, "model_name": "ticketed"},
        "cause with its own alert": _cause("engine-hang", "critical", "ticketed"),
        "cause of another playbook": _cause("kv-cache-pressure", "critical", "ticketed"),
        "cause alone": _cause("engine-hang", "critical", "alone"),
        "kill the platform names": {**oom, "model_name": "killed"},
        "restart loop of the kill": {**loop, "model_name": "killed"},
        "restart loop of another model": {**loop, "model_name": "alone"},
    }
    with Alertmanager(doc) as am:
        body = json.dumps([{"labels": labels} for labels in alerts.values()]).encode()
        req = urllib.request.Request(
            f"{am.url}/api/v2/alerts", body, {"Content-Type": "application/json"}
        )
        urllib.request.urlopen(req, timeout=10).close()
        inhibited: dict[str, bool] = {}
        for _ in range(50):  # inhibitions are computed as the alerts arrive; allow a moment
            held = {a["fingerprint"]: a["status"]["inhibitedBy"] for a in am.alerts()}
            by_labels = {
                json.dumps(a["labels"], sort_keys=True): bool(held[a["fingerprint"]])
                for a in am.alerts()
            }
            inhibited = {
                name: by_labels.get(json.dumps(labels, sort_keys=True), False)
                for name, labels in alerts.items()
            }
            awaited = ("cause of the paged model", "cause with its own alert")
            if all(inhibited[k] for k in (*awaited, "restart loop of the kill")):
                break
            time.sleep(0.1)
    assert inhibited == {
        "page": False,
        "cause of the paged model": True,
        "own alert": False,
        "cause with its own alert": True,
        "cause of another playbook": False,
        "cause alone": False,
        "kill the platform names": False,
        "restart loop of the kill": True,
        "restart loop of another model": False,
    }


def _matches(matchers: list[str], alertname: str) -> bool:
    """Whether Alertmanager's ``alertname`` matcher among ``matchers`` (``=`` or ``=~``, the
    regex anchored as Alertmanager anchors it) selects ``alertname``."""
    for m in matchers:
        found = re.fullmatch(r'alertname(=~|=)"(.*)"', m)
        if found:
            op, value = found.groups()
            return value == alertname if op == "=" else bool(re.fullmatch(value, alertname))
    return False


def test_a_cause_the_platform_names_holds_back_what_it_explains():
    """Each playbook read from the platform's own metrics (kube-state-metrics, cAdvisor,
    node-exporter, DCGM) holds back, for the same model (or the same target, for alerts of a
    target that never served), the alert of every playbook its signature explains: one
    incident, one ticket, the one that names the cause."""
    from diagnoser.catalog import load_catalog
    from diagnoser.metrics.signals import platform as platform_signals

    platform = {s.name for s in platform_signals.signals()}
    catalog = {pb.id: pb for pb in load_catalog()}
    rules = yaml.safe_load((ROOT / "deploy" / "alertmanager.yml").read_text())["inhibit_rules"]
    pairs = [
        (pb.alert.name, catalog[other].alert.name)
        for pb in catalog.values()
        if pb.signature and pb.alert and set(pb.signature.requires) & platform
        for other in pb.signature.explains
        if catalog[other].alert
    ]
    assert ("VllmLivenessProbeKill", "VllmEngineHung") in pairs
    missing = [
        (cause, symptom)
        for cause, symptom in pairs
        if not any(
            _matches(r["source_matchers"], cause)
            and _matches(r["target_matchers"], symptom)
            and r["equal"] in (["model_name"], ["job", "instance"])
            for r in rules
        )
    ]
    assert not missing, f"no inhibition of these alerts by their platform cause: {missing}"


def test_every_sent_receiver_calls_the_diagnosis_webhook():
    doc = yaml.safe_load((ROOT / "deploy" / "alertmanager.yml").read_text())
    urls = {r["name"]: [w["url"] for w in r.get("webhook_configs", [])] for r in doc["receivers"]}
    assert urls["page"] == urls["ticket"] == ["http://webhook:9095/alerts"]
    assert urls["discard"] == []


@pytest.mark.slow
def test_the_files_the_dockerfile_copies_build_the_wheel(tmp_path):
    """What `pip install .` sees inside the image: only the copied files, and enough of them."""
    import sys
    import zipfile

    context = tmp_path / "src"
    for line in re.findall(r"^COPY (.+) \S+$", (ROOT / "Dockerfile").read_text(), re.M):
        for source in line.split():
            src, dst = ROOT / source, context / source
            if src.is_dir():
                shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), "."],
        capture_output=True,
        text=True,
        check=False,
        cwd=context,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    (wheel,) = tmp_path.glob("servediag-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "diagnoser/_catalog/playbooks/kv-cache-pressure.yaml" in names
    assert "diagnoser/_catalog/scenarios/context-length-rejections.yaml" in names
    # What ships is what users run: the lab, its benchmarks and its step-trace hook stay out.
    assert not [
        n for n in names if n.startswith(("lab/", "diagnoser/lab/", "diagnoser/_catalog/real"))
    ]
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "servediag = diagnoser.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()
