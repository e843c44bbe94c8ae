"""``import jobtrace``: the instrumentation's names, resolved lazily, and the compiled entry points while tracing runs."""

from __future__ import annotations

import subprocess
import textwrap

import jobtrace
import otel_instrumentation
from tests.conftest import PYTHON, python_env

NAMES = ("init_tracing", "step", "phase", "span", "log_metrics", "get_tracing", "Tracing", "guard")


def run(code: str, tmp_path) -> str:
    proc = subprocess.run([PYTHON, "-c", textwrap.dedent(code)], env=python_env(), capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_the_documented_names_are_the_instrumentations():
    from otel_instrumentation import _setup

    for name in NAMES:
        assert getattr(jobtrace, name) is getattr(otel_instrumentation, name), name
    assert jobtrace.get_tracing() is otel_instrumentation.get_tracing()
    assert set(NAMES) | {"__version__"} == set(jobtrace.__all__) and set(NAMES) <= set(dir(jobtrace))
    if jobtrace.get_tracing() is None:
        assert jobtrace.step is _setup.step and jobtrace.phase("x") is _setup._NULL_SPAN
    assert isinstance(jobtrace.__version__, str)


def test_an_unknown_name_is_an_attribute_error():
    import pytest

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        jobtrace.nope


def test_the_core_and_the_version_never_import_the_instrumentation(tmp_path):
    """``import jobtrace.events`` is what every layer does: it must not pull in the training-side package."""
    out = run("""
        import sys
        import jobtrace, jobtrace.events, jobtrace.identity, jobtrace.store
        from jobtrace import __version__
        before = sorted(m for m in sys.modules if m.split(".")[0] == "otel_instrumentation")
        jobtrace.init_tracing
        print(before, "otel_instrumentation" in sys.modules)
    """, tmp_path)
    assert out == "[] True"


def test_while_tracing_runs_the_facades_entry_points_are_the_compiled_ones_too(tmp_path):
    """Resolved before init_tracing, during it, and after shutdown: always what otel_instrumentation has."""
    out = run("""
        import jobtrace, otel_instrumentation as oi
        from otel_instrumentation import _setup
        names = ("step", "phase", "span", "log_metrics")
        before = [getattr(jobtrace, n) is getattr(_setup, n) for n in names]
        t = jobtrace.init_tracing("facade", data_dir="store", torch=False, console=False)
        entry = t.recorder.entry_points()
        # (a bound method is a new object at each lookup: the entry points compare equal, the names are one object)
        during = [getattr(jobtrace, n) is getattr(oi, n) and getattr(oi, n) == entry.get(n, getattr(_setup, n))
                  for n in names]
        with jobtrace.step(1):
            with jobtrace.phase("forward"):
                jobtrace.log_metrics(loss=0.5)
        t.shutdown()
        after = [getattr(jobtrace, n) is getattr(_setup, n) for n in names]
        print(all(before), all(during), all(after), bool(entry), type(t.recorder).__name__)
    """, tmp_path)
    native = out.endswith("NativeRecorder")
    assert out.split()[:4] == ["True", "True", "True", str(native)], out


def test_resolved_first_while_tracing_the_facade_gets_the_live_entry_points(tmp_path):
    out = run("""
        import otel_instrumentation as oi
        t = oi.init_tracing("facade2", data_dir="store", torch=False, console=False)
        import jobtrace
        print(jobtrace.phase is oi.phase, jobtrace.span is oi.span, type(t.recorder).__name__)
        t.shutdown()
        print(jobtrace.phase is oi.phase is oi._setup.phase)
    """, tmp_path)
    assert out.split()[:2] == ["True", "True"] and out.split()[-1] == "True", out
