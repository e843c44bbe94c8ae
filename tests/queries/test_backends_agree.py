"""The same verdicts from the embedded store and from the real servers, for the same real torch job.

A 4-rank gloo job with three faults at once (rank 1 slow, rank 0's loss NaN from step 6,
rank 3 hangs at step 10) ships to VictoriaLogs (Loki push API) while writing the embedded
store and to OpenSearch (its ``_bulk`` API). The hung job is stopped the way an operator would (SIGTERM, then SIGKILL), so some
lines may still sit in the killed ranks' spools: they are sent with ``jobtrace replay``,
as a user would, before the server is asked. Then ``trace-job``'s analysis runs on each
backend and must reach the same findings.
"""

from __future__ import annotations

import uuid

import pytest
from click.testing import CliRunner

from jobtrace.cli import main
from queries import AnalysisConfig, analyze, load_local
from queries._backends import TimeRange, load_job

pytestmark = [pytest.mark.servers, pytest.mark.torchjob]
pytest.importorskip("torch", reason="torch is part of the test dependencies (jobtrace[torch])")

CFG = AnalysisConfig(stall_s=6.0)


def verdicts(report) -> list[tuple[str, list[int]]]:
    return sorted((f.kind, f.ranks) for f in report.findings if f.severity in ("error", "warning"))


ORDER = {"colls": "rank, grp, seq, ts, span_id", "steps": "rank, step", "mets": "rank, step", "ranks": "rank",
         "scaling": "rank, ts, step"}


def tables(job) -> dict[str, list[tuple]]:
    """The derived tables every check reads, row by row (NaN made comparable)."""
    job.build_tables()
    out = {}
    for table, order in ORDER.items():
        found = job.con.execute(f"SELECT * FROM {table} ORDER BY {order}").fetchall()
        out[table] = [tuple("NaN" if isinstance(v, float) and v != v else v for v in row) for row in found]
    return out


@pytest.fixture(scope="module")
def faulty_job(victorialogs, opensearch, tmp_path_factory):
    from jobtrace.demo import DemoConfig, run_job

    data = tmp_path_factory.mktemp("agree")
    job_id = f"agree-{uuid.uuid4().hex[:8]}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JOBTRACE_LOKI_URL", victorialogs.url + "/insert/loki")
        mp.setenv("JOBTRACE_ES_URL", opensearch.url)
        for var in ("JOBTRACE_LOKI_FORMAT", "JOBTRACE_LOKI_STRUCTURED_METADATA", "JOBTRACE_LOCAL"):
            mp.delenv(var, raising=False)
        rc = run_job(DemoConfig(job_id=job_id, data_dir=str(data), ranks=4, steps=30, slow_ranks=[1], slow_ms=40,
                                nan_step=6, hang_rank=3, hang_step=10, heartbeat_s=0.5, stall_s=6.0, timeout_s=240))
    assert rc == -1  # stopped after the stall
    for backend, url in (("loki", victorialogs.url + "/insert/loki"), ("elasticsearch", opensearch.url)):
        for spool in sorted((data / job_id / ".spool").glob(f"{backend}-r*")):
            res = CliRunner().invoke(main, ["replay", str(spool), "--to", backend, "--url", url])
            assert res.exit_code == 0, res.output
    return job_id, data


def test_embedded_store_names_all_three_faults(faulty_job):
    job_id, data = faulty_job
    found = verdicts(analyze(load_local(data, job_id), CFG))
    assert ("stalled_rank", [3]) in found
    assert ("nan_loss", [0]) in found
    assert any(kind in ("slow_rank", "late_arrival") and ranks == [1] for kind, ranks in found), found


def test_victorialogs_gives_the_same_verdicts(faulty_job, victorialogs):
    job_id, data = faulty_job
    victorialogs.force_flush()
    here = load_local(data, job_id)
    there = load_job("victorialogs", job_id, url=victorialogs.url, time_range=TimeRange.parse("1h", None))
    assert there.stats.events == here.stats.events
    assert verdicts(analyze(there, CFG)) == verdicts(analyze(here, CFG))


def test_victorialogs_summing_on_the_server_gives_the_same_tables(faulty_job, victorialogs):
    job_id, data = faulty_job
    victorialogs.force_flush()
    here = load_local(data, job_id)
    there = load_job("victorialogs", job_id, url=victorialogs.url, time_range=TimeRange.parse("1h", None),
                     aggregate=True)
    assert there.stats.events == here.stats.events
    # the server summed the spans and metrics: few events came whole, yet every table is the same
    assert there.stats.fetched_events is not None and there.stats.fetched_events < here.stats.events / 2
    assert tables(there) == tables(here)
    assert verdicts(analyze(there, CFG)) == verdicts(analyze(here, CFG))


def test_victorialogs_reads_every_event_where_a_view_needs_them(faulty_job, victorialogs):
    job_id, data = faulty_job
    victorialogs.force_flush()
    here = load_local(data, job_id)
    there = load_job("victorialogs", job_id, url=victorialogs.url, time_range=TimeRange.parse("1h", None),
                     whole=True, aggregate=True)  # the timeline's whole read wins over summing
    assert there.stats.fetched_events is None
    assert there.con.execute("SELECT count(*) FROM events").fetchone()[0] == here.stats.events
    assert tables(there) == tables(here)


def test_opensearch_gives_the_same_verdicts(faulty_job, opensearch):
    job_id, data = faulty_job
    here = load_local(data, job_id)
    there = load_job("elasticsearch", job_id, url=opensearch.url, time_range=TimeRange.parse("1h", None))
    assert there.stats.events == here.stats.events
    assert verdicts(analyze(there, CFG)) == verdicts(analyze(here, CFG))
