"""The golden library kept on Loki, beside the jobs that ship there.

There is no Loki server here: real demo jobs (two ranks, gloo) ship with the real Loki shipper (snappy
protobuf, decoded with classes compiled from Loki's published push.proto) to the documented-API stand-in
of ``fake_loki`` behind a real HTTP listener, with no embedded store. ``jobtrace golden --backend loki``
reads each job back through ``query_range``, pushes the entry as records of one stream (Loki's JSON push
format) and reads the library back the same way; ``trace-job --backend loki --golden`` chooses from it.
"""

from __future__ import annotations

import json

import orjson
import pytest
from click.testing import CliRunner

from jobtrace.cli import main, trace_job
from loki import library as loki_library
from queries import _golden_library
from tests.demo_jobs import run_demo
from tests.loki.fake_loki import FakeLoki, FakeLokiHTTP

pytest.importorskip("torch", reason="the jobs are torch.distributed jobs")
pytestmark = pytest.mark.torchjob

HEALTHY = ("lk-gold-a", "lk-gold-b", "lk-gold-c")


@pytest.fixture(scope="module")
def loki(tmp_path_factory, push_pb2):
    server = FakeLokiHTTP(FakeLoki(push_pb2=push_pb2))
    data = str(tmp_path_factory.mktemp("golden-loki"))
    env = {"JOBTRACE_LOKI_URL": server.url, "JOBTRACE_LOCAL": "0"}
    for name in HEALTHY:
        assert run_demo(env, job_id=name, data_dir=data, ranks=2, steps=16) == 0
    assert run_demo(env, job_id="lk-gold-slow", data_dir=data, ranks=2, steps=16, slow_ranks=[1], slow_ms=20) == 0
    yield server
    server.close()


def cli(*args: str):
    return CliRunner().invoke(main, list(args))


def test_entries_added_from_loki_are_kept_there_and_chosen_there(loki, tmp_path, monkeypatch):
    monkeypatch.setattr(_golden_library, "LOKI_PART", 2_000)  # an entry of several lines, as large ones are
    empty = tmp_path / "empty"
    where = ["--backend", "loki", "--url", loki.url, "--data-dir", str(empty)]
    for name in HEALTHY:
        res = cli("golden", "add", name, *where, "--since", "2h", "--tag", "nightly")
        assert res.exit_code == 0, res.output
    assert not empty.exists()
    selector = loki_library().render("golden_library")
    ours = [e for e in loki.fake.entries if e.labels == {"jobtrace_library": "golden"}]
    assert len(ours) > len(HEALTHY)  # entries cut into parts
    assert all(len(e.line.encode()) < 256 * 1024 for e in ours)  # Loki's default max_line_size
    assert [orjson.loads(e.line)["op"] for e in ours] == ["add"] * len(ours)

    listed = json.loads(cli("golden", "list", *where, "--json").output)
    assert [e["name"] for e in listed] == list(HEALTHY) and all(e["tags"] == ["nightly"] for e in listed)
    assert any(q.get("query") == selector for q in loki.fake.queries)

    res = CliRunner().invoke(trace_job, ["lk-gold-slow", "--backend", "loki", "--url", loki.url, "--since", "2h",
                                         "--data-dir", str(empty), "--golden", "--json"])
    report = json.loads(res.output)
    assert res.exit_code == 1 and sorted(report["golden"]) == list(HEALTHY)
    assert "step_ms" in {f["details"].get("metric") for f in report["findings"] if f["kind"] == "golden_deviation"}

    # Added again (retagged): the latest record wins. Removed: a record says so, and the name is gone.
    assert cli("golden", "add", "lk-gold-b", *where, "--since", "2h", "--tag", "weekly").exit_code == 0
    shown = json.loads(cli("golden", "show", "lk-gold-b", *where).output)
    assert shown["tags"] == ["weekly"]
    assert cli("golden", "remove", "lk-gold-a", *where).exit_code == 0
    assert [e["name"] for e in json.loads(cli("golden", "list", *where, "--json").output)] == ["lk-gold-b",
                                                                                              "lk-gold-c"]
    res = cli("golden", "remove", "lk-gold-a", *where)
    assert res.exit_code == 3 and "lk-gold-a" in res.output


def test_a_record_whose_parts_did_not_all_arrive_is_not_an_entry(loki, tmp_path):
    """A push cut short leaves an entry's first parts only: the library skips it rather than fail on it."""
    where = ["--backend", "loki", "--url", loki.url, "--data-dir", str(tmp_path)]
    before = json.loads(cli("golden", "list", *where, "--json").output)
    loki.fake.add({"jobtrace_library": "golden"}, 2**62, orjson.dumps(
        {"op": "add", "name": "torn", "rev": "x", "part": 0, "parts": 2, "data": "AAAA"}).decode())
    loki.fake.add({"jobtrace_library": "golden"}, 2**62 + 1, "not a record")
    after = json.loads(cli("golden", "list", *where, "--json").output)
    assert [e["name"] for e in after] == [e["name"] for e in before] and "torn" not in [e["name"] for e in after]
