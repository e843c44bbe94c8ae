"""OTLP/JSON spans into a job: NVIDIA NeMo Lens's own output (data/nemo_lens, read back from a real Jaeger),
then what ``trace-job`` concludes from them. The expected values are read from the documents by this test,
independently of the parser."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from ingest import IngestConfig, Ingestor, open_sink
from jobtrace.cli import main
from queries import analyze, load_local
from tests.conftest import read_events

LENS = Path(__file__).parent / "data" / "nemo_lens"


def document_spans(path: Path) -> list[tuple[int, dict]]:
    """(dl.rank, span) for every span of a Jaeger v3 answer, attributes as a plain dict."""
    out = []
    for batch in json.loads(path.read_text())["result"]["resourceSpans"]:
        res = {a["key"]: next(iter(a["value"].values())) for a in batch["resource"]["attributes"]}
        for scope in batch["scopeSpans"]:
            for s in scope["spans"]:
                s = {**s, "attrs": {a["key"]: next(iter(a["value"].values())) for a in s.get("attributes", [])}}
                out.append((int(res["dl.rank"]), s))
    return out


def ingest(tmp_path: Path, name: str) -> str:
    res = CliRunner().invoke(main, ["ingest", str(LENS / f"{name}.json"), "--job", name, "--data-dir", str(tmp_path),
                                    "--quiet"])
    assert res.exit_code == 0, res.output
    return name


@pytest.mark.parametrize("name", ["healthy", "slow-rank-0", "slow-rank-1"])
def test_every_lens_span_lands_on_its_rank_with_its_step_and_the_steps_metrics(tmp_path, name):
    ingest(tmp_path, name)
    events = read_events(tmp_path / name)
    spans = [e for e in events if e["kind"] == "span"]
    doc = document_spans(LENS / f"{name}.json")
    assert len(spans) == len(doc)
    by_id = {e["span_id"]: e for e in spans}
    for rank, s in doc:
        e = by_id[s["spanId"]]
        assert (e["rank"], e["node"], e["name"]) == (rank, "vm", s["name"])
        assert (e["start"], e["dur"]) == (int(s["startTimeUnixNano"]),
                                          int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"]))
        assert e["attrs"]["otel.trace_id"] == s["traceId"]
        if "dl.iteration" in s["attrs"]:
            assert e["step"] == int(s["attrs"]["dl.iteration"])
        expected = {"train.step": "step", "forward_backward": "phase", "optimizer": "phase", "train.job": "user"}
        assert e["cat"] == expected[s["name"]]
        if e["cat"] == "phase":
            assert by_id[e["parent_id"]]["cat"] == "step" and by_id[e["parent_id"]]["step"] == e["step"]
    # The step span's dl.loss, dl.grad_norm and dl.learning_rate are the step's metrics, under our names.
    loss = {(r, int(s["attrs"]["dl.iteration"])): s["attrs"]["dl.loss"] for r, s in doc if s["name"] == "train.step"}
    metrics = {(e["rank"], e["step"]): e["metrics"] for e in events if e["kind"] == "metric"}
    assert {k: m["loss"] for k, m in metrics.items()} == loss and len(loss) == 60
    assert {m["lr"] for m in metrics.values()} == {1e-3}
    # Lens gives each rank a trace of its own; the job's events still share one trace id.
    assert len({e["attrs"]["otel.trace_id"] for e in spans}) == 2 and len({e["trace_id"] for e in events}) == 1


@pytest.mark.parametrize("slow", [0, 1])
def test_the_slow_rank_is_named_from_lens_spans_alone(tmp_path, slow):
    """No collective is recorded; the ranks' optimizer spans end together and start apart, so that phase is
    where the fast rank waits, and the rank that arrives last in it is the slow one."""
    name = ingest(tmp_path, f"slow-rank-{slow}")
    report = analyze(load_local(tmp_path, name))
    slow_findings = [f for f in report.findings if f.kind == "slow_rank"]
    assert [f.ranks for f in slow_findings] == [[slow]]
    assert slow_findings[0].details["others_wait_op"] == "optimizer"
    assert report.to_dict()["collectives"]["inferred_from_phases"] == ["optimizer"]
    by = {r.rank: r for r in report.per_rank}
    assert by[slow].compute_ms > 2 * by[1 - slow].compute_ms and by[1 - slow].collective_ms > 30


def test_a_healthy_lens_job_is_healthy_and_no_phase_is_taken_for_a_collective(tmp_path):
    report = analyze(load_local(tmp_path, ingest(tmp_path, "healthy")))
    assert report.findings == [] and report.steps == 30 and report.ranks == 2
    assert "inferred_from_phases" not in report.to_dict()["collectives"]


def _ingest_lines(tmp_path: Path, lines: list[bytes]) -> tuple[list[dict], object]:
    path = tmp_path / "in.log"
    path.write_bytes(b"\n".join(lines) + b"\n")
    summary = Ingestor(IngestConfig(job="j"), open_sink("local", "j", data_dir=tmp_path / "s")).run([str(path)])
    return read_events(tmp_path / "s" / "j"), summary


def test_what_is_not_an_otlp_document_stays_a_log_line_and_broken_spans_are_counted(tmp_path):
    span = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "train.step",
            "attributes": [{"key": "dl.iteration", "value": {"intValue": "4"}},
                           {"key": "dl.loss", "value": {"doubleValue": "NaN"}}]}
    good = {"resourceSpans": [{"resource": {"attributes": [{"key": "dl.rank", "value": {"intValue": "3"}}]},
                               "scopeSpans": [{"spans": [{**span, "startTimeUnixNano": "1000000000",
                                                          "endTimeUnixNano": "1500000000"}]}]}]}
    untimed = {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}
    events, summary = _ingest_lines(tmp_path, [
        b'2026-12-06 10:00:00 INFO exporter sent "resourceSpans" to the collector',  # a log line naming the key
        b'{"resourceSpans": [ this is not json',
        orjson.dumps(untimed),
        orjson.dumps(good),
    ])
    logs = [e["msg"] for e in events if e["kind"] == "log"]
    assert any("sent \"resourceSpans\"" in m for m in logs) and any("this is not json" in m for m in logs)
    [step] = [e for e in events if e["kind"] == "span"]
    assert (step["rank"], step["step"], step["cat"], step["dur"]) == (3, 4, "step", 500_000_000)
    [metric] = [e for e in events if e["kind"] == "metric"]
    assert metric["metrics"]["loss"] == "NaN"  # a non-finite loss kept as the analysis reads it
    skipped = defaultdict(int, summary.to_dict().get("skipped") or {})
    assert any("without times" in reason for reason in skipped), summary.to_dict()
