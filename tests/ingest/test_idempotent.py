"""Ingest is idempotent and atomic (issue 20): the same content twice is a no-op, a grown file is read on from
where it was, a changed one is refused, and an ingest killed part way leaves a job that says so, which the
same command then finishes without losing or doubling a line.

The logs are real (tests/corpus, each with its provenance); the ingests are the real command, run in their
own processes where one is killed, in both engines.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from ingest._lane import lane_module
from jobtrace.cli import main
from jobtrace.store import LEDGER_NAME, IngestLedger

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
MEGATRON = CORPUS / "healthy" / "bigscience-meg-gpt2-n8-pp8-iterations-validation.log"
"""A real Megatron-DeepSpeed log (provenance beside it, in the .json)."""
ENGINES = ["python", pytest.param("compiled", marks=pytest.mark.skipif(
    lane_module() is None and not os.environ.get("CI"), reason="the compiled lane is not built here"))]


def _ingest(store: Path, job: str, *paths: Path | str, extra: tuple[str, ...] = ()) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["ingest", *map(str, paths), "--job", job, "--data-dir", str(store), "-q", *extra])
    return res.exit_code, " ".join(res.output.split())  # as one line: the console wraps at its width


def _events(store: Path, job: str, ts: bool = True) -> collections.Counter[tuple]:
    """The job's events without their span ids (a file read on from an offset numbers its spans apart); without
    their times too where ``ts`` is false (this log has no stamps: its lines take the file's mtime)."""
    out: collections.Counter[tuple] = collections.Counter()
    for f in (store / job).glob("*.jsonl"):
        for line in f.read_bytes().splitlines():
            e = orjson.loads(line)
            out[(e["kind"], e.get("ts") if ts else None, e.get("rank"), e.get("name"), e.get("step"), e.get("msg"),
                 json.dumps(e.get("value")), json.dumps(e.get("dur")))] += 1
    return out


@pytest.mark.parametrize("engine", ENGINES)
def test_the_same_content_twice_is_a_no_op_that_says_so(tmp_path, engine):
    log = tmp_path / "train.log"
    shutil.copy(MEGATRON, log)
    store = tmp_path / "s"
    rc, _ = _ingest(store, "j", log, extra=("--engine", engine))
    once = _events(store, "j")
    assert rc == 0 and sum(once.values()) > 100
    rc, out = _ingest(store, "j", log, extra=("--engine", engine))
    assert rc == 0 and "nothing new" in out and "already ingested" in out
    assert _events(store, "j") == once
    # the same bytes under another name (a copy of the logs) are not read again either
    copy = tmp_path / "copy" / "train.log"
    copy.parent.mkdir()
    shutil.copy(log, copy)
    rc, out = _ingest(store, "j", copy, extra=("--engine", engine))
    assert rc == 0 and "the same content as" in out and str(log) in out
    assert _events(store, "j") == once


@pytest.mark.parametrize("engine", ENGINES)
def test_a_grown_file_is_read_on_from_where_it_was(tmp_path, engine):
    lines = MEGATRON.read_bytes().splitlines(keepends=True)
    log = tmp_path / "train.log"
    log.write_bytes(b"".join(lines[: len(lines) // 2]))
    store = tmp_path / "s"
    assert _ingest(store, "j", log, extra=("--engine", engine))[0] == 0
    with open(log, "ab") as fh:
        fh.write(b"".join(lines[len(lines) // 2:]))
    rc, out = _ingest(store, "j", log, extra=("--engine", engine))
    assert rc == 0 and "grew by" in out
    whole = tmp_path / "whole" / "train.log"
    whole.parent.mkdir()
    shutil.copy(MEGATRON, whole)
    _ingest(tmp_path / "w", "j", whole, extra=("--engine", engine))
    got, want = _events(store, "j", ts=False), _events(tmp_path / "w", "j", ts=False)
    # every metric of the whole file, once; log lines as well (a block cut at the join may differ in how it
    # is grouped, never in which lines it holds)
    assert {k: n for k, n in got.items() if k[0] == "metric"} == {k: n for k, n in want.items() if k[0] == "metric"}
    assert sum(n for k, n in got.items() if k[0] == "log") == sum(n for k, n in want.items() if k[0] == "log")


def test_a_changed_file_is_refused_and_replace_and_append_say_what_they_do(tmp_path):
    log = tmp_path / "train.log"
    shutil.copy(MEGATRON, log)
    store = tmp_path / "s"
    _ingest(store, "j", log)
    once = _events(store, "j", ts=False)
    log.write_bytes(b"rewritten\n" + MEGATRON.read_bytes())  # no longer starts with what was read
    rc, out = _ingest(store, "j", log)
    assert rc == 3 and "changed since it was ingested" in out and "--replace" in out and "--append" in out
    assert _events(store, "j", ts=False) == once
    shutil.copy(MEGATRON, log)
    rc, _ = _ingest(store, "j", log, extra=("--append",))
    assert rc == 0 and _events(store, "j", ts=False) == collections.Counter({k: 2 * n for k, n in once.items()})
    rc, _ = _ingest(store, "j", log, extra=("--replace",))
    assert rc == 0 and _events(store, "j", ts=False) == once
    rc, out = _ingest(store, "j", log, extra=("--replace", "--append"))
    assert rc == 2 and "opposite" in out
    help_text = " ".join(CliRunner().invoke(main, ["ingest", "--help"]).output.split())
    assert "holds those events twice" in help_text and "removed first" in help_text


def _big_log(tmp_path: Path, copies: int = 2000) -> Path:
    """A long real log: the Megatron excerpt, ``copies`` times over (about 39 MB)."""
    big = tmp_path / "big.log"
    chunk = MEGATRON.read_bytes()
    with open(big, "wb") as fh:
        for _ in range(copies):
            fh.write(chunk)
    return big


def _ledger_record(store: Path, job: str) -> dict | None:
    try:
        return json.loads((store / job / LEDGER_NAME).read_text())["sources"][0]
    except (OSError, ValueError, KeyError, IndexError):
        return None


def _command(store: Path, job: str, path: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "jobtrace.cli", "ingest", str(path), "--job", job, "--data-dir", str(store),
            "-q", "--no-align", *extra]


def _kill_when(proc: subprocess.Popen, ready, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert proc.poll() is None, "the ingest finished before it could be interrupted"
        assert time.monotonic() < deadline, "the ingest made no progress"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.mark.parametrize("engine", ENGINES)
def test_an_ingest_killed_part_way_is_reported_and_finished_by_the_same_command(tmp_path, engine):
    big = _big_log(tmp_path)
    store = tmp_path / "s"
    proc = subprocess.Popen(_command(store, "j", big, "--engine", engine), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)

    def part_way() -> bool:
        r = _ledger_record(store, "j")
        return r is not None and 0.15 * r["size"] <= r["read"] < 0.85 * r["size"]

    _kill_when(proc, part_way)
    read = _ledger_record(store, "j")["read"] / big.stat().st_size
    report = subprocess.run([sys.executable, "-m", "jobtrace.cli", "trace", "j", "--data-dir", str(store),
                             "--json"], capture_output=True, text=True, timeout=300)
    caveats = orjson.loads(report.stdout)["caveats"]
    assert caveats == [caveats[0]] and caveats[0].startswith(f"ingest incomplete: {100 * read:.0f} % of big.log")

    rerun = subprocess.run(_command(store, "j", big, "--engine", engine), capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    assert f"the last ingest stopped at {100 * read:.0f} %" in " ".join(rerun.stdout.split())
    clean = subprocess.run(_command(tmp_path / "clean", "j", big, "--engine", engine), capture_output=True, timeout=600)
    assert clean.returncode == 0
    assert _events(store, "j") == _events(tmp_path / "clean", "j")  # nothing lost, nothing twice
    assert IngestLedger(store, "j").records()[0].state == "complete"
    again = subprocess.run([sys.executable, "-m", "jobtrace.cli", "trace", "j", "--data-dir", str(store),
                            "--json"], capture_output=True, text=True, timeout=300)
    assert orjson.loads(again.stdout)["caveats"] == []


@pytest.mark.parametrize("engine", ENGINES)
def test_a_follow_that_resumes_continues_at_its_recorded_offset(tmp_path, engine):
    lines = _big_log(tmp_path, copies=60).read_bytes().splitlines(keepends=True)
    third = len(lines) // 3
    log = tmp_path / "run.log"
    log.write_bytes(b"".join(lines[:third]))
    store = tmp_path / "s"
    proc = subprocess.Popen(_command(store, "j", log, "--follow", "--engine", engine), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _kill_when(proc, lambda: ((r := _ledger_record(store, "j")) is not None and r["offset"] == log.stat().st_size), 120)
    offset = _ledger_record(store, "j")["offset"]
    with open(log, "ab") as fh:  # the job goes on writing while nobody follows it
        fh.write(b"".join(lines[third:]))
    rerun = subprocess.run(_command(store, "j", log, "--follow", "--idle-exit", "1", "--engine", engine),
                           capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{os.path.getsize(log) - offset:,} bytes" in rerun.stdout  # only what came after the offset was read
    clean = subprocess.run(_command(tmp_path / "clean", "j", log, "--engine", engine), capture_output=True, timeout=600)
    assert clean.returncode == 0
    got, want = _events(store, "j", ts=False), _events(tmp_path / "clean", "j", ts=False)
    assert {k: n for k, n in got.items() if k[0] == "metric"} == {k: n for k, n in want.items() if k[0] == "metric"}
    assert sum(got.values()) == sum(want.values())
