"""``trace-job JOB`` (also ``jobtrace trace JOB``): rebuild a job's timeline and name the slow or stalled rank."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

import click

from jobtrace import config
from jobtrace.errors import ConfigError, JobNotFound

from .exitcodes import Command, finish
from .options import BACKENDS, job_id_argument, version_option

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["analysis_options", "report_and_exit", "say_written", "trace_job", "trace_job_main"]


def analysis_options(f: Any) -> Any:
    f = click.option("--stall-threshold", "stall_s", type=click.FloatRange(0, min_open=True), default=300.0, show_default=True,
                     help="Seconds without progress (or heartbeat) before a rank counts as stalled.")(f)
    f = click.option("--slow-factor", type=click.FloatRange(1, min_open=True), default=1.3, show_default=True,
                     help="A rank is slow when its median compute per step is this many times the median rank's.")(f)
    f = click.option("--json", "as_json", is_flag=True,
                     help="Print the report as JSON (its schema: docs/schema/report.schema.json).")(f)
    return f


def _view_options(f: Any) -> Any:
    """Flight Recorder input, golden runs, backend links and the timeline views (see queries._trace)."""
    options: list[tuple[str, dict[str, Any]]] = [
        ("--flight-recorder", dict(multiple=True, type=click.Path(exists=True),
                                   help="PyTorch Flight Recorder dump file or folder (repeatable).")),
        ("--compare-to", dict(multiple=True, help="Compare with this golden run (repeatable; see `jobtrace golden`).")),
        ("--golden", dict(is_flag=True, help="Compare with the library's entries most like this job (see "
                                              "`jobtrace golden`), chosen by shape, then by profile.")),
        ("--gate", dict(type=click.FloatRange(0), default=None,
                        help="With golden runs: a deviation score above this is a problem (exit 1); the report "
                             "says how many golden runs would fail it themselves (leave-one-out).")),
        ("--max-step-time-regression-pct", dict(type=click.FloatRange(0), default=None,
                                                help="With golden runs: a median step this many percent slower than "
                                                     "theirs is a problem (exit 1), as a pipeline gate.")),
        ("--golden-dir", dict(default=None, help="Where golden runs are kept (default <data-dir>/.golden; with "
                                                 "--backend elasticsearch or loki, on that server).")),
        ("--timeline", dict(default=None, type=click.Path(dir_okay=False),
                            help="Write an interactive HTML timeline to this file (named on stderr).")),
        ("--perfetto", dict(default=None, type=click.Path(dir_okay=False),
                            help="Write a Perfetto/Chrome trace to this file (named on stderr).")),
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

    try:
        links = LinkConfig(grafana_url=kw["grafana_url"], grafana_datasource=kw["grafana_datasource"],
                           kibana_url=kw["kibana_url"], kibana_data_view=kw["kibana_data_view"])
    except ConfigError as exc:  # a base URL that is not http(s): the option's fault, a usage error
        raise click.BadParameter(str(exc), param_hint="'--grafana-url' / '--kibana-url'") from None
    return TraceOptions(flight_recorder=kw["flight_recorder"], compare_to=kw["compare_to"], golden=kw["golden"],
                        golden_dir=kw["golden_dir"], links=links, timeline=kw["timeline"], perfetto=kw["perfetto"])


def say_written(what: str, path: str | None) -> None:
    """Name a file a command wrote on stderr (``wrote the timeline: /abs/t.html (1.2 MB)``), so that a user
    finds it and stdout stays the report alone (``--json`` pipes cleanly)."""
    import os

    if not path or not os.path.exists(path):
        return
    size = os.path.getsize(path)
    shown = f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size / 1e3:.1f} kB"
    click.echo(f"wrote {what}: {click.format_filename(os.path.abspath(path))} ({shown})", err=True)


def report_and_exit(report: Any, as_json: bool, console: Console | None = None) -> NoReturn:
    """Print the report (text or JSON, on stdout) and exit 0 if the job is healthy, 1 if a problem was found."""
    from queries import format_json, print_report

    if as_json:
        click.echo(format_json(report))
    else:
        from rich.console import Console

        print_report(report, console or Console())
    finish(report.healthy)


@click.command(name="trace-job", cls=Command, context_settings={"help_option_names": ["-h", "--help"]})
@job_id_argument
@version_option
@click.option("--backend", type=click.Choice(BACKENDS), default="local", show_default=True, envvar=config.BACKEND,
              help="Where the job's events are (archive: what `jobtrace archive` put in object storage).")
@click.option("--url", default=None, help="Backend URL (default from JOBTRACE_LOKI_URL / JOBTRACE_VL_URL / JOBTRACE_ES_URL; "
              "for an archive, s3://bucket/prefix).")
@click.option("--since", default=None, help="Start of the time range for servers: 90m, 7d, RFC 3339 (default 7d).")
@click.option("--until", default=None, help="End of the time range for servers (default now).")
@click.option("--data-dir", envvar=config.DATA_DIR, default="jobtrace-data", show_default=True,
              help="Embedded store directory (local backend).")
@analysis_options
@_view_options
def trace_job(job_id: str, backend: str, url: str | None, since: str | None, until: str | None, data_dir: str,
              stall_s: float, slow_factor: float, as_json: bool, **views: Any) -> None:
    """Rebuild JOB_ID's timeline and name the slow or stalled rank.

    \b
    Examples:
      trace-job run-17                    # the embedded store, ./jobtrace-data
      trace-job run-17 --json | jq .findings
      trace-job run-17 --timeline t.html --perfetto t.pftrace
      trace-job run-17 --backend loki --url http://loki:3100 --since 2d
      trace-job run-17 --backend archive --url s3://training-logs/jobs
      trace-job run-17 --golden --gate 6  # compare with known-good runs

    Exit status: 0 healthy, 1 problem found, 2 usage error, 3 error (job not found, store or backend
    unreadable), 4 internal error (rerun with --debug for the traceback).
    """
    from dataclasses import replace

    from queries import AnalysisConfig, TimeRange, load_flight_recorder, load_job
    from queries import trace_job as run_trace

    try:
        rng = TimeRange.parse(since, until) if backend != "local" else None
    except ConfigError as exc:  # a bad --since/--until is the option's fault: a usage error
        raise click.BadParameter(str(exc), param_hint="'--since' / '--until'") from None
    opts = _trace_options(views)
    try:
        # The views draw every event, and golden profiles and Flight Recorder merges read them: only the
        # report alone can be built from what the server aggregates.
        whole = bool(opts.timeline or opts.perfetto or opts.flight_recorder or opts.golden or opts.compare_to)
        job = load_job(backend, job_id, data_dir=data_dir, url=url, time_range=rng, whole=whole)
    except JobNotFound as exc:
        if not opts.flight_recorder:
            raise  # exit 3, the message naming the backend it was not found in
        # A job known only from its Flight Recorder dumps: made of them alone, never of the embedded
        # store when a server was named (the report would mix two backends without saying so).
        if backend != "local":
            click.echo(f"note: {exc}; reporting on the Flight Recorder dumps alone", err=True)
        job = load_flight_recorder(job_id, opts.flight_recorder)
        opts = replace(opts, flight_recorder=())
    if backend in ("elasticsearch", "loki") and not opts.golden_dir and (opts.golden or opts.compare_to):
        from queries import open_library

        opts = replace(opts, library=open_library(backend, url=url))  # the library on the jobs' own server
    cfg = AnalysisConfig(stall_s=stall_s, slow_factor=slow_factor,
                         max_step_time_regression_pct=views["max_step_time_regression_pct"], golden_gate=views["gate"])
    report, _ = run_trace(job_id, data_dir, cfg, opts, job=job)
    say_written("the timeline", opts.timeline)
    say_written("the Perfetto trace", opts.perfetto)
    report_and_exit(report, as_json)


def trace_job_main() -> None:
    """The ``trace-job`` script."""
    trace_job(prog_name="trace-job")
