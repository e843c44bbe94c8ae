"""A real torch.distributed job's spans in a real Jaeger: one trace, every rank, a root, nothing orphaned."""

from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("torch", reason="torch is part of the test dependencies (jobtrace[torch])")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otlp extra is part of the test dependencies")

from click.testing import CliRunner

from jobtrace.cli import main
from jobtrace.demo import DemoConfig, run_job
from otel_instrumentation import trace_id_for_job
from queries import analyze, load_local
from tests.conftest import read_events

pytestmark = pytest.mark.torchjob

RANKS, STEPS, PHASES = 2, 5, ("data", "forward", "backward", "optimizer")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tmp_path_factory.mktemp("store")


@pytest.fixture(scope="module")
def trace(jaeger, store):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", jaeger.otlp_url)
        rc = run_job(DemoConfig(job_id="jaeger-job", data_dir=str(store), ranks=RANKS, steps=STEPS))
    assert rc == 0
    per_rank = 1 + STEPS * (1 + len(PHASES) + 1)  # at least: the step spans, their phases and all_reduce
    return jaeger.trace(trace_id_for_job("jaeger-job"), min_spans=RANKS * per_rank + 1)


def rank_of(trace, span):
    tags = {t["key"]: t["value"] for t in trace["processes"][span["processID"]]["tags"]}
    return tags["jobtrace.rank"]


def test_one_root_span_closed_by_rank_0_and_no_span_is_orphaned(trace):
    spans = {s["spanID"]: s for s in trace["spans"]}
    roots = [s for s in spans.values() if not s["references"]]
    assert [(r["operationName"], rank_of(trace, r)) for r in roots] == [("job", 0)]
    assert [r["spanID"] for s in spans.values() for r in s["references"] if r["spanID"] not in spans] == []
    assert not trace.get("warnings")


def test_every_rank_steps_under_the_root_with_phases_under_steps_and_all_reduce_under_the_optimizer(trace):
    spans = {s["spanID"]: s for s in trace["spans"]}
    parent = {sid: (s["references"][0]["spanID"] if s["references"] else None) for sid, s in spans.items()}
    name = {sid: s["operationName"] for sid, s in spans.items()}
    root = next(sid for sid, p in parent.items() if p is None)
    steps = Counter(rank_of(trace, s) for sid, s in spans.items() if name[sid] == "step" and parent[sid] == root)
    assert steps == {r: STEPS for r in range(RANKS)}
    for sid in spans:
        if name[sid] in PHASES:
            assert name[parent[sid]] == "step"
    reduces = [sid for sid in spans if name[sid] == "all_reduce"]
    assert len(reduces) == RANKS * STEPS and all(name[parent[sid]] == "optimizer" for sid in reduces)


def test_processes_name_the_job_and_each_rank(trace):
    instances = sorted({t["value"] for p in trace["processes"].values() for t in p["tags"]
                        if t["key"] == "service.instance.id"})
    assert instances == [f"jaeger-job/rank-{r}" for r in range(RANKS)]


def test_spans_carry_nemo_lens_names_for_nvidias_readers(trace):
    """NeMo Lens / NVRx conventions (NVIDIA-NeMo/Lens ``src/nemo/lens/semconv.py``): ``dl.*`` and ``nemo.run.id``
    (Lens) and ``nv.dl.*`` (NVRx) on the resource, ``dl.iteration`` on a step's spans, and the step's loss on its span as ``dl.loss``."""
    for process in trace["processes"].values():
        tags = {t["key"]: t["value"] for t in process["tags"]}
        assert tags["nv.dl.job.uuid"] == tags["nv.dl.run.uuid"] == tags["nemo.run.id"] == "jaeger-job"
        assert tags["nv.dl.rank"] == tags["dl.rank"] == tags["jobtrace.rank"]
        assert tags["nv.dl.world_size"] == tags["dl.world_size"] == RANKS
    steps = [s for s in trace["spans"] if s["operationName"] == "step"]
    for s in steps:
        tags = {t["key"]: t["value"] for t in s["tags"]}
        assert tags["dl.iteration"] == tags["jobtrace.step"]
        assert isinstance(tags["dl.loss"], float) and tags["dl.loss"] == tags["dl.loss"]  # the demo logs its loss
    assert len({(rank_of(trace, s), {t["key"]: t["value"] for t in s["tags"]}["dl.iteration"]) for s in steps}) \
        == RANKS * STEPS


def test_the_trace_read_back_from_jaeger_as_otlp_json_is_the_same_job(trace, jaeger, store, tmp_path):
    """Jaeger's API v3 (OTLP/JSON) through ``jobtrace ingest``: every span on its rank and step, the steps'
    losses as the ranks logged them, and the same per-rank steps as the job's own store."""
    doc = tmp_path / "trace.json"
    doc.write_bytes(jaeger.trace_otlp(trace_id_for_job("jaeger-job")))
    res = CliRunner().invoke(main, ["ingest", str(doc), "--job", "from-jaeger", "--data-dir", str(tmp_path / "d"),
                                    "--quiet"])
    assert res.exit_code == 0, res.output
    back = read_events(tmp_path / "d" / "from-jaeger")
    own = read_events(store / "jaeger-job")
    assert len([e for e in back if e["kind"] == "span"]) == len(trace["spans"])
    steps = lambda evs: sorted((e["rank"], e["step"]) for e in evs if e["kind"] == "span" and e.get("cat") == "step")
    assert steps(back) == steps(own) and len(steps(back)) == RANKS * STEPS
    loss = lambda evs: {(e["rank"], e["step"]): e["metrics"]["loss"] for e in evs
                        if e["kind"] == "metric" and "loss" in (e.get("metrics") or {})}
    assert loss(back) == loss(own) and len(loss(back)) == RANKS * STEPS
    colls = lambda evs: sorted((e["rank"], e["attrs"]["seq"]) for e in evs if e.get("cat") == "collective")
    assert colls(back) == colls(own)
    report = analyze(load_local(tmp_path / "d", "from-jaeger"))
    assert (report.ranks, report.steps) == (RANKS, STEPS) and report.findings == []
