"""The golden library on real gloo jobs (the demo's script under torchrun, two ranks): entries added, listed,
shown and removed; a job with problems refused; the nearest same-shape entries chosen by themselves; a new
warning named with its step; a step-time regression gating the exit code. Template mining on real NCCL
lines from the corpus."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("torch", reason="torch is part of the test dependencies (jobtrace[torch])")

from jobtrace.cli import main, trace_job
from jobtrace.demo import DemoConfig, run_job
from queries import load_events
from queries._patterns import log_patterns, same_template

pytestmark = pytest.mark.torchjob
CORPUS = Path(__file__).resolve().parents[1] / "corpus"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("golden")
    jobs = {f"ok{i}": dict(ranks=2) for i in range(3)}
    jobs |= {"three": dict(ranks=3), "ok-new": dict(ranks=2), "stall": dict(ranks=2, stall_rank=1, stall_step=8,
                                                                             stall_seconds=0.3),
             "slow": dict(ranks=2, slow_ranks=[1], slow_ms=20)}
    for name, kw in jobs.items():
        assert run_job(DemoConfig(job_id=name, data_dir=str(d), steps=16, **kw)) == 0
    for name in ("ok0", "ok1", "ok2", "three"):
        res = CliRunner().invoke(main, ["golden", "add", name, "--data-dir", str(d), "--tag", "demo"])
        assert res.exit_code == 0, res.output
    return d


def cli(*args):
    return CliRunner().invoke(main, [*args])


def trace(store, job, *args):
    res = CliRunner().invoke(trace_job, [job, "--data-dir", str(store), "--json", *args])
    return res.exit_code, json.loads(res.output)


def test_the_library_lists_shows_and_removes_its_entries(store, tmp_path):
    res = cli("golden", "list", "--data-dir", str(store), "--json")
    entries = {e["name"]: e for e in json.loads(res.output)}
    assert sorted(entries) == ["ok0", "ok1", "ok2", "three"]
    assert (entries["three"]["world"], entries["ok0"]["world"], entries["ok0"]["steps"]) == (3, 2, 16)
    assert entries["ok0"]["tags"] == ["demo"] and entries["ok0"]["templates"] > 0
    shown = json.loads(cli("golden", "show", "ok1", "--data-dir", str(store)).output)
    assert any(t["template"].startswith("step <NUM> loss <NUM>") for t in shown["templates"]), shown["templates"][:5]
    # An entry keeps features, never lines: far smaller than the job's events.
    size = (store / ".golden" / "ok1.json").stat().st_size
    assert size < sum(p.stat().st_size for p in (store / "ok1").glob("*.jsonl")) / 2
    # remove, from a copy of the library
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "ok0.json").write_bytes((store / ".golden" / "ok0.json").read_bytes())
    assert cli("golden", "remove", "ok0", "--golden-dir", str(lib)).exit_code == 0
    assert not (lib / "ok0.json").exists()
    res = cli("golden", "remove", "ok0", "--golden-dir", str(lib))
    assert res.exit_code == 3 and "no golden run 'ok0'" in res.output


def test_a_job_with_problems_is_refused_unless_forced(store, tmp_path):
    res = cli("golden", "add", "slow", "--data-dir", str(store), "--golden-dir", str(tmp_path))
    assert res.exit_code == 1 and "slow_rank" in res.output and "--force" in res.output
    assert not list(tmp_path.glob("*.json"))
    res = cli("golden", "slow", "--data-dir", str(store), "--golden-dir", str(tmp_path), "--force")  # the old form
    assert res.exit_code == 0 and (tmp_path / "slow.json").is_file()


def test_golden_chooses_the_same_shape_entries_and_says_why(store):
    _, report = trace(store, "ok-new", "--golden")
    assert sorted(report["golden"]) == ["ok0", "ok1", "ok2"]  # not the 3-rank entry
    assert "same shape, 2 ranks on 1 node" in report["golden_choice"] and "node(s)" not in report["golden_choice"]
    assert "1 nodes" not in report["golden_choice"]


def test_among_same_shape_entries_those_of_the_runs_model_and_configuration_come_first():
    from queries import GoldenProfile, choose_golden

    def entry(name, step_ms, **shape):
        return GoldenProfile(name, name, [1, 2, 3], {"step_ms": [step_ms] * 3}, shape={"world": 8, "nodes": 1, **shape})

    new = entry("new", 100.0, model="llama-7b", config_hash="aa")
    entries = [entry("near-other-model", 100.0, model="llama-13b", config_hash="aa"),
               entry("same-model-other-config", 130.0, model="llama-7b", config_hash="bb"),
               entry("same-both", 150.0, model="llama-7b", config_hash="aa"),
               entry("unsaid", 101.0)]
    chosen, why = choose_golden(new, entries, k=3)
    assert [e.name for e in chosen] == ["same-both", "same-model-other-config", "unsaid"]  # model, then config
    assert "same model first (llama-7b)" in why and "same configuration first" in why


def test_a_healthy_run_raises_no_pattern_finding(store):
    _, report = trace(store, "ok-new", "--golden")
    assert [f["kind"] for f in report["findings"] if "pattern" in f["kind"]] == []


def test_a_new_warning_is_named_with_its_step_and_line(store):
    _, report = trace(store, "stall", "--golden")
    [new] = [f for f in report["findings"] if f["kind"] == "new_log_pattern"]
    assert new["steps"] == [8] and "injected one-off stall" in new["summary"]
    assert new["details"]["template"].startswith("rank <NUM>: injected one-off stall of <NUM>s at step <NUM>")


def test_the_deviation_score_names_its_contributions_and_the_gate_says_its_false_alarms(store):
    code, report = trace(store, "stall", "--golden", "--gate", "2")
    [dev] = [f for f in report["findings"] if f["kind"] == "golden_score"]
    assert code == 1 and dev["severity"] == "error" and dev["details"]["score"] >= 3
    # (these 3 ms steps are too noisy for their series to score nothing: tests/queries/test_golden_runs.py has steady ones)
    assert ("new_log_pattern", 8) in {(p["what"], p.get("step")) for p in dev["details"]["contributions"]}
    loo = dev["details"]["leave_one_out"]
    assert loo["runs"] == 3 and len(loo["scores"]) == 3 and "leave-one-out" in dev["summary"]
    # The same run under a gate above its score: reported, not failed.
    code, report = trace(store, "stall", "--golden", "--gate", str(dev["details"]["score"] + 1))
    [dev] = [f for f in report["findings"] if f["kind"] == "golden_score"]
    assert dev["severity"] == "info"


def test_a_step_time_regression_fails_the_gate(store):
    code, report = trace(store, "slow", "--golden", "--max-step-time-regression-pct", "100")
    [reg] = [f for f in report["findings"] if f["kind"] == "step_time_regression"]
    assert code == 1 and reg["details"]["regression_pct"] > 100
    assert sorted(reg["details"]["references"]) == ["ok0", "ok1", "ok2"]


def test_lines_that_differ_only_in_numbers_and_ids_are_one_template(tmp_path):
    """Real NCCL WARN lines (tests/corpus): peers, ports, opcodes, lengths and error codes differ, the words not."""
    events = []
    for path in sorted((CORPUS / "hardware").glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if "NCCL WARN NET/IB : Got completion" in line:
                events.append({"ts": len(events) + 1, "kind": "log", "rank": 0, "world": 1, "node": "n",
                               "level": "WARNING", "msg": line[line.index("NCCL WARN"):]})
    assert len(events) >= 6
    job = load_events("nccl", events, "test")
    templates = log_patterns(job.con)["templates"]
    counts = sorted(v["count"] for v in templates.values())
    # two wordings of the completion error in these logs (ib_plugin "from peer …" and net_ib "with error …")
    assert len(templates) == 2 and sum(counts) == len(events), templates
    assert all("<NUM>" in t or "<IP>" in t for t in templates)
    assert same_template("a <*> c", "a b c") and not same_template("a b c", "a b d")
