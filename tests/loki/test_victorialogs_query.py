"""``trace-job --backend victorialogs`` query building against a real VictoriaLogs: quoting, windows, fallbacks."""

from __future__ import annotations

import time
import uuid

import orjson
import pytest

from jobtrace.errors import JobNotFound
from jobtrace.http import HttpConfig
from queries._backends import TimeRange
from queries._victorialogs import (
    VictoriaLogsReader,
    _parse_time_ns,
    load_victorialogs,
    rfc3339_ns,
)
from shippers import RequestsTransport
from shippers._loki import LokiEncoder, LokiOptions, push_url

pytestmark = pytest.mark.servers

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def push(url: str, job: str, n: int, t0: int, push_to: str | None = None, **encoder_kw) -> list[dict]:
    events = []
    for i in range(n):
        ev = {"ts": t0 + i * 1_000_000, "kind": "span" if i % 2 else "metric", "job": job, "trace_id": TRACE,
              "rank": i % 3, "local_rank": 0, "world": 3, "node": "n0", "pid": 7, "span_id": f"{i + 1:016x}",
              "step": i // 3, "v": 1}
        if ev["kind"] == "span":
            ev.update(name="forward", cat="phase", start=ev["ts"] - 500, dur=500, attrs={"op": "x", "n": 2})
        else:
            ev.update(metrics={"loss": "NaN" if i == 4 else 0.5})
        events.append(ev)
    enc = LokiEncoder(push_to or push_url(url + "/insert/loki"), LokiOptions(**encoder_kw))
    transport = RequestsTransport(HttpConfig(url=url))
    for i in range(0, n, 500):
        resp = transport.send(enc.request([orjson.dumps(e) + b"\n" for e in events[i:i + 500]]), 30)
        assert resp.status == 204, resp.body
    return events


def test_a_hostile_job_id_reads_only_that_job(vl):
    hostile = f'h{uuid.uuid4().hex[:6]}"}} or {{job=~".*"}} | "\\\n'
    t0 = time.time_ns() - 10**9
    mine = push(vl.url, hostile, 30, t0)
    push(vl.url, "x", 30, t0)
    vl.force_flush()
    job = load_victorialogs(hostile, url=vl.url, time_range=TimeRange.parse("1h", None))
    assert job.stats.events == len(mine)
    assert {r[0] for r in job.con.execute("SELECT DISTINCT job FROM events").fetchall()} == {hostile}


def test_many_windows_in_parallel_return_every_event_once(vl):
    job_id = f"win-{uuid.uuid4().hex[:8]}"
    t0 = time.time_ns() - 600 * 10**9
    events = push(vl.url, job_id, 3000, t0)  # 3 s of events
    vl.force_flush()
    reader = VictoriaLogsReader(vl.url, RequestsTransport(HttpConfig(url=vl.url)), parallel=3, window_lines=1000)
    windows = reader.windows('{training_job="%s"}' % job_id, t0 - 60 * 10**9, t0 + 60 * 10**9)
    assert len(windows) >= 3
    job = load_victorialogs(job_id, url=vl.url, time_range=TimeRange(t0 - 60 * 10**9, t0 + 60 * 10**9),
                            window_lines=1000, parallel=3)
    got = job.con.execute("SELECT ts, span_id FROM events ORDER BY ts").fetchall()
    assert got == [(e["ts"], e["span_id"]) for e in events]


def test_lines_stored_with_message_parsing_on_are_rebuilt_from_fields(vl):
    """Another producer left VictoriaLogs' JSON parsing on: the events are rebuilt, numbers and nesting included."""
    job_id = f"parsed-{uuid.uuid4().hex[:8]}"
    t0 = time.time_ns() - 10**9
    events = push(vl.url, job_id, 20, t0, push_to=vl.url + "/insert/loki/api/v1/push?disable_message_parsing=0")
    vl.force_flush()
    job = load_victorialogs(job_id, url=vl.url, time_range=TimeRange.parse("1h", None))
    rows = job.con.execute("SELECT ts, kind, rank, step, dur, attrs, metrics FROM events ORDER BY ts").fetchall()
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [(e["ts"], e["kind"], e["rank"], e["step"]) for e in events]
    assert orjson.loads(rows[1][5]) == {"op": "x", "n": 2} and rows[1][4] == 500
    assert orjson.loads(rows[4][6]) == {"loss": "NaN"}


def test_a_missing_job_is_not_found(vl):
    with pytest.raises(JobNotFound, match="widen with --since"):
        load_victorialogs(f"nope-{uuid.uuid4().hex}", url=vl.url, time_range=TimeRange.parse("1h", None))


def test_times_round_trip_with_nanoseconds():
    ns = 1_767_225_600_123_456_789
    assert rfc3339_ns(ns) == "2026-01-01T00:00:00.123456789Z" and _parse_time_ns(rfc3339_ns(ns)) == ns
