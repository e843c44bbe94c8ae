"""Run a function when a module is imported (now, if it already is): how integrations attach without a line.

A training script may import ``transformers`` before or after ``init_tracing``; importing it ourselves
would cost seconds in scripts that never use it. A finder at the head of ``sys.meta_path`` answers
only for the watched names: it asks the other finders for the real spec and wraps its loader so that,
once the module has executed, the hook runs with it. A hook's failure is reported once and never
breaks the import.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = ["when_imported"]

Hook = Callable[[ModuleType], None]
_lock = threading.Lock()
_hooks: dict[str, list[Hook]] = {}
_finder: _Finder | None = None


def when_imported(name: str, hook: Hook, on_error: Callable[[str, BaseException], None] | None = None) -> None:
    """Call ``hook(module)`` once ``name`` is imported: at once if it is already in ``sys.modules``."""
    global _finder
    guarded = _guard(name, hook, on_error)
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _hooks.setdefault(name, []).append(guarded)
            if _finder is None:
                _finder = _Finder()
                sys.meta_path.insert(0, _finder)
    if module is not None:
        guarded(module)


def _guard(name: str, hook: Hook, on_error: Callable[[str, BaseException], None] | None) -> Hook:
    def run(module: ModuleType) -> None:
        try:
            hook(module)
        except Exception as exc:  # noqa: BLE001 - an integration must never break the user's import
            if on_error is not None:
                on_error(name, exc)

    return run


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname not in _hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _Loader(spec.loader, fullname)
                return spec
            if spec is not None:
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any, name: str) -> None:
        self._inner = inner
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._inner, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        with _lock:
            hooks = _hooks.pop(self._name, [])
        for hook in hooks:
            hook(module)

    def __getattr__(self, item: str) -> Any:  # get_resource_reader, is_package… of the real loader
        return getattr(self._inner, item)
