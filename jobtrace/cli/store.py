"""``jobtrace jobs``, ``export`` and ``replay``: the embedded store's jobs, and moving them to a server."""

from __future__ import annotations

from typing import Final

import click

from jobtrace import config

from .exitcodes import Command, finish
from .options import Duration, backend_option

SHIP_TO: Final = ("loki", "victorialogs", "elasticsearch")
"""The servers ``export`` and ``replay`` send to: ``shippers.SHIPPER_BACKENDS``, spelled here so that
reading the options imports no shipper (a test holds the two equal)."""

__all__ = ["archive", "export", "jobs", "prune_command", "replay"]


@click.command(cls=Command)
@click.argument("spool_dir", type=click.Path(exists=True, file_okay=False))
@backend_option(SHIP_TO, default=None, help="The spool's backend.")
@click.option("--url", default=None,
              help="Server URL (default JOBTRACE_LOKI_URL / JOBTRACE_VL_URL / JOBTRACE_ES_URL).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(0, min_open=True), default=600.0, show_default=True,
              help="Give up waiting after this many seconds (what is left stays spooled).")
def replay(spool_dir: str, backend: str, url: str | None, timeout_s: float) -> None:
    """Send what a shipper left in SPOOL_DIR (a server outage outlasting the job), in order, then exit.

    Exit status: 0 all sent, 1 some left (still spooled), 2 usage error, 3 error (server unreachable
    or refusing, spool in use), 4 internal error (rerun with --debug).
    """
    import os
    from pathlib import Path

    from rich.console import Console

    from shippers import ProcessInfo, open_shipper

    console = Console(stderr=True)
    path = Path(spool_dir)
    info = ProcessInfo("replay", "replay", 0, os.getpid(), path.parent, spool_override=path)
    shipper = open_shipper(backend, info, url)
    pending = shipper.spool.pending_bytes()
    done = shipper.wait_idle(timeout_s)
    shipper.close()
    stats = shipper.stats
    console.print(f"replayed {pending} bytes: {stats.sent} events accepted, {stats.rejected} refused "
                  f"(dead-letter: {shipper.dead_letter.path}), {stats.spooled_bytes} bytes left")
    finish(done)


@click.command(name="export", cls=Command)
@click.argument("job_id")
@backend_option(SHIP_TO, default=None, help="Where to send the job.")
@click.option("--url", default=None,
              help="Server URL (default JOBTRACE_LOKI_URL / JOBTRACE_VL_URL / JOBTRACE_ES_URL).")
@click.option("--data-dir", envvar=config.DATA_DIR, default="jobtrace-data", show_default=True)
@click.option("--timeout", "timeout_s", type=click.FloatRange(0, min_open=True), default=600.0, show_default=True,
              help="Stop after this many seconds; what the server has not taken is reported (a rerun is safe).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def export(job_id: str, backend: str, url: str | None, data_dir: str, timeout_s: float, as_json: bool) -> None:
    """Send JOB_ID from the embedded store to Loki, VictoriaLogs or Elasticsearch/OpenSearch (credentials from the environment).

    Exit status: 0 everything accepted, 1 something not sent or refused (see the summary), 2 usage
    error, 3 error (job not found, server unreachable), 4 internal error (rerun with --debug).
    """
    import orjson
    from rich.console import Console
    from rich.progress import Progress

    from shippers import export_job

    console = Console(stderr=True)
    with Progress(console=console, transient=True, disable=as_json or not console.is_terminal) as bar:
        task = bar.add_task(f"export {job_id}", total=None)
        summary = export_job(data_dir, job_id, backend, url=url, timeout_s=timeout_s,
                             progress=lambda done, total: bar.update(task, completed=done, total=total))
    if as_json:
        click.echo(orjson.dumps(summary.to_dict(), option=orjson.OPT_INDENT_2).decode())
    else:
        s = summary
        console.print(f"exported {s.job} to {s.backend}: {s.files} files ({s.from_segments} rebuilt from segments), "
                      f"{s.lines} lines, {s.sent} accepted, {s.refused} refused, {s.torn} torn and {s.corrupt} corrupt lines skipped "
                      f"in {s.seconds:.1f}s", highlight=False)
        if s.refused:
            console.print(f"refused lines are kept in {s.dead_letter}", highlight=False)
        if s.left_bytes:
            console.print(f"{s.left_bytes} bytes not yet accepted: jobtrace replay {s.spool} --backend {s.backend}",
                          highlight=False)
        if s.unread_files:
            console.print(f"{len(s.unread_files)} files not sent before the timeout; run the export again "
                          "(Elasticsearch and Loki keep one copy of a line sent twice)", highlight=False)
    finish(summary.complete)


@click.command(cls=Command)
@click.option("--data-dir", envvar=config.DATA_DIR, default="jobtrace-data", show_default=True)
def jobs(data_dir: str) -> None:
    """List the jobs in the embedded store.

    Exit status: 0 listed, 2 usage error, 3 error (store unreadable), 4 internal error (rerun with --debug).
    """
    from queries import list_local_jobs

    for job in list_local_jobs(data_dir):
        click.echo(job)


@click.command(name="prune", cls=Command)
@click.option("--older-than", "older_than", type=Duration(), envvar=config.RETENTION_LOGS, default="7d",
              show_default=True, help="Prune jobs whose newest file is older than this (7d, 36h, 2w; default "
              "JOBTRACE_RETENTION_LOGS).")
@click.option("--data-dir", envvar=config.DATA_DIR, default="jobtrace-data", show_default=True)
@click.option("--dry-run", is_flag=True, help="Say what would be freed; change nothing.")
def prune_command(older_than: float, data_dir: str, dry_run: bool) -> None:
    """Delete the raw JSON lines of quiet jobs, keeping what trace-job reads (segments and rollups).

    Each rank's lines file goes once a Parquet segment holds the same events (written now for ranks
    that died before writing theirs); trace-job gives the same report from the segments alone. A file
    that cannot become a segment (a torn or invalid line) is kept, and said. The spool of lines not
    yet shipped, Flight Recorder dumps, the ingest ledger and golden runs are never touched.

    \b
    Examples:
      jobtrace prune                      # JOBTRACE_RETENTION_LOGS, 7 days by default
      jobtrace prune --older-than 2w --dry-run

    Exit status: 0 done, 2 usage error, 3 error (store unreadable), 4 internal error.
    """
    from jobtrace.store import prune

    report = prune(data_dir, older_than, dry_run=dry_run)
    verb = "would free" if dry_run else "freed"
    click.echo(f"{len(report.jobs)} job(s) pruned, {report.skipped_recent} more recent left alone; "
               f"{report.files_removed} lines file(s) removed, {verb} {report.bytes_freed / 1e6:.1f} MB"
               + (f"; {report.segments_written} segment(s) written for ranks that had none"
                  if report.segments_written else ""))
    for path in report.kept:
        click.echo(f"kept {path}: it has a torn or invalid line, so no segment can stand for it", err=True)
    finish(True)


@click.command(name="archive", cls=Command)
@click.argument("job_id")
@click.option("--to", "url", required=True, metavar="s3://BUCKET/PREFIX",
              help="Where the job goes (any S3-compatible store; AWS_ENDPOINT_URL for MinIO, SeaweedFS, Ceph).")
@click.option("--data-dir", envvar=config.DATA_DIR, default="jobtrace-data", show_default=True)
def archive(job_id: str, url: str, data_dir: str) -> None:
    """Copy a job's store to object storage: its lines (zstd), segments, rollups and dumps, and a manifest.

    The cold tier of the retention policy: read it back with
    `trace-job JOB --backend archive --url s3://BUCKET/PREFIX` (every object is checked against the
    manifest, written last, so an unfinished archive is never read as a partial job). Credentials and
    region come the standard AWS way (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION).

    \b
    Examples:
      jobtrace archive run-17 --to s3://training-logs/jobtrace
      AWS_ENDPOINT_URL=http://seaweedfs:8333 jobtrace archive run-17 --to s3://logs

    Exit status: 0 archived, 2 usage error, 3 error (no such job, the store refused), 4 internal error.
    """
    from jobtrace.store import archive_job

    report = archive_job(data_dir, job_id, url)
    click.echo(f"archived {job_id} to {report.url}: {report.objects} objects, {report.bytes_local / 1e6:.1f} MB "
               f"stored as {report.bytes_stored / 1e6:.1f} MB (manifest last)")
    finish(True)
