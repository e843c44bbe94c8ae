"""Tests of the compiled parts: where CI builds them their absence fails; elsewhere those tests are skipped."""

from __future__ import annotations

import os
from types import ModuleType

import pytest


def need_native() -> ModuleType:
    """``otel_instrumentation._native``: CI builds the compiled parts (their absence fails there); elsewhere a skip."""
    if os.environ.get("CI"):
        from otel_instrumentation import _native

        return _native
    return pytest.importorskip("otel_instrumentation._native", reason="jobtrace_native is built by `pip install -e .` where a Rust toolchain is found")
