"""Packs on their way out: a rank's rollup sent beside its events when its store sink closes, and by ``export``.

A rank that exits cleanly compacts its JSON lines into a segment and a rollup; its *pack* (the rollup
as a few ``kind="rollup"`` lines, :mod:`jobtrace.store._packs`) then goes to the shippers that take
packs, so ``trace-job`` on a log server reads a few records per rank instead of every event. These
tests check the wiring (which sinks get the pack, that a failure never breaks shutdown), the Loki
encoding of pack lines (their own stream, the rank in structured metadata, nothing dead-lettered),
and ``jobtrace export`` against a real VictoriaLogs: the packs arrive, the read uses them and gives the
embedded store's findings, a second export changes nothing, and a rank the redactor changed gets none.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from jobtrace.store import PACK_KIND, job_dir, job_files, pack_lines, unpack
from jobtrace.synth import SynthJob, write_job
from queries import AnalysisConfig, analyze, load_local
from queries._backends import TimeRange, load_job
from shippers import LocalStoreSink, connect_packs, export_job
from shippers._loki import LokiEncoder, LokiOptions, LokiShipper
from tests.servers.victorialogs_server import VictoriaLogsServer

CFG = AnalysisConfig()
RANKS = 4


class Recorder:
    """A sink that keeps what it is given (the wiring under test is the store sink's, not a server's)."""

    takes_chunks = False

    def __init__(self, takes_packs: bool, fail: bool = False) -> None:
        self.takes_packs = takes_packs
        self.fail = fail
        self.lines: list[bytes] = []

    def write(self, lines: Sequence[bytes]) -> None:
        if self.fail:
            raise OSError("disk full")
        self.lines += lines

    def flush(self) -> None: ...

    def close(self) -> None: ...


def synth(root: Path, **kw: Any) -> SynthJob:
    job = SynthJob(job_id=f"packs-{uuid.uuid4().hex[:8]}", ranks=RANKS, steps=30, ranks_per_node=2,
                   slow_ranks={2: 1.8}, nan_step=20, t0_ns=time.time_ns() - 900 * 10**9, **kw)
    write_job(root, job)
    return job


def verdicts(job: Any) -> list[tuple[str, list[int]]]:
    return sorted((f.kind, list(f.ranks)) for f in analyze(job, CFG).findings if f.severity in ("error", "warning"))


# ---- the store sink hands its pack on at close --------------------------------------------------------------

def test_the_store_sink_sends_its_pack_at_close_to_the_pack_takers_closed_after_it(tmp_path: Path) -> None:
    """Of the sinks after the store, those that take packs get the rank's pack once it compacted; a sink listed
    before it (closed already when it closes), or one that takes no packs, gets nothing; one that fails
    changes nothing for the others and does not break the close."""
    job = synth(tmp_path / "src", compact=False)
    (source,) = sorted(job_dir(tmp_path / "src", job.job_id).glob("node0000.r1.*.jsonl"))
    before, failing, taker, other = Recorder(True), Recorder(True, fail=True), Recorder(True), Recorder(False)
    store = LocalStoreSink(tmp_path / "data", job.job_id, "node0000", 1, 1001)
    sinks = [before, store, failing, taker, other]
    connect_packs(sinks)  # type: ignore[arg-type]  # Recorders are sinks
    assert store.pack_consumers == [failing, taker]
    store.write([source.read_bytes()])
    store.close()

    records = [orjson.loads(line) for line in taker.lines]
    assert records and {r["kind"] for r in records} == {PACK_KIND} and {r["rank"] for r in records} == {1}
    assert store.packed == len(records) and all(line.endswith(b"\n") for line in taker.lines)
    packs = unpack(records)
    try:
        assert packs.ranks == {1} and not packs.skipped
        assert packs.events[1] == sum(1 for _ in source.open("rb"))
    finally:
        packs.close()
    assert before.lines == [] and other.lines == []


def test_no_pack_without_a_segment_or_without_takers(tmp_path: Path) -> None:
    """With compaction off there is no rollup, so no pack; with no taker nothing is packed (no DuckDB work)."""
    job = synth(tmp_path / "src", compact=False)
    (source,) = sorted(job_dir(tmp_path / "src", job.job_id).glob("node0000.r0.*.jsonl"))
    taker = Recorder(True)
    off = LocalStoreSink(tmp_path / "a", job.job_id, "node0000", 0, 1000, compact=False)
    connect_packs([off, taker])
    off.write([source.read_bytes()])
    off.close()
    alone = LocalStoreSink(tmp_path / "b", job.job_id, "node0000", 0, 1000)
    connect_packs([alone])
    alone.write([source.read_bytes()])
    alone.close()
    assert taker.lines == [] and off.packed == 0 and alone.packed == 0
    assert list((tmp_path / "b").rglob("*.parquet"))  # it did compact: the segment is there


def test_the_default_sinks_wire_the_shipper_after_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``init_tracing``'s sinks: the store first, then the Loki shipper, which takes its pack."""
    from jobtrace.config import TracingSettings
    from jobtrace.identity import resolve_identity
    from otel_instrumentation._setup import _default_sinks

    monkeypatch.setenv("JOBTRACE_LOKI_URL", "http://127.0.0.1:9/insert/loki")  # never contacted: closed unused
    monkeypatch.delenv("JOBTRACE_ES_URL", raising=False)
    monkeypatch.delenv("JOBTRACE_LOCAL", raising=False)
    ident = resolve_identity({}, job_id="wired", rank=0, world_size=1)
    sinks = _default_sinks(str(tmp_path), TracingSettings.from_env(), False)(ident)
    try:
        store, shipper = sinks
        assert isinstance(store, LocalStoreSink) and isinstance(shipper, LokiShipper)
        assert store.pack_consumers == [shipper]
    finally:
        for sink in sinks:
            if isinstance(sink, LokiShipper):
                sink.shutdown_timeout_s = 0
            sink.close()


# ---- the Loki encoding of pack lines ---------------------------------------------------------------------------

def test_pack_lines_are_a_stream_of_their_own_with_the_rank_as_metadata(tmp_path: Path) -> None:
    """``kind="rollup"`` as the stream label (every event query excludes it), the rank in structured metadata,
    every line under the default line limit: none is refused locally, in either payload format."""
    job = synth(tmp_path)
    (segment,) = [s for s in job_files(job_dir(tmp_path, job.job_id)).segments if Path(s).name.startswith("node0001.r3.")]
    lines = pack_lines(segment)
    assert lines and max(map(len, lines)) < LokiOptions().max_line_bytes
    enc = LokiEncoder("http://loki:3100/loki/api/v1/push", LokiOptions(format="json"))
    (stream,) = json.loads(enc.request(lines).body)["streams"]
    assert enc._local_rejects == [] and len(stream["values"]) == len(lines)
    assert stream["stream"] == {"training_job": job.job_id, "node": "node0001", "kind": PACK_KIND}
    assert {v[2]["rank"] for v in stream["values"]} == {"3"}
    assert [v[1].encode() + b"\n" for v in stream["values"]] == lines  # the line itself, unchanged
    wire = LokiEncoder("http://loki:3100/loki/api/v1/push")
    wire.request(lines)
    assert wire._local_rejects == [] and len(wire._sent) == len(lines)


# ---- jobtrace export to a real VictoriaLogs --------------------------------------------------------------------

@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in [v for v in os.environ if v.startswith("JOBTRACE_") and v != "JOBTRACE_SERVERS_CACHE"]:
        monkeypatch.delenv(var)
    yield


def pack_rows(vl: VictoriaLogsServer, job_id: str) -> list[dict[str, Any]]:
    vl.force_flush()
    return vl.query('{training_job="%s", kind="rollup"} | fields _msg, _stream, rank' % job_id)


@pytest.mark.servers
def test_export_sends_every_ranks_pack_and_the_read_uses_them(tmp_path: Path, victorialogs: VictoriaLogsServer,
                                                              clean_env: None) -> None:
    job = synth(tmp_path)
    local = load_local(tmp_path, job.job_id)
    expected, events = verdicts(local), local.stats.events
    assert any(kind == "nan_loss" for kind, _ in expected), expected

    summary = export_job(tmp_path, job.job_id, "victorialogs", url=victorialogs.url, timeout_s=120)
    assert summary.complete and summary.refused == 0, summary.to_dict()
    assert summary.sent == summary.lines == events  # events only: the packs are counted apart
    assert (summary.packed_ranks, summary.packs_skipped, summary.packs_refused) == (RANKS, {}, 0)
    assert summary.packs_text == f"packs: {summary.packs} records for {RANKS} ranks"
    rows = pack_rows(victorialogs, job.job_id)
    assert len(rows) == summary.packs
    assert all('kind="rollup"' in r["_stream"] and r["rank"] == str(orjson.loads(r["_msg"])["rank"]) for r in rows)

    span = TimeRange.parse("2h", None)
    there = load_job("victorialogs", job.job_id, url=victorialogs.url, time_range=span)
    assert f"{RANKS} ranks read from the rollups they shipped at exit" in there.source, there.source
    assert there.stats.events == events
    assert verdicts(there) == expected

    # Sent again (a rerun after a partial export): the server holds every pack twice, and unpacking drops the
    # copies. VictoriaLogs keeps every event twice as well (it drops no duplicate line, unlike Loki), so each
    # rank has more events on the server than its pack stands for, and the reader reads them whole: the packs
    # then change nothing (the same report as a read without them).
    again = export_job(tmp_path, job.job_id, "victorialogs", url=victorialogs.url, timeout_s=120)
    assert again.complete and again.packed_ranks == RANKS
    rows = pack_rows(victorialogs, job.job_id)
    assert len(rows) == 2 * summary.packs
    packs = unpack(orjson.loads(r["_msg"]) for r in rows)
    try:
        assert packs.ranks == set(range(RANKS)) and not packs.skipped and packs.records == 2 * summary.packs
    finally:
        packs.close()
    there = load_job("victorialogs", job.job_id, url=victorialogs.url, time_range=span)
    assert there.stats.events == 2 * events and "0 ranks read from the rollups" in there.source, there.source
    without = load_job("victorialogs", job.job_id, url=victorialogs.url, time_range=span, packs=False)
    assert (there.stats.events, verdicts(there)) == (without.stats.events, verdicts(without))


@pytest.mark.servers
def test_export_without_packs_and_a_rank_the_redactor_changed(tmp_path: Path, victorialogs: VictoriaLogsServer,
                                                              clean_env: None,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """``packs=False`` sends none; with redaction changing a rank's lines on the way, that rank gets no pack (the
    Parquet inside it would still hold what was redacted) and is read from its redacted events."""
    job = synth(tmp_path)
    summary = export_job(tmp_path, job.job_id, "victorialogs", url=victorialogs.url, timeout_s=120, packs=False)
    assert summary.complete and (summary.packs, summary.packed_ranks) == (0, 0)
    assert pack_rows(victorialogs, job.job_id) == []

    other = synth(tmp_path)
    patterns = tmp_path / "patterns.tsv"
    patterns.write_text("loss_text\tloss [0-9]+\\.[0-9]{4}\n")  # in the log records' messages only
    monkeypatch.setenv("JOBTRACE_REDACT_PATTERNS", str(patterns))
    summary = export_job(tmp_path, other.job_id, "victorialogs", url=victorialogs.url, timeout_s=120)
    assert summary.complete, summary.to_dict()
    assert (summary.packs, summary.packs_skipped) == (0, {"redacted on the way": RANKS})
    assert pack_rows(victorialogs, other.job_id) == []
    victorialogs.force_flush()
    there = load_job("victorialogs", other.job_id, url=victorialogs.url, time_range=TimeRange.parse("2h", None))
    assert "rollups" not in there.source
    msgs = [m for (m,) in there.con.execute("SELECT msg FROM events WHERE kind = 'log'").fetchall()]
    assert msgs and all(m.endswith("[REDACTED:loss_text]") for m in msgs), msgs[:3]
