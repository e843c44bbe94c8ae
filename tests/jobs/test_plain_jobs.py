"""Verdicts on plain torchrun jobs that know nothing of jobtrace (issue 19), in both forms a user keeps.

``run_jobs.py`` runs ``train.py`` under ``torchrun --tee 3 --log-dir`` (4 ranks, gloo, CPU) once per
case, with one fault on rank 2. Each job's console file and its log directory are ingested as a
user would (``jobtrace ingest PATH --job …``) and analysed with the default thresholds.

The verdict is judged the way a user judges it, on the first try: the report's first error (or,
with none, its first warning) must be of the fault's kind and name rank 2 alone; a healthy job
must have no error or warning. The expectations come from the injected fault, never from a run
of the analysis; the cases still wrong are strict xfails, so each fails the day it comes right
until its mark goes.

``JOBTRACE_PLAIN_JOBS`` names a folder of jobs already run (``python tests/jobs/run_jobs.py DIR``)
to check them without running them again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ingest import IngestConfig, Ingestor, open_sink
from queries import analyze, load_local

from .run_jobs import CASES, FAULT_RANK, run_case

pytestmark = pytest.mark.torchjob
pytest.importorskip("torch", reason="torch is part of the test dependencies (jobtrace[torch])")

R = FAULT_RANK
EXPECTED: dict[str, tuple[tuple[str, ...], list[int] | None] | None] = {
    "slow_rank": (("slow_rank", "late_arrival"), [R]),
    "slow_episode": (("slow_episode",), [R]),
    "hang": (("hang", "stalled_rank"), [R]),
    "crash": (("python_exception",), [R]),
    "mismatch": (("collective_mismatch",), [R]),
    "nan": (("nan_loss",), [R]),
    "spike": (("loss_spike",), None),  # every rank's loss jumps: no one rank to blame
    "slow_data": (("data_wait",), [R]),
    "healthy_busy": None,
}
"""Per case: the kinds that name its fault and the ranks the finding must name (``None``: any)."""

STILL_WRONG: dict[tuple[str, str], str] = {}
"""(case, form) → what the analysis says instead: strict xfails until it is right."""


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> Path:
    done = os.environ.get("JOBTRACE_PLAIN_JOBS")
    if done:
        return Path(done)
    out = tmp_path_factory.mktemp("plain-jobs")
    for case in CASES.values():
        run_case(case, out)
    return out


def _input(jobs: Path, case: str, form: str) -> Path:
    return jobs / case / ("console.log" if form == "console" else "logdir")


def _report(jobs: Path, case: str, form: str, tmp_path: Path):
    store = tmp_path / "store"
    Ingestor(IngestConfig(job=case), open_sink("local", case, data_dir=store)).run([str(_input(jobs, case, form))])
    return analyze(load_local(store, case))


def culprit(report):
    """The finding a user reads first: the first error, else the first warning, else ``None``."""
    for severity in ("error", "warning"):
        for f in report.findings:
            if f.severity == severity:
                return f
    return None


def _params():
    for case in EXPECTED:
        for form in ("console", "logdir"):
            why = STILL_WRONG.get((case, form))
            marks = [pytest.mark.xfail(strict=True, reason=f"issue 19, still wrong: {why}")] if why else []
            yield pytest.param(case, form, id=f"{case}-{form}", marks=marks)


@pytest.mark.parametrize(("case", "form"), list(_params()))
def test_the_first_finding_names_the_fault_and_its_rank(jobs, case, form, tmp_path):
    meta = json.loads((jobs / case / "case.json").read_text())
    assert meta["returncode"] is not None, f"{case} did not end within the run's timeout"
    report = _report(jobs, case, form, tmp_path)
    first = culprit(report)
    seen = [(f.severity, f.kind, f.ranks, f.summary[:120]) for f in report.findings]
    want = EXPECTED[case]
    if want is None:
        assert first is None, seen
        return
    kinds, ranks = want
    assert first is not None and first.kind in kinds, seen
    if ranks is not None:
        assert first.ranks == ranks, seen


@pytest.mark.parametrize("case", [c for c, w in EXPECTED.items() if w is None or w[0][0] != "loss_spike"])
def test_both_forms_see_the_same_ranks(jobs, case, tmp_path):
    """The console's ``[defaultN]:`` streams are local ranks 0–3, as the log directory's folders are: no
    launcher line becomes a fifth rank, and the numbering is N's, not the order of first appearance."""
    ranks = {}
    for form in ("console", "logdir"):
        report = _report(jobs, case, form, tmp_path / form)
        ranks[form] = sorted(r.rank for r in report.per_rank if r.rank is not None)
    assert ranks["console"] == ranks["logdir"] == list(range(4)), ranks


def test_ingested_jobs_join_the_golden_library(jobs, tmp_path):
    """A team seeds its library from old logs: the healthy job's console, ingested, becomes an entry; the slow
    data loader's run, ingested the same way, is refused as an entry and compared against it."""
    from click.testing import CliRunner

    from jobtrace.cli import main, trace_job

    store = tmp_path / "store"
    for case in ("healthy_busy", "slow_data"):
        Ingestor(IngestConfig(job=case), open_sink("local", case, data_dir=store)).run([str(_input(jobs, case, "console"))])
    res = CliRunner().invoke(main, ["golden", "add", "healthy_busy", "--data-dir", str(store), "--tag", "ingested"])
    assert res.exit_code == 0, res.output
    shown = json.loads(CliRunner().invoke(main, ["golden", "show", "healthy_busy", "--data-dir", str(store)]).output)
    assert shown["world"] == 4 and shown["tags"] == ["ingested"] and "data_ms" in shown["series"]
    res = CliRunner().invoke(main, ["golden", "add", "slow_data", "--data-dir", str(store)])
    assert res.exit_code == 1 and "data_wait" in res.output
    res = CliRunner().invoke(trace_job, ["slow_data", "--data-dir", str(store), "--json", "--golden", "--gate", "6"])
    report = json.loads(res.output)
    assert res.exit_code == 1 and report["golden"] == ["healthy_busy"], report["golden_choice"]
    # The run's series are medians over ranks: its step departs (the others wait for rank 2 in backward's
    # all-reduces); the score per rank names rank 2, by its data phase.
    departed = {f["details"]["metric"] for f in report["findings"] if f["kind"] == "golden_deviation"}
    assert "step_ms" in departed, [f["summary"] for f in report["findings"]]
    [score] = [f for f in report["findings"] if f["kind"] == "golden_score"]
    first = score["details"]["ranks"][0]
    assert (first["rank"], first["contributions"][0]["what"]) == (R, "data_ms"), score["details"]["ranks"]
