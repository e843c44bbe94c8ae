"""``trace-job --backend loki`` through the packs the ranks shipped at exit (issue 26), against the fake Loki.

A small faulty job is written to an embedded store and shipped with the real Loki shipper (JSON
push, structured metadata on) into :class:`FakeLoki`: every rank's events, and the packs of every
rank but one (:func:`jobtrace.store.pack_lines`, as a rank's clean exit sends them). The reader
must give the embedded store's verdicts and derived tables while reading whole only the rank with
no pack; a replayed push, ``whole`` and ``packs=False`` are handled; counting falls back to a whole
read where Loki refuses it; and every query it sends parses with Grafana's LogQL grammar.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import queries._loki as loki_reader
from jobtrace.store import RANK_IN_NAME, job_dir, job_files, pack_lines
from jobtrace.synth import SynthJob, write_job
from queries import JobData, analyze, load_local
from queries._backends import TimeRange
from queries._loki import load_loki, rank_filter
from shippers import InMemoryTransport
from tests.loki.conftest import lezer_parse
from tests.loki.fake_loki import FakeLoki
from tests.queries.test_server_reads import CFG, Verdicts, assert_same_tables, derived_tables, verdicts

JOB = SynthJob(job_id="loki-packs", ranks=12, steps=20, ranks_per_node=4, slow_ranks={7: 1.6}, nan_step=15,
               logs_per_step=1)
UNPACKED = 5
"""The rank whose pack is never shipped (as if it had been killed): it must be read from its events."""
URL = "http://loki:3100"


@dataclass
class Shipped:
    fake: FakeLoki
    pack_entries: list[Any]
    time_range: TimeRange
    events: int
    rank_events: dict[int, int]
    verdicts: Verdicts
    tables: dict[str, list[tuple[Any, ...]]]


def _ship(fake: FakeLoki, spool: Path, rank: int, node: str, lines: list[bytes]) -> None:
    """``lines`` through the real Loki shipper (JSON push, so no protobuf classes are needed) into ``fake``."""
    from shippers import ProcessInfo
    from shippers._loki import LokiShipper

    s = LokiShipper.from_env(ProcessInfo(JOB.job_id, node, rank, 1000 + rank, spool), url=URL,
                             transport=InMemoryTransport(fake))
    try:
        s.write(lines)
        assert s.wait_idle(60)
    finally:
        s.close()


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shipped]:
    data = tmp_path_factory.mktemp("loki-packs")
    spool = tmp_path_factory.mktemp("spool")
    directory = write_job(data, JOB)
    fake = FakeLoki()
    with pytest.MonkeyPatch.context() as mp:
        for var in [v for v in os.environ if v.startswith("JOBTRACE_")]:
            mp.delenv(var)
        mp.setenv("JOBTRACE_LOKI_FORMAT", "json")
        for path in sorted(directory.glob("*.jsonl")):
            m = RANK_IN_NAME.search(path.name)
            assert m
            _ship(fake, spool, int(m[1]), path.name.split(".")[0], path.read_bytes().splitlines(keepends=True))
        n_events = len(fake.entries)
        packed = 0
        for segment in job_files(job_dir(data, JOB.job_id)).segments:
            m = RANK_IN_NAME.search(Path(segment).name)
            assert m
            if int(m[1]) != UNPACKED:
                lines = pack_lines(segment)
                assert lines, f"no pack for {segment}"
                _ship(fake, spool, int(m[1]), Path(segment).name.split(".")[0], lines)
                packed += 1
        assert packed == JOB.ranks - 1
    pack_entries = fake.entries[n_events:]
    assert pack_entries and all(e.labels["kind"] == "rollup" and "rank" in e.metadata for e in pack_entries)
    local = load_local(data, JOB.job_id)
    report = analyze(local, CFG)
    per_rank = dict(local.con.execute("SELECT rank, count(*) FROM events GROUP BY rank").fetchall())
    first, last = local.con.execute("SELECT min(ts), max(ts) FROM events").fetchone()  # type: ignore[misc]
    yield Shipped(fake, pack_entries, TimeRange(first - 3600 * 10**9, last + 3600 * 10**9), local.stats.events,
                  per_rank, verdicts(report), derived_tables(local))


def _fake(shipped: Shipped, **kw: Any) -> FakeLoki:
    """A fresh fake holding what was shipped (queries logged from zero)."""
    fake = FakeLoki(**kw)
    fake.entries = copy.copy(shipped.fake.entries)
    return fake


def _load(fake: FakeLoki, time_range: TimeRange, **kw: Any) -> JobData:
    return load_loki(JOB.job_id, url=URL, time_range=time_range, transport=InMemoryTransport(fake), **kw)


def _sent(fake: FakeLoki) -> list[str]:
    return [q.get("query") or q["match[]"] for q in fake.queries]


def test_packs_give_the_embedded_stores_verdicts_and_tables(shipped: Shipped) -> None:
    fake = _fake(shipped)
    job = _load(fake, shipped.time_range)
    assert f"{JOB.ranks - 1} ranks read from the rollups they shipped at exit" in job.source, job.source
    assert job.stats.events == shipped.events  # the server's count, what the report says it read
    assert job.stats.fetched_events is not None and job.stats.fetched_events < shipped.events / 4
    found = verdicts(analyze(job, CFG))
    assert any(kind in ("slow_rank", "late_arrival") and ranks == [7] for kind, ranks in found), found
    assert any(kind == "nan_loss" for kind, _ in found), found
    assert found == shipped.verdicts
    assert_same_tables(job, shipped.tables, "loki (packs)")
    # The events were read through a rank filter naming only the rank without a pack.
    assert any(q.endswith(f'| rank=~"{UNPACKED}"') for q in _sent(fake)), _sent(fake)


def test_the_rank_without_a_pack_is_read_from_its_events(shipped: Shipped) -> None:
    job = _load(_fake(shipped), shipped.time_range)
    got = dict(job.con.execute("SELECT rank, count(*) FROM events GROUP BY rank").fetchall())
    assert got[UNPACKED] == shipped.rank_events[UNPACKED]
    assert all(got[r] < shipped.rank_events[r] for r in got if r != UNPACKED)


def test_packs_pushed_twice_are_read_once(shipped: Shipped) -> None:
    """A push replayed (Loki keeps both copies when the second arrives out of order or via another
    ingester) changes nothing: duplicates are dropped."""
    job = _load(_fake(shipped), shipped.time_range)
    analyze(job, CFG)
    before = derived_tables(job), job.stats.fetched_events
    fake = _fake(shipped)
    fake.entries += copy.deepcopy(shipped.pack_entries)
    job = _load(fake, shipped.time_range)
    assert f"{JOB.ranks - 1} ranks read from the rollups" in job.source
    assert verdicts(analyze(job, CFG)) == shipped.verdicts
    assert (derived_tables(job), job.stats.fetched_events) == before


@pytest.mark.parametrize("options", [{"whole": True}, {"packs": False}])
def test_whole_and_packs_off_read_every_event(shipped: Shipped, options: dict[str, bool]) -> None:
    fake = _fake(shipped)
    job = _load(fake, shipped.time_range, **options)
    assert "rollups" not in job.source
    assert job.stats.events == shipped.events
    assert job.con.execute("SELECT count(*) FROM events").fetchone()[0] == shipped.events  # type: ignore[index]
    assert not any('kind="rollup"' in q for q in _sent(fake))
    assert verdicts(analyze(job, CFG)) == shipped.verdicts


def test_load_job_passes_whole_to_loki(shipped: Shipped) -> None:
    """The timeline and Perfetto views ask ``load_job(..., whole=True)``: they draw every event, not the packs."""
    from queries._backends import load_job

    fake = _fake(shipped)
    job = load_job("loki", JOB.job_id, url=URL, time_range=shipped.time_range, whole=True,
                   transport=InMemoryTransport(fake))
    assert "rollups" not in job.source
    assert job.con.execute("SELECT count(*) FROM events").fetchone()[0] == shipped.events  # type: ignore[index]


def test_a_time_range_cutting_the_job_reads_the_events(shipped: Shipped) -> None:
    """A pack stands for all of its rank's events, so it is not used for a range holding only some of them."""
    ts = sorted(e.ts for e in shipped.fake.entries if e.labels["kind"] != "rollup")
    cut = TimeRange(ts[len(ts) // 2], shipped.time_range.end_ns)
    job = _load(_fake(shipped), cut)
    assert "rollups" not in job.source
    assert 0 < job.stats.events < shipped.events


def test_ranks_are_counted_in_slices_and_over_split_ranges(shipped: Shipped, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Loki with max_query_series 4 and max_query_length 1h: counts go in slices of 4 ranks, over hour-long
    instant queries, and the read is the same."""
    monkeypatch.setattr(loki_reader, "MAX_SERIES", 4)
    monkeypatch.setattr(loki_reader, "MAX_QUERY_LENGTH_NS", 3600 * 10**9)
    fake = _fake(shipped, max_series=4, max_query_length_ns=3600 * 10**9)
    job = _load(fake, shipped.time_range)
    assert f"{JOB.ranks - 1} ranks read from the rollups" in job.source
    assert job.stats.events == shipped.events
    assert verdicts(analyze(job, CFG)) == shipped.verdicts
    slices = [q for q in _sent(fake) if q.startswith("sum by (rank)")]
    assert {q.split("| rank < ")[1].split(" ")[0] for q in slices} == {"4", "8", "12"}
    assert len({q["time"] for q in fake.queries if "time" in q}) >= 2  # the 2h+ range took several instants


def test_counts_loki_refuses_fall_back_to_a_whole_read(shipped: Shipped) -> None:
    """A Loki whose max_query_series is below the slices' 500 ranks answers 400: every event is read instead."""
    fake = _fake(shipped, max_series=3)
    job = _load(fake, shipped.time_range)
    assert "rollups" not in job.source
    assert job.con.execute("SELECT count(*) FROM events").fetchone()[0] == shipped.events  # type: ignore[index]
    assert verdicts(analyze(job, CFG)) == shipped.verdicts


def test_a_rank_filter_too_long_reads_every_rank(shipped: Shipped, monkeypatch: pytest.MonkeyPatch) -> None:
    """Then every rank's events are read, and those take the place of the packs (:func:`with_packs`)."""
    monkeypatch.setattr(loki_reader, "MAX_RANK_FILTER", 5)
    fake = _fake(shipped)
    job = _load(fake, shipped.time_range)
    assert f"0 ranks read from the rollups they shipped at exit; {shipped.events:,} of {shipped.events:,}" in job.source
    assert verdicts(analyze(job, CFG)) == shipped.verdicts
    assert not any("| rank=~" in q for q in _sent(fake))


def test_events_of_no_rank_are_counted_and_read(shipped: Shipped) -> None:
    """A line of the job without rank metadata (a launcher's log) is counted by ``| rank=""`` and read whole."""
    fake = _fake(shipped)
    ts = shipped.fake.entries[0].ts
    fake.add({"training_job": JOB.job_id, "node": "launcher", "kind": "log", "level": "INFO"}, ts,
             f'{{"ts": {ts}, "kind": "log", "job": "{JOB.job_id}", "node": "launcher", "level": "INFO", '
             f'"msg": "launcher says hi", "v": 1}}')
    job = _load(fake, shipped.time_range)
    assert job.stats.events == shipped.events + 1
    assert job.con.execute("SELECT count(*) FROM events WHERE rank IS NULL").fetchone()[0] == 1  # type: ignore[index]
    assert any(q.endswith(f'| rank=~"{UNPACKED}" or rank=""') for q in _sent(fake))


def test_rank_filter_forms() -> None:
    assert rank_filter([3, 17], False) == '| rank=~"3|17"'
    assert rank_filter([1, 2, 3, 4, 9], True) == '| rank=~"9" or (rank >= 1 and rank < 5) or rank=""'
    assert rank_filter(list(range(0, 20_000, 2)), False) is None


def test_the_fake_evaluates_label_filters_as_loki_does() -> None:
    """A numeric comparison drops a line without the label; a string matcher sees it as ""; regexes are anchored."""
    fake = FakeLoki()
    fake.add({"a": "x"}, 1, "ranked", {"rank": "17"})
    fake.add({"a": "x"}, 2, "unranked")
    match = fake._matcher
    entries = fake.entries
    assert [e.line for e in entries if match('{a="x"} | rank >= 0')(e)] == ["ranked"]
    assert [e.line for e in entries if match('{a="x"} | rank=""')(e)] == ["unranked"]
    assert [e.line for e in entries if match('{a="x"} | rank=~"1|7"')(e)] == []
    assert [e.line for e in entries if match('{a="x"} | rank=~"3|17" or rank=""')(e)] == ["ranked", "unranked"]
    with pytest.raises(ValueError):
        match('{a="x"} | rank >= "0"')


def test_every_query_sent_parses_with_grafanas_grammar(shipped: Shipped, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loki_reader, "MAX_SERIES", 4)
    fake = _fake(shipped, max_series=4)
    fake.add({"training_job": JOB.job_id, "node": "launcher", "kind": "log"}, shipped.fake.entries[0].ts, "{}")
    _load(fake, shipped.time_range)
    ranges = '{a="b"} ' + (rank_filter([1, 2, 3, 9, 12], True) or "")  # the range form too
    sent = sorted(set(_sent(fake)) | {ranges})
    kinds = {"pack": 'kind="rollup"}', "slice": "sum by (rank)", "unranked": '| rank=""', "read": "| rank=~"}
    assert all(any(k in q for q in sent) for k in kinds.values()), sent
    errors = {q: e for q, e in lezer_parse({str(i): q for i, q in enumerate(sent)}).items() if e}
    assert not errors, {sent[int(i)]: e for i, e in errors.items()}
