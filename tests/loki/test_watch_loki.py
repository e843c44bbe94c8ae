"""``jobtrace watch --backend loki`` on a real hung gloo job whose ranks ship to Loki only.

There is no Loki server here: the ranks' real Loki shipper pushes (snappy protobuf, decoded with classes
compiled from Loki's published push.proto) to the documented-API stand-in of ``fake_loki`` behind a real
HTTP listener, and the watcher, a second process, reads it back through ``query_range`` as it would read
Loki. Whatever the stand-in finds malformed (a selector Loki would refuse, a bad push) is a 400 there.
"""

from __future__ import annotations

import pytest

from loki import library as loki_library
from tests.loki.fake_loki import FakeLoki, FakeLokiHTTP
from tests.watching import Job, Watcher

pytest.importorskip("torch", reason="the jobs are torch.distributed jobs")
pytestmark = pytest.mark.torchjob


def test_a_hang_is_named_from_loki_while_the_job_still_hangs(tmp_path, push_pb2):
    loki = FakeLokiHTTP(FakeLoki(push_pb2=push_pb2))
    job = Job(tmp_path, "lk-hang", 4, "--steps", "400", "--hang-rank", "1", "--hang-step", "12",
              env_extra={"JOBTRACE_LOKI_URL": loki.url, "JOBTRACE_LOCAL": "0"})
    try:
        watcher = Watcher(tmp_path, "lk-hang", "--backend", "loki", "--url", loki.url, "--lookback", "20",
                          "--timeout", "120")
        _, alert = watcher.wait_for("hang")
        assert job.proc.poll() is None  # still hung
        assert alert["ranks"] == [1] and alert["evidence"]["waiting"] == [0, 2, 3]
        assert alert["evidence"]["op"] == "all_reduce"
        assert "injected hang" in " ".join(alert["evidence"]["doing"]["1"]["last_logs"])
        assert not list((tmp_path / "lk-hang").glob("*.jsonl"))  # Loki's events alone
        queries = [q for q in loki.fake.queries if "query" in q]
        selector = loki_library().render("job_events", job="lk-hang")  # the query library's, job id escaped
        assert queries and all(q["query"] == selector and q["direction"] == "forward" for q in queries)
        # each poll asks for the lookback only, never the job from its start
        assert all(int(q["end"]) - int(q["start"]) <= 21 * 10**9 for q in queries)
        job.stop()
        assert watcher.finish() == 1  # the job's ranks are gone: the watch ends, with the alert it fired
        loki.close()
        # a server that goes away while a watch runs: said, retried, not an error exit
        late = Watcher(tmp_path, "lk-hang", "--backend", "loki", "--url", loki.url, "--timeout", "4",
                       "--wait-for-job", "1")
        assert late.finish() == 3  # never reachable at the start: no such job there (exit 3)
    finally:
        job.stop()
        loki.close()
