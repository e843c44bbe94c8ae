"""Real demo jobs whose ranks ship where the environment says, as a user's would."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def jobtrace_env(**variables: str) -> Iterator[None]:
    """Only these ``JOBTRACE_`` variables set (the session's others unset) until the block ends."""
    saved = dict(os.environ)
    for var in [v for v in os.environ if v.startswith("JOBTRACE_")]:
        del os.environ[var]
    os.environ.update(variables)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_demo(env: dict[str, str], **cfg: Any) -> int:
    """``jobtrace.demo.run_job(DemoConfig(**cfg))`` under :func:`jobtrace_env` ``(**env)``."""
    from jobtrace.demo import DemoConfig, run_job

    with jobtrace_env(**env):
        return run_job(DemoConfig(**cfg))
