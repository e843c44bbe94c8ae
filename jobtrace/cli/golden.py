"""``jobtrace golden JOB``: keep a finished job as a reference run for ``trace-job --compare-to``."""

from __future__ import annotations

import sys

import click
from rich.console import Console

from jobtrace import config
from jobtrace.errors import JobtraceError, Refused

from .exitcodes import EXIT_PROBLEM, fail

__all__ = ["golden"]


@click.command()
@click.argument("job_id")
@click.option("--data-dir", envvar=config.DATA_DIR, default="jobtrace-data", show_default=True)
@click.option("--name", default=None, help="Name of the reference (default: the job id).")
@click.option("--golden-dir", default=None, help="Where golden runs are kept (default <data-dir>/.golden).")
@click.option("--force", is_flag=True, help="Keep the job even if its own report is not healthy.")
def golden(job_id: str, data_dir: str, name: str | None, golden_dir: str | None, force: bool) -> None:
    """Mark the finished job JOB_ID as a golden (reference) run for `trace-job --compare-to`."""
    from queries import mark_golden

    try:
        path, _ = mark_golden(job_id, data_dir, name, golden_dir, force=force)
    except Refused as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_PROBLEM)
    except JobtraceError as exc:
        fail(Console(stderr=True), exc)
        return
    click.echo(f"golden run {name or job_id} saved to {path}")
