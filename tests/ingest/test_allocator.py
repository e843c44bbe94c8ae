"""The ingest command keeps freed megabyte buffers for reuse instead of faulting fresh pages for each."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Rounds of three 8 MB buffers alive at once, then freed (as a read chunk and the lane's outputs are): with glibc's
# defaults the freed 24 MB at the heap top exceeds its trim threshold and goes back to the system each round, so
# every round faults its pages in again.
_ROUNDS = """
import resource, sys
sys.path.insert(0, {root!r})
if {tuned}:
    from ingest._allocator import keep_freed_memory
    assert keep_freed_memory()
def round_():
    xs = [b"\\x01" * (8 << 20) for _ in range(3)]
    del xs
round_(); round_()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    round_()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""


def _faults(tuned: bool) -> int:
    code = textwrap.dedent(_ROUNDS.format(root=str(ROOT), tuned=tuned))
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_freed_buffers_are_reused_without_page_faults():
    defaults, tuned = _faults(False), _faults(True)
    pages = 10 * 3 * (8 << 20) // 4096
    assert defaults > pages // 2, defaults  # the premise: glibc's defaults fault every round in again
    assert tuned < pages // 20, (tuned, defaults)


def test_the_ingest_command_sets_the_thresholds(monkeypatch, tmp_path):
    """The command, not the library: a process that merely calls Ingestor keeps its allocator as it was."""
    from click.testing import CliRunner

    import ingest
    import jobtrace.cli.ingest as cli

    calls: list[int] = []
    monkeypatch.setattr(ingest, "keep_freed_memory", lambda: calls.append(1) or True)
    log = tmp_path / "a.log"
    log.write_text("2026-01-05 12:00:00,250 - INFO - __main__ - step 1 loss 1.5\n")
    res = CliRunner().invoke(cli.ingest_command, [str(log), "--job", "j", "--data-dir", str(tmp_path / "d"), "-q"])
    assert res.exit_code == 0, res.output
    assert calls == [1]


def test_without_glibc_nothing_changes(monkeypatch):
    import ctypes

    import ingest._allocator as allocator

    class NotGlibc:
        def __init__(self, *_a: object) -> None:
            pass

        mallopt = staticmethod(lambda *_a: 1)

    monkeypatch.setattr(ctypes, "CDLL", NotGlibc)
    assert allocator.keep_freed_memory() is False
