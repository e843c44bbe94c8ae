"""``trace-job --backend loki``: query building and pagination against Loki's documented API (a fake Loki)."""

from __future__ import annotations

import re
import time
from dataclasses import asdict

import orjson
import pytest

from jobtrace.errors import JobNotFound, QueryError
from jobtrace.synth import SynthJob, write_job
from queries import analyze, load_local
from queries._backends import TimeRange, load_job
from queries._loki import LokiReader, load_loki, query_base
from shippers import InMemoryTransport, Response
from tests.loki.fake_loki import FakeLoki, go_unquote

T0 = 1_767_225_600_000_000_000
HOUR = 3600 * 10**9
RANGE = TimeRange(T0 - HOUR, T0 + 24 * HOUR)


def fill(fake: FakeLoki, n: int, *, job: str = "j", same_ts_every: int = 1, t0: int = T0, streams: int = 4,
         label: str = "training_job") -> list:
    """``n`` events of job ``job``, its id in the stream label ``label``; ``same_ts_every`` consecutive events share
    one timestamp (across streams)."""
    expected = []
    for i in range(n):
        ts = t0 + (i // same_ts_every) * 1000
        ev = {"ts": ts, "kind": "log", "job": job, "trace_id": "a" * 32, "rank": i % streams, "node": "n",
              "level": "INFO", "msg": f"line {i}", "v": 1}
        text = orjson.dumps(ev).decode()
        fake.add({label: job, "node": "n", "kind": f"k{i % streams}"}, ts, text, {"rank": str(i % streams)})
        expected.append((ts, text))
    return expected


def reader(fake: FakeLoki, **kw) -> tuple[LokiReader, InMemoryTransport]:
    transport = InMemoryTransport(fake)
    return LokiReader("http://loki:3100", transport, **kw), transport


def selector(job: str) -> str:
    import loki

    return loki.library().render("job_events", job=job)


class TestPagination:
    @pytest.mark.parametrize("same_ts", [1, 3, 7])
    def test_every_line_arrives_exactly_once_across_page_boundaries(self, same_ts):
        """Pages of 100 over 2,500 lines where up to 7 lines share a nanosecond across streams."""
        fake = FakeLoki(max_entries=100)
        expected = fill(fake, 2500, same_ts_every=same_ts)
        r, _ = reader(fake, limit=100, parallel=1)
        got = list(r.fetch(selector("j"), RANGE.start_ns, RANGE.end_ns))
        assert sorted(got) == sorted(expected) and len(got) == len(expected)
        assert r.counters.duplicates > 0 or same_ts == 1

    def test_requests_follow_the_documented_query_range_api(self):
        """forward paging, start inclusive at the last timestamp, end exclusive, limit; a count query first."""
        fake = FakeLoki(max_entries=100)
        fill(fake, 250)
        r, transport = reader(fake, limit=100, parallel=1)
        list(r.fetch(selector("j"), RANGE.start_ns, RANGE.end_ns))
        hist, *pages = fake.queries
        assert re.fullmatch(r'sum\(count_over_time\(\{training_job=~"j", kind!="rollup"\} \[\d+s\]\)\)', hist["query"])
        assert hist["step"].endswith("s") and int(hist["start"]) == RANGE.start_ns
        assert all(p["direction"] == "forward" and p["limit"] == "100" and p["query"] == '{training_job=~"j", kind!="rollup"}'
                   for p in pages)
        assert [int(p["start"]) for p in pages[1:]] == [T0 + 99 * 1000, T0 + 198 * 1000]
        assert all(t.headers["X-Loki-Response-Encoding-Flags"] == "categorize-labels" for t in transport.requests)
        assert all(t.url.startswith("http://loki:3100/loki/api/v1/query_range?") for t in transport.requests)

    def test_only_the_time_with_lines_is_fetched(self):
        """Two bursts days apart in a 7-day range: the empty days cost no page request."""
        fake = FakeLoki()
        a = fill(fake, 300, t0=T0)
        b = fill(fake, 300, t0=T0 + 72 * HOUR)
        r, _ = reader(fake, limit=1000, parallel=2)
        got = list(r.fetch(selector("j"), T0 - 24 * HOUR, T0 + 6 * 24 * HOUR))
        assert sorted(got) == sorted(a + b)
        assert r.counters.requests <= 4  # one count query + one page per burst

    def test_both_response_encodings_are_read(self):
        """With categorize-labels (values carry metadata) and without (metadata merged into stream labels)."""
        fake = FakeLoki()
        expected = fill(fake, 120)
        r, _ = reader(fake, limit=50, parallel=1)
        r.headers.pop("X-Loki-Response-Encoding-Flags")
        assert sorted(r.fetch(selector("j"), RANGE.start_ns, RANGE.end_ns)) == sorted(expected)

    def test_more_lines_on_one_nanosecond_than_a_page_are_read_stream_by_stream(self):
        """25 lines on one nanosecond, pages of 10: the series API lists the 4 streams, each is read alone."""
        fake = FakeLoki(max_entries=10)
        expected = fill(fake, 25, same_ts_every=25) + fill(fake, 30, t0=T0 + 10**6)
        r, _ = reader(fake, limit=10, parallel=1)
        got = list(r.fetch(selector("j"), RANGE.start_ns, RANGE.end_ns))
        assert sorted(got) == sorted(expected) and len(got) == len(expected)
        assert any("match[]" in q for q in fake.queries)

    def test_more_lines_of_one_stream_on_one_nanosecond_than_a_page_is_reported_not_looped(self):
        fake = FakeLoki(max_entries=10)
        fill(fake, 25, same_ts_every=25, streams=1)
        r, _ = reader(fake, limit=10, parallel=1)
        with pytest.raises(QueryError, match="share the timestamp"):
            list(r.fetch(selector("j"), RANGE.start_ns, RANGE.end_ns))

    def test_a_server_limit_below_ours_is_adopted(self):
        """Loki answers 400 'max entries limit per query exceeded (5000 > 300)': pages shrink to 300."""
        fake = FakeLoki(max_entries=300)
        expected = fill(fake, 1000)
        r, _ = reader(fake, limit=5000, parallel=1)
        assert sorted(r.fetch(selector("j"), RANGE.start_ns, RANGE.end_ns)) == sorted(expected)
        assert r.limit == 300

    @pytest.mark.parametrize("given", ["http://loki:3100", "http://loki:3100/", "http://loki:3100/loki/api/v1/push",
                                       "http://loki:3100/loki"])
    def test_query_base(self, given):
        assert query_base(given) == "http://loki:3100/loki/api/v1"


class TestQueryBuilding:
    def test_a_hostile_job_id_selects_only_that_job(self):
        """The job id is escaped: Loki (here the fake, with Go unquoting and anchored regex) reads it back exactly."""
        hostile = 'x"} |= "" or {job=~".+\\`\n'
        fake = FakeLoki()
        mine = fill(fake, 30, job=hostile)
        fill(fake, 30, job="x")
        fill(fake, 30, job="other")
        job = load_loki(hostile, url="http://loki:3100", time_range=RANGE, transport=InMemoryTransport(fake))
        assert job.stats.events == len(mine)
        sent = fake.queries[-1]["query"]
        pattern = go_unquote(re.fullmatch(r'\{training_job=~(.*), kind!="rollup"\}', sent).group(1))
        assert re.fullmatch(pattern, hostile) and not re.fullmatch(pattern, "x")

    def test_tenant_and_credentials_go_in_headers_never_in_errors(self, monkeypatch):
        monkeypatch.setenv("JOBTRACE_LOKI_TENANT", "team-a")
        monkeypatch.setenv("JOBTRACE_LOKI_TOKEN", "tok-SECRET")
        seen = []

        def loki(req):
            seen.append(req)
            return Response(401, b"no org id")

        with pytest.raises(QueryError) as err:
            load_loki("j", url="http://user:pw-SECRET@loki:3100", time_range=RANGE, transport=InMemoryTransport(loki))
        assert seen[0].headers["X-Scope-OrgID"] == "team-a"
        assert "SECRET" not in str(err.value) and "401" in str(err.value)

    def test_a_job_with_no_lines_is_not_found(self):
        with pytest.raises(JobNotFound, match="widen with --since"):
            load_loki("missing", url="http://loki:3100", time_range=RANGE, transport=InMemoryTransport(FakeLoki()))


def _comparable(report) -> dict:
    d = report.to_dict()
    d.pop("source")
    return d


class TestReport:
    def test_trace_job_on_loki_gives_the_embedded_stores_report(self, tmp_path, push_pb2):
        """A job shipped by the real LokiShipper into Loki's push format and read back: the very same report."""
        from shippers._loki import LokiShipper
        from shippers._registry import ProcessInfo

        job = SynthJob(job_id="synth-loki", ranks=8, steps=12, ranks_per_node=4, slow_ranks={5: 3.0}, nan_step=9)
        directory = write_job(tmp_path / "store", job)
        fake = FakeLoki(push_pb2=push_pb2)
        for i, path in enumerate(sorted(directory.glob("*.jsonl"))):
            s = LokiShipper.from_env(ProcessInfo(job.job_id, "n", i, 1, tmp_path / "spool"), url="http://loki:3100",
                                     transport=InMemoryTransport(fake))
            s.write(path.read_bytes().splitlines(keepends=True))
            assert s.wait_idle(30)
            s.close()
        local = analyze(load_local(tmp_path / "store", job.job_id))
        remote_job = load_job("loki", job.job_id, url="http://loki:3100", time_range=RANGE,
                              transport=InMemoryTransport(fake), limit=500)
        remote = analyze(remote_job)
        assert remote.source == "loki:http://loki:3100/loki/api/v1"
        assert _comparable(remote) == _comparable(local)
        assert {f.kind for f in remote.findings} >= {"slow_rank", "nan_loss"}

    def test_a_job_of_1000_ranks_is_fast(self, tmp_path):
        """1,000 ranks: every event comes back (checked by the report's event count and per-rank summary)."""
        job = SynthJob(job_id="big", ranks=1000, steps=6, ranks_per_node=8, slow_ranks={417: 3.0}, heartbeat_s=10.0)
        directory = write_job(tmp_path, job)
        fake = FakeLoki()
        n = 0
        for path in directory.glob("*.jsonl"):
            lines = []
            for raw in path.read_bytes().splitlines():
                ev = orjson.loads(raw)
                ev["ts"] += ev["rank"]  # the generator stamps all ranks alike; real clocks differ by more than 1 ns
                lines.append(orjson.dumps(ev))
                fake.add({"training_job": ev["job"], "node": ev["node"], "kind": ev["kind"]}, ev["ts"], lines[-1].decode(),
                         {"rank": str(ev["rank"])})
                n += 1
            path.write_bytes(b"\n".join(lines) + b"\n")
        local = analyze(load_local(tmp_path, job.job_id))
        t0 = time.perf_counter()
        remote = analyze(load_loki(job.job_id, url="http://loki:3100", time_range=RANGE,
                                   transport=InMemoryTransport(fake)))
        elapsed = time.perf_counter() - t0
        assert remote.events == n == local.events
        assert [asdict(r) for r in remote.per_rank] == [asdict(r) for r in local.per_rank]
        assert [f.ranks for f in remote.findings] == [f.ranks for f in local.findings] == [[417]]
        pages = [q for q in fake.queries if not q.get("query", "sum(").startswith("sum(")]
        assert len(pages) <= n // 5000 + 8  # full pages, plus at most one partial page per window
        assert elapsed < 60, f"{n} events took {elapsed:.1f}s"


class TestJobLabel:
    def test_data_shipped_under_the_old_job_label_is_read_with_the_setting(self, monkeypatch):
        """Streams whose job id is in ``job`` (what earlier versions shipped) are not this job's for the default
        ``training_job`` reader, and are read whole with ``JOBTRACE_LOKI_JOB_LABEL=job`` (docs/loki.md)."""
        fake = FakeLoki()
        fill(fake, 40, job="old", label="job")
        fill(fake, 30, job="other-tool", label="training_job")  # a job id that is someone's scrape job name is no match
        monkeypatch.delenv("JOBTRACE_LOKI_JOB_LABEL", raising=False)
        with pytest.raises(JobNotFound):
            load_loki("old", url="http://loki:3100", time_range=RANGE, transport=InMemoryTransport(fake))
        monkeypatch.setenv("JOBTRACE_LOKI_JOB_LABEL", "job")
        job = load_loki("old", url="http://loki:3100", time_range=RANGE, transport=InMemoryTransport(fake))
        assert job.stats.lines == 40 and all(q["query"].count("{job=~") == 1 for q in fake.queries[-2:])
