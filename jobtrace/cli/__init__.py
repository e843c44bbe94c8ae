"""Command line: ``trace-job`` (the lookup) and ``jobtrace`` (demo, jobs, and the rest).

One module per command group: :mod:`.trace` (``trace-job``, ``jobtrace trace``),
:mod:`.ingest`, :mod:`.store` (``jobs``, ``export``, ``replay``), :mod:`.golden`,
:mod:`.setup` and :mod:`.demo`; :mod:`.exitcodes` holds the exit codes:

    0  healthy: no problem found
    1  problem found (a slow, stalled or silent rank, NaN loss, …)
    2  usage error (bad option)
    3  error: job not found, store unreadable, backend unreachable
"""

from __future__ import annotations

import click

from .demo import demo
from .exitcodes import EXIT_ERROR, EXIT_HEALTHY, EXIT_PROBLEM, EXIT_USAGE
from .golden import golden
from .ingest import ingest_command
from .setup import setup
from .store import export, jobs, replay
from .trace import trace_job, trace_job_main

__all__ = ["EXIT_ERROR", "EXIT_HEALTHY", "EXIT_PROBLEM", "EXIT_USAGE", "main", "trace_job", "trace_job_main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="jobtrace")
def main() -> None:
    """jobtrace: one trace for every rank of a distributed training job."""


for _command, _name in ((trace_job, "trace"), (ingest_command, "ingest"), (setup, "setup"), (replay, "replay"),
                        (export, "export"), (jobs, "jobs"), (golden, "golden"), (demo, "demo")):
    main.add_command(_command, name=_name)
