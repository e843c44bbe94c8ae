"""Synthetic jobs in the embedded-store format, for benchmarks and tests of the analysis.

The generator models data-parallel training the way the analysis sees it: every
rank starts a step together, loads data and computes for its own time, then waits in
all_reduce until the slowest rank arrives. Faults are the ones the demo injects (slow
ranks, slow from a step on, a one-off stall, a slow data loader, a hung rank, a
mismatched collective, NaN loss, a memory leak, a job-wide regression), so benchmarks on
8,192 ranks exercise the same code paths as the real torch jobs in the tests.
"""

from __future__ import annotations

import os
import random
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from jobtrace.identity import trace_id_for_job
from jobtrace.store import compact as write_segment
from jobtrace.store import job_dir

__all__ = ["SynthJob", "write_job"]


@dataclass
class SynthJob:
    job_id: str = "synth"
    ranks: int = 8
    steps: int = 100
    ranks_per_node: int = 8
    compute_ms: float = 100.0
    jitter: float = 0.03
    slow_ranks: dict[int, float] = field(default_factory=dict)  # rank -> compute factor
    hang_rank: int | None = None
    hang_step: int = 0
    hang_s: float = 600.0
    nan_step: int | None = None
    slow_from: dict[int, tuple[float, ...]] = field(default_factory=dict)  # rank -> (first step, factor[, last step])
    stalls: dict[int, tuple[int, float]] = field(default_factory=dict)  # rank -> (step, extra seconds), one-off
    data_wait_ms: dict[int, float] = field(default_factory=dict)  # rank -> extra data-loader ms per step
    leaks: dict[int, tuple[int, float]] = field(default_factory=dict)  # rank -> (first step, MB per step)
    regress_step: int | None = None  # every rank's compute is multiplied by regress_factor from this step
    regress_factor: float = 1.5
    mismatch_rank: int | None = None  # this rank records all_gather where the others record all_reduce
    mismatch_step: int = 0
    memory: bool = True  # one rss_bytes metric per rank and step, as the memory hook records
    logs_per_step: int = 1
    heartbeat_s: float = 10.0
    seed: int = 7
    compact: bool | None = None  # write each rank's Parquet segment, as a clean exit does (default: unless hung)
    t0_ns: int = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z


def write_job(data_dir: str | os.PathLike[str], job: SynthJob, *, keep_lines: bool = True,
              processes: int = 1) -> Path:
    """Write the job's per-rank files; returns the job directory.

    Ranks are written one after another (a timeline pass first fixes every step's start
    and the all_reduce arrival, which depend on all ranks), so memory stays at a few
    arrays whatever the job's size and 8,192 ranks never hold 8,192 open files.
    ``keep_lines=False`` deletes each rank's JSON lines once its segment is written, as
    a retention policy that prunes raw logs does; ``processes`` writes ranks in parallel.
    """
    directory = job_dir(data_dir, job.job_id)
    directory.mkdir(parents=True, exist_ok=True)
    starts, computes = _timeline(job)
    compact = job.compact if job.compact is not None else job.hang_rank is None
    work = [(directory, job, starts, computes, r, compact, keep_lines) for r in range(job.ranks)]
    if processes > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(processes) as pool:
            sizes = pool.starmap(_write_rank, work, chunksize=8)
    else:
        sizes = [_write_rank(*args) for args in work]
    if not keep_lines:  # what the pruned lines weighed, for the benchmarks' raw-size column
        (directory / ".synth-raw-bytes").write_text(str(sum(sizes)))
    return directory


def _factor(job: SynthJob, r: int, s: int) -> float:
    factor = job.slow_ranks.get(r, 1.0)
    episode = job.slow_from.get(r)
    if episode and s >= episode[0] and (len(episode) < 3 or s <= episode[2]):
        factor *= episode[1]
    if job.regress_step is not None and s >= job.regress_step:
        factor *= job.regress_factor
    return factor


def _timeline(job: SynthJob) -> tuple[list[int], list[array[float]]]:
    """Each step's start and each rank's compute (ns, data wait included)."""
    rnd = random.Random(job.seed)
    steps = job.steps if job.hang_rank is None else job.hang_step + 1
    starts: list[int] = []
    computes: list[array[float]] = []
    t = job.t0_ns
    for s in range(steps):
        compute = array("d", (job.compute_ms * _factor(job, r, s) * (1 + rnd.uniform(-job.jitter, job.jitter)) * 1e6
                              + job.data_wait_ms.get(r, 0.0) * 1e6 for r in range(job.ranks)))
        for r, (stall_step, extra_s) in job.stalls.items():
            if stall_step == s and r < job.ranks:
                compute[r] += extra_s * 1e9
        starts.append(t)
        computes.append(compute)
        t += int(max(compute)) + int(4e6)
    return starts, computes


def _write_rank(directory: Path, job: SynthJob, starts: list[int], computes: list[array[float]], r: int,
                compact: bool, keep_lines: bool) -> int:
    rnd = random.Random(job.seed * 1_000_003 + r + 1)
    dumps = orjson.dumps
    nl = orjson.OPT_APPEND_NEWLINE
    node = f"node{r // job.ranks_per_node:04d}"
    base = {"job": job.job_id, "trace_id": trace_id_for_job(job.job_id), "rank": r,
            "local_rank": r % job.ranks_per_node, "world": job.ranks, "node": node, "pid": 1000 + r, "v": 1}
    sid = iter(range((r << 40) + 1, 1 << 62))
    extra_data = job.data_wait_ms.get(r, 0.0) * 1e6
    path = directory / f"{node}.r{r}.p{1000 + r}.jsonl"
    with open(path, "wb") as out:
        for s, (t, compute) in enumerate(zip(starts, computes)):
            if job.hang_rank is not None and s == job.hang_step:
                for b in range(1, int(job.hang_s // job.heartbeat_s) + 1):
                    attrs = ({"in_span": "forward", "in_cat": "phase", "progress_age_ms": int(b * job.heartbeat_s * 1000)}
                             if r == job.hang_rank else
                             {"in_span": "optimizer", "in_cat": "phase", "in_op": "all_reduce", "in_group": "default",
                              "in_seq": s + 1, "progress_age_ms": int(b * job.heartbeat_s * 1000)})
                    out.write(dumps({"ts": t + int(b * job.heartbeat_s * 1e9), "kind": "heartbeat", **base, "step": s,
                                     "attrs": attrs}, option=nl))
                break
            step_id = f"{next(sid):016x}"
            c = int(compute[r])
            data = int((compute[r] - extra_data) * 0.05 + extra_data)
            fwd = int(c * 0.35)
            bwd = c - data - fwd
            wait = int(max(compute) - c) + int(2e6)
            opt_start = t + c
            for name, start, dur in (("data", t, data), ("forward", t + data, fwd), ("backward", t + data + fwd, bwd)):
                out.write(dumps({"ts": start + dur, "kind": "span", **base, "span_id": f"{next(sid):016x}",
                                 "parent_id": step_id, "name": name, "cat": "phase", "start": start, "dur": dur,
                                 "step": s}, option=nl))
            opt_id = f"{next(sid):016x}"
            op = "all_gather" if r == job.mismatch_rank and s == job.mismatch_step else "all_reduce"
            out.write(dumps({"ts": opt_start + wait, "kind": "span", **base, "span_id": f"{next(sid):016x}",
                             "parent_id": opt_id, "name": op, "cat": "collective", "start": opt_start,
                             "dur": wait, "step": s, "attrs": {"op": op, "group": "default",
                             "group_size": job.ranks, "seq": s + 1, "bytes": 1 << 24}}, option=nl))
            end = opt_start + wait + int(1e6)
            out.write(dumps({"ts": end, "kind": "span", **base, "span_id": opt_id, "parent_id": step_id,
                             "name": "optimizer", "cat": "phase", "start": opt_start, "dur": end - opt_start,
                             "step": s}, option=nl))
            out.write(dumps({"ts": end, "kind": "span", **base, "span_id": step_id, "name": "step", "cat": "step",
                             "start": t, "dur": end - t, "step": s}, option=nl))
            loss = 2.0 * (0.99 ** s) + rnd.uniform(0, 0.01)
            metric = "NaN" if job.nan_step is not None and s >= job.nan_step else round(loss, 5)
            out.write(dumps({"ts": end, "kind": "metric", **base, "step": s,
                             "metrics": {"loss": metric, "lr": 1e-4, "grad_norm": 1.0}}, option=nl))
            if job.memory:
                rss = 2_000_000_000 + rnd.randrange(0, 4096) * 4096
                if r in job.leaks and s >= job.leaks[r][0]:
                    rss += int((s - job.leaks[r][0] + 1) * job.leaks[r][1] * 2**20)
                out.write(dumps({"ts": end, "kind": "metric", **base, "step": s, "metrics": {"rss_bytes": rss}},
                                option=nl))
            for _ in range(job.logs_per_step):
                out.write(dumps({"ts": end, "kind": "log", **base, "step": s, "level": "INFO",
                                 "logger": "train", "msg": f"step {s} loss {loss:.4f}"}, option=nl))
    size = path.stat().st_size
    if compact and write_segment(path) is not None and not keep_lines:
        path.unlink()
    return size
