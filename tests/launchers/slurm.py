"""A one-node SLURM cluster for the tests: munged, slurmctld and slurmd on this machine, started and stopped.

Debian's ``slurm-wlm`` and ``munge``. The node claims more CPUs than the machine has
(``config_overrides``), so two tasks of a test fit on a 2-core CI machine; tasks are tracked by
process (``proctrack/linuxproc``), without cgroups, which a container may not give.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.servers.base import free_port

__all__ = ["available", "cluster"]

BINARIES = ("slurmctld", "slurmd", "srun", "sbatch", "squeue", "munged", "munge")


def available() -> bool:
    return all(shutil.which(b) or os.path.exists(f"/usr/sbin/{b}") for b in BINARIES) and \
        os.path.exists("/etc/munge/munge.key") and os.geteuid() == 0


def _munge_running() -> bool:
    return subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode == 0


@contextmanager
def cluster(root: Path) -> Iterator[dict[str, str]]:
    """The cluster's environment (``SLURM_CONF``) while it runs."""
    for d in ("state", "spool", "log"):
        (root / d).mkdir(parents=True, exist_ok=True)
    conf = root / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=jobtrace", "SlurmctldHost=localhost", f"SlurmctldPort={free_port()}",
        f"SlurmdPort={free_port()}", "AuthType=auth/munge", "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none", "SwitchType=switch/none", "MpiDefault=none", "SchedulerType=sched/builtin",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "ReturnToService=2",
        "SlurmdParameters=config_overrides", "SlurmUser=root", f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool", f"SlurmctldPidFile={root}/slurmctld.pid", f"SlurmdPidFile={root}/slurmd.pid",
        f"SlurmctldLogFile={root}/log/ctld.log", f"SlurmdLogFile={root}/log/d.log",
        "NodeName=localhost CPUs=8 State=UNKNOWN",
        "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE", ""]))
    env = dict(os.environ, SLURM_CONF=str(conf))
    procs = []
    if not _munge_running():
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        subprocess.run(["munged", "--force"], check=True, capture_output=True)
    try:
        for daemon in ("slurmctld", "slurmd"):
            procs.append(subprocess.Popen([daemon, "-D", "-f", str(conf)], env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True)
            if out.stdout.strip() == "idle":
                break
            time.sleep(0.5)
        else:
            logs = "".join(p.read_text()[-2000:] for p in (root / "log").glob("*.log"))
            raise RuntimeError(f"the SLURM node never became idle:\n{logs}")
        yield env
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
