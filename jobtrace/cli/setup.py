"""``jobtrace setup``: index templates, retention policies and Kibana saved objects (the ``kibana`` package)."""

from __future__ import annotations

import click

from jobtrace import config

from .exitcodes import Command, finish

__all__ = ["setup"]


@click.command(name="setup", cls=Command)
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
@click.option("--wait", "wait_s", type=click.FloatRange(0), default=0.0, show_default=True,
              help="Seconds to wait for the servers to come up (for compose stacks).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def setup(url: str, kibana_url: str | None, kibana_space: str | None, logs_retention: str,
          metrics_retention: str, traces_retention: str | None, replicas: int | None, wait_s: float,
          as_json: bool) -> None:
    """Install jobtrace's index templates, retention policies and Kibana saved objects (idempotent).

    \b
    Examples:
      jobtrace setup --url https://es:9200
      jobtrace setup --url https://es:9200 --kibana-url https://kibana:5601
      jobtrace setup --url https://es:9200 --logs-retention 14d
      jobtrace setup --url http://opensearch:9200 --wait 120   # compose stack

    Exit status: 0 all installed, 1 installed with warnings (e.g. no ISM plugin), 2 usage error, 3 error
    (wrong credentials, an unsupported or unreachable server), 4 internal error (rerun with --debug).
    """
    from dataclasses import asdict

    import orjson
    from rich.console import Console

    from jobtrace.http import HttpConfig
    from jobtrace.redact import redact_url
    from kibana import Retention, parse_days, run_setup

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
    finish(report.ok)
