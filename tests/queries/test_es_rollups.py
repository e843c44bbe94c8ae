"""OpenSearch's per rank × step rollups (tier A, :mod:`queries._server_tables`) give the embedded store's tables.

A synthetic 64-rank job (one slow rank, NaN loss from step 50, one rank numbered by ingest) is written to the embedded
store and shipped to a real OpenSearch with ``jobtrace export``'s code. ``trace-job
--backend elasticsearch`` then reads it as per-step aggregates plus the few events the
checks read whole; every derived table must equal the one built from every event, row
for row (NaN equal to NaN), and the verdicts must be the same. The aggregations are also
read in tiny pages (many ``after_key`` round trips, many point-in-time pages), and the
whole pull (``whole=True``) must still give the same tables.
"""

from __future__ import annotations

import math
import uuid
from pathlib import Path
from typing import Any

import pytest

from jobtrace.synth import SynthJob, write_job
from queries import analyze, load_local
from queries._backends import TimeRange, load_job

pytestmark = [pytest.mark.servers]

T0 = 1_767_225_600 * 10**9  # SynthJob's first event
RANGE = TimeRange(T0 - 60 * 10**9, T0 + 86_400 * 10**9)
ORDER = {"colls": "rank, step, grp, seq, ts", "steps": "rank, step", "mets": "rank, step", "ranks": "rank",
         "scaling": "rank, ts"}


@pytest.fixture(scope="module")
def shipped(opensearch: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The synthetic job, in a temporary embedded store and in OpenSearch (searchable)."""
    from jobtrace.http import HttpConfig
    from kibana._setup import run_setup
    from shippers import export_job

    data = tmp_path_factory.mktemp("es-rollups")
    job_id = f"rollups-{uuid.uuid4().hex[:8]}"
    job_dir = write_job(data, SynthJob(job_id=job_id, ranks=64, steps=60, ranks_per_node=8, slow_ranks={21: 1.6},
                                       nan_step=50, logs_per_step=1, compact=False))
    # Rank 63 as ingest writes a stream whose rank it numbered itself: every line says rank_est, which the
    # cluster stores but does not index.
    (estimated,) = job_dir.glob("*.r63.*.jsonl")
    lines = estimated.read_bytes().splitlines()
    estimated.write_bytes(b"".join(line[:-1] + b',"rank_est":true}\n' for line in lines if line.strip()))
    run_setup(HttpConfig(opensearch.url), replicas=0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JOBTRACE_ES_SETUP", "off")  # set up above: the export only sends
        summary = export_job(data, job_id, "elasticsearch", url=opensearch.url)
    assert summary.complete, summary.to_dict()
    opensearch.refresh("*-jobtrace-*")
    return job_id, data


def _same(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _rows(job: Any, table: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    cur = job.con.execute(f"SELECT * FROM {table} ORDER BY {ORDER[table]}")
    return [d[0] for d in cur.description], cur.fetchall()


def assert_same_tables(here: Any, there: Any) -> None:
    """Every derived table of ``there`` equals ``here``'s, column for column and row for row."""
    here.build_tables()
    there.build_tables()
    for table in ORDER:
        cols, want = _rows(here, table)
        got_cols, got = _rows(there, table)
        assert got_cols == cols, table
        assert len(got) == len(want), table
        for w, g in zip(want, got, strict=True):
            diff = {c: (x, y) for c, x, y in zip(cols, w, g, strict=True) if not _same(x, y)}
            assert not diff, f"{table} row {w[:3]}: {diff}"


def verdicts(job: Any) -> list[tuple[str, list[int]]]:
    return sorted((f.kind, f.ranks) for f in analyze(job).findings if f.severity in ("error", "warning"))


def test_rollups_give_the_embedded_stores_tables_and_verdicts(shipped: tuple[str, Path], opensearch: Any) -> None:
    job_id, data = shipped
    here = load_local(data, job_id)
    there = load_job("elasticsearch", job_id, url=opensearch.url, time_range=RANGE)
    assert there.stats.events == here.stats.events
    assert there.stats.fetched_events is not None and there.stats.fetched_events < here.stats.events / 4
    assert there.prebuilt  # the tables came from the cluster's aggregates
    assert_same_tables(here, there)
    estimated = there.con.execute("SELECT list(rank ORDER BY rank) FROM ranks WHERE rank_est").fetchone()
    assert estimated == ([63],)
    found = verdicts(there)
    assert found == verdicts(load_local(data, job_id))
    assert ("slow_rank", [21]) in found
    assert any(kind == "nan_loss" for kind, _ in found)


def test_tiny_pages_give_the_same_tables(shipped: tuple[str, Path], opensearch: Any, fault_proxy: Any) -> None:
    """50 buckets per composite page and 500 hits per search page: hundreds of ``after_key`` round trips."""
    job_id, data = shipped
    proxy = fault_proxy(opensearch)  # passes every request through, counting them
    there = load_job("elasticsearch", job_id, url=proxy.url, time_range=RANGE, bucket_page=50, page_size=500,
                     parallel=3)
    assert there.prebuilt
    # 64 ranks x 60 steps x 4 phases = 15,360 phase buckets alone: 300+ pages of 50
    assert proxy.requests_seen > 15_360 // 50, proxy.requests_seen
    assert_same_tables(load_local(data, job_id), there)


def test_whole_pull_still_reads_every_event(shipped: tuple[str, Path], opensearch: Any) -> None:
    job_id, data = shipped
    here = load_local(data, job_id)
    there = load_job("elasticsearch", job_id, url=opensearch.url, time_range=RANGE, whole=True)
    assert there.stats.fetched_events is None and not there.prebuilt
    assert there.con.execute("SELECT count(*) FROM events").fetchone() == (here.stats.events,)
    assert_same_tables(here, there)


def test_throttled_aggregations_are_retried(shipped: tuple[str, Path], opensearch: Any, fault_proxy: Any) -> None:
    """429 (a full search queue: ``es_rejected_execution_exception``) twice in the middle of the read."""
    job_id, data = shipped
    proxy = fault_proxy(opensearch)
    load_job("elasticsearch", job_id, url=proxy.url, time_range=RANGE)
    requests = proxy.requests_seen
    proxy.reset_counts()
    proxy.respond(429, '{"error":{"type":"es_rejected_execution_exception"},"status":429}',
                  {"Content-Type": "application/json"}, count=2, after=requests // 2)
    there = load_job("elasticsearch", job_id, url=proxy.url, time_range=RANGE)
    assert sum(r.status == 429 for r in proxy.seen) == 2
    assert there.prebuilt
    assert_same_tables(load_local(data, job_id), there)
