"""Evidence from outside a rank's process (``queries._outside``): the node's kernel log and SLURM's view.

* Real kernel lines from public reports (``data/kernel_lines.tsv``, provenance beside each group): Xid,
  ECC, NVLink, a GPU off the bus, the OOM killer, hung tasks, a segfault in NCCL, PCIe AER, machine
  checks; and ordinary lines of the same logs, which must stay unflagged.
* A real kernel OOM kill: a rank of a real gloo job that leaks memory inside a memory cgroup of its own
  is killed by the kernel, and ``jobtrace watch`` reports it dead with the kernel's line naming its pid.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from queries import classify_kernel_line, kernel_evidence
from queries._outside import read_kernel_log

DATA = Path(__file__).parent / "data" / "kernel_lines.tsv"


def corpus() -> list[tuple[str, str, str]]:
    rows, source = [], ""
    for raw in DATA.read_text().splitlines():
        if raw.startswith("# source: "):
            source = raw[len("# source: "):]
        elif raw and not raw.startswith("#"):
            kind, line = raw.split("\t", 1)
            rows.append((None if kind == "-" else kind, line, source))
    return rows


def test_real_kernel_lines_are_classified_as_a_reader_would():
    rows = corpus()
    assert len(rows) >= 50 and len({r[0] for r in rows}) == 10  # nine kinds and the unflagged
    wrong = [(want, classify_kernel_line(line), line[:100], src) for want, line, src in rows
             if classify_kernel_line(line) != want]
    assert not wrong, wrong


def test_classifying_a_huge_line_takes_linear_time():
    """The patterns are plain scans: 8x the text costs about 8x, never 64x (a kernel record is at most 1 KiB,
    but journalctl's are not bounded)."""
    def cost(n: int) -> float:
        line = "NVRM: " + "nvlink " * (n // 7) + "x" * (n % 7)
        started = time.perf_counter()
        for _ in range(5):
            classify_kernel_line(line)
        return time.perf_counter() - started

    cost(1000)
    ratio = min(cost(80_000) / cost(10_000) for _ in range(3))
    assert ratio < 24, ratio


def test_an_unreadable_kernel_log_is_said_not_hidden(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no journalctl to fall back on
    found = kernel_evidence(time.time_ns(), {1}, path=str(tmp_path / "no-kmsg"))
    assert found["lines"] == [] and "not readable here" in found["error"] and "no-kmsg" in found["error"]


def _kmsg_readable() -> bool:
    try:
        read_kernel_log(time.time_ns() - 10**9, time.time_ns())
        return True
    except OSError:
        return False


@contextmanager
def memory_cgroup(name: str, limit: int) -> Iterator[Path]:
    """A memory cgroup (v1 or v2) limited to ``limit`` bytes; write a pid to ``<it>/cgroup.procs`` to move it."""
    for root, knob in ((Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes"), (Path("/sys/fs/cgroup"), "memory.max")):
        if (root / knob).exists() or (knob == "memory.max" and (root / "cgroup.subtree_control").exists()
                                      and "memory" in (root / "cgroup.subtree_control").read_text()):
            group = root / name
            try:
                group.mkdir(exist_ok=True)
                (group / knob).write_text(str(limit))
            except OSError as exc:
                pytest.skip(reason=f"cannot make a memory cgroup here ({exc})")
            try:
                yield group
            finally:
                for _ in range(50):
                    try:
                        group.rmdir()
                        break
                    except OSError:
                        time.sleep(0.2)
            return
    pytest.skip(reason="no writable memory cgroup controller here")


@pytest.mark.torchjob
def test_a_rank_killed_by_the_kernel_oom_killer_is_dead_with_the_kernels_line(tmp_path):
    pytest.importorskip("torch", reason="a torch.distributed job")
    if os.geteuid() != 0 or not _kmsg_readable():
        pytest.skip(reason="needs root (a memory cgroup) and a readable kernel log")
    from tests.watching import Job, Watcher

    with memory_cgroup(f"jobtrace-test-{os.getpid()}", 384 << 20) as group:
        job = Job(tmp_path, "kernel-oom", 2, "--steps", "100000", "--leak-rank", "1", "--leak-step", "12",
                  "--leak-mb", "64")
        try:
            pid = job.pid_of(1)
            (group / "cgroup.procs").write_text(str(pid))  # before its leak starts: it is charged from now on
            watcher = Watcher(tmp_path, "kernel-oom", "--timeout", "150")
            _, alert = watcher.wait_for("rank_died", timeout=120)
            assert alert["ranks"] == [1]
            kernel = alert["evidence"]["kernel"]
            assert "error" not in kernel, kernel
            ours = [x for x in kernel["lines"] if x["pid"] == pid]
            assert any(x["kind"] == "host_oom" and f"Killed process {pid}" in x["text"] for x in ours), kernel
            assert kernel["about_ranks_pids"] == [pid] and kernel["window_s"] == 900
        finally:
            job.stop()
        watcher.finish()
