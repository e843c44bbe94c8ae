"""Steps and phases without ``oi.step``: a real 2-rank DDP job where rank 0 marks its steps and rank 1 does not.

The two ranks run the same steps, held together by DDP's all-reduce in every backward pass, so rank 1's
automatic steps must agree with rank 0's explicit ones, end where the script saw ``opt.step()`` return,
and rank 0 must have no automatic step beside its own.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="steps are read from torch's optimizer, module and backward hooks")

pytestmark = pytest.mark.torchjob
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", params=["1", "0"], ids=["compiled", "python"])
def job(request, tmp_path_factory):
    if request.param == "1":
        pytest.importorskip("jobtrace_native", reason="the compiled recorder is not built")
    data = tmp_path_factory.mktemp("autostep")
    env = dict(os.environ, JOBTRACE_ROOT=str(ROOT), JOBTRACE_DATA_DIR=str(data), JOBTRACE_JOB_ID="auto",
               JOBTRACE_NATIVE=request.param, OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                          str(Path(__file__).parent / "autostep_job.py")], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    spans: dict[int, list[dict]] = {0: [], 1: []}
    for path in (data / "auto").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            e = json.loads(line)
            if e.get("kind") == "span" and e.get("cat") in ("step", "phase"):
                spans[e["rank"]].append(e)
    truth = {r: json.loads((data / f"ends{r}.json").read_text()) for r in (0, 1)}
    return spans, truth


def steps(spans, rank):
    return sorted((e for e in spans[rank] if e["cat"] == "step"), key=lambda e: e["step"])


def test_the_unmarked_rank_has_one_step_per_optimizer_step_with_its_phases(job):
    spans, truth = job
    auto = steps(spans, 1)
    assert [e["step"] for e in auto] == list(range(8)) and all(e["attrs"] == {"auto": True} for e in auto)
    assert truth[1]["auto_steps"] == 8 and truth[1]["auto_on"]
    for s in auto:
        phases = {e["name"] for e in spans[1] if e["cat"] == "phase" and e["parent_id"] == s["span_id"]}
        assert phases == {"data", "forward", "backward", "optimizer"}, (s["step"], phases)
    data = [e for e in spans[1] if e["name"] == "data"]
    assert all(e["dur"] >= 4_000_000 for e in data)  # the loader's 5 ms


def test_an_automatic_step_ends_where_the_optimizer_step_did(job):
    spans, truth = job
    for s, end in zip(steps(spans, 1), truth[1]["ends"]):
        assert 0 <= end - s["ts"] < 2_000_000  # within 2 ms before the script's own clock read


def test_the_marked_rank_keeps_only_its_own_steps(job):
    spans, truth = job
    own = steps(spans, 0)
    assert [e["step"] for e in own] == list(range(8)) and not any((e.get("attrs") or {}).get("auto") for e in own)
    assert truth[0]["auto_steps"] == 0 and not truth[0]["auto_on"]
    assert sum(1 for e in spans[0] if e["cat"] == "phase") == 8 * 4  # the script's phases, none added


def test_automatic_and_explicit_steps_agree_on_the_same_job(job):
    spans, _ = job
    auto, own = steps(spans, 1), steps(spans, 0)
    ends = [abs(a["ts"] - o["ts"]) for a, o in zip(auto, own)]
    assert statistics.median(ends) < 5_000_000  # DDP holds the ranks together: the same ends, to a few ms
    # The automatic step also holds the loop's 10 ms between steps, which the explicit one leaves out.
    extra = [a["dur"] - o["dur"] for a, o in zip(auto[1:], own[1:])]
    assert 5_000_000 < statistics.median(extra) < 30_000_000
