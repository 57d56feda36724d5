"""The catalog: every id of the design present, and bad playbooks rejected in one line."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import data_json

from diagnoser.catalog import CatalogError, builtin_dir, load_catalog, load_playbook

ROOT = Path(__file__).resolve().parent.parent


def test_every_design_id_is_in_the_catalog_as_the_design_classes_it(catalog):
    """The design's ids are all there, detectable or advisory as the design says; the
    playbooks added since (patterns met on real servers) are the catalog's own, and each
    passes every other test here like the design's."""
    ids = data_json("design-ids.json")
    detectable, advisory = ids["detectable"], ids["advisory"]
    assert len(detectable) == 16 and len(advisory) == 4
    assert set(detectable) <= {p.id for p in catalog.detectable()}
    assert set(advisory) <= {p.id for p in catalog.advisory()}


def test_detectable_playbooks_have_a_signature_and_an_alert(catalog):
    for pb in catalog.detectable():
        assert pb.signature is not None and pb.signature.all, pb.id
        assert pb.alert is not None, pb.id
        assert pb.alert.name.startswith("Vllm"), pb.alert.name


def test_advisory_playbooks_point_at_detectable_ones(catalog):
    for pb in catalog.advisory():
        assert pb.relates_to, pb.id
        assert all(catalog[r].detectable for r in pb.relates_to), pb.id


def test_playbooks_that_explain_each_other_are_the_pairs_ordered_by_events(catalog):
    """Two that explain each other are told apart by which began first: the built-in pair
    is a full KV cache and a prefix cache that stopped hitting."""
    mutual = {
        tuple(sorted((pb.id, other)))
        for pb in catalog.detectable()
        for other in pb.signature.explains
        if pb.id in catalog[other].signature.explains
    }
    assert mutual == {("kv-cache-pressure", "prefix-cache-collapse")}
    for pair in mutual:
        assert all(catalog[pid].signature.onset for pid in pair)


def test_every_playbook_sets_onset_and_evidence_from_its_signature(catalog):
    for pb in catalog.detectable():
        sig = pb.signature
        assert sig.onset is not None, pb.id
        named = {c.signal for c in sig.all}
        assert named & set(pb.evidence), f"{pb.id}: evidence shows none of its signature"


# --- malformed playbooks --------------------------------------------------------------------


def _mutate(tmp_path: Path, change) -> Path:
    data = yaml.safe_load((builtin_dir() / "prompt-length-shift.yaml").read_text())
    change(data)
    path = tmp_path / f"{data.get('id', 'broken')}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _set(path: str, value):
    def change(data):
        *parents, last = path.split(".")
        node = data
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        if value is KeyError:
            del node[last]
        else:
            node[last] = value

    return change


@pytest.mark.parametrize(
    ("change", "where", "says"),
    [
        (_set("severity", "urgent"), "severity", "not one of"),
        (_set("title", KeyError), "(top level)", "'title' is required"),
        (_set("colour", "red"), "(top level)", "unknown field 'colour'"),
        (_set("signature.all.0.signal", "ttft_p97"), "signature.all[0].signal", "unknown signal"),
        (_set("signature.all.1.rises", "a lot"), "signature.all[1].rises", "is not of type"),
        (_set("signature.all.1.falls", 0.5), "signature.all[1]", "exactly one of"),
        (_set("signature.none.0.why", KeyError), "signature.none[0].why", "which cause"),
        (_set("signature.all.0.held", 0.5), "signature.all[0].held", "does not apply"),
        (_set("alert", KeyError), "alert", "required for a detectable"),
        (_set("alert.expr", "${ttft_p97} > 1"), "alert.expr", "neither a signal"),
        (
            _set("alert.summary", "Prompts grew on {{ $labels.model_name }}."),
            "alert.summary",
            "static",
        ),
        (_set("alert.for", "30 minutes"), "alert.for", "does not match"),
        (_set("evidence", ["ttft_p95", "nope"]), "evidence[1]", "unknown signal"),
        (_set("signature.requires", ["dcgm_nope"]), "signature.requires", "unknown signal"),
        (_set("id", "other-id"), "id", "must equal the file name"),
    ],
)
def test_a_malformed_playbook_names_the_file_and_the_field(tmp_path, change, where, says):
    path = _mutate(tmp_path, change)
    if where == "id":  # keep the file name while the id inside changes
        path = path.rename(tmp_path / "prompt-length-shift.yaml")
    with pytest.raises(CatalogError) as err:
        load_playbook(path)
    assert err.value.path == str(path)
    assert err.value.where == where
    assert says in err.value.message
    assert "\n" not in str(err.value)


def test_yaml_syntax_errors_give_the_line(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("id: x\ntitle: [unclosed\n")
    with pytest.raises(CatalogError) as err:
        load_playbook(path)
    assert err.value.where == "line 3" and "not valid YAML" in err.value.message


def test_a_users_playbook_may_not_reuse_a_builtin_id(tmp_path):
    shutil.copy(builtin_dir() / "prompt-length-shift.yaml", tmp_path)
    with pytest.raises(CatalogError, match="already defined"):
        load_catalog(tmp_path)


def test_a_users_playbook_joins_the_catalog(tmp_path):
    data = yaml.safe_load((builtin_dir() / "prompt-length-shift.yaml").read_text())
    data["id"] = "tenant-prompt-growth"
    data["alert"]["name"] = "VllmTenantPromptGrowth"
    data["seed"] = {"symptoms": []}
    (tmp_path / "tenant-prompt-growth.yaml").write_text(yaml.safe_dump(data))
    cat = load_catalog(tmp_path)
    assert "tenant-prompt-growth" in cat and len(cat) == len(load_catalog()) + 1


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diagnoser", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )


def test_validate_reports_a_malformed_playbook_in_one_line_with_exit_2(tmp_path):
    _mutate(tmp_path, _set("signature.all.0.rises", -1))
    proc = _cli("catalog", "validate", str(tmp_path))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "prompt-length-shift.yaml: signature.all[0].rises:" in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.prometheus
def test_validate_accepts_the_builtin_catalog():
    proc = _cli("catalog", "validate", str(builtin_dir()))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"ok: {len(load_catalog())} playbook"), proc.stdout


def test_validate_of_a_missing_directory_is_a_usage_error(tmp_path):
    proc = _cli("catalog", "validate", str(tmp_path / "nope"))
    assert proc.returncode == 2 and "not a directory" in proc.stderr


def test_validate_renders_alerts_so_a_bad_placeholder_is_caught(tmp_path):
    data = yaml.safe_load((builtin_dir() / "prompt-length-shift.yaml").read_text())
    data["id"] = "site-queue"
    data["alert"]["name"] = "VllmSiteQueue"
    data["alert"]["expr"] = "${requests_waiting_by_reason@instance} > ${ratio} * ${ttft_ratio}"
    data["alert"].pop("fallback")
    data["seed"] = {"symptoms": []}
    (tmp_path / "site-queue.yaml").write_text(yaml.safe_dump(data))
    proc = _cli("catalog", "validate", str(tmp_path))
    assert proc.returncode == 2
    assert "site-queue.yaml: alert.expr: ${requests_waiting_by_reason@instance}" in proc.stderr
    assert "not recorded per instance" in proc.stderr


def test_the_committed_schema_is_the_composed_one():
    from diagnoser.catalog.schema import render

    committed = (ROOT / "diagnoser" / "catalog" / "playbook.schema.json").read_text()
    assert committed == render(), "run make generate (servediag catalog schema)"


def _with(tmp_path, pid: str, edit) -> Path:
    data = yaml.safe_load((builtin_dir() / f"{pid}.yaml").read_text())
    data["id"] = "site-copy"
    data["alert"]["name"] = "VllmSiteCopy"
    data["seed"] = {"symptoms": []}
    edit(data)
    path = tmp_path / "site-copy.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (
            lambda d: d["signature"]["supporting"][0].update(param="ttft_ratio"),
            "'ttft_ratio' is bound at signature.all[1].param",
        ),
        (
            lambda d: d["alert"].setdefault("params", {}).update(ttft_ratio=2),
            "alert.params.ttft_ratio: is bound to a signature condition",
        ),
        (
            lambda d: (
                d["alert"]
                .setdefault("params", {})
                .update(spare={"value": 1, "why": "never used at all"})
            ),
            "parameter 'spare' is not used in alert.expr",
        ),
        (
            lambda d: d["alert"].update(expr="${ttft_p95} > ${ratio} * ${ttft_ratio}"),
            "alert.fallback: the expression compares with no offset",
        ),
        (
            lambda d: d["signature"]["all"][0].update(held=0.5),
            "signature.all[0].held: does not apply to 'rises'",
        ),
        (
            lambda d: d["signature"].update(explains=["queue-saturation", "site-copy"]),
            "unknown playbook 'site-copy'",
        ),
    ],
)
def test_thresholds_have_one_source_and_a_broken_binding_is_one_line(tmp_path, edit, says):
    path = _with(tmp_path, "prompt-length-shift", edit)
    with pytest.raises(CatalogError, match=re.escape(says)):
        load_catalog(path.parent)


def test_an_otherwise_stands_in_only_for_what_its_signature_requires(tmp_path):
    """container-oom-killed's otherwise (node-exporter's OOM kills where kube-state-metrics
    is not scraped) inherits its onset-free parts and binds no alert parameter; one nested
    in another, one that reads nothing in its place, or one with nothing to stand in for is
    refused in one line."""
    pb = load_playbook(builtin_dir() / "container-oom-killed.yaml")
    assert pb.signature is not None and pb.signature.otherwise is not None
    other = pb.signature.otherwise
    assert other.requires == ("host_oom_kills_at_down",) and other.max_confidence < 0.95
    assert other.explains == pb.signature.explains
    assert pb.signature.judged_on(lambda name: name != "container_oom_killed") is other
    assert pb.signature.judged_on(lambda name: True) is pb.signature
    assert pb.signature.judged_on(lambda name: False) is pb.signature

    def nested(d):
        d["signature"]["otherwise"]["otherwise"] = dict(d["signature"]["otherwise"])

    for edit, says in (
        (nested, "signature.otherwise.otherwise: an otherwise has no otherwise of its own"),
        (
            lambda d: d["signature"]["otherwise"].pop("requires"),
            "signature.otherwise.requires: say what it reads in their place",
        ),
        (
            lambda d: d["signature"].pop("requires"),
            "signature.otherwise: judged where requires has no series: name them",
        ),
    ):
        path = _with(tmp_path, "container-oom-killed", edit)
        with pytest.raises(CatalogError, match=re.escape(says)):
            load_playbook(path)


def _site_playbooks(tmp_path, explains: dict[str, list[str]]) -> None:
    """A site's own playbooks (copies of queue-saturation) that explain the others given."""
    base = yaml.safe_load((builtin_dir() / "queue-saturation.yaml").read_text())
    for pid, ids in explains.items():
        data = {**base, "id": pid, "seed": {"symptoms": []}}
        data["alert"] = {**base["alert"], "name": "Vllm" + pid.title().replace("-", "")}
        data["signature"] = {**base["signature"], "explains": ids}
        (tmp_path / f"{pid}.yaml").write_text(yaml.safe_dump(data))


def test_a_cycle_of_explanations_is_refused(tmp_path):
    _site_playbooks(tmp_path, {"site-a": ["site-b"], "site-b": ["site-c"], "site-c": ["site-a"]})
    with pytest.raises(CatalogError, match="cycle site-a -> site-b -> site-c -> site-a"):
        load_catalog(tmp_path)


def test_two_playbooks_may_explain_each_other(tmp_path):
    """Each can be the other's consequence; the order of events decides (see test_rank)."""
    _site_playbooks(tmp_path, {"site-a": ["site-b"], "site-b": ["site-a"]})
    cat = load_catalog(tmp_path)
    assert cat["site-a"].signature.explains == ("site-b",)


def test_an_override_of_a_bound_parameter_changes_the_signature_too(catalog):
    from diagnoser.site import Site
    from diagnoser.site.config import AlertOverride, SiteConfig

    cfg = SiteConfig(alerts={"VllmKvCachePressure": AlertOverride(params={"kv_usage": 0.95})})
    pb = Site.build(cfg, catalog).catalog["kv-cache-pressure"]
    assert pb.alert.params["kv_usage"] == 0.95
    (cond,) = [c for c in pb.signature.all if c.param == "kv_usage"]
    assert cond.value == 0.95 and catalog["kv-cache-pressure"].alert.params["kv_usage"] == 0.9


def test_a_threshold_can_be_bound_only_to_a_shape_with_one(tmp_path):
    def bind_tracks(d):
        d["signature"]["supporting"].append(
            {"signal": "itl_p99", "tracks": "prompt_tokens_rate", "param": "corr"}
        )

    path = _with(tmp_path, "prompt-length-shift", bind_tracks)
    with pytest.raises(CatalogError, match="'tracks' has no threshold to bind"):
        load_catalog(path.parent)
