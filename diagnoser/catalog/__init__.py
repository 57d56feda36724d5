"""The playbook catalog: the model, the loader with its schema, and the shape registry."""

from diagnoser.catalog.loader import (
    BY,
    PLACEHOLDER,
    TARGETS,
    Catalog,
    CatalogError,
    builtin_dir,
    load_catalog,
    load_playbook,
    playbook_files,
    with_param,
)
from diagnoser.catalog.model import CHAPTERS, GROUPS, Alert, Condition, Playbook, Signature

__all__ = [
    "BY",
    "CHAPTERS",
    "GROUPS",
    "PLACEHOLDER",
    "TARGETS",
    "Alert",
    "Catalog",
    "CatalogError",
    "Condition",
    "Playbook",
    "Signature",
    "builtin_dir",
    "load_catalog",
    "load_playbook",
    "playbook_files",
    "with_param",
]
