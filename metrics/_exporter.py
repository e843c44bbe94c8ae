"""The running jobs of a node's embedded store as Prometheus metrics: one endpoint per node, off the ranks.

Why a sidecar and not an endpoint in each rank (or in local rank 0): the ranks already write every
event to the store, so reading it back costs the training processes nothing, and the endpoint
outlives them. A hung or frozen rank can serve nothing, and a rank 0 that died takes its node's
endpoint with it; the sidecar keeps reporting both, with ``jobtrace_heartbeat_age_seconds`` growing,
which is what the alert rules need. One process per node also means one scrape target per node
whatever the number of ranks (``jobtrace metrics serve``).

Each scrape reads only what the ranks appended since the last one (:class:`queries.LocalTail`). A
job whose files have not changed for ``forget_after_s`` is dropped, so its series go stale in
Prometheus instead of being reported forever; older jobs are never read.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from jobtrace.errors import JobNotFound
from jobtrace.store import job_dir, newest_write_ns
from queries import LocalTail, list_local_jobs, read_kernel_log

from ._gpu import GpuSampler
from ._state import COUNTERS, GAUGES, STEP_BUCKETS, RankMetrics

__all__ = ["StoreMetrics"]


class StoreMetrics:
    """A ``prometheus_client`` collector over the jobs in the store at ``data_dir`` (or only ``jobs``)."""

    def __init__(self, data_dir: str | os.PathLike[str], jobs: Sequence[str] = (), *,
                 forget_after_s: float = 900.0, gpus: GpuSampler | None = None, kernel_log: bool = False,
                 node: str = "") -> None:
        self.data_dir = data_dir
        self.gpus = gpus
        self.node = node
        self.kernel_log = kernel_log
        self.kernel_counts: dict[str, int] = {}
        self.kernel_error: str | None = None
        self._kernel_seen_ns = time.time_ns()  # count what happens from now on
        self.only = tuple(jobs)
        self.forget_after_s = forget_after_s
        self.tails: dict[str, LocalTail] = {}
        self.ranks: dict[tuple[str, int], RankMetrics] = {}
        self.scrapes = 0
        self.skipped = 0
        self._lock = threading.Lock()  # a scrape (the HTTP server's thread) and a push may come at once

    # ---- following the store ----------------------------------------------------------------------
    def poll(self, now_ns: int | None = None) -> None:
        """Read what the jobs' ranks appended since the last call; drop the jobs that stopped writing."""
        now_ns = now_ns or time.time_ns()
        horizon = now_ns - int(self.forget_after_s * 1e9)
        for job in self.only or list_local_jobs(self.data_dir):
            if job not in self.tails and newest_write_ns(job_dir(self.data_dir, job)) < horizon:
                continue  # an old job: never read
            tail = self.tails.setdefault(job, LocalTail(self.data_dir, job))
            try:
                events = tail.read()
            except (JobNotFound, OSError):  # a job removed meanwhile: forget it
                self._forget(job)
                continue
            for e in events:
                rank = e.get("rank")
                if isinstance(rank, int):
                    key = (job, rank)
                    r = self.ranks.get(key) or self.ranks.setdefault(key, RankMetrics(job, rank))
                    r.feed(e)
            self.skipped = sum(t.skipped for t in self.tails.values())
        for job in list(self.tails):
            newest = max((r.last_event_ns for (j, _), r in self.ranks.items() if j == job), default=0)
            if newest and newest < horizon:
                self._forget(job)

    def _forget(self, job: str) -> None:
        self.tails.pop(job, None)
        for key in [k for k in self.ranks if k[0] == job]:
            del self.ranks[key]

    # ---- exposition -------------------------------------------------------------------------------
    def collect(self) -> Iterator[Any]:
        """The metric families, read fresh (``prometheus_client`` calls this on every scrape)."""
        with self._lock:
            yield from self._collect()

    def _collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
        from prometheus_client.samples import Exemplar

        now = time.time_ns()
        self.poll(now)
        self.scrapes += 1
        ranks = sorted(self.ranks.values(), key=lambda r: (r.job, r.rank))
        names = ["job", "rank", "node", "local_rank"]

        def labels(r: RankMetrics) -> list[str]:
            lab = r.labels()
            return [lab.get(n, "") for n in names]

        step = GaugeMetricFamily("jobtrace_step", "The last step the rank finished.", labels=names)
        step_s = GaugeMetricFamily("jobtrace_step_seconds", "The last step's duration.", labels=names)
        compute = GaugeMetricFamily("jobtrace_compute_seconds",
                                    "The last step's duration less its time in collectives: a straggler's is the "
                                    "longest (the others wait for it in the collective).", labels=names)
        coll = GaugeMetricFamily("jobtrace_collective_seconds",
                                 "The last step's time in (synchronous) collectives: what it waited.", labels=names)
        share = GaugeMetricFamily("jobtrace_comm_share_ratio",
                                  "The last step's share of time in collectives (0-1).", labels=names)
        age = GaugeMetricFamily("jobtrace_heartbeat_age_seconds",
                                "Seconds since the rank's last event, heartbeats included: grows on a hang (absent "
                                "once the rank ended cleanly).", labels=names)
        steps = CounterMetricFamily("jobtrace_steps", "Steps the rank finished.", labels=names)
        hist = HistogramMetricFamily("jobtrace_step_duration_seconds",
                                     "Step durations (exemplars: the trace and span of a step).", labels=names)
        gauges: dict[str, Any] = {}
        counters: dict[str, Any] = {}
        for r in ranks:
            lab = labels(r)
            if not r.stopped:  # a rank that ended cleanly is not silent: no age, so no heartbeat alert for it
                age.add_metric(lab, max(0.0, (now - r.last_event_ns) / 1e9))
            if r.step is None:
                continue
            step.add_metric(lab, r.step)
            steps.add_metric(lab, r.steps_total)
            if r.step_seconds is not None:
                step_s.add_metric(lab, r.step_seconds)
                if r.collective_seconds is not None:
                    coll.add_metric(lab, r.collective_seconds)
                    compute.add_metric(lab, max(0.0, r.step_seconds - r.collective_seconds))
                    if r.step_seconds > 0:
                        share.add_metric(lab, min(1.0, r.collective_seconds / r.step_seconds))
            cumulative = 0
            buckets: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
            for i, bound in enumerate(STEP_BUCKETS):
                cumulative += r.buckets[i]
                le = "+Inf" if bound == float("inf") else repr(bound)
                ex = r.exemplars.get(i)
                if ex is None:
                    buckets.append((le, cumulative))
                else:
                    buckets.append((le, cumulative, Exemplar({"trace_id": ex["trace_id"], "span_id": ex["span_id"]},
                                                             ex["value"], ex["ts"])))
            hist.add_metric(lab, buckets, r.step_sum)
        for r in ranks:
            lab = labels(r)
            for name, value in {**r.values, **r.derived()}.items():
                if name not in GAUGES:
                    continue  # an input of a derived gauge (flops_per_step, peak_flops)
                series, help_text = GAUGES[name]
                family = gauges.get(series) or gauges.setdefault(
                    series, GaugeMetricFamily(series, help_text, labels=names))
                family.add_metric(lab, value)
            for name, value in r.counters.items():
                series, help_text = COUNTERS[name]
                family = counters.get(series) or counters.setdefault(
                    series, CounterMetricFamily(series, help_text, labels=names))
                family.add_metric(lab, value)
        yield from (step, steps, step_s, hist, compute, coll, share, age, *gauges.values(), *counters.values())
        yield from self._gpu_families(GaugeMetricFamily, CounterMetricFamily)
        if self.kernel_log:
            yield from self._kernel_families(GaugeMetricFamily, CounterMetricFamily)
        jobs = GaugeMetricFamily("jobtrace_exporter_jobs", "Jobs this exporter follows.")
        jobs.add_metric([], len(self.tails))
        yield jobs


    def _gpu_families(self, gauge: Any, counter: Any) -> Iterator[Any]:
        if self.gpus is None:
            return
        families: dict[str, Any] = {}
        readings = self.gpus.sample()
        for r in readings:
            family = families.get(r.name)
            if family is None:
                names = list(r.labels)
                family = families[r.name] = (counter(r.name[: -len("_total")], "GPU counter (NVML).", labels=names)
                                             if r.name.endswith("_total") else gauge(r.name, "GPU (NVML).", labels=names))
            family.add_metric(list(r.labels.values()), r.value)
        yield from families.values()
        sampled = gauge("jobtrace_exporter_gpus_sampled", "GPUs sampled through NVML (0: none here, or NVML failed).")
        sampled.add_metric([], len({r.labels["gpu"] for r in readings}))
        yield sampled

    def _kernel_families(self, gauge: Any, counter: Any) -> Iterator[Any]:
        """This node's flagged kernel lines (Xid, ECC, NVLink, OOM killer…) counted since the sidecar started."""
        now = time.time_ns()
        try:
            for line in read_kernel_log(self._kernel_seen_ns + 1, now):
                self.kernel_counts[line.kind] = self.kernel_counts.get(line.kind, 0) + 1
                self._kernel_seen_ns = max(self._kernel_seen_ns, line.ts_ns)
            self.kernel_error = None
        except OSError as exc:
            self.kernel_error = str(exc)
        readable = gauge("jobtrace_exporter_kernel_log_readable", "Whether this node's kernel log can be read.")
        readable.add_metric([], 0 if self.kernel_error else 1)
        yield readable
        events = counter("jobtrace_node_kernel_events", "Kernel log lines by what they are evidence of (gpu_xid, "
                         "gpu_ecc, nvlink, gpu_lost, host_oom, hung_task, segfault, pcie, hardware).",
                         labels=["node", "kind"])
        for kind, n in sorted(self.kernel_counts.items()):
            events.add_metric([self.node, kind], n)
        yield events
