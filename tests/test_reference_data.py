"""The reference data in tests/data is what scripts/extract-reference takes from the design
material, when that material is beside the checkout (skipped, saying why, when it is not)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _extractor() -> ModuleType:
    path = ROOT / "scripts" / "extract-reference"
    loader = importlib.machinery.SourceFileLoader("extract_reference", str(path))
    spec = importlib.util.spec_from_loader("extract_reference", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "name",
    [
        "reference-metric-types.json",
        "design-ids.json",
        "seed-lines.json",
        "gpu-step-costs.json",
    ],
)
def test_the_committed_extract_is_current(name, shared_dir):
    fresh = _extractor().render(shared_dir)[name]
    committed = (ROOT / "tests" / "data" / name).read_text(encoding="utf-8")
    assert committed == fresh, f"tests/data/{name} is stale: run scripts/extract-reference"
