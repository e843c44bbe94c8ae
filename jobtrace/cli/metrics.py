"""``jobtrace metrics``: the node's running jobs as a Prometheus scrape endpoint (:mod:`metrics`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import click

from jobtrace import config
from jobtrace.errors import ConfigError

from .exitcodes import Command

if TYPE_CHECKING:
    from metrics import OtlpPusher, RemoteWriter, StoreMetrics

__all__ = ["metrics_command"]


@click.command(cls=Command)
@click.option("--data-dir", envvar=config.DATA_DIR, default="jobtrace-data", show_default=True,
              help="The embedded store the node's ranks write.")
@click.option("--job", "jobs", multiple=True, help="Only these jobs (default: every job writing to the store).")
@click.option("--listen", default="127.0.0.1:9464", show_default=True,
              help="host:port of the /metrics endpoint (0.0.0.0 exposes it to the network: mind who can read it); "
              "'' serves none (push only).")
@click.option("--remote-write", "remote_write", default=None, metavar="URL",
              help="Also push the series there by Prometheus remote write every --push-interval (credentials: "
              "JOBTRACE_PROM_*). Default: JOBTRACE_PROM_URL if set.")
@click.option("--otlp", "otlp", default=None, metavar="URL",
              help="Also push the series as OTLP metrics there (a Collector's …/v1/metrics) every --push-interval. "
              "Default: OTEL_EXPORTER_OTLP_METRICS_ENDPOINT if set (headers and TLS: the OTEL_EXPORTER_OTLP_* "
              "variables).")
@click.option("--push-interval", type=click.FloatRange(1), default=15.0, show_default=True,
              help="Seconds between two pushes (remote write, OTLP).")
@click.option("--forget-after", type=click.FloatRange(10), default=900.0, show_default=True,
              help="Seconds after a job's last event before its series are dropped (they go stale in Prometheus).")
@click.option("--gpus/--no-gpus", default=True, show_default=True,
              help="Sample this node's GPUs through NVML (nvidia-ml-py) at each scrape; nothing where there is none.")
@click.option("--kernel-log/--no-kernel-log", default=True, show_default=True,
              help="Count this node's kernel log lines by kind (Xid, ECC, NVLink, OOM killer…) from the start.")
@click.option("--once", is_flag=True, help="Print one scrape's text to stdout and exit (for a look, or a cron job).")
def metrics_command(data_dir: str, jobs: tuple[str, ...], listen: str, remote_write: str | None, otlp: str | None,
                    push_interval: float, forget_after: float, gpus: bool, kernel_log: bool, once: bool) -> None:
    """Serve every running job of this node's store as Prometheus metrics, one endpoint per node.

    Per rank (labels job, rank, node, local_rank; never a step): step time and its histogram (exemplars:
    the step's trace and span), steps, time in collectives and its share, heartbeat age, and what the job
    logs: loss, grad norm, learning rate, loss scale, skipped steps, samples/s, tokens/s, TFLOP/s, MFU,
    host RSS, CUDA allocated/reserved/peak. Per GPU (NVML): utilisation, memory, power, temperature, SM
    clock, throttle reasons, ECC, PCIe and NVLink throughput; and the node's kernel log lines by kind.
    The ranks pay nothing: the sidecar reads what they already write, and keeps reporting a hung rank
    (its heartbeat age grows).

    \b
    Examples:
      jobtrace metrics                        # http://127.0.0.1:9464/metrics
      jobtrace metrics --once --job run-17
      jobtrace metrics --listen '' --remote-write https://mimir/api/v1/push
      jobtrace metrics --otlp http://otel-collector:4318/v1/metrics

    Scrape it with honor_labels: true (the series carry the training job's own "job" label); see
    docs/metrics.md. Exit status: 0 stopped, 2 usage error, 3 error (the port is taken), 4 internal error.
    """
    import socket

    from metrics import GpuSampler, StoreMetrics, serve

    node = socket.gethostname()
    collector = StoreMetrics(data_dir, jobs, forget_after_s=forget_after, node=node, kernel_log=kernel_log,
                             gpus=GpuSampler(node=node) if gpus else None)
    if once:
        from prometheus_client import CollectorRegistry, generate_latest

        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        click.echo(generate_latest(registry).decode(), nl=False)
        return
    pushers: list[Callable[[], None]] = []
    if remote_write or config.get_str(config.PROM.url):
        from metrics import RemoteWriter

        pushers.append(partial(_push_remote_write, RemoteWriter(remote_write), collector))
    if otlp or config.get_str(config.OTLP_METRICS_ENDPOINT):
        from metrics import OtlpPusher

        pushers.append(partial(_push_otlp, OtlpPusher(otlp, node=node), collector))
    if listen:
        host, _, port = listen.rpartition(":")
        if not host or not port.isdigit():
            raise click.BadParameter(f"{listen!r}: expected host:port", param_hint="--listen")
        try:
            serve(collector, host.strip("[]"), int(port))
        except OSError as exc:
            raise ConfigError(f"cannot listen on {listen}: {exc.strerror or exc}") from None
        click.echo(f"serving http://{listen}/metrics for the jobs in {data_dir} (Ctrl-C stops)", err=True)
    elif not pushers:
        raise click.UsageError("nothing to do: --listen '' serves nothing, and no --remote-write or --otlp is given")
    try:
        while True:
            for push in pushers:
                push()
            time.sleep(push_interval if pushers else 3600)
    except KeyboardInterrupt:
        pass


def _push_remote_write(writer: RemoteWriter, collector: StoreMetrics) -> None:
    """One push; a failure is said once per different error, and the next interval tries again."""
    from jobtrace.errors import ShipperError

    before = writer.last_error
    try:
        writer.push(collector.collect())
    except ShipperError as exc:
        if writer.last_error != before:
            click.echo(f"jobtrace metrics: {exc} (retrying every interval)", err=True)


def _push_otlp(pusher: OtlpPusher, collector: StoreMetrics) -> None:
    failures = pusher.failures
    if not pusher.push(collector.collect()) and failures == 0:
        click.echo("jobtrace metrics: the OTLP receiver refused or did not answer (retrying every interval)", err=True)
