"""The shared shipper core: batch worker, disk spool, spooling sender (with an in-memory transport).

Real-server behaviour (VictoriaLogs, OpenSearch, fault proxy) is tested with each shipper.
"""

from __future__ import annotations

import time

import orjson
import pytest

from jobtrace.errors import BackendUnavailable, ShipperError
from shippers import (
    BatchWorker,
    InMemoryTransport,
    Outcome,
    Request,
    Response,
    RetryPolicy,
    Spool,
    SpoolingSender,
)

FAST = RetryPolicy(initial_s=0.01, max_s=0.05)


class ListSink:
    takes_chunks = False

    def __init__(self, delay=0.0):
        self.lines = []
        self.delay = delay

    def write(self, lines):
        time.sleep(self.delay)
        self.lines.extend(lines)

    def flush(self):
        pass

    def close(self):
        pass


def enc(items):
    return [orjson.dumps({"i": i}) + b"\n" for i in items]


class TestBatchWorker:
    def test_everything_emitted_is_exported_in_order(self):
        sink = ListSink()
        w = BatchWorker(enc, [sink], batch_size=100, flush_interval_s=0.01)
        for i in range(10_000):
            w.emit(i)
        w.shutdown()
        assert [orjson.loads(x)["i"] for x in sink.lines] == list(range(10_000))

    def test_a_full_queue_spills_to_disk_instead_of_dropping_or_blocking(self, tmp_path):
        """A sink slower than the producer: the queue stays bounded, spilled items still arrive."""
        sink = ListSink(delay=0.05)
        w = BatchWorker(enc, [sink], max_queue=100, batch_size=50, flush_interval_s=0.01,
                        spill_path=str(tmp_path / "spill.jsonl"))
        t0 = time.perf_counter()
        for i in range(2000):
            w.emit(i)
        emit_s = time.perf_counter() - t0
        assert w.queued <= 100
        w.shutdown()
        assert w.stats.spilled > 0
        assert sorted(orjson.loads(x)["i"] for x in sink.lines) == list(range(2000))
        assert emit_s < 2.0  # the producer was never held up for the sink's 2 s of work

    def test_a_failing_sink_is_counted_and_does_not_stop_the_others(self):
        class Broken(ListSink):
            def write(self, lines):
                raise OSError("disk full")

        good = ListSink()
        w = BatchWorker(enc, [Broken(), good], flush_interval_s=0.01)
        for i in range(10):
            w.emit(i)
        w.shutdown()
        assert len(good.lines) == 10 and w.stats.sink_errors["Broken.write"] >= 1

    def test_force_flush_returns_after_export(self):
        sink = ListSink()
        w = BatchWorker(enc, [sink], flush_interval_s=60)
        w.emit(1)
        assert w.force_flush(5) and len(sink.lines) == 1
        w.shutdown()


class TestSpool:
    def test_lines_come_back_in_order_across_segments_and_commit_drops_old_segments(self, tmp_path):
        sp = Spool(tmp_path, segment_bytes=1000)
        lines = [f"line {i}\n".encode() for i in range(500)]
        for i in range(0, 500, 10):
            sp.append(lines[i:i + 10])
        got = []
        while True:
            b = sp.read_batch(64, 1 << 20)
            if not b.lines:
                break
            got += b.lines
            sp.commit(b.end)
        assert got == lines and sp.pending_bytes() == 0
        assert len(list(tmp_path.glob("seg-*"))) == 1

    def test_backlog_is_counted_while_the_sender_drops_segments(self, tmp_path):
        """``jobtrace export`` counts the backlog while the sender commits: a 1,024-rank export once died
        with FileNotFoundError on a segment dropped between the listing and its size."""
        sp = Spool(tmp_path, segment_bytes=1000)
        for i in range(0, 500, 10):
            sp.append([f"line {j}\n".encode() for j in range(i, i + 10)])
        before = sp.pending_bytes()
        batch = sp.read_batch(300, 1 << 20)
        listing = sp._segments

        def sender_commits_right_after_the_listing() -> list[int]:
            segments = listing()
            for seg in segments:  # commit's first half: the finished segments go, the cursor not yet moved
                if seg < batch.end[0]:
                    (tmp_path / f"seg-{seg:012d}.jsonl").unlink()
            return segments

        sp._segments = sender_commits_right_after_the_listing  # type: ignore[method-assign]
        during = sp.pending_bytes()
        sp._segments = listing  # type: ignore[method-assign]
        sp.commit(batch.end)
        assert 0 < sp.pending_bytes() <= during < before

    def test_uncommitted_lines_survive_a_restart(self, tmp_path):
        sp = Spool(tmp_path)
        sp.append([b"a\n", b"b\n", b"c\n"])
        b = sp.read_batch(1, 100)
        sp.commit(b.end)
        sp._write_fd, fd = -1, sp._write_fd  # simulate a crash: no close()
        import fcntl
        import os
        os.close(fd)
        fcntl.flock(sp._lock_fd, fcntl.LOCK_UN)
        again = Spool(tmp_path)
        assert again.read_batch(10, 100).lines == [b"b\n", b"c\n"]
        again.close()

    def test_a_torn_append_is_not_replayed_as_a_line(self, tmp_path):
        sp = Spool(tmp_path)
        sp.append([b"whole\n"])
        import fcntl
        import os
        os.write(sp._write_fd, b'{"torn')
        os.close(sp._write_fd)
        fcntl.flock(sp._lock_fd, fcntl.LOCK_UN)
        again = Spool(tmp_path)
        again.append([b"next\n"])
        assert again.read_batch(10, 1000).lines == [b"whole\n", b"next\n"]
        again.close()

    def test_one_spool_directory_cannot_be_used_twice(self, tmp_path):
        sp = Spool(tmp_path)
        with pytest.raises(ShipperError, match="in use"):
            Spool(tmp_path)
        sp.close()


class LinesEncoder:
    """The simplest backend: POST lines; 200 = all accepted; per-line refusals in a JSON body."""

    name = "test"
    max_batch_lines = 50
    max_batch_bytes = 1 << 20

    def request(self, lines):
        return Request("POST", "http://test/ingest", b"".join(lines))

    def outcome(self, lines, response):
        if response.status == 200:
            return Outcome.all_ok()
        if response.status == 207:
            body = orjson.loads(response.body)
            return Outcome(rejected=[(i, body["reason"]) for i in body["bad"]],
                           retry=body.get("retry", []), status=400)
        return Outcome(rejected=[(i, response.body.decode()) for i in range(len(lines))], status=response.status)


class Server:
    """A scripted server: responses by call number, then 200; records accepted lines."""

    def __init__(self, script=()):
        self.script = list(script)
        self.accepted = []
        self.calls = 0
        self.times = []

    def __call__(self, req):
        self.calls += 1
        self.times.append(time.monotonic())
        step = self.script.pop(0) if self.script else None
        if step == "down":
            raise BackendUnavailable("POST http://test/ingest: ConnectionError")
        if isinstance(step, Response):
            if step.status == 207:
                body = orjson.loads(step.body)
                not_taken = set(body["bad"]) | set(body.get("retry", []))
                lines = req.body.splitlines(keepends=True)
                self.accepted += [l for i, l in enumerate(lines) if i not in not_taken]
            return step
        self.accepted += req.body.splitlines(keepends=True)
        return Response(200)


def make_sender(tmp_path, server, **kw):
    return SpoolingSender(LinesEncoder(), InMemoryTransport(server), tmp_path / "spool",
                          policy=kw.pop("policy", FAST), **kw)


LINES = [f"event {i}\n".encode() for i in range(400)]


class TestSpoolingSender:
    def test_an_outage_loses_nothing_and_duplicates_nothing(self, tmp_path):
        server = Server(["down"] * 20)
        s = make_sender(tmp_path, server)
        for i in range(0, 400, 40):
            s.write(LINES[i:i + 40])
        assert s.wait_idle(20)
        s.close()
        assert server.accepted == LINES  # in order, each exactly once
        assert s.stats.retries >= 20 and s.stats.rejected == 0

    def test_retry_after_is_honoured(self, tmp_path):
        server = Server([Response(429, b"slow down", {"Retry-After": "0.4"})])
        s = make_sender(tmp_path, server, policy=RetryPolicy(initial_s=5, max_s=5))
        s.write(LINES[:5])
        assert s.wait_idle(10)
        s.close()
        assert 0.35 <= server.times[1] - server.times[0] < 2.0
        assert server.accepted == LINES[:5]

    def test_4xx_goes_to_the_dead_letter_file_with_the_reason(self, tmp_path):
        server = Server([Response(400, b"entry too far behind")])
        s = make_sender(tmp_path, server, dead_letter=tmp_path / "dead.jsonl")
        s.write(LINES[:3])
        assert s.wait_idle(10)
        s.close()
        dead = [orjson.loads(l) for l in (tmp_path / "dead.jsonl").read_bytes().splitlines()]
        assert [d["line"] for d in dead] == ["event 0", "event 1", "event 2"]
        assert dead[0]["reason"] == "entry too far behind" and dead[0]["status"] == 400
        assert s.stats.rejected == 3 and server.accepted == []

    def test_partial_success_retries_only_the_failed_lines(self, tmp_path):
        body = orjson.dumps({"bad": [1], "retry": [3], "reason": "mapper_parsing_exception"})
        server = Server([Response(207, body)])
        s = make_sender(tmp_path, server, dead_letter=tmp_path / "dead.jsonl")
        s.write(LINES[:5])
        assert s.wait_idle(10)
        s.close()
        assert server.accepted == [LINES[0], LINES[2], LINES[4], LINES[3]]  # 3 retried alone, 1 refused
        assert s.stats.rejected == 1

    @pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
    def test_close_still_sends_what_is_spooled_when_the_sender_thread_has_died(self, tmp_path):
        calls = []

        def breaks_once(req):
            calls.append(req)
            if len(calls) == 1:
                raise RuntimeError("a bug in a transport")  # not a BackendUnavailable: kills the thread
            return Response(200)

        s = SpoolingSender(LinesEncoder(), InMemoryTransport(breaks_once), tmp_path / "spool", policy=FAST)
        s.write(LINES[:10])
        s._thread.join(5)
        assert not s._thread.is_alive() and len(calls) == 1
        s.close()
        assert s.stats.sent == 10 and s.stats.spooled_bytes == 0 and len(calls) == 2

    def test_unsent_lines_stay_spooled_and_the_next_sender_sends_them_first(self, tmp_path):
        down = Server(["down"] * 10_000)
        s = make_sender(tmp_path, down, shutdown_timeout_s=0.3)
        s.write(LINES[:100])
        s.close()
        assert s.stats.spooled_bytes > 0
        up = Server()
        s2 = make_sender(tmp_path, up)
        s2.write(LINES[100:150])
        assert s2.wait_idle(10)
        s2.close()
        assert up.accepted == LINES[:150]

    def test_memory_stays_bounded_during_a_long_outage(self, tmp_path):
        """While the server is down the backlog is on disk; requests never exceed one batch."""
        server = Server(["down"] * 50)
        s = make_sender(tmp_path, server)
        for _ in range(200):
            s.write([b"x" * 200 + b"\n"] * 100)
        backlog = s.spool.pending_bytes()
        assert backlog > 3_000_000
        assert s.wait_idle(60)
        s.close()
        sizes = [len(r.body) for r in s.transport.requests]
        assert max(sizes) <= LinesEncoder.max_batch_lines * 201
        assert len(server.accepted) == 20_000

    def test_secrets_never_appear_in_repr(self):
        from shippers import HttpConfig

        cfg = HttpConfig(url="https://x", password="hunter2", bearer_token="tok-123", api_key="k")
        assert "hunter2" not in repr(cfg) and "tok-123" not in repr(cfg) and "***" in repr(cfg)
