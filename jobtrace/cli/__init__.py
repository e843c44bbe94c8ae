"""Command line: ``trace-job`` (the lookup) and ``jobtrace`` (demo, jobs, and the rest).

One module per command group: :mod:`.trace` (``trace-job``, ``jobtrace trace``),
:mod:`.ingest`, :mod:`.store` (``jobs``, ``export``, ``replay``), :mod:`.golden`,
:mod:`.setup`, :mod:`.demo` and :mod:`.watch`. :mod:`.exitcodes` maps every error to the exit code
it ends a command with, the same for every command:

    0    healthy, or done: no problem found, everything sent
    1    problem found (a slow, stalled or silent rank, NaN loss, something unsent, a refusal)
    2    usage error: a bad option or argument
    3    error: any JobtraceError (a bad variable or missing URL, job not found, store unreadable,
         backend unreachable)
    4    internal error: any other exception (a bug); one line, the traceback with --debug
    130  interrupted (Ctrl-C)
"""

from __future__ import annotations

import click

from .demo import demo
from .exitcodes import EXIT_ERROR, EXIT_HEALTHY, EXIT_INTERNAL, EXIT_PROBLEM, EXIT_USAGE, Group
from .golden import golden
from .ingest import ingest_command
from .metrics import metrics_command
from .options import version_option
from .setup import setup
from .store import archive, export, jobs, prune_command, replay
from .trace import trace_job, trace_job_main
from .watch import watch

__all__ = ["EXIT_ERROR", "EXIT_HEALTHY", "EXIT_INTERNAL", "EXIT_PROBLEM", "EXIT_USAGE", "main", "trace_job",
           "trace_job_main"]


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@version_option
def main() -> None:
    """jobtrace: one trace for every rank of a distributed training job.

    \b
    Examples:
      jobtrace demo --slow-rank 2          # a real job with a fault, traced
      jobtrace jobs                        # the store's jobs and their state
      jobtrace trace run-17                # the same as: trace-job run-17
      jobtrace ingest logs/ --job run-17   # log files into events
      eval "$(_JOBTRACE_COMPLETE=bash_source jobtrace)"  # docs/cli.md

    Settings come from arguments, then JOBTRACE_* variables, then jobtrace.toml (or
    [tool.jobtrace] in pyproject.toml): docs/configuration.md.

    Exit status: 0 healthy or done, 1 problem found, 2 usage error, 3 error (job not found, store
    unreadable, backend unreachable), 4 internal error (rerun with --debug); the same for every
    command, whose help says what each means for it.
    """


for _command, _name in ((trace_job, "trace"), (ingest_command, "ingest"), (setup, "setup"), (replay, "replay"),
                        (export, "export"), (jobs, "jobs"), (golden, "golden"), (demo, "demo"), (watch, "watch"),
                        (metrics_command, "metrics"), (prune_command, "prune"),
                        (archive, "archive")):
    main.add_command(_command, name=_name)
