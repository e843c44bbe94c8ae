"""Tests of the metrics path (``jobtrace metrics``)."""

from __future__ import annotations

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
