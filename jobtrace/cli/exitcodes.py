"""The exit codes of every jobtrace command, so ``trace-job`` can gate a pipeline.

    0  healthy: no problem found
    1  problem found (a slow, stalled or silent rank, NaN loss, …)
    2  usage error (bad option)
    3  error: job not found, store unreadable, backend unreachable
"""

from __future__ import annotations

import sys
from typing import NoReturn

from rich.console import Console

EXIT_HEALTHY, EXIT_PROBLEM, EXIT_USAGE, EXIT_ERROR = 0, 1, 2, 3

__all__ = ["EXIT_ERROR", "EXIT_HEALTHY", "EXIT_PROBLEM", "EXIT_USAGE", "fail"]


def fail(console: Console, exc: Exception) -> NoReturn:
    console.print(f"[bold red]error:[/] {exc}", highlight=False)
    sys.exit(EXIT_ERROR)
