"""Building a Go server from the module proxy into the cache: shared by VictoriaLogs and Jaeger."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .base import ServerError, build_lock, cache_dir, run_logged


def go_binary() -> str:
    """``$JOBTRACE_GO``, else the toolchain install-toolchains.sh put in the cache, else PATH."""
    bootstrapped = str(cache_dir() / "go" / "bin" / "go")
    for cand in (os.environ.get("JOBTRACE_GO"), bootstrapped, shutil.which("go"), "/usr/local/go/bin/go"):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise ServerError("no Go toolchain found: set JOBTRACE_GO or run tests/servers/install-toolchains.sh")


def build_go_server(name: str, version: str, package: str, binary_name: str, ldflags: str = "") -> Path:
    """Return ``<cache>/<name>-<version>/bin/<binary_name>``, building ``package@version`` on first use.

    ``go install`` first; a release whose go.mod carries ``replace`` directives refuses
    that, and is then built from a throwaway tools module (``go get -tool``), where a
    dependency's ``replace`` is ignored. GOMODCACHE/GOCACHE keep their defaults, so a
    rebuild after a cache wipe is fast. ``CGO_ENABLED=0``: no C toolchain needed.
    """
    root = cache_dir() / f"{name}-{version}"
    binary = root / "bin" / binary_name
    if binary.is_file():
        return binary
    with build_lock(name):
        if binary.is_file():
            return binary
        tmp = root.with_name(root.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "bin").mkdir(parents=True)
        log = cache_dir() / f"{name}-{version}-build.log"
        log.unlink(missing_ok=True)
        env = dict(os.environ, CGO_ENABLED="0", GOBIN=str(tmp / "bin"),
                   GOTOOLCHAIN=os.environ.get("JOBTRACE_GOTOOLCHAIN", "auto"))
        go = go_binary()
        flags = ["-ldflags", ldflags] if ldflags else []
        try:
            run_logged([go, "install", *flags, f"{package}@{version}"], log, env=env)
        except ServerError:
            if "replace directives" not in log.read_text(errors="replace"):
                raise
            mod = tmp / "toolsmod"
            mod.mkdir()
            run_logged([go, "mod", "init", f"jobtrace/{name}tools"], log, cwd=mod, env=env)
            run_logged([go, "get", "-tool", f"{package}@{version}"], log, cwd=mod, env=env)
            run_logged([go, "build", *flags, "-o", str(tmp / "bin" / binary_name), package], log, cwd=mod, env=env)
        (root / "bin").mkdir(parents=True, exist_ok=True)
        os.replace(tmp / "bin" / binary_name, binary)
        shutil.rmtree(tmp, ignore_errors=True)
    return binary
