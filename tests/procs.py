"""Stopping a launcher and everything it started: torchrun puts each worker in a session of its own, so a
signal to the launcher's process group never reaches a worker, and a worker frozen with the GIL held (or in
C++) outlives its launcher's SIGKILL. Left behind, hung workers pile up and eat the machine's memory."""

from __future__ import annotations

import signal
import subprocess

import psutil

__all__ = ["stop_tree"]


def stop_tree(proc: subprocess.Popen, term_timeout: float = 10.0) -> None:  # type: ignore[type-arg]
    """SIGCONT and SIGTERM to ``proc`` and every descendant, then SIGKILL to whatever is left."""
    try:
        root = psutil.Process(proc.pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        for sig in (signal.SIGCONT, signal.SIGTERM):
            try:
                p.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
    _, alive = psutil.wait_procs(tree, timeout=term_timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=10)
    if proc.poll() is None:
        proc.wait(timeout=10)
