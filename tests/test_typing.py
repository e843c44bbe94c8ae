"""The packages type-check under the strict mypy configuration in pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["otel_instrumentation", "shippers", "queries", "ingest", "jobtrace", "loki", "kibana"]


def test_mypy_strict_reports_no_errors():
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", *PACKAGES],
        cwd=ROOT, capture_output=True, text=True, timeout=500, check=False,
    )
    assert proc.returncode == 0, f"mypy failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"
