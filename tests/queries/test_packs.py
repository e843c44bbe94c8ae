"""Packs: a rank's rollup as records for a log server, and what a reader accepts back (issue 26).

The server tests (``test_vl_packs``, ``test_es_packs``) show a packed job read back gives the
embedded store's report. These pin the pack itself: its tables are the rollup the rank wrote,
row for row; big tables split into parts under the line limit and join again; and every way a set
of records can be unusable (a part lost, another version, a restarted rank, damage, a time range
that cuts the rank's events) makes the reader skip that rank's pack and say why, never misread it.
"""

from __future__ import annotations

import base64
import copy
import glob
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pytest

from jobtrace.store import PACK_KIND, PACK_TABLES, PART_BYTES, job_files, pack_lines, pack_records, rollup_paths, unpack
from jobtrace.synth import SynthJob, write_job


@pytest.fixture(scope="module")
def segments(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Four ranks of a faulty synthetic job, each with its segment and rollup (as a clean exit leaves them)."""
    data = tmp_path_factory.mktemp("packs")
    directory = write_job(data, SynthJob(job_id="p", ranks=4, steps=300, slow_ranks={2: 1.6}, nan_step=250,
                                         logs_per_step=1))
    return sorted(job_files(directory).segments)


def _rows(con: duckdb.DuckDBPyConnection, source: str) -> str:
    return repr(sorted(con.execute(f"SELECT * FROM {source}").fetchall(), key=repr))  # NaN-safe


def test_a_pack_holds_the_ranks_rollup_row_for_row(segments: list[str]) -> None:
    records = pack_records(segments[2])
    assert {r["rollup"]["table"] for r in records} == set(PACK_TABLES)
    assert {(r["kind"], r["job"], r["rank"]) for r in records} == {(PACK_KIND, "p", 2)}
    packs = unpack(records)
    try:
        assert packs.ranks == {2} and packs.skipped == {}
        con = duckdb.connect()
        for table, path in rollup_paths(Path(segments[2])).items():
            if table not in PACK_TABLES:
                continue  # scaling: derived from the loss-scale metrics the pack's events hold
            assert _rows(con, f"read_parquet('{packs.tables[table][0]}')") == _rows(con, f"read_parquet('{path}')")
        # the events the checks read directly: every log, the ten longest data waits, the first step and loss
        seg = f"read_parquet('{segments[2]}')"
        kinds = dict(con.execute(f"SELECT kind, count(*) FROM read_parquet('{packs.tables['events'][0]}') "
                                 "GROUP BY kind").fetchall())
        logs = con.execute(f"SELECT count(*) FROM {seg} WHERE kind = 'log'").fetchone()[0]  # type: ignore[index]
        assert kinds == {"log": logs, "span": 11, "metric": 1}
        assert packs.events[2] == con.execute(f"SELECT count(*) FROM {seg}").fetchone()[0]  # type: ignore[index]
    finally:
        packs.close()
    assert not packs.dir.exists()


def test_every_line_is_under_the_line_limit_and_a_big_table_joins_again(tmp_path: Path) -> None:
    """8,000 steps make tables larger than one part: each line stays under Loki's 256 KiB, the parts rejoin."""
    directory = write_job(tmp_path, SynthJob(job_id="big", ranks=1, steps=8000, logs_per_step=2))
    segment = job_files(directory).segments[0]
    lines = pack_lines(segment)
    assert max(len(line) for line in lines) < 192 * 1024
    records = [orjson.loads(line) for line in lines]
    split = {r["rollup"]["table"] for r in records if r["rollup"]["parts"] > 1}
    assert "steps" in split
    assert all(len(base64.b64decode(r["parquet"])) <= PART_BYTES for r in records)
    packs = unpack(reversed(records))  # any order
    try:
        con = duckdb.connect()
        path = rollup_paths(Path(segment))["steps"]
        assert _rows(con, f"read_parquet('{packs.tables['steps'][0]}')") == _rows(con, f"read_parquet('{path}')")
    finally:
        packs.close()


def _all(segments: list[str]) -> list[dict[str, Any]]:
    return [r for s in segments for r in pack_records(s)]


def test_duplicates_are_dropped(segments: list[str]) -> None:
    records = _all(segments)
    packs = unpack(records + copy.deepcopy(records))
    try:
        assert packs.ranks == {0, 1, 2, 3} and packs.skipped == {}
        assert {t: len(files) for t, files in packs.tables.items()} == dict.fromkeys(PACK_TABLES, 4)
    finally:
        packs.close()


@pytest.mark.parametrize(("spoil", "reason"), [
    (lambda rs: [r for r in rs if not (r["rank"] == 1 and r["rollup"]["table"] == "steps")], "a part missing"),
    (lambda rs: [r | {"rollup": r["rollup"] | {"key": "00000000"}} if r["rank"] == 1 else r for r in rs],
     "packed by another version of jobtrace"),
    (lambda rs: [r | {"pid": 7} if r["rank"] == 1 and r["rollup"]["table"] == "colls" else r for r in rs],
     "several processes (a restarted rank)"),
    (lambda rs: [r | {"parquet": "not base64!"} if r["rank"] == 1 and r["rollup"]["table"] == "mets" else r
                 for r in rs], "a part damaged"),
    (lambda rs: [r | {"parquet": base64.b64encode(b"PAR1 junk").decode()}
                 if r["rank"] == 1 and r["rollup"]["table"] == "ranks" else r for r in rs], "a part damaged"),
])
def test_an_unusable_pack_is_skipped_and_counted(segments: list[str], spoil: Any, reason: str) -> None:
    packs = unpack(spoil(_all(segments)))
    try:
        assert packs.ranks == {0, 2, 3}
        assert packs.skipped == {reason: 1}
        assert not any(f.endswith("/r1.parquet") for files in packs.tables.values() for f in files)
    finally:
        packs.close()


def test_records_that_are_not_packs_are_counted(segments: list[str]) -> None:
    packs = unpack([{"kind": PACK_KIND, "rank": "zero"}, {"kind": PACK_KIND, "rank": 3, "rollup": "x"},
                    *pack_records(segments[0])])
    try:
        assert packs.ranks == {0} and packs.skipped == {"not a pack record": 2}
    finally:
        packs.close()


def test_a_pack_is_used_only_inside_the_time_range_read(segments: list[str]) -> None:
    records = pack_records(segments[0])
    first, last = records[0]["rollup"]["first_ts"], records[0]["rollup"]["last_ts"]
    for start, end, used in ((first, last + 1, True), (first + 1, last + 1, False), (first, last, False)):
        packs = unpack(records, start_ns=start, end_ns=end)
        try:
            assert bool(packs.ranks) is used, (start, end)
        finally:
            packs.close()


def test_no_pack_without_a_rollup(segments: list[str], tmp_path: Path) -> None:
    directory = write_job(tmp_path, SynthJob(job_id="n", ranks=1, steps=5))
    segment = job_files(directory).segments[0]
    for p in rollup_paths(Path(segment)).values():
        p.unlink()
    assert pack_records(segment) == []
    assert pack_records(tmp_path / "missing.parquet") == []
    assert not glob.glob("/tmp/jobtrace-pack-*/events.parquet")

