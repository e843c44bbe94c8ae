"""``jobtrace golden JOB``: keep a finished job as a reference run for ``trace-job --compare-to``."""

from __future__ import annotations

import click

from jobtrace import config

from .exitcodes import Command

__all__ = ["golden"]


@click.command(cls=Command)
@click.argument("job_id")
@click.option("--data-dir", envvar=config.DATA_DIR, default="jobtrace-data", show_default=True)
@click.option("--name", default=None, help="Name of the reference (default: the job id).")
@click.option("--golden-dir", default=None, help="Where golden runs are kept (default <data-dir>/.golden).")
@click.option("--force", is_flag=True, help="Keep the job even if its own report is not healthy.")
def golden(job_id: str, data_dir: str, name: str | None, golden_dir: str | None, force: bool) -> None:
    """Mark the finished job JOB_ID as a golden (reference) run for `trace-job --compare-to`.

    Exit status: 0 saved, 1 refused (the job is not healthy; --force keeps it), 2 usage error,
    3 error (job not found), 4 internal error (rerun with --debug).
    """
    from queries import mark_golden

    path, _ = mark_golden(job_id, data_dir, name, golden_dir, force=force)  # Refused: exit 1
    click.echo(f"golden run {name or job_id} saved to {path}")
