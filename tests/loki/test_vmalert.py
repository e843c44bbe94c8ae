"""jobtrace's VictoriaLogs alert rules (``loki/rules/jobtrace-vlogs-alerts.yaml``, generated from the query library
like the Loki ruler's) evaluated for real: vmalert against a real VictoriaLogs that real hung, frozen, NaN and
out-of-memory gloo jobs ship to, notifying a real Alertmanager.

The rules are the library's with shorter windows (a test cannot wait the shipped 5 minutes of silence), from
the same generator (``vlogs_rules_yaml(overrides=…)``); each alert must fire with the rank it is about.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

pytest.importorskip("torch", reason="the jobs are torch.distributed jobs")

from loki._build import vlogs_rules_yaml
from tests.procs import stop_tree
from tests.servers import VmalertServer

pytestmark = [pytest.mark.torchjob, pytest.mark.servers]

SHORT = {"JobtraceRankSilent": {"silent": "10s", "lookback": "10m"}, "JobtraceStuckInCollective": {"wait_s": 8}}


def start_job(tmp_path: Path, job: str, ranks: int, vl_url: str, *args: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBTRACE_")}
    env.update(JOBTRACE_JOB_ID=job, JOBTRACE_DATA_DIR=str(tmp_path / "d"), JOBTRACE_LOKI_URL=vl_url + "/insert/loki",
               OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
                             "-m", "jobtrace.demo.train", *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def firing(vmalert: VmalertServer, want: set[tuple[str, str, str]], timeout: float = 240) -> set[tuple[str, str, str]]:
    """``(alertname, training_job, rank)`` of vmalert's firing alerts, once ``want`` is among them (or the timeout:
    the silent-rank rule keeps its shipped ``for: 1m``, so on a loaded machine it fires two minutes in or later)."""
    deadline = time.monotonic() + timeout
    seen: set[tuple[str, str, str]] = set()
    while time.monotonic() < deadline:
        seen = {(a["labels"]["alertname"], a["labels"].get("training_job", ""), a["labels"].get("rank", ""))
                for a in vmalert.alerts() if a.get("state") == "firing"}
        if want <= seen:
            break
        time.sleep(1)
    return seen


def test_the_rules_fire_on_real_jobs(tmp_path, victorialogs, alertmanager):
    rules = tmp_path / "rules.yaml"
    rules.write_text(vlogs_rules_yaml(interval="2s", overrides=SHORT))
    vmalert = VmalertServer(rule_file=rules, datasource=victorialogs.url, notifier=alertmanager, interval="2s")
    hung = start_job(tmp_path, "vm-hang", 4, victorialogs.url, "--steps", "100000", "--freeze-rank", "1",
                     "--hang-step", "10", "--nan-step", "4", "--nan-rank", "2")
    oom = start_job(tmp_path, "vm-oom", 2, victorialogs.url, "--steps", "100", "--oom-rank", "1", "--hang-step", "3")
    try:
        vmalert.start()
        want = {("JobtraceStuckInCollective", "vm-hang", r) for r in ("0", "2", "3")} | {
            ("JobtraceRankSilent", "vm-hang", "1"), ("JobtraceLossNaN", "vm-hang", "2"),
            ("JobtraceCudaOOM", "vm-oom", "1")}
        seen = firing(vmalert, want)
        assert want <= seen, seen
        assert ("JobtraceStuckInCollective", "vm-hang", "1") not in seen  # the frozen rank is not waiting: it is why
        # only the frozen rank is silent (the server is shared: other tests' finished jobs are not this one's)
        assert not {s for s in seen if s[0] == "JobtraceRankSilent" and s[1] == "vm-hang" and s[2] != "1"}
        # a waiting rank's value is the milliseconds it has waited (over the rule's 8 s), and its text says so
        stuck = [a for a in vmalert.alerts() if a.get("state") == "firing" and a["labels"].get("training_job") == "vm-hang"
                 and a["labels"]["alertname"] == "JobtraceStuckInCollective"]
        assert stuck
        for a in stuck:
            shown = re.search(r"inside this collective for (\S+) ms", a["annotations"]["description"])
            assert shown and float(shown.group(1)) == pytest.approx(float(a["value"])) and float(a["value"]) > 8000, a
        # and Alertmanager has them
        names = {a["labels"]["alertname"] for a in requests.get(alertmanager + "/api/v2/alerts", timeout=5).json()}
        assert {"JobtraceStuckInCollective", "JobtraceRankSilent", "JobtraceLossNaN", "JobtraceCudaOOM"} <= names
    finally:
        for job in (hung, oom):
            stop_tree(job)
        vmalert.close()
