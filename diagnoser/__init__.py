"""servediag: observability and diagnosis for LLM inference servers (vLLM, SGLang).

From Python (a notebook, a script)::

    import diagnoser
    d = diagnoser.diagnose("http://prometheus:9090", since="1h")
    d.findings[0].playbook.id          # the likely cause
    d.findings_frame()                 # pandas: each finding with its numbers
    d.to_frame()                       # pandas: every series it read, long format

``diagnose`` and ``kv_budget`` are documented in ``diagnoser.api``. The names below are
imported when first used, so ``import diagnoser`` stays as quick as the command line's start.
"""

from __future__ import annotations

# Not ``typing.TYPE_CHECKING``: importing typing alone costs more than this package's start.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from diagnoser.api import connect, diagnose, kv_budget
    from diagnoser.diagnosis.model import Diagnosis
    from diagnoser.plumbing.errors import UserError
    from diagnoser.plumbing.source import SourceError
    from diagnoser.whatif.setup import SetupOptions

__all__ = [
    "Diagnosis",
    "SetupOptions",
    "SourceError",
    "UserError",
    "connect",
    "diagnose",
    "kv_budget",
]

_WHERE = {
    "diagnose": "diagnoser.api",
    "kv_budget": "diagnoser.api",
    "connect": "diagnoser.api",
    "Diagnosis": "diagnoser.diagnosis.model",
    "SourceError": "diagnoser.plumbing.source",
    "UserError": "diagnoser.plumbing.errors",
    "SetupOptions": "diagnoser.whatif.setup",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'diagnoser' has no attribute {name!r}")
