"""``jobtrace watch JOB``: follow a running job and alert while it is still happening (:mod:`queries._live`)."""

from __future__ import annotations

import socket
import time
from typing import Any

import click

from jobtrace import config
from jobtrace.errors import JobNotFound

from .exitcodes import Command, finish

__all__ = ["watch"]


@click.command(cls=Command)
@click.argument("job_id")
@click.option("--backend", type=click.Choice(["local", "loki", "victorialogs", "elasticsearch"]), default="local",
              show_default=True, help="Where the job's events are: the embedded store, or a server (JOBTRACE_LOKI_URL, "
              "JOBTRACE_VL_URL, JOBTRACE_ES_URL; Elasticsearch covers OpenSearch).")
@click.option("--url", default=None, help="The server's URL (default: the backend's JOBTRACE_*_URL).")
@click.option("--lookback", type=click.FloatRange(2), default=30.0, show_default=True,
              help="Seconds of a server's recent events read on each poll (ranks' events arrive out of order).")
@click.option("--data-dir", envvar=config.DATA_DIR, default="jobtrace-data", show_default=True)
@click.option("--interval", type=click.FloatRange(0.1, 60), default=1.0, show_default=True,
              help="Seconds between two reads of the job's new events.")
@click.option("--hang-after", type=click.FloatRange(1), default=8.0, show_default=True,
              help="Seconds ranks wait in one collective, with a member of the group outside it, before it is a hang.")
@click.option("--silent-after", type=click.FloatRange(1), default=12.0, show_default=True,
              help="Seconds without a single event (heartbeats included) before a rank is silent.")
@click.option("--slow-factor", type=click.FloatRange(1, min_open=True), default=2.0, show_default=True,
              help="A rank computing this many times the median rank's is a straggler.")
@click.option("--wait-for-job", type=click.FloatRange(0), default=60.0, show_default=True,
              help="Seconds to wait for the job's first events before giving up (exit 3).")
@click.option("--timeout", type=click.FloatRange(0), default=0.0,
              help="Stop after this many seconds (0: until every rank has stopped or died).")
@click.option("--webhook", default=None, help="Also POST alerts here (http or https).")
@click.option("--webhook-format", type=click.Choice(["alertmanager", "slack"]), default="alertmanager",
              show_default=True, help="alertmanager: its /api/v2/alerts list; slack: an incoming webhook's text.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line per alert that fires or clears.")
def watch(job_id: str, backend: str, url: str | None, lookback: float, data_dir: str, interval: float, hang_after: float, silent_after: float, slow_factor: float,
          wait_for_job: float, timeout: float, webhook: str | None, webhook_format: str, as_json: bool) -> None:
    """Follow a running job (the embedded store, Loki, VictoriaLogs, Elasticsearch/OpenSearch) and alert as soon as something is wrong with it.

    Alerts: a hang (ranks wait in a collective that a rank never joined: that rank, and what it is
    doing), a silent or dead rank, a straggler, NaN/Inf loss, a loss spike, a grad-norm explosion.
    Each fires once with its evidence and resolves when its condition clears.

    \b
    Examples:
      jobtrace watch run-17
      jobtrace watch run-17 --json --webhook http://alertmanager:9093/api/v2/alerts
      jobtrace watch run-17 --backend loki --url http://loki:3100
      jobtrace watch run-17 --webhook https://hooks.slack.com/services/... --webhook-format slack

    Exit status: 0 the job ended with no alert, 1 an alert fired, 2 usage error, 3 error (no such
    job after --wait-for-job), 4 internal error (rerun with --debug).
    """
    from rich.console import Console

    from queries import LiveConfig, LiveState, Webhook, open_tail

    console = Console(stderr=as_json, highlight=False)
    tail = open_tail(backend, job_id, data_dir=data_dir, url=url, lookback_s=lookback)
    where = tail.where
    state = LiveState(LiveConfig(hang_after_s=hang_after, silent_after_s=silent_after, slow_factor=slow_factor,
                                 local_host=socket.gethostname()))
    hook = Webhook(webhook, webhook_format, job_id) if webhook else None
    start = time.monotonic()
    while not tail.exists():
        if time.monotonic() - start > wait_for_job:
            raise JobNotFound(f"no events of job {job_id!r} in {where} after {wait_for_job:g}s")
        time.sleep(min(interval, 1.0))
    console.print(f"watching {job_id} in {where}" + (f"; alerts also to the {hook.describe()}" if hook else ""))
    try:
        while True:
            state.feed(tail.read())
            fired, cleared = state.evaluate(time.time_ns())
            for alert in fired:
                _add_native_stacks(alert, state)
            for alert in fired + cleared:
                _show(console, alert, as_json, job_id)
            if hook is not None:
                hook.send(fired, cleared, list(state.active.values()))
            if state.finished(time.time_ns()) or (timeout and time.monotonic() - start > timeout):
                break
            time.sleep(interval)
    except KeyboardInterrupt:
        pass
    ended = "ended" if state.finished(time.time_ns()) else "still running"
    console.print(f"job {job_id} {ended}: {state.fired} alert(s), {len(state.active)} still active; "
                  f"{state.events:,} events read" + (f" in {tail.requests:,} queries" if tail.requests else "")
                  + (f", {tail.skipped:,} lines skipped (not this job's events)" if tail.skipped else "")
                  + (f"; webhook: {hook.sent} posts, errors {hook.errors or 'none'}"
                                                      if hook else ""))
    finish(state.fired == 0)


def _add_native_stacks(alert: Any, state: Any) -> None:
    """For a hang or silent rank on this host, its stacks as py-spy reads them from outside (native frames
    too: the NCCL or gloo call it is stuck in), where py-spy is installed. From the watcher, not the rank:
    a frozen rank cannot run anything, and a process may not ptrace its parent where Yama's scope is 1."""
    import shutil
    import subprocess

    if alert.kind not in ("hang", "silent") or shutil.which("py-spy") is None:
        return
    stacks = {}
    for rank in alert.ranks:
        r = state.ranks.get(rank)
        if r is None or r.pid is None or r.node != state.cfg.local_host:
            continue
        try:
            out = subprocess.run(["py-spy", "dump", "--pid", str(r.pid), "--native"], capture_output=True, text=True,
                                 timeout=20)
        except (OSError, subprocess.TimeoutExpired) as exc:
            stacks[rank] = f"py-spy failed: {type(exc).__name__}"
            continue
        stacks[rank] = (out.stdout or out.stderr).strip()[-6000:]
    if stacks:
        alert.evidence["native_stacks"] = stacks


def _show(console: Any, alert: Any, as_json: bool, job: str) -> None:
    state = "resolved" if alert.resolved_ns is not None else "firing"
    if as_json:
        import orjson

        click.echo(orjson.dumps({"job": job, "state": state, **alert.to_dict()}, default=str,
                                option=orjson.OPT_NON_STR_KEYS).decode())
        return
    from rich.text import Text

    stamp = time.strftime("%H:%M:%S")
    style = "green" if state == "resolved" else ("bold red" if alert.severity == "critical" else "yellow")
    console.print(Text(f"[{stamp}] {state.upper():<8} ", style=style) + Text(alert.summary))
    if state == "firing":
        for rank, doing in (alert.evidence.get("doing") or {}).items():
            for line in doing.get("last_logs") or []:
                console.print(Text(f"    rank {rank} last log: {line}"))
            if doing.get("stacks"):
                console.print(Text(f"    rank {rank} stacks (its heartbeat thread's dump):"))
                for line in str(doing["stacks"]).splitlines()[-12:]:
                    console.print(Text(f"      {line}"))
        for rank, text in (alert.evidence.get("native_stacks") or {}).items():
            console.print(Text(f"    rank {rank} native stacks (py-spy):"))
            for line in str(text).splitlines()[:20]:
                console.print(Text(f"      {line}"))
