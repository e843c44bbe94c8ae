"""Shared fixtures. Real servers come from tests/servers (VictoriaLogs, OpenSearch, Jaeger)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.compiled import need_native

pytest_plugins = ["tests.servers.fixtures"]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _no_tracing_outlives_its_test():
    """A test that failed before shutting its tracing down must not hand it to the next test.

    ``init_tracing`` returns the live handle when one exists, so a leftover would send the
    next test's events to the failed test's store and fail it too.
    """
    yield
    import otel_instrumentation as oi

    leftover = oi.get_tracing()
    if leftover is not None:
        leftover.shutdown(timeout_s=5)


@pytest.fixture(params=["native", "python"])
def tracing(request, tmp_path, monkeypatch):
    """A live ``init_tracing`` for this test, writing to a temporary store; shut down afterwards.

    Once with the compiled recorder (``jobtrace_native``, which CI builds) and once with the Python one.
    """
    import otel_instrumentation as oi

    for var in [v for v in os.environ if v.startswith(("JOBTRACE_", "SLURM_", "OMPI_", "PMI_")) or v in
                ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "TRACEPARENT")]:
        monkeypatch.delenv(var, raising=False)
    if request.param == "native":
        need_native()
    monkeypatch.setenv("JOBTRACE_NATIVE", "1" if request.param == "native" else "0")
    t = oi.init_tracing("test-job", data_dir=str(tmp_path), heartbeat_s=0.2, torch=False)
    kind = type(t.recorder).__name__
    if kind != {"native": "NativeRecorder", "python": "Recorder"}[request.param]:
        t.shutdown()
        pytest.fail(f"asked for the {request.param} recorder, got {kind} (CI builds the compiled parts: it must be there)")
    yield t
    t.shutdown()


def read_events(directory: Path) -> list[dict]:
    """Every complete event line in a job directory, as dicts."""
    import orjson

    out = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_bytes().splitlines(keepends=True):
            if line.endswith(b"\n"):
                out.append(orjson.loads(line))
    return out


def python_env(**extra: str) -> dict[str, str]:
    """Environment for a child Python process with launcher variables removed."""
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith(("JOBTRACE_", "SLURM_", "OMPI_", "PMI_")) and k != "JOBTRACE_SERVERS_CACHE")
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "TRACEPARENT")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


PYTHON = sys.executable
