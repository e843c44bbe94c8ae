"""A real torch.distributed job's spans in a real Jaeger: one trace, every rank, a root, nothing orphaned."""

from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("torch", reason="torch is part of the test dependencies (jobtrace[torch])")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otlp extra is part of the test dependencies")

from jobtrace.demo import DemoConfig, run_job
from otel_instrumentation import trace_id_for_job

pytestmark = pytest.mark.torchjob

RANKS, STEPS, PHASES = 2, 5, ("data", "forward", "backward", "optimizer")


@pytest.fixture(scope="module")
def trace(jaeger, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", jaeger.otlp_url)
        rc = run_job(DemoConfig(job_id="jaeger-job", data_dir=str(tmp_path_factory.mktemp("store")), ranks=RANKS,
                                steps=STEPS))
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
    """NeMo Lens / NVRx conventions (NVIDIA-NeMo/Lens ``src/nemo/lens/semconv.py``): ``nv.dl.*`` on the
    resource, ``dl.iteration`` on a step's spans, and the step's loss on its span as ``dl.loss``."""
    for process in trace["processes"].values():
        tags = {t["key"]: t["value"] for t in process["tags"]}
        assert tags["nv.dl.job.uuid"] == tags["nv.dl.run.uuid"] == "jaeger-job"
        assert tags["nv.dl.rank"] == tags["jobtrace.rank"] and tags["nv.dl.world_size"] == RANKS
    steps = [s for s in trace["spans"] if s["operationName"] == "step"]
    for s in steps:
        tags = {t["key"]: t["value"] for t in s["tags"]}
        assert tags["dl.iteration"] == tags["jobtrace.step"]
        assert isinstance(tags["dl.loss"], float) and tags["dl.loss"] == tags["dl.loss"]  # the demo logs its loss
    assert len({(rank_of(trace, s), {t["key"]: t["value"] for t in s["tags"]}["dl.iteration"]) for s in steps}) \
        == RANKS * STEPS
