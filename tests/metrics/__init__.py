"""Tests of the metrics path (``jobtrace metrics``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import orjson


def last_losses(job_dir: Path) -> dict[str, float]:
    """Each rank's last logged loss, read from the job's own store: what a receiver must end up holding."""
    events = [orjson.loads(line) for f in job_dir.glob("*.jsonl") for line in f.read_bytes().splitlines()]
    last: dict[str, float] = {}
    for e in sorted((e for e in events if e.get("kind") == "metric" and "loss" in (e.get("metrics") or {})),
                    key=lambda e: e["ts"]):
        last[str(e["rank"])] = e["metrics"]["loss"]
    return last


def wait_for_series(query: Callable[[str], list[dict]], promql: str, n: int, timeout: float = 90) -> list[dict]:
    """``query(promql)`` once it returns ``n`` series or more (a server ingests and evaluates on its own clock)."""
    deadline = time.monotonic() + timeout
    result: list[dict] = []
    while time.monotonic() < deadline:
        result = query(promql)
        if len(result) >= n:
            return result
        time.sleep(1)
    raise AssertionError(f"{promql}: {len(result)} series after {timeout}s, wanted {n}: {result}")
