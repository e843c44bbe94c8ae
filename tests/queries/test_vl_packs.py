"""Reading a job from the real VictoriaLogs through the packs its ranks shipped at exit (issue 26).

A rank that exits cleanly ships its *pack* beside its events: its rows of the derived tables and
the events the checks read directly (:mod:`jobtrace.store._packs`). The reader then reads a few
records per rank instead of every event, and reads whole only the ranks that left no pack. These
tests ship the 64-rank faulty job of ``test_server_reads`` with ``jobtrace export``'s code, push the
packs of all ranks but one through the Loki shipper (as a rank's exit does), and check that the read
gives the embedded store's verdicts and derived tables row for row, that the rank without a pack
arrives whole, and that a replayed push, a whole read and a time range cutting the job are handled.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from jobtrace.store import RANK_IN_NAME, job_dir, job_files, pack_lines
from jobtrace.synth import write_job
from queries import JobData, analyze, load_local
from queries._backends import TimeRange, load_job
from tests.queries.test_server_reads import (
    CFG,
    JOB,
    Verdicts,
    assert_faults_found,
    assert_same_tables,
    derived_tables,
    verdicts,
)
from tests.servers.victorialogs_server import VictoriaLogsServer

pytestmark = [pytest.mark.servers]

UNPACKED = 5
"""The rank whose pack is never shipped (as if it had been killed): it must be read from its events."""


@dataclass(frozen=True)
class PackedJob:
    job_id: str
    data_dir: Path
    time_range: TimeRange
    events: int
    rank_events: dict[int, int]
    verdicts: Verdicts
    tables: dict[str, list[tuple[Any, ...]]]
    url: str
    middle_ns: int


def push_packs(server: VictoriaLogsServer, data: Path, job_id: str, spool: Path, skip: int | None) -> int:
    """Every segment's pack (but rank ``skip``'s) through the Loki shipper to VictoriaLogs; the records pushed."""
    from shippers import ProcessInfo, open_shipper

    shipper = open_shipper("victorialogs", ProcessInfo(job_id, "packs", 0, os.getpid(), spool), server.url)
    pushed = 0
    try:
        for segment in job_files(job_dir(data, job_id)).segments:
            m = RANK_IN_NAME.search(Path(segment).name)
            if m and int(m[1]) != skip:
                lines = pack_lines(segment)
                assert lines, f"no pack for {segment}"
                shipper.write(lines)
                pushed += len(lines)
        assert shipper.wait_idle(120)
    finally:
        shipper.close()
    assert shipper.stats.rejected == 0
    server.force_flush()
    return pushed


@pytest.fixture(scope="module")
def packed(victorialogs: VictoriaLogsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PackedJob]:
    from shippers import export_job

    data = tmp_path_factory.mktemp("vl-packs")
    job_id = f"packs-{uuid.uuid4()}"
    job = replace(JOB, job_id=job_id)
    write_job(data, job)
    with pytest.MonkeyPatch.context() as mp:
        for var in [v for v in os.environ if v.startswith("JOBTRACE_") and v != "JOBTRACE_SERVERS_CACHE"]:
            mp.delenv(var)
        summary = export_job(data, job_id, "victorialogs", url=victorialogs.url, timeout_s=300, packs=False)
        assert summary.complete, summary.to_dict()
        push_packs(victorialogs, data, job_id, tmp_path_factory.mktemp("spool"), UNPACKED)
        local = load_local(data, job_id)
        report = analyze(local, CFG)
        first_ns, end_ns = local.con.execute("SELECT min(ts), max(ts) FROM events").fetchone()  # type: ignore[misc]
        per_rank = dict(local.con.execute("SELECT rank, count(*) FROM events GROUP BY rank").fetchall())
        yield PackedJob(job_id, data, TimeRange(job.t0_ns - 60 * 10**9, end_ns + 60 * 10**9), local.stats.events,
                        per_rank, verdicts(report), derived_tables(local), victorialogs.url, (first_ns + end_ns) // 2)


def _load(packed: PackedJob, **options: Any) -> JobData:
    return load_job("victorialogs", packed.job_id, url=packed.url, time_range=options.pop("time_range",
                                                                                          packed.time_range), **options)


def test_packs_give_the_embedded_stores_verdicts_and_tables(packed: PackedJob) -> None:
    job = _load(packed)
    assert "63 ranks read from the rollups they shipped at exit" in job.source, job.source
    assert job.stats.events == packed.events  # the server's count, what the report says it read
    assert job.stats.fetched_events is not None and job.stats.fetched_events < packed.events / 4
    found = verdicts(analyze(job, CFG))
    assert_faults_found(found)
    assert found == packed.verdicts
    assert_same_tables(job, packed.tables, "victorialogs (packs)")


def test_the_rank_without_a_pack_is_read_from_its_events(packed: PackedJob) -> None:
    job = _load(packed)
    got = dict(job.con.execute("SELECT rank, count(*) FROM events GROUP BY rank").fetchall())
    assert got[UNPACKED] == packed.rank_events[UNPACKED]
    assert all(got[r] < packed.rank_events[r] for r in got if r != UNPACKED)
    assert not job.con.execute("SELECT count(*) FROM events WHERE kind NOT IN ('log', 'span', 'metric', 'heartbeat')"
                               ).fetchone()[0]  # type: ignore[index]


def test_packs_pushed_twice_are_read_once(packed: PackedJob, victorialogs: VictoriaLogsServer,
                                          tmp_path: Path) -> None:
    """A push replayed (VictoriaLogs keeps both copies) changes nothing: duplicates are dropped."""
    job = _load(packed)
    analyze(job, CFG)
    before = derived_tables(job), job.stats.fetched_events
    push_packs(victorialogs, packed.data_dir, packed.job_id, tmp_path / "spool", UNPACKED)
    job = _load(packed)
    assert "63 ranks read from the rollups" in job.source
    assert verdicts(analyze(job, CFG)) == packed.verdicts
    assert (derived_tables(job), job.stats.fetched_events) == before


def test_a_whole_read_ignores_the_packs(packed: PackedJob) -> None:
    job = _load(packed, whole=True)
    assert "rollups" not in job.source
    assert job.stats.events == packed.events
    assert job.con.execute("SELECT count(*) FROM events").fetchone()[0] == packed.events  # type: ignore[index]


def test_a_time_range_cutting_the_job_reads_the_events(packed: PackedJob) -> None:
    """A pack stands for all of its rank's events, so it is not used for a range holding only some of them."""
    cut = TimeRange(packed.middle_ns, packed.time_range.end_ns)
    job = _load(packed, time_range=cut)
    assert "rollups" not in job.source
    assert 0 < job.stats.events < packed.events
