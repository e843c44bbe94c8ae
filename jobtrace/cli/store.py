"""``jobtrace jobs``, ``export`` and ``replay``: the embedded store's jobs, and moving them to a server."""

from __future__ import annotations

import datetime
from typing import Any, Final

import click

from jobtrace import config

from .exitcodes import Command, finish
from .options import Duration, backend_option, job_id_argument, renamed_option

SHIP_TO: Final = ("loki", "victorialogs", "elasticsearch")
"""The servers ``export`` and ``replay`` send to: ``shippers.SHIPPER_BACKENDS``, spelled here so that
reading the options imports no shipper (a test holds the two equal)."""

JOBS_SCHEMA_VERSION: Final = 1
"""``schema_version`` of ``jobtrace jobs --json`` (docs/schema/jobs.schema.json): raised when a key is renamed
or removed, or its meaning changes; new keys do not raise it."""

JOB_STATES: Final = ("running", "finished", "failed", "hung", "unknown")
"""What ``jobtrace jobs`` says of a job of the embedded store (see :func:`job_state`)."""

SERVER_JOB_STATES: Final = ("running", "ended")
"""What ``jobtrace jobs --backend <server>`` says of a job: running while its last event is more recent than
trace-job's stall threshold, ended otherwise (a server is asked one aggregation, not for the verdict)."""

LIST_FROM: Final = ("local", "loki", "victorialogs", "elasticsearch")
"""Where ``jobtrace jobs`` lists jobs: the embedded store, or a server (``queries.SERVER_JOB_BACKENDS``, spelled
here so that reading the options imports no reader; a test holds the two equal)."""

__all__ = ["JOBS_SCHEMA_VERSION", "JOB_STATES", "LIST_FROM", "SERVER_JOB_STATES", "archive", "export",
           "format_jobs_table", "job_row", "job_state", "jobs", "prune_command", "replay"]


@click.command(cls=Command)
@click.argument("spool_dir", type=click.Path(exists=True, file_okay=False))
@backend_option(SHIP_TO, default=None, help="The spool's backend.")
@click.option("--url", default=None,
              help="Server URL (default JOBTRACE_LOKI_URL / JOBTRACE_VL_URL / JOBTRACE_ES_URL).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(0, min_open=True), default=600.0, show_default=True,
              help="Give up waiting after this many seconds (what is left stays spooled).")
def replay(spool_dir: str, backend: str, url: str | None, timeout_s: float) -> None:
    """Send what a shipper left in SPOOL_DIR (a server outage outlasting the job), in order, then exit.

    \b
    Examples:
      jobtrace replay jobtrace-data/run-17/.spool/loki-r0 --backend loki
      jobtrace replay spool/ --backend elasticsearch --timeout 120

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
@job_id_argument
@backend_option(SHIP_TO, default=None, help="Where to send the job.")
@click.option("--url", default=None,
              help="Server URL (default JOBTRACE_LOKI_URL / JOBTRACE_VL_URL / JOBTRACE_ES_URL).")
@click.option("--data-dir", envvar=config.DATA_DIR, default="jobtrace-data", show_default=True)
@click.option("--timeout", "timeout_s", type=click.FloatRange(0, min_open=True), default=600.0, show_default=True,
              help="Stop after this many seconds; what the server has not taken is reported (a rerun is safe).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def export(job_id: str, backend: str, url: str | None, data_dir: str, timeout_s: float, as_json: bool) -> None:
    """Send JOB_ID from the embedded store to Loki, VictoriaLogs or Elasticsearch/OpenSearch (credentials from the environment).

    \b
    Examples:
      jobtrace export run-17 --backend loki --url http://loki:3100
      jobtrace export run-17 --backend victorialogs --url http://victorialogs:9428
      jobtrace export run-17 --backend elasticsearch --json

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
        if s.packs or s.packs_skipped:
            console.print(s.packs_text, highlight=False)
        if s.refused:
            console.print(f"refused lines are kept in {s.dead_letter}", highlight=False)
        if s.left_bytes:
            console.print(f"{s.left_bytes} bytes not yet accepted: jobtrace replay {s.spool} --backend {s.backend}",
                          highlight=False)
        if s.unread_files:
            console.print(f"{len(s.unread_files)} files not sent before the timeout; run the export again "
                          "(Elasticsearch and Loki keep one copy of a line sent twice)", highlight=False)
    finish(summary.complete)


def job_state(report: Any, last_write_ns: int, now_ns: int, settled_s: float) -> tuple[str, str]:
    """``(state, why)`` of a job from its report and its files' last write.

    * ``failed``: a rank's own log reports a failure (an OOM, an exception, an exit code): the
      report's rank status ``failed``;
    * ``hung``: a rank stalled, went silent, or ranks wait in a collective one never joined (the
      findings ``hang`` and ``stalled_rank``), whether or not its processes are still alive;
    * ``running``: otherwise, while its files were written less than ``settled_s`` ago
      (``JOBTRACE_CACHE_SETTLED_S``, the same rule that keeps a running job out of the cache);
    * ``finished``: otherwise.

    In that order: a rank that crashed usually leaves the others hung, and the crash is the news.
    """
    failed = [r.rank for r in report.per_rank if r.status == "failed"]
    if failed:
        cause = next((f for f in report.findings if f.details.get("root_cause")), None)
        return "failed", f"rank(s) {_ranks(failed)} failed" + (f": {cause.kind}" if cause else "")
    stuck = [r.rank for r in report.per_rank if r.status in ("stalled", "silent")]
    hang = next((f for f in report.findings if f.kind in ("hang", "stalled_rank")), None)
    if stuck or hang:
        ranks = stuck or (hang.ranks if hang else [])
        return "hung", f"rank(s) {_ranks(ranks)} stopped progressing" if ranks else "a collective never completed"
    problems = sorted({f.kind for f in report.findings if f.severity in ("error", "warning")})
    said = ", ".join(problems) if problems else "healthy"
    if last_write_ns and (now_ns - last_write_ns) / 1e9 < settled_s:
        return "running", f"written {max(0.0, (now_ns - last_write_ns) / 1e9):.0f}s ago; {said} so far"
    return "finished", said


def _ranks(ranks: list[int]) -> str:
    return ",".join(str(r) for r in sorted(set(ranks)))


def _iso(ns: int | None) -> str | None:
    if not ns:
        return None
    stamp = datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.UTC)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def job_row(data_dir: str, job_id: str, now_ns: int) -> dict[str, Any]:
    """One job of the store as ``jobtrace jobs --json`` shows it (docs/schema/jobs.schema.json).

    The state is trace-job's own verdict (its default thresholds), so the list never disagrees
    with the report; a settled job's second read comes from the store's columnar cache.
    """
    from jobtrace.errors import JobtraceError
    from jobtrace.store import job_dir, newest_write_ns
    from queries import analyze, load_local

    last_write = newest_write_ns(job_dir(data_dir, job_id))
    row: dict[str, Any] = {"job_id": job_id, "last_write_ns": last_write or None, "last_write": _iso(last_write)}
    try:
        report = analyze(load_local(data_dir, job_id))
    except JobtraceError as exc:  # one unreadable job must not hide the others
        return row | {"state": "unknown", "reason": str(exc)}
    except Exception as exc:  # noqa: BLE001 - nor one the analysis trips on: listed, and said how to see why
        return row | {"state": "unknown", "reason": f"not analysable ({type(exc).__name__}: {exc}); "
                                                    f"trace-job {job_id} --debug shows where"}
    settled = config.get_float(config.CACHE_SETTLED_S, default=60.0, minimum=0.0) or 0.0
    state, why = job_state(report, last_write, now_ns, settled)
    return row | {
        "state": state, "reason": why, "first_ns": report.t_min, "last_ns": report.t_max,
        "first": _iso(report.t_min), "last": _iso(report.t_max), "ranks": report.ranks,
        "world_size": report.world_size, "nodes": len(report.nodes), "steps": report.steps,
        "events": report.events, "healthy": report.healthy, "findings": sorted({f.kind for f in report.findings}),
    }


def format_jobs_table(rows: list[dict[str, Any]]) -> str:
    """The jobs as an aligned text table: job, state, ranks, steps, first and last event (UTC), why.

    A count a row lacks (a job that could not be read; ranks and steps on Loki) shows as ``-``. Plain
    text, no colour and no truncation, so it reads the same in a terminal and in a CI log.
    """
    header = ("JOB", "STATE", "RANKS", "STEPS", "FIRST (UTC)", "LAST (UTC)", "WHY")

    def when(ns: int | None) -> str:
        iso = _iso(ns)
        return iso[:19].replace("T", " ") if iso else "-"

    def count(value: int | None) -> str:
        return "-" if value is None else str(value)

    body = [(r["job_id"], r["state"], count(r.get("ranks")), count(r.get("steps")), when(r.get("first_ns")),
             when(r.get("last_ns")), r.get("reason") or "") for r in rows]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header) - 1)]
    right = {2, 3}
    out = []
    for line in [header, *body]:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths))]
        out.append("  ".join([*cells, line[-1]]).rstrip())
    return "\n".join(out)


@click.command(cls=Command)
@backend_option(LIST_FROM, default="local",
                help="Where the jobs are: the embedded store, or a server, asked with one aggregation (its URL and "
                     "credentials as trace-job's: JOBTRACE_LOKI_URL / JOBTRACE_VL_URL / JOBTRACE_ES_URL).")
@click.option("--url", default=None, help="The server's URL (default: the backend's JOBTRACE_*_URL).")
@click.option("--since", default=None, help="Servers: jobs with events after this: 90m, 7d, RFC 3339 (default 7d).")
@click.option("--until", default=None, help="Servers: and before this (default now).")
@click.option("--data-dir", envvar=config.DATA_DIR, default="jobtrace-data", show_default=True,
              help="Embedded store directory (local backend).")
@click.option("--format", "fmt", type=click.Choice(["auto", "table", "names", "json"]), default="auto",
              show_default=True, help="auto: the table on a terminal, the names alone when piped (as ls does, so "
              "`for j in $(jobtrace jobs)` keeps working).")
@click.option("--json", "as_json", is_flag=True, help="The same as --format json (its schema: "
              "docs/schema/jobs.schema.json).")
def jobs(backend: str, url: str | None, since: str | None, until: str | None, data_dir: str, fmt: str,
         as_json: bool) -> None:
    """List the jobs in the embedded store, or on a server: state, ranks, steps, first and last event.

    The embedded store's state (running, finished, failed, hung) is trace-job's verdict on each job:
    failed when a rank's log reports a failure, hung when a rank stopped progressing, running while
    its files are still being written, finished otherwise.

    A server (--backend victorialogs, elasticsearch, loki) is asked ONE aggregation, never for the
    jobs' events, so the state is only running (an event within trace-job's 5-minute stall
    threshold) or ended: `trace-job JOB --backend …` gives the verdict. Loki gives no ranks or
    steps ("-"), and first and last to its bucket's length.

    \b
    Examples:
      jobtrace jobs
      jobtrace jobs --json | jq -r '.jobs[] | select(.state == "hung") | .job_id'
      jobtrace jobs --format names --data-dir /scratch/jobtrace
      jobtrace jobs --backend victorialogs --url http://vl:9428 --since 2d
      jobtrace jobs --backend elasticsearch --format table

    Exit status: 0 listed, 2 usage error, 3 error (store unreadable, server unreachable or refusing),
    4 internal error (rerun with --debug).
    """
    import sys
    import time

    from queries import list_local_jobs

    if as_json:
        fmt = "json"
    if fmt == "auto":
        fmt = "table" if sys.stdout.isatty() else "names"
    if backend != "local":
        _server_jobs(backend, url, since, until, fmt)
        return
    names = list_local_jobs(data_dir)
    if fmt == "names":
        for job in names:
            click.echo(job)
        return
    now = time.time_ns()
    rows = [job_row(data_dir, job, now) for job in names]
    if fmt == "json":
        import orjson

        doc = {"schema_version": JOBS_SCHEMA_VERSION, "data_dir": data_dir, "jobs": rows}
        click.echo(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
    elif rows:
        click.echo(format_jobs_table(rows))
    else:
        click.echo(f"no jobs in {data_dir}", err=True)


def _server_jobs(backend: str, url: str | None, since: str | None, until: str | None, fmt: str) -> None:
    """``jobs --backend <server>``: one aggregation on the server (:func:`queries.list_server_jobs`), printed."""
    from jobtrace.errors import ConfigError
    from jobtrace.redact import url_for_display
    from queries import TimeRange, list_server_jobs

    try:
        rng = TimeRange.parse(since, until)
    except ConfigError as exc:  # a bad --since/--until is the option's fault: a usage error
        raise click.BadParameter(str(exc), param_hint="'--since' / '--until'") from None
    rows = list_server_jobs(backend, url=url, time_range=rng)
    if fmt == "names":
        for row in rows:
            click.echo(row["job_id"])
    elif fmt == "json":
        import orjson

        doc = {"schema_version": JOBS_SCHEMA_VERSION, "backend": backend, "url": url_for_display(url) if url else None,
               "since_ns": rng.start_ns, "until_ns": rng.end_ns, "since": _iso(rng.start_ns), "until": _iso(rng.end_ns),
               "jobs": rows}
        click.echo(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
    elif rows:
        click.echo(format_jobs_table(rows))
    else:
        click.echo(f"no jobs on {backend} between {_iso(rng.start_ns)} and {_iso(rng.end_ns)} (widen with --since)",
                   err=True)


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
      jobtrace prune            # JOBTRACE_RETENTION_LOGS, 7 days by default
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
@job_id_argument
@renamed_option("--url", "--to", "url", required=True, metavar="s3://BUCKET/PREFIX",
                help="Where the job goes (any S3-compatible store; AWS_ENDPOINT_URL for MinIO, SeaweedFS, Ceph); "
                     "the URL trace-job --backend archive --url reads it back from.")
@click.option("--data-dir", envvar=config.DATA_DIR, default="jobtrace-data", show_default=True)
def archive(job_id: str, url: str, data_dir: str) -> None:
    """Copy a job's store to object storage: its lines (zstd), segments, rollups and dumps, and a manifest.

    The cold tier of the retention policy: read it back with
    `trace-job JOB --backend archive --url s3://BUCKET/PREFIX` (every object is checked against the
    manifest, written last, so an unfinished archive is never read as a partial job). Credentials and
    region come the standard AWS way (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION).

    \b
    Examples:
      jobtrace archive run-17 --url s3://training-logs/jobtrace
      AWS_ENDPOINT_URL=http://minio:9000 jobtrace archive run-17 --url s3://logs

    Exit status: 0 archived, 2 usage error, 3 error (no such job, the store refused), 4 internal error.
    """
    from jobtrace.store import archive_job

    report = archive_job(data_dir, job_id, url)
    click.echo(f"archived {job_id} to {report.url}: {report.objects} objects, {report.bytes_local / 1e6:.1f} MB "
               f"stored as {report.bytes_stored / 1e6:.1f} MB (manifest last)")
    finish(True)
