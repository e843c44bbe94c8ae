"""A golden library of five real healthy gloo jobs, and what it flags.

Every job is the demo's script under torchrun (two ranks, gloo, 30 steps) with a steady forward pass
(``device_ms``: the host waits 100 ms a step, as it would on its GPU), so that a small regression is
measurable on a shared 2-core machine. Against the library:

* a run whose forward pass is 8 % slower from step 12, a run whose rank 1 keeps 16 MB more memory every step
  from step 12, a run whose targets gain noise at step 12 (a corrupted shard) and a run with a warning the library never
  logged are each flagged with the step and the series or template that departs;
* ten further healthy runs are not flagged at all (no band left, no template, a score under the gate), and
  the library's own leave-one-out scores are printed in every report.

The library's runs and the healthy runs are interleaved, so that a busy spell of the machine falls on both.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

pytest.importorskip("torch", reason="torch is part of the test dependencies (jobtrace[torch])")

from jobtrace.cli import main, trace_job
from jobtrace.demo import DemoConfig, run_job

pytestmark = pytest.mark.torchjob

STEPS, ONSET, GATE = 30, 12, 8.0
DEVICE_MS = 100.0
LIBRARY = [f"lib{i}" for i in range(5)]
HEALTHY = [f"ok{i}" for i in range(10)]
FAULTS = {
    "phase8": dict(regress_step=ONSET, regress_ms=0.08 * DEVICE_MS, regress_phase="forward"),  # +8 %
    "memory": dict(leak_ranks=[1], leak_step=ONSET, leak_mb=16.0),
    "loss": dict(noise_step=ONSET, label_noise=0.5),
    "warning": dict(stall_rank=1, stall_step=ONSET, stall_seconds=0.05),
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("golden-runs")
    order = [name for pair in zip(LIBRARY + [None] * 5, HEALTHY) for name in pair if name] + list(FAULTS)
    for name in order:
        cfg = DemoConfig(job_id=name, data_dir=str(d), ranks=2, steps=STEPS, device_ms=DEVICE_MS, **FAULTS.get(name, {}))
        assert run_job(cfg) == 0, name
    for name in LIBRARY:
        res = CliRunner().invoke(main, ["golden", "add", name, "--data-dir", str(d), "--tag", "steady"])
        assert res.exit_code == 0, res.output
    return d


def trace(store, job):
    res = CliRunner().invoke(trace_job, [job, "--data-dir", str(store), "--json", "--golden", "--gate", str(GATE)])
    report = json.loads(res.output)
    return res.exit_code, report, {f["kind"]: f for f in report["findings"]}, [
        f for f in report["findings"] if f["kind"] == "golden_deviation"]


def test_an_entry_keeps_the_runs_model_configuration_and_versions(store):
    """``init_tracing(model=, config=)`` and the frameworks imported, as the heartbeats said them."""
    res = CliRunner().invoke(main, ["golden", "show", "lib0", "--data-dir", str(store)])
    shown = json.loads(res.output)
    import torch

    assert shown["model"] == "demo-mlp" and len(shown["config_hash"]) == 16
    assert shown["versions"]["torch"] == torch.__version__ and "python" in shown["versions"]
    assert (shown["world"], shown["ranks"]) == (2, 2)


def test_ten_healthy_runs_raise_nothing_and_the_library_scores_itself(store):
    scores = {}
    for name in HEALTHY:
        code, report, kinds, deviations = trace(store, name)
        assert sorted(report["golden"]) == LIBRARY
        assert deviations == [], (name, [d["summary"] for d in deviations])
        assert not {"new_log_pattern", "missing_log_pattern", "log_pattern_rate"} & set(kinds), (name, kinds)
        score = kinds["golden_score"]
        assert score["severity"] == "info", (name, score["summary"])
        scores[name] = score["details"]["score"]
        loo = score["details"]["leave_one_out"]
        assert loo["runs"] == 5 and len(loo["scores"]) == 5 and "leave-one-out" in score["summary"]
    print("healthy runs' scores:", scores, "library leave-one-out:", loo["scores"])
    assert max(scores.values()) <= GATE


def test_a_phase_eight_percent_slower_is_named_from_its_step(store):
    code, _, kinds, deviations = trace(store, "phase8")
    forward = [d for d in deviations if d["details"]["metric"] == "forward_ms"]
    assert code == 1 and forward, [d["summary"] for d in deviations]
    d = forward[0]["details"]
    assert ONSET - 1 <= d["start_step"] <= ONSET + 1 and d["band"] == "learned"
    assert 1.04 < d["ratio"] < 1.15  # the run's forward pass against the library's: about 1.08
    top = {p["what"]: p for p in kinds["golden_score"]["details"]["contributions"]}
    assert "forward_ms" in top and top["forward_ms"]["steps"][0] <= ONSET + 2


def test_memory_that_grows_on_one_rank_is_named_with_its_rank(store):
    code, _, kinds, deviations = trace(store, "memory")
    memory = [d for d in deviations if d["details"]["metric"] == "memory_mb"]
    assert code == 1 and memory, [d["summary"] for d in deviations]
    assert ONSET <= memory[0]["details"]["start_step"] <= ONSET + 4  # 16 MB a step clears a 32 MB floor in 2-3
    score = kinds["golden_score"]
    assert score["severity"] == "error" and score["details"]["score"] > GATE
    by_rank = score["details"]["ranks"]
    top = [r for r in by_rank if any(c["what"] == "memory_mb" for c in r["contributions"])]
    assert top and top[0]["rank"] == 1, by_rank


def test_a_loss_curve_that_departs_is_named_from_its_step(store):
    code, _, kinds, deviations = trace(store, "loss")
    loss = [d for d in deviations if d["details"]["metric"] == "loss"]
    assert code == 1 and loss, [d["summary"] for d in deviations]
    assert ONSET <= loss[0]["details"]["start_step"] <= ONSET + 5  # SGD takes a few steps to blow up
    assert loss[0]["details"]["ratio"] > 1.2
    assert kinds["golden_score"]["severity"] == "error"
    assert "loss" in {p["what"] for p in kinds["golden_score"]["details"]["contributions"]}


def test_a_new_warning_template_is_named_with_its_step(store):
    code, _, kinds, _ = trace(store, "warning")
    new = kinds["new_log_pattern"]
    assert code == 1 and new["steps"] == [ONSET] and "injected one-off stall" in new["summary"]
    top = kinds["golden_score"]["details"]["contributions"]
    assert ("new_log_pattern", ONSET) in {(p["what"], p.get("step")) for p in top}
