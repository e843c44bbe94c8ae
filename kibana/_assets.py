"""The packaged template and saved-object files, read as data (see :mod:`kibana`)."""


from __future__ import annotations

import copy
import functools
import json
from importlib import resources
from typing import Any

__all__ = ["FLAVOURS", "SAVED_OBJECT_FILES", "load_template", "saved_objects", "saved_objects_path"]

FLAVOURS = ("kibana", "opensearch-dashboards")
SAVED_OBJECT_FILES = {"kibana": "kibana.ndjson", "opensearch-dashboards": "opensearch-dashboards.ndjson"}


@functools.cache
def _read_json(name: str) -> Any:
    return json.loads(resources.files(__package__ or "kibana").joinpath("templates").joinpath(name).read_text(encoding="utf-8"))


def load_template(name: str) -> Any:
    """A fresh (deep-copied) body from ``templates/<name>.json``."""
    return copy.deepcopy(_read_json(name if name.endswith(".json") else name + ".json"))


def saved_objects_path(flavour: str) -> Any:
    """The packaged NDJSON file for ``kibana`` or ``opensearch-dashboards`` (a Traversable)."""
    if flavour not in SAVED_OBJECT_FILES:
        raise ValueError(f"unknown dashboards flavour {flavour!r}; one of {', '.join(FLAVOURS)}")
    return resources.files(__package__ or "kibana").joinpath("saved_objects").joinpath(SAVED_OBJECT_FILES[flavour])


def saved_objects(flavour: str) -> bytes:
    """The NDJSON bytes to import into Kibana (``kibana``) or OpenSearch Dashboards."""
    data: bytes = saved_objects_path(flavour).read_bytes()
    return data
