"""`jobtrace replay`: what a shipper left spooled (server down past the job's end) is sent later."""

from __future__ import annotations

import json

import pytest
import requests
from click.testing import CliRunner

from jobtrace.cli import main
from shippers import RetryPolicy
from shippers._loki import LokiShipper
from shippers._registry import ProcessInfo
from tests.servers.base import free_port

pytestmark = pytest.mark.servers


def test_replay_sends_a_dead_servers_backlog_in_full(tmp_path, victorialogs):
    info = ProcessInfo("replay-job", "n0", 0, 1, tmp_path / "spool")
    dead = LokiShipper.from_env(info, url=f"http://127.0.0.1:{free_port()}", policy=RetryPolicy(initial_s=0.01, max_s=0.05),
                                shutdown_timeout_s=0.3)
    lines = [json.dumps({"ts": 1_767_225_600_000_000_000 + i, "kind": "log", "job": "replay-job", "trace_id": "ab" * 16,
                         "rank": 0, "node": "n0", "level": "INFO", "msg": f"line {i}"}).encode() + b"\n" for i in range(500)]
    dead.write(lines)
    dead.close()
    spool = info.spool_dir("loki")
    assert dead.stats.spooled_bytes > 0 and dead.stats.sent == 0

    res = CliRunner().invoke(main, ["replay", str(spool), "--to", "loki", "--url", victorialogs.url + "/insert/loki"])
    assert res.exit_code == 0, res.output
    assert "500 events accepted" in res.output and "0 bytes left" in res.output
    victorialogs.force_flush()
    r = requests.post(victorialogs.url + "/select/logsql/query",
                      data={"query": '{training_job="replay-job"} | stats count() as n'}, timeout=30)
    assert json.loads(r.text.splitlines()[0])["n"] == "500"
