"""``jobtrace watch`` on real gloo jobs while they run: a hang named with its culprit before anyone stops
the job, a frozen rank, a killed rank, a NaN loss, the webhook into a real Alertmanager, and no alert
at all on a healthy job with a CPU hog on each core.

The jobs are the demo's training script under torchrun, started here and left running (``run_job``
would stop a hung job itself); the watcher is the real command, a second process, reading the store
the ranks write.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.watching import Job, Watcher

pytest.importorskip("torch", reason="the jobs are torch.distributed jobs")


pytestmark = pytest.mark.torchjob


def test_a_hang_is_named_with_its_culprit_while_the_job_still_hangs(tmp_path, alertmanager):
    job = Job(tmp_path, "hang", 4, "--steps", "400", "--hang-rank", "1", "--hang-step", "15")
    try:
        watcher = Watcher(tmp_path, "hang", "--webhook", alertmanager + "/api/v2/alerts", "--timeout", "120")
        arrived, alert = watcher.wait_for("hang")
        assert job.proc.poll() is None  # the job is still there, hung
        assert alert["ranks"] == [1] and alert["evidence"]["waiting"] == [0, 2, 3]
        assert alert["evidence"]["op"] == "all_reduce" and "injected hang" in " ".join(
            alert["evidence"]["doing"]["1"]["last_logs"])
        assert "in phase 'forward'" in alert["summary"]
        if shutil.which("py-spy"):  # its stacks read from outside, native frames and all
            native = alert["evidence"]["native_stacks"]["1"]
            assert "train.py" in native and "sleep" in native, native[:2000]
        # the same alert, in Alertmanager's own API (labels from jobtrace's payload)
        deadline = time.monotonic() + 20
        found = []
        while time.monotonic() < deadline and not found:
            found = [a for a in requests.get(alertmanager + "/api/v2/alerts", timeout=5).json()
                     if a["labels"].get("alertname") == "jobtrace_hang"]
            time.sleep(0.5)
        assert found and found[0]["labels"]["ranks"] == "1" and found[0]["labels"]["job"] == "hang"
        assert "never joined: rank 1" in found[0]["annotations"]["summary"] and found[0]["status"]["state"] == "active"
    finally:
        job.stop()
    assert watcher.finish() == 1


@pytest.mark.servers
@pytest.mark.parametrize("backend", ["victorialogs", "elasticsearch"])
def test_a_hang_is_named_from_a_server_while_the_job_still_hangs(tmp_path, backend, request):
    """The ranks ship to a real VictoriaLogs or OpenSearch only (no embedded store); the watcher reads the server."""
    if backend == "victorialogs":
        url = request.getfixturevalue("victorialogs").url
        ship = {"JOBTRACE_LOKI_URL": url + "/insert/loki"}
    else:
        url = request.getfixturevalue("opensearch").url
        ship = {"JOBTRACE_ES_URL": url, "JOBTRACE_ES_NAMESPACE": "watch"}
    name = f"{backend[:2]}-hang"
    job = Job(tmp_path, name, 4, "--steps", "400", "--hang-rank", "2", "--hang-step", "12",
              env_extra={**ship, "JOBTRACE_LOCAL": "0"})
    try:
        watcher = Watcher(tmp_path, name, "--backend", backend, "--url", url, "--timeout", "120")
        _, alert = watcher.wait_for("hang")
        assert job.proc.poll() is None
        assert alert["ranks"] == [2] and alert["evidence"]["waiting"] == [0, 1, 3]
        assert "injected hang" in " ".join(alert["evidence"]["doing"]["2"]["last_logs"])
        assert not list((tmp_path / name).glob("*.jsonl"))  # no embedded store: the server's events alone
    finally:
        job.stop()
    assert watcher.finish() == 1
    assert "queries" in watcher.stderr


def test_a_frozen_rank_is_silent_until_it_thaws_and_a_killed_one_died(tmp_path):
    job = Job(tmp_path, "freeze", 3, "--steps", "4000", "--nan-step", "3", "--nan-rank", "0")
    try:
        watcher = Watcher(tmp_path, "freeze", "--silent-after", "6", "--timeout", "150")
        _, nan = watcher.wait_for("nan_loss")
        assert nan["ranks"] == [0] and nan["evidence"]["step"] == 3
        pid = job.pid_of(2)
        time.sleep(3)
        os.kill(pid, signal.SIGSTOP)  # frozen: not even its heartbeat thread runs
        _, silent = watcher.wait_for("silent")
        assert silent["ranks"] == [2] and "not even a heartbeat" in silent["summary"]
        os.kill(pid, signal.SIGCONT)
        watcher.wait_for("silent", "resolved")
        os.kill(pid, signal.SIGKILL)
        _, died = watcher.wait_for("rank_died")
        assert 2 in died["ranks"]
    finally:
        job.stop()
    assert watcher.finish() == 1


def test_a_healthy_job_on_a_loaded_machine_raises_no_alert(tmp_path):
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        job = Job(tmp_path, "healthy", 4, "--steps", "150")
        watcher = Watcher(tmp_path, "healthy", "--timeout", "240")
        code = watcher.finish(timeout=260)
        job.stop()
    finally:
        for h in hogs:
            h.kill()
    assert [a for _, a in watcher.alerts] == [] and code == 0


def test_ranks_that_came_late_to_the_collective_are_waiting_not_missing():
    """Found by bench_live.py: rank 0 had waited 8 s, ranks 1 and 3 a moment less; they were named as never
    having joined. The heartbeats are the shape a 4-rank job's are (2 s apart, ages in ms)."""
    from queries import LiveConfig, LiveState

    now = 100 * 10**9
    beat = lambda rank, age_ms, seq: {"ts": now - 10**9, "kind": "heartbeat", "rank": rank, "world": 4, "node": "n",
                                      "attrs": {"in_op": "all_reduce", "in_group": "default", "in_seq": seq,
                                                "op_age_ms": age_ms, "in_span": "optimizer", "in_cat": "phase"}}
    done = lambda rank, seq: {"ts": now - 10 * 10**9, "kind": "span", "rank": rank, "world": 4, "node": "n",
                              "cat": "collective", "name": "all_reduce", "start": now - 11 * 10**9, "dur": 10**9,
                              "attrs": {"group": "default", "seq": seq, "group_size": 4}}
    state = LiveState(LiveConfig(hang_after_s=8))
    state.feed([done(r, 26) for r in range(4)] + [beat(0, 7500, 27), beat(1, 6500, 27), beat(3, 6000, 27),
                                                   {**beat(2, 0, 0), "attrs": {"in_span": "forward", "in_cat": "phase",
                                                                                "span_age_ms": 7600}}])
    fired, _ = state.evaluate(now)
    assert [(a.kind, a.ranks, a.evidence["waiting"]) for a in fired] == [("hang", [2], [0, 1, 3])]


def test_a_straggler_is_named_while_the_job_runs(tmp_path):
    job = Job(tmp_path, "slow", 4, "--steps", "4000", "--slow-rank", "2", "--slow-ms", "40")
    try:
        watcher = Watcher(tmp_path, "slow", "--timeout", "120")
        _, alert = watcher.wait_for("straggler")
        assert job.proc.poll() is None and alert["ranks"] == [2]
        assert alert["evidence"]["compute_ms"] > 2 * alert["evidence"]["median_ms"]
    finally:
        job.stop()
    watcher.finish()
    assert {a["ranks"][0] for _, a in watcher.alerts if a["kind"] == "straggler" and a["state"] == "firing"} == {2}


def test_the_hung_scene_follows_the_alert_with_the_flight_recorders_word(tmp_path):
    """The hang is named at 8 s; the ranks' heartbeat threads record the scene at 10 s without progress
    (every thread's stack, and torch's Flight Recorder buffer, here on gloo). The alert is shown again with
    it: the hung rank's stack in its forward pass, and the dumps saying the waiting ranks have the hung
    all-reduce in flight while the hung rank's last retired one is the one before."""
    job = Job(tmp_path, "fr-hang", 3, "--steps", "400", "--hang-rank", "1", "--hang-step", "10",
              env_extra={"TORCH_FR_BUFFER_SIZE": "2000"})
    try:
        watcher = Watcher(tmp_path, "fr-hang", "--timeout", "120")
        _, fired = watcher.wait_for("hang")
        deadline = time.monotonic() + 60
        alert = fired
        while time.monotonic() < deadline and not (
                alert["evidence"]["doing"]["1"].get("stacks") and len(alert["evidence"].get("waiting_flight_recorder")
                                                                       or {}) == 2):
            time.sleep(0.5)
            updates = [a for _, a in watcher.alerts if a["kind"] == "hang" and a["state"] == "updated"]
            alert = updates[-1] if updates else fired
        assert job.proc.poll() is None
        hung = alert["evidence"]["doing"]["1"]
        assert "train.py" in hung["stacks"] and "_inject" in hung["stacks"], hung["stacks"]  # where it sleeps
        last = hung["flight_recorder"]["groups"]["default_pg"]["last_retired"]  # "gloo:all_reduce #14"
        assert last.startswith("gloo:all_reduce #")
        for rank in ("0", "2"):  # (Flight Recorder numbers collectives its own way: compared with itself)
            fr = alert["evidence"]["waiting_flight_recorder"][rank]
            assert Path(fr["file"]).name.startswith("fr-")
            assert fr["groups"]["default_pg"]["in_flight"] == [f"gloo:all_reduce #{int(last.split('#')[1]) + 1}"], fr
    finally:
        job.stop()
    assert watcher.finish() == 1


@pytest.mark.servers
def test_a_server_that_goes_away_mid_watch_is_said_and_waited_for(tmp_path, private_victorialogs):
    """VictoriaLogs stopped for a while under a running watch: the watcher says it cannot read, keeps polling, says
    when the server answers again, and ends as usual (no error exit, the job's steps still seen)."""
    vl = private_victorialogs
    job = Job(tmp_path, "vl-away", 2, "--steps", "100000",
              env_extra={"JOBTRACE_LOKI_URL": vl.url + "/insert/loki", "JOBTRACE_LOCAL": "0"})
    try:
        watcher = Watcher(tmp_path, "vl-away", "--backend", "victorialogs", "--url", vl.url, "--timeout", "40")
        time.sleep(8)
        vl.stop()
        time.sleep(6)
        vl.restart()
        rc = watcher.finish(timeout=90)
    finally:
        job.stop()
    err = watcher.stderr
    assert "cannot read VictoriaLogs" in err and "answers again" in err, err
    assert rc in (0, 1) and "events read" in err
