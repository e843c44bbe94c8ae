"""Collectives recorded through c10d's process-group hooks (torch 2.15 on), in a real 2-rank gloo job.

The job (``pg_job.py``) calls no tracing code around a collective: one is imported before
``init_tracing``, one is asynchronous and waited on later, a subgroup is made after tracing starts,
point-to-point ops and a functional collective run. Every one must be recorded, matched across ranks
by (group, seq), and timed to its completion.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the collectives are torch.distributed's")

from otel_instrumentation import native_hooks  # noqa: E402
from otel_instrumentation._collectives import hooks_supported, ranks_text  # noqa: E402

pytestmark = [pytest.mark.torchjob,
              pytest.mark.skipif(not hooks_supported(), reason="this torch has no process-group hooks")]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", params=[("1", "1"), ("0", "1"), ("1", "0")],
                ids=["compiled", "python-recorder", "python-hooks"])
def job(request, tmp_path_factory):
    """The job under (the recorder, the process-group hooks): compiled or Python each."""
    recorder, hooks = request.param
    if recorder == "1":
        pytest.importorskip("jobtrace_native", reason="the compiled recorder is not built")
    if hooks == "1" and native_hooks.built_path() is None:
        pytest.skip(reason="the compiled hooks are not built (python -m otel_instrumentation.native_hooks; CI builds them)")
    data = tmp_path_factory.mktemp("pg-hooks")
    env = dict(os.environ, JOBTRACE_ROOT=str(ROOT), JOBTRACE_DATA_DIR=str(data), JOBTRACE_JOB_ID="pg",
               JOBTRACE_NATIVE=recorder, JOBTRACE_NATIVE_HOOKS=hooks, OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                          str(Path(__file__).parent / "pg_job.py")], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count(f"mode=hooks errors=0 compiled={hooks}") == 2, run.stdout
    spans: dict[int, list[dict]] = {0: [], 1: []}
    for path in (data / "pg").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event.get("cat") == "collective":
                spans[event["rank"]].append(event)
    for rank in spans:
        spans[rank].sort(key=lambda e: e["start"])
    return spans


def ops(spans, rank):
    return [(e["name"], e["attrs"]["group"], e["attrs"].get("seq")) for e in spans[rank]]


def test_every_collective_is_recorded_once_with_the_same_group_and_seq_on_both_ranks(job):
    names = [name for name, _, _ in ops(job, 0)]
    assert names.count("all_reduce") == 3  # the early-bound one, the async one, the functional one
    assert {"send", "recv", "broadcast", "barrier"} <= set(names)
    collectives = {r: [o for o in ops(job, r) if o[0] not in ("send", "recv")] for r in (0, 1)}
    assert collectives[0] == collectives[1]  # the same (op, group, seq) sequence on every rank
    default = [seq for _, group, seq in collectives[0] if group == "default"]
    assert default == list(range(1, len(default) + 1))  # counted per group, without gaps


def test_the_early_bound_collective_has_its_payload_and_the_groups_ranks(job):
    first = job[0][0]
    assert first["name"] == "all_reduce" and first["attrs"]["bytes"] == 4000 and first["attrs"]["ranks"] == "0-1"
    assert first["attrs"]["group_size"] == 2 and first["attrs"]["seq"] == 1


def test_async_work_is_timed_to_its_completion_not_its_launch(job):
    async_ar = [e for e in job[0] if e["name"] == "all_reduce" and e["attrs"]["bytes"] == 40][0]
    # rank 1 arrived 0.4 s late: rank 0's async all-reduce completed only then, though its call returned at once
    assert async_ar["dur"] >= 300_000_000 and "async" not in async_ar["attrs"]
    late = [e for e in job[1] if e["name"] == "all_reduce" and e["attrs"]["bytes"] == 40][0]
    assert late["dur"] < async_ar["dur"]  # the late rank waited least


def test_a_subgroup_made_after_tracing_started_counts_its_own_seq(job):
    bcast = [e for e in job[0] if e["name"] == "broadcast"]
    assert len(bcast) == 1 and bcast[0]["attrs"]["group"] != "default" and bcast[0]["attrs"]["seq"] == 1


def test_point_to_point_ops_carry_their_own_count_and_no_group_seq(job):
    p2p = [e for e in job[0] if e["name"] in ("send", "recv")]
    assert len(p2p) == 2 and all(e["attrs"]["seq"] is None and e["attrs"]["p2p_seq"] >= 1 for e in p2p)
    assert {e["attrs"].get("peer") for e in p2p} == {1}


def test_collectives_inside_a_step_are_its_children(job):
    assert all(e.get("step") == 0 for e in job[0])


@pytest.mark.parametrize("ranks, text", [([0, 1, 2, 3], "0-3"), ([0, 8, 16, 24], "0-24/8"), ([0, 1, 4, 5], "0-1,4-5"),
                                         ([3], "3"), ([0, 2], "0,2"), ([], "")])
def test_ranks_text(ranks, text):
    assert ranks_text(ranks) == text
