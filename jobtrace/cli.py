"""Command line: ``trace-job`` (the lookup) and ``jobtrace`` (demo, jobs, and the rest).

Exit codes, so ``trace-job`` can gate a pipeline:

    0  healthy: no problem found
    1  problem found (a slow, stalled or silent rank, NaN loss, …)
    2  usage error (bad option)
    3  error: job not found, store unreadable, backend unreachable
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click
from rich.console import Console

from jobtrace import config
from jobtrace.errors import JobNotFound, JobtraceError, Refused

EXIT_HEALTHY, EXIT_PROBLEM, EXIT_USAGE, EXIT_ERROR = 0, 1, 2, 3

__all__ = ["main", "trace_job_main", "EXIT_HEALTHY", "EXIT_PROBLEM", "EXIT_USAGE", "EXIT_ERROR"]


def _analysis_options(f: Any) -> Any:
    f = click.option("--stall-threshold", "stall_s", type=float, default=300.0, show_default=True,
                     help="Seconds without progress (or heartbeat) before a rank counts as stalled.")(f)
    f = click.option("--slow-factor", type=float, default=1.3, show_default=True,
                     help="A rank is slow when its median compute per step is this many times the median rank's.")(f)
    f = click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")(f)
    return f


def _view_options(f: Any) -> Any:
    """Flight Recorder input, golden runs, backend links and the timeline views (see queries._trace)."""
    options: list[tuple[str, dict[str, Any]]] = [
        ("--flight-recorder", dict(multiple=True, type=click.Path(exists=True),
                                   help="PyTorch Flight Recorder dump file or folder (repeatable).")),
        ("--compare-to", dict(multiple=True, help="Compare with this golden run (repeatable; see `jobtrace golden`).")),
        ("--golden-dir", dict(default=None, help="Where golden runs are kept (default <data-dir>/.golden).")),
        ("--timeline", dict(default=None, type=click.Path(dir_okay=False), help="Write an interactive HTML timeline.")),
        ("--perfetto", dict(default=None, type=click.Path(dir_okay=False), help="Write a Perfetto/Chrome trace JSON.")),
        ("--grafana-url", dict(envvar=config.GRAFANA_URL, default=None, help="Link findings to Grafana Explore.")),
        ("--grafana-datasource", dict(envvar=config.GRAFANA_DATASOURCE, default=None, help="Loki data source uid.")),
        ("--kibana-url", dict(envvar=config.KIBANA.url, default=None, help="Link findings to Kibana Discover.")),
        ("--kibana-data-view", dict(envvar=config.KIBANA_DATA_VIEW, default=None, help="Kibana data view id.")),
    ]
    for name, kw in options:
        f = click.option(name, **kw)(f)
    return f


def _trace_options(kw: dict[str, Any]) -> Any:
    from queries import LinkConfig, TraceOptions

    links = LinkConfig(grafana_url=kw["grafana_url"], grafana_datasource=kw["grafana_datasource"],
                       kibana_url=kw["kibana_url"], kibana_data_view=kw["kibana_data_view"])
    return TraceOptions(flight_recorder=kw["flight_recorder"], compare_to=kw["compare_to"],
                        golden_dir=kw["golden_dir"], links=links, timeline=kw["timeline"], perfetto=kw["perfetto"])


def _report_and_exit(report: Any, as_json: bool, console: Console) -> None:
    from queries import format_json, print_report

    if as_json:
        click.echo(format_json(report))
    else:
        print_report(report, console)
    sys.exit(EXIT_HEALTHY if report.healthy else EXIT_PROBLEM)


def _fail(console: Console, exc: Exception) -> None:
    console.print(f"[bold red]error:[/] {exc}", highlight=False)
    sys.exit(EXIT_ERROR)


@click.command(name="trace-job", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("job_id")
@click.option("--backend", type=click.Choice(["local", "loki", "victorialogs", "elasticsearch"]), default="local",
              show_default=True, envvar=config.BACKEND, help="Where the job's events are.")
@click.option("--url", default=None, help="Backend URL (default from JOBTRACE_LOKI_URL / JOBTRACE_VL_URL / JOBTRACE_ES_URL).")
@click.option("--since", default=None, help="Start of the time range for servers: 90m, 7d, RFC 3339 (default 7d).")
@click.option("--until", default=None, help="End of the time range for servers (default now).")
@click.option("--data-dir", envvar=config.DATA_DIR, default="jobtrace-data", show_default=True,
              help="Embedded store directory (local backend).")
@_analysis_options
@_view_options
def trace_job(job_id: str, backend: str, url: str | None, since: str | None, until: str | None, data_dir: str,
              stall_s: float, slow_factor: float, as_json: bool, **views: Any) -> None:
    """Rebuild JOB_ID's timeline and name the slow or stalled rank.

    Exit status: 0 healthy, 1 problem found, 2 usage error, 3 error.
    """
    from queries import AnalysisConfig
    from queries import trace_job as run_trace
    from queries import TimeRange, load_job

    console = Console(stderr=False)
    try:
        rng = TimeRange.parse(since, until) if backend != "local" else None
        opts = _trace_options(views)
        try:
            job = load_job(backend, job_id, data_dir=data_dir, url=url, time_range=rng)
        except JobNotFound:
            if not opts.flight_recorder:
                raise
            job = None  # a job known only from its Flight Recorder dumps
        report, _ = run_trace(job_id, data_dir, AnalysisConfig(stall_s=stall_s, slow_factor=slow_factor), opts, job=job)
    except JobtraceError as exc:
        _fail(Console(stderr=True), exc)
        return
    _report_and_exit(report, as_json, console)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="jobtrace")
def main() -> None:
    """jobtrace: one trace for every rank of a distributed training job."""


main.add_command(trace_job, name="trace")


def _add_ingest_command() -> None:
    """``jobtrace ingest PATH... --job ID``: existing training logs → events (the ``ingest`` package)."""
    from ingest._cli import ingest_command

    main.add_command(ingest_command, name="ingest")


_add_ingest_command()


@main.command(name="setup")
@click.option("--url", envvar=config.ES.url, required=True,
              help="Elasticsearch/OpenSearch URL (credentials: JOBTRACE_ES_USERNAME/_PASSWORD, _API_KEY, _TOKEN, "
                   "_CA_FILE; see the README).")
@click.option("--kibana-url", envvar=config.KIBANA.url, default=None,
              help="Kibana or OpenSearch Dashboards URL: also import the saved objects "
                   "(credentials: JOBTRACE_KIBANA_*, default the JOBTRACE_ES_* ones).")
@click.option("--kibana-space", default=None, help="Kibana space to import into (default space if not given).")
@click.option("--logs-retention", default="7d", show_default=True, envvar=config.ES_LOGS_RETENTION,
              help="How long to keep log records and heartbeats (7d, 2w, 1y).")
@click.option("--metrics-retention", default="365d", show_default=True, envvar=config.ES_METRICS_RETENTION,
              help="How long to keep metric points and per-step step spans.")
@click.option("--traces-retention", default=None, envvar=config.ES_TRACES_RETENTION,
              help="How long to keep phase/collective spans (default: as logs).")
@click.option("--replicas", type=click.IntRange(0), default=None,
              help="index.number_of_replicas for jobtrace data (default: the cluster's).")
@click.option("--wait", "wait_s", type=float, default=0.0, show_default=True,
              help="Seconds to wait for the servers to come up (for compose stacks).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def setup(url: str, kibana_url: str | None, kibana_space: str | None, logs_retention: str,
          metrics_retention: str, traces_retention: str | None, replicas: int | None, wait_s: float,
          as_json: bool) -> None:
    """Install jobtrace's index templates, retention policies and Kibana saved objects (idempotent).

    Exit status: 0 all installed, 1 installed with warnings (e.g. no ISM plugin), 3 error.
    """
    from dataclasses import asdict

    import orjson

    from jobtrace.http import HttpConfig
    from jobtrace.redact import redact_url
    from kibana import Retention, parse_days, run_setup

    err = Console(stderr=True)
    try:
        retention = Retention(parse_days(logs_retention), parse_days(metrics_retention),
                              parse_days(traces_retention) if traces_retention else None)
        http = HttpConfig.from_env(config.ES.prefix, url=url)
        kb = None
        if kibana_url:
            # Kibana's own credentials when any is set, else the cluster's (one user for both is common).
            prefix = config.KIBANA.prefix if HttpConfig.has_credentials(config.KIBANA.prefix) else config.ES.prefix
            kb = HttpConfig.from_env(prefix, url=kibana_url)
        report = run_setup(http, retention=retention, replicas=replicas, kibana=kb, kibana_space=kibana_space,
                           wait_s=wait_s,
                           flavour=config.get_choice(config.ES_FLAVOR, ("elasticsearch", "opensearch", "victorialogs")))
    except JobtraceError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        sys.exit(3)
    if as_json:
        click.echo(orjson.dumps(asdict(report) | {"ok": report.ok}, option=orjson.OPT_INDENT_2).decode())
    else:
        out = Console()
        out.print(f"[bold]{report.cluster}[/] at {redact_url(http.url)}", highlight=False)
        for item in report.installed:
            out.print(f"  installed  {item}", highlight=False)
        for item in report.unchanged:
            out.print(f"  unchanged  {item}", highlight=False)
        out.print(f"  retention  {report.retention}", highlight=False)
        if report.saved_objects:
            out.print(f"  saved objects  {report.saved_objects}", highlight=False)
        for w in report.warnings:
            out.print(f"[yellow]warning:[/] {w}", highlight=False)
    sys.exit(0 if report.ok else 1)


@main.command()
@click.argument("spool_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--to", "to", type=click.Choice(["loki", "elasticsearch"]), required=True, help="The spool's backend.")
@click.option("--url", default=None, help="Server URL (default JOBTRACE_LOKI_URL / JOBTRACE_ES_URL).")
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True,
              help="Give up waiting after this many seconds (what is left stays spooled).")
def replay(spool_dir: str, to: str, url: str | None, timeout_s: float) -> None:
    """Send what a shipper left in SPOOL_DIR (a server outage outlasting the job), in order, then exit.

    Exit status: 0 all sent, 1 some left (still spooled), 3 error.
    """
    import os
    from pathlib import Path

    from shippers import ProcessInfo, open_shipper

    console = Console(stderr=True)
    path = Path(spool_dir)
    info = ProcessInfo("replay", "replay", 0, os.getpid(), path.parent, spool_override=path)
    try:
        shipper = open_shipper(to, info, url)
    except JobtraceError as exc:
        _fail(console, exc)
        return
    pending = shipper.spool.pending_bytes()
    done = shipper.wait_idle(timeout_s)
    shipper.close()
    stats = shipper.stats
    console.print(f"replayed {pending} bytes: {stats.sent} events accepted, {stats.rejected} refused "
                  f"(dead-letter: {shipper.dead_letter.path}), {stats.spooled_bytes} bytes left")
    sys.exit(EXIT_HEALTHY if done else EXIT_PROBLEM)


@main.command(name="export")
@click.argument("job_id")
@click.option("--to", "to", type=click.Choice(["loki", "elasticsearch"]), required=True, help="Where to send the job.")
@click.option("--url", default=None, help="Server URL (default JOBTRACE_LOKI_URL / JOBTRACE_ES_URL).")
@click.option("--data-dir", envvar=config.DATA_DIR, default="jobtrace-data", show_default=True)
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True,
              help="Stop after this many seconds; what the server has not taken is reported (a rerun is safe).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def export(job_id: str, to: str, url: str | None, data_dir: str, timeout_s: float, as_json: bool) -> None:
    """Send JOB_ID from the embedded store to Loki or Elasticsearch/OpenSearch (credentials from the environment).

    Exit status: 0 everything accepted, 1 something not sent or refused (see the summary), 3 error.
    """
    import orjson
    from rich.progress import Progress

    from shippers import export_job

    console = Console(stderr=True)
    try:
        with Progress(console=console, transient=True, disable=as_json or not console.is_terminal) as bar:
            task = bar.add_task(f"export {job_id}", total=None)
            summary = export_job(data_dir, job_id, to, url=url, timeout_s=timeout_s,
                                 progress=lambda done, total: bar.update(task, completed=done, total=total))
    except JobtraceError as exc:
        _fail(console, exc)
        return
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
            console.print(f"{s.left_bytes} bytes not yet accepted: jobtrace replay {s.spool} --to {s.backend}",
                          highlight=False)
        if s.unread_files:
            console.print(f"{len(s.unread_files)} files not sent before the timeout; run the export again "
                          "(Elasticsearch and Loki keep one copy of a line sent twice)", highlight=False)
    sys.exit(EXIT_HEALTHY if summary.complete else EXIT_PROBLEM)


@main.command()
@click.option("--data-dir", envvar=config.DATA_DIR, default="jobtrace-data", show_default=True)
def jobs(data_dir: str) -> None:
    """List the jobs in the embedded store."""
    from queries import list_local_jobs

    for job in list_local_jobs(data_dir):
        click.echo(job)


@main.command()
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
        _fail(Console(stderr=True), exc)
        return
    click.echo(f"golden run {name or job_id} saved to {path}")


@main.command()
@click.option("--ranks", type=click.IntRange(2, 64), default=4, show_default=True)
@click.option("--steps", type=click.IntRange(3), default=30, show_default=True)
@click.option("--slow-rank", type=int, multiple=True, help="Make this rank slow (repeatable).")
@click.option("--slow-ms", type=float, default=40.0, show_default=True, help="Extra forward time of a slow rank.")
@click.option("--hang-rank", type=int, default=None, help="Make this rank hang forever.")
@click.option("--hang-step", type=int, default=8, show_default=True)
@click.option("--nan-step", type=int, default=None, help="Make rank 0's loss NaN from this step.")
@click.option("--ranks-per-node", type=int, default=0, help="Simulate nodes of this many ranks.")
@click.option("--job-id", default=None, help="Default: demo-<time>.")
@click.option("--data-dir", envvar=config.DATA_DIR, default="jobtrace-data", show_default=True)
@click.option("--verbose", is_flag=True, help="Show the training job's own output.")
@click.option("--json", "as_json", is_flag=True)
def demo(ranks: int, steps: int, slow_rank: tuple[int, ...], slow_ms: float, hang_rank: int | None, hang_step: int,
         nan_step: int | None, ranks_per_node: int, job_id: str | None, data_dir: str, verbose: bool,
         as_json: bool) -> None:
    """Run a real torch.distributed job (gloo, CPU) with an injected fault, then trace it."""
    from jobtrace.demo import DemoConfig, run_job
    from queries import AnalysisConfig, analyze, load_local

    for r in (*slow_rank, *( [hang_rank] if hang_rank is not None else [])):
        if not 0 <= r < ranks:
            raise click.BadParameter(f"rank {r} is not in 0..{ranks - 1}")
    console = Console(stderr=as_json)
    job_id = job_id or time.strftime("demo-%Y%m%d-%H%M%S")
    cfg = DemoConfig(job_id=job_id, data_dir=data_dir, ranks=ranks, steps=steps, slow_ranks=list(slow_rank),
                     slow_ms=slow_ms, hang_rank=hang_rank, hang_step=hang_step, nan_step=nan_step,
                     ranks_per_node=ranks_per_node, quiet=not verbose)
    fault = (f"slow ranks {list(slow_rank)}" if slow_rank else "") + (f" hang rank {hang_rank}" if hang_rank is not None else "")
    console.print(f"[bold]jobtrace demo[/]: job {job_id}, {ranks} ranks, {steps} steps, {fault.strip() or 'no fault'}")
    t0 = time.monotonic()
    try:
        import torch  # noqa: F401
    except ImportError:
        _fail(console, JobtraceError("the demo needs torch: pip install 'jobtrace[torch]'"))
    rc = run_job(cfg)
    console.print(f"job {'stopped after a stall' if rc == -1 else f'exited with {rc}'} in {time.monotonic() - t0:.1f}s; "
                  f"tracing it: trace-job {job_id} --data-dir {data_dir}" + (f" --stall-threshold {cfg.stall_s:g}" if hang_rank is not None else ""))
    try:
        report = analyze(load_local(data_dir, job_id), AnalysisConfig(stall_s=cfg.stall_s if hang_rank is not None else 300.0))
    except JobtraceError as exc:
        _fail(console, exc)
        return
    _report_and_exit(report, as_json, Console())


def trace_job_main() -> None:
    trace_job(prog_name="trace-job")


if __name__ == "__main__":
    main()
