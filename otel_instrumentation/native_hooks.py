"""The compiled process-group hooks (``native/pg_hooks/pg_hooks.cpp``): built once per torch, loaded where built.

Python hooks on a process group cost each collective two or three hand-overs of the GIL, since
DDP's reducer issues its all-reduces from the autograd engine, which runs without it; on a busy
host that is most of what tracing DDP costs (docs/performance.md). The same hooks in C++ never take
the GIL: they keep their records under a mutex until :meth:`GroupHooks.drain` (the heartbeat thread)
turns them into the recorder's items.

They must be compiled against the torch that runs the job, so no wheel can carry them:
``python -m otel_instrumentation.native_hooks`` (or :func:`build`) compiles them with
``torch.utils.cpp_extension`` (a C++ compiler and ninja; about 20 s) into
``$JOBTRACE_CACHE_DIR/pg_hooks/<torch version>-<source hash>/``. :func:`load` only loads what is
built there: tracing never compiles in a training job. ``JOBTRACE_NATIVE_HOOKS=0`` keeps the
Python hooks.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from jobtrace import config

__all__ = ["build", "built_path", "load"]

NAME = "jobtrace_pg_hooks"
SOURCE = Path(__file__).resolve().parent.parent / "native" / "pg_hooks" / "pg_hooks.cpp"
_loaded: ModuleType | None = None


def _folder() -> Path | None:
    """Where this torch's build lives (None when the source is not here: an install without native/)."""
    try:
        import torch
    except Exception:  # noqa: BLE001
        return None
    if not SOURCE.is_file():
        return None
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    root = Path(config.get_str(config.CACHE_DIR) or Path.home() / ".cache" / "jobtrace")
    return root / "pg_hooks" / f"torch-{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}-{digest}"


def built_path() -> Path | None:
    """The compiled module for this torch, where it has been built."""
    folder = _folder()
    if folder is None:
        return None
    path = folder / f"{NAME}.so"
    return path if path.is_file() else None


def load() -> ModuleType | None:
    """The compiled hooks where built for this torch and not turned off; else None (the Python hooks)."""
    global _loaded
    if _loaded is not None:
        return _loaded
    if not config.get_bool(config.NATIVE_HOOKS, default=True):
        return None
    path = built_path()
    if path is None:
        return None
    try:
        import torch  # noqa: F401 - its libraries must be loaded before the module's

        loader = importlib.machinery.ExtensionFileLoader(NAME, str(path))
        spec = importlib.util.spec_from_file_location(NAME, str(path), loader=loader)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    except Exception:  # noqa: BLE001 - a stale or broken build: the Python hooks stand in
        return None
    _loaded = module
    return module


def build(verbose: bool = False) -> Path:
    """Compile the hooks for this torch (a no-op where built); returns the module's path."""
    folder = _folder()
    if folder is None:
        raise RuntimeError("the compiled hooks need torch and the source tree's native/pg_hooks")
    folder.mkdir(parents=True, exist_ok=True)
    from torch.utils import cpp_extension

    cpp_extension.load(name=NAME, sources=[str(SOURCE)], build_directory=str(folder), extra_cflags=["-O2"],
                       verbose=verbose)
    path = folder / f"{NAME}.so"
    if not path.is_file():
        raise RuntimeError(f"the build left no {path.name} in {folder}")
    return path


if __name__ == "__main__":
    print(build(verbose="-v" in sys.argv))
