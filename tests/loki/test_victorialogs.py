"""End to end into a real VictoriaLogs through its Loki push API: a real multi-rank torch job, read back.

The job is the demo's training script under torchrun (4 ranks, gloo, CPU) with rank 2
slow and rank 0's loss NaN from step 9, with ``JOBTRACE_LOKI_URL`` pointing at
VictoriaLogs: every rank ships protobuf+snappy pushes with structured metadata. The
embedded store is on as well, and is the ground truth the server is compared with.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter

import pytest
import requests

from queries import analyze, load_local
from queries._backends import TimeRange, load_job
from tests.conftest import read_events

pytestmark = [pytest.mark.servers, pytest.mark.torchjob]
torch = pytest.importorskip("torch", reason="torch is part of the test dependencies (jobtrace[torch])")


def logsql(vl, query: str, **params) -> list[dict]:
    vl.force_flush()
    r = requests.post(vl.url + "/select/logsql/query", data={"query": query, **params}, timeout=60)
    assert r.status_code == 200, r.text
    return [json.loads(line) for line in r.text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def shipped(vl, tmp_path_factory):
    """(job id, data dir) of a torch job that shipped to VictoriaLogs while writing the embedded store."""
    from jobtrace.demo import DemoConfig, run_job

    data = tmp_path_factory.mktemp("vl-job")
    job_id = f"vl-e2e-{uuid.uuid4().hex[:8]}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JOBTRACE_LOKI_URL", vl.url + "/insert/loki")
        for var in ("JOBTRACE_LOKI_FORMAT", "JOBTRACE_LOKI_STRUCTURED_METADATA", "JOBTRACE_LOCAL"):
            mp.delenv(var, raising=False)
        rc = run_job(DemoConfig(job_id=job_id, data_dir=str(data), ranks=4, steps=12, slow_ranks=[2], slow_ms=40,
                                nan_step=9, heartbeat_s=0.5, stall_s=120, timeout_s=240))
    assert rc == 0
    return job_id, data


class TestShippedJob:
    def test_every_event_of_every_rank_arrives_once(self, vl, shipped):
        """Counts per rank and kind on the server equal the embedded store's; each line arrives once."""
        job_id, data = shipped
        local = read_events(data / job_id)
        rows = logsql(vl, '{training_job="%s", kind!="rollup"} | fields _msg' % job_id)  # events, not packs
        remote = [json.loads(r["_msg"]) for r in rows]
        assert Counter((e["rank"], e["kind"]) for e in remote) == Counter((e["rank"], e["kind"]) for e in local)
        assert sorted(json.dumps(e, sort_keys=True) for e in remote) == \
            sorted(json.dumps(e, sort_keys=True) for e in local)
        # nothing was refused, nothing left behind
        spool = data / job_id / ".spool"
        assert not list(spool.rglob("dead-letter.jsonl"))
        assert not list(spool.rglob("seg-*.jsonl"))

    def test_labels_are_streams_and_ids_are_structured_fields(self, vl, shipped):
        """Stream = job/node/kind(/level); rank, trace_id, span_id, step are fields equal to the line's."""
        job_id, _ = shipped
        rows = logsql(vl, '{training_job="%s"} | fields _stream, _msg, rank, trace_id, span_id, step' % job_id)
        streams = {r["_stream"] for r in rows}
        assert all("rank" not in s and "step" not in s for s in streams)
        assert len(streams) <= 1 * 1 * (4 + 1) * 3  # one node, four kinds and the packs, logs by level
        traces = set()
        for r in rows:
            ev = json.loads(r["_msg"])
            assert r["rank"] == str(ev["rank"]) and r["trace_id"] == ev["trace_id"]
            assert r.get("span_id", "") == ev.get("span_id", "")
            assert r.get("step", "") == (str(ev["step"]) if "step" in ev else "")
            traces.add(ev["trace_id"])
        assert len(traces) == 1
        # the structured fields are searchable: one rank's spans by trace id and rank
        (trace,) = traces
        n = logsql(vl, '{training_job="%s", kind="span"} trace_id:="%s" rank:=2 | stats count() as n' % (job_id, trace))
        assert int(n[0]["n"]) > 12

    def test_trace_job_on_victorialogs_gives_the_embedded_stores_report(self, vl, shipped):
        """The full report from the server (LogsQL) equals the one from the embedded store."""
        job_id, data = shipped
        vl.force_flush()
        local = analyze(load_local(data, job_id)).to_dict()
        remote = analyze(load_job("victorialogs", job_id, url=vl.url, time_range=TimeRange.parse("2h", None)))
        assert remote.source.startswith("victorialogs:")
        # every rank exited cleanly and shipped its pack: the report comes from the packs (TestPacks)
        assert "4 ranks read from the rollups they shipped at exit" in remote.source, remote.source
        remote_d = remote.to_dict()
        local.pop("source")
        remote_d.pop("source")
        assert remote_d == local
        kinds = [f["kind"] for f in remote_d["findings"]]
        assert "slow_rank" in kinds and "nan_loss" in kinds
        assert next(f for f in remote_d["findings"] if f["kind"] == "slow_rank")["ranks"] == [2]

    def test_trace_job_cli_on_victorialogs(self, vl, shipped):
        """`trace-job <id> --backend victorialogs --url … --json`: exit 1 (problems found), the same findings."""
        from click.testing import CliRunner

        from jobtrace.cli import trace_job

        job_id, data = shipped
        result = CliRunner().invoke(trace_job, [job_id, "--backend", "victorialogs", "--url", vl.url, "--json",
                                                "--since", "2h"])
        assert result.exit_code == 1, result.output
        report = json.loads(result.output)
        assert report["ranks"] == 4 and report["steps"] == 12
        assert {f["kind"] for f in report["findings"]} >= {"slow_rank", "nan_loss"}


class TestPacks:
    """Each rank of the job, exiting cleanly, shipped its pack (its rollup: :mod:`jobtrace.store._packs`) beside
    its events through the same Loki push: trace-job reads the ranks from them, and the views of events
    (tail, the job listing) neither show nor count them."""

    def test_each_rank_shipped_its_pack_as_a_stream_of_its_own(self, vl, shipped):
        from jobtrace.store import unpack

        job_id, _ = shipped
        rows = logsql(vl, '{training_job="%s", kind="rollup"} | fields _msg, _stream, rank' % job_id)
        records = [json.loads(r["_msg"]) for r in rows]
        assert {r["rank"] for r in records} == {0, 1, 2, 3}
        assert all('kind="rollup"' in r["_stream"] and r["rank"] == str(rec["rank"]) for r, rec in zip(rows, records))
        packs = unpack(records)
        try:
            assert packs.ranks == {0, 1, 2, 3} and not packs.skipped
        finally:
            packs.close()

    def test_the_read_from_packs_equals_the_read_of_every_event(self, vl, shipped):
        """The same report as the embedded store's (TestShippedJob) and as reading every event on the server."""
        job_id, data = shipped
        span = TimeRange.parse("2h", None)
        packed = load_job("victorialogs", job_id, url=vl.url, time_range=span)
        assert "4 ranks read from the rollups they shipped at exit" in packed.source, packed.source
        assert packed.stats.fetched_events is not None and packed.stats.fetched_events < packed.stats.events
        whole = load_job("victorialogs", job_id, url=vl.url, time_range=span, packs=False)
        a, b = analyze(packed).to_dict(), analyze(whole).to_dict()
        a.pop("source")
        b.pop("source")
        assert a == b

    def test_tail_and_job_listing_show_and_count_events_only(self, vl, shipped):
        from queries._server_jobs import list_server_jobs
        from queries._tail import VictoriaLogsTail

        job_id, data = shipped
        local = read_events(data / job_id)
        tail = VictoriaLogsTail(job_id, vl.url, lookback_s=7200)
        seen = tail.read()
        assert Counter(e["kind"] for e in seen) == Counter(e["kind"] for e in local)
        (row,) = [r for r in list_server_jobs("victorialogs", url=vl.url, time_range=TimeRange.parse("2h", None))
                  if r["job_id"] == job_id]
        assert (row["events"], row["ranks"]) == (len(local), 4)
