"""``jobtrace watch JOB``: follow a running job and alert while it is still happening (:mod:`queries._live`)."""

from __future__ import annotations

import socket
import time
from typing import Any

import click

from jobtrace import config
from jobtrace.errors import BackendUnavailable, JobNotFound, ServerUnavailable

from .exitcodes import Command, finish
from .options import job_id_argument

__all__ = ["watch"]


@click.command(cls=Command)
@job_id_argument
@click.option("--backend", type=click.Choice(["local", "loki", "victorialogs", "elasticsearch"]), default="local",
              show_default=True, envvar=config.BACKEND, help="Where the job's events are: the embedded store, or a server (JOBTRACE_LOKI_URL, "
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
@click.option("--kernel-window", type=click.FloatRange(60), default=900.0, show_default=True,
              help="Seconds of this node's kernel log read before a dead or hung rank's last event (Xid, ECC, "
              "NVLink, OOM killer lines); NCCL timeouts often surface ~10 minutes after their cause.")
@click.option("--timeout", type=click.FloatRange(0), default=0.0,
              help="Stop after this many seconds (0: until every rank has stopped or died).")
@click.option("--webhook", default=None, help="Also POST alerts here (http or https).")
@click.option("--webhook-format", type=click.Choice(["alertmanager", "slack"]), default="alertmanager",
              show_default=True, help="alertmanager: its /api/v2/alerts list; slack: an incoming webhook's text.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line per alert that fires or clears.")
def watch(job_id: str, backend: str, url: str | None, lookback: float, data_dir: str, interval: float, hang_after: float, silent_after: float, slow_factor: float,
          wait_for_job: float, kernel_window: float, timeout: float, webhook: str | None, webhook_format: str, as_json: bool) -> None:
    """Follow a running job (the embedded store, Loki, VictoriaLogs, Elasticsearch/OpenSearch) and alert as soon as something is wrong with it.

    Alerts: a hang (ranks wait in a collective that a rank never joined: that rank, and what it is
    doing), a silent or dead rank, a straggler, NaN/Inf loss, a loss spike, a grad-norm explosion.
    Each fires once with its evidence and resolves when its condition clears.

    \b
    Examples:
      jobtrace watch run-17
      jobtrace watch run-17 --json --webhook http://am:9093/api/v2/alerts
      jobtrace watch run-17 --backend loki --url http://loki:3100
      jobtrace watch run-17 --webhook-format slack \\
          --webhook https://hooks.slack.com/services/...

    Exit status: 0 the job ended with no alert, 1 an alert fired, 2 usage error, 3 error (no such
    job after --wait-for-job), 4 internal error (rerun with --debug).
    """
    from rich.console import Console
    from rich.text import Text

    from queries import LiveConfig, LiveState, Webhook, add_outside_evidence, open_tail

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
    console.print(Text(f"watching {job_id} in {where}" + (f"; alerts also to the {hook.describe()}" if hook else "")),
                  soft_wrap=True)
    polls, unreachable = 0, 0
    try:
        while True:
            try:
                state.feed(tail.read())
                if unreachable:
                    console.print(Text(f"{where} answers again"), soft_wrap=True)
                unreachable = 0
            except (BackendUnavailable, ServerUnavailable) as exc:  # a server restarting must not end the watch
                if not unreachable:
                    console.print(Text(f"cannot read {where} ({exc}); retrying every {interval:g}s"), soft_wrap=True)
                unreachable += 1
            polls += 1
            fired, cleared = state.evaluate(time.time_ns())
            for alert in fired:
                add_outside_evidence(alert, state, kernel_window_s=kernel_window)
            for alert in fired + cleared:
                _show(console, alert, as_json, job_id)
            for alert in state.updated:  # its ranks' stall scene arrived after it fired
                _show(console, alert, as_json, job_id, updated=True)
            if hook is not None:
                hook.send(fired, cleared, list(state.active.values()))
            if state.finished(time.time_ns()) or (timeout and time.monotonic() - start > timeout):
                break
            time.sleep(interval)
    except KeyboardInterrupt:
        pass
    _show_slurm_end(console, state, as_json, job_id)
    ended = "ended" if state.finished(time.time_ns()) else "still running"
    summary = (f"job {job_id} {ended}: {state.fired} alert(s), {len(state.active)} still active; "
               f"{state.events:,} events read ({tail.bytes_read / 1e6:.1f} MB in {polls:,} polls"
               + (f", {tail.requests:,} queries)" if tail.requests else ")")
               + (f", {tail.skipped:,} lines skipped (not this job's events)" if tail.skipped else "")
               + (f"; webhook: {hook.sent} posts, errors {hook.errors or 'none'}" if hook else "")
               + _clock_text(state.clocks))
    console.print(Text(summary), soft_wrap=True)  # Text: a job id is not markup; one line, for scripts to read
    finish(state.fired == 0)


def _clock_text(clocks: dict[str, Any]) -> str:
    """``; clocks: aligned to node0's: node1 -30000.1 ms`` where offsets were applied (as trace-job's header)."""
    if not clocks.get("applied"):
        return ""
    return (f"; clocks: aligned to {clocks['reference']}'s: "
            + ", ".join(f"{n} {clocks['offsets_ms'][n]:+.1f} ms" for n in clocks["applied"]))


def _show(console: Any, alert: Any, as_json: bool, job: str, *, updated: bool = False) -> None:
    state = "resolved" if alert.resolved_ns is not None else "updated" if updated else "firing"
    if as_json:
        import orjson

        click.echo(orjson.dumps({"job": job, "state": state, **alert.to_dict()}, default=str,
                                option=orjson.OPT_NON_STR_KEYS).decode())
        return
    from rich.text import Text

    stamp = time.strftime("%H:%M:%S")
    style = "green" if state == "resolved" else ("bold red" if alert.severity == "critical" else "yellow")
    console.print(Text(f"[{stamp}] {state.upper():<8} ", style=style) + Text(alert.summary))
    if state in ("firing", "updated"):
        for rank, doing in (alert.evidence.get("doing") or {}).items():
            for line in doing.get("last_logs") or []:
                console.print(Text(f"    rank {rank} last log: {line}"))
            if doing.get("stacks"):
                console.print(Text(f"    rank {rank} stacks (its heartbeat thread's dump):"))
                for line in str(doing["stacks"]).splitlines()[-12:]:
                    console.print(Text(f"      {line}"))
            for group, fr in ((doing.get("flight_recorder") or {}).get("groups") or {}).items():
                console.print(Text(f"    rank {rank} Flight Recorder, group {group}: in flight "
                                   f"{', '.join(fr['in_flight']) or 'nothing'}; last retired {fr['last_retired']}"))
        kernel = alert.evidence.get("kernel") or {}
        if kernel.get("error"):
            console.print(Text(f"    kernel log: {kernel['error']}"))
        for line in kernel.get("lines") or []:
            console.print(Text(f"    kernel {line['ts']} [{line['kind']}] {line['text']}"))
        for step in alert.evidence.get("slurm") or []:
            console.print(Text(f"    SLURM {_slurm_line(step)}"))
        for rank, text in (alert.evidence.get("native_stacks") or {}).items():
            console.print(Text(f"    rank {rank} native stacks (py-spy):"))
            for line in str(text).splitlines()[:20]:
                console.print(Text(f"      {line}"))


def _slurm_line(step: dict[str, Any]) -> str:
    job, st = step.get("job") or {}, step.get("step") or {}
    state = job.get("JobState") or st.get("State") or "?"
    return (f"step {step['id']}: job {state}, exit code {job.get('ExitCode', '?')}"
            + (f", reason {job['Reason']}" if job.get("Reason") not in (None, "None") else "")
            + (f"; step {st['State']}" if st.get("State") else ""))


def _show_slurm_end(console: Any, state: Any, as_json: bool, job: str) -> None:
    """Where SLURM started the ranks: the steps' final state and exit code, once the watch ends."""
    from queries import slurm_evidence

    steps = sorted({r.slurm for r in state.ranks.values() if r.slurm})
    if not steps or not any(a.kind == "rank_died" for a in state.history):
        return
    time.sleep(1.0)  # slurmctld records the step's end a moment after its last task is gone
    for step in steps:
        found = slurm_evidence(step)
        if as_json:
            import orjson

            click.echo(orjson.dumps({"job": job, "state": "info", "kind": "slurm_step", "evidence": found}).decode())
        else:
            from rich.text import Text

            console.print(Text(f"SLURM {_slurm_line(found)}"))
