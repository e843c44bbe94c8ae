"""Columnar segments: what a rank leaves at a clean exit, and how the reader trusts or bypasses them."""

from __future__ import annotations

import glob
import os

import pytest

from jobtrace.store import SEGMENT_RE, compact, refresh_rollup, rollup_paths, segment_for
from jobtrace.synth import SynthJob, write_job
from queries import analyze, load_local
from shippers import LocalStoreSink


def _summaries(job):
    return [f.summary for f in analyze(job).findings]


def test_segments_give_the_same_events_and_report_as_the_lines(tmp_path):
    """The same job read from its segments and from its lines: identical events, counts and verdicts."""
    spec = dict(ranks=8, steps=40, slow_ranks={3: 1.8}, leaks={6: (20, 4.0)}, nan_step=35)
    write_job(tmp_path / "a", SynthJob(job_id="j", compact=True, **spec))
    write_job(tmp_path / "b", SynthJob(job_id="j", compact=False, **spec))
    segments = [p for p in (tmp_path / "a/j").iterdir() if SEGMENT_RE.match(p.name)]
    assert len(segments) == 8 and all(p.exists() for s in segments for p in rollup_paths(s).values())
    assert not glob.glob(str(tmp_path / "b/j/*.parquet"))
    seg, raw = load_local(tmp_path / "a", "j", cache=False), load_local(tmp_path / "b", "j", cache=False)
    assert sorted(seg.rollups) == ["colls", "mets", "ranks", "scaling", "steps"] and not raw.rollups
    query = "SELECT * FROM events ORDER BY rank, ts, kind, span_id, msg, metrics::VARCHAR"
    assert seg.con.execute(query).fetchall() == raw.con.execute(query).fetchall()
    assert (seg.stats.lines, seg.stats.events, seg.stats.skipped) == (raw.stats.lines, raw.stats.events, {})
    found = _summaries(seg)
    assert found == _summaries(raw) and any("rank 3" in s for s in found)
    # The derived tables appended from the ranks' rollups equal those derived from the events.
    for table, order in (("steps", "rank, step"), ("mets", "rank, step"), ("colls", "rank, ts, span_id"),
                         ("ranks", "rank")):
        q = f"SELECT * FROM {table} ORDER BY {order}"
        assert repr(seg.con.execute(q).fetchall()) == repr(raw.con.execute(q).fetchall()) != "[]"  # NaN-safe
    q = "SELECT * FROM scaling ORDER BY rank, ts, span_id"  # fp16 loss scaling: none in a CPU job
    assert seg.con.execute(q).fetchall() == raw.con.execute(q).fetchall()


def test_a_mixed_job_derives_only_the_ranks_without_a_rollup(tmp_path):
    """A killed rank (no segment) and a rank with a segment from another version (no rollup) beside clean ranks."""
    spec = dict(ranks=4, steps=20, slow_ranks={1: 2.0})
    directory = write_job(tmp_path / "a", SynthJob(job_id="m", **spec))
    write_job(tmp_path / "b", SynthJob(job_id="m", compact=False, **spec))
    files = sorted(directory.glob("*.jsonl"))
    for p in directory.glob(f"{glob.escape(files[0].name)}.*.parquet"):
        p.unlink()  # rank 0 was killed: lines only
    for p in rollup_paths(segment_for(files[2])).values():
        p.unlink()  # rank 2's rollup is missing: derived from its segment
    mixed, raw = load_local(tmp_path / "a", "m", cache=False), load_local(tmp_path / "b", "m", cache=False)
    assert len(mixed.rollups["steps"]) == 2
    assert _summaries(mixed) == _summaries(raw)
    q = "SELECT * FROM steps ORDER BY rank, step"
    assert mixed.con.execute(q).fetchall() == raw.con.execute(q).fetchall()


def test_a_file_that_grew_after_its_segment_is_read_from_its_lines(tmp_path):
    directory = write_job(tmp_path, SynthJob(job_id="g", ranks=2, steps=5))
    before = load_local(tmp_path, "g", cache=False).stats.events
    path = sorted(directory.glob("*.jsonl"))[0]
    with open(path, "ab") as fh:
        fh.write(b'{"ts":1,"kind":"log","job":"g","trace_id":"x","rank":0,"msg":"late"}\n')
        fh.write(b'not json at all\n')
    assert segment_for(path) is None  # the old segment no longer matches the file's length
    job = load_local(tmp_path, "g", cache=False)
    assert job.stats.events == before + 1
    assert job.stats.skipped == {"not a valid event": 1}
    assert job.con.execute("SELECT count(*) FROM events WHERE msg = 'late'").fetchone() == (1,)


def test_no_segment_for_a_torn_or_invalid_file(tmp_path):
    torn = tmp_path / "n.r0.p1.jsonl"
    torn.write_bytes(b'{"ts":1,"kind":"log","msg":"a"}\n{"ts":2,"kind":"lo')
    bad = tmp_path / "n.r1.p2.jsonl"
    bad.write_bytes(b'{"ts":1,"kind":"log","msg":"a"}\n\x00\xff binary junk\n')
    assert compact(torn) is None and compact(bad) is None
    assert sorted(f.name for f in tmp_path.iterdir()) == ["n.r0.p1.jsonl", "n.r1.p2.jsonl"]  # no segment, no .tmp


def test_a_segment_serves_alone_once_the_raw_lines_are_pruned(tmp_path):
    directory = write_job(tmp_path, SynthJob(job_id="p", ranks=4, steps=10, slow_ranks={2: 2.0}))
    full = load_local(tmp_path, "p", cache=False)
    for path in directory.glob("*.jsonl"):
        path.unlink()
    pruned = load_local(tmp_path, "p", cache=False)
    assert pruned.stats.events == full.stats.events and pruned.stats.files == 4
    assert "p" in __import__("queries").list_local_jobs(tmp_path)


def test_a_pruned_job_gets_this_versions_rollup_back_from_its_segments(tmp_path):
    """Raw lines pruned and rollups from another version: refresh_rollup rebuilds them from the segment alone."""
    spec = dict(ranks=4, steps=30, slow_ranks={2: 2.0}, leaks={1: (10, 8.0)})
    directory = write_job(tmp_path / "a", SynthJob(job_id="p", **spec), keep_lines=False)
    write_job(tmp_path / "b", SynthJob(job_id="p", compact=False, **spec))
    assert not list(directory.glob("*.jsonl")) and (directory / ".synth-raw-bytes").exists()
    segments = sorted(p for p in directory.iterdir() if SEGMENT_RE.match(p.name))
    for seg in segments:  # as if written by another version: its rollup key is not ours
        for path in rollup_paths(seg).values():
            path.rename(path.with_name(path.name.replace(path.name.split("-")[-1], "0ldc0de0.parquet")))
    assert not load_local(tmp_path / "a", "p").rollups
    assert all(refresh_rollup(seg) for seg in segments)
    assert not list(directory.glob("*0ldc0de0*"))  # the other version's files are gone
    fresh, raw = load_local(tmp_path / "a", "p"), load_local(tmp_path / "b", "p", cache=False)
    assert sorted(fresh.rollups) == ["colls", "mets", "ranks", "scaling", "steps"]
    assert _summaries(fresh) == _summaries(raw) and any("rank 2" in s for s in _summaries(fresh))


@pytest.mark.parametrize("env,expected", [("1", True), ("0", False)])
def test_the_store_sink_writes_its_segment_on_close_unless_disabled(tmp_path, monkeypatch, env, expected):
    monkeypatch.setenv("JOBTRACE_COMPACT", env)
    sink = LocalStoreSink(tmp_path, "s", "node-a", 0, os.getpid())
    sink.write([b'{"ts":5,"kind":"log","job":"s","rank":0,"msg":"hi"}\n'] * 3)
    sink.close()
    assert (segment_for(sink.path) is not None) == expected
    job = load_local(tmp_path, "s", cache=False)
    assert (job.stats.lines, job.stats.events) == (3, 3)


def test_a_restarted_rank_is_derived_over_all_its_lives(tmp_path):
    """Two files for one rank (a restart, new pid): its rollups are not used, its rows come from both files' events."""
    spec = dict(ranks=2, steps=10)
    directory = write_job(tmp_path / "a", SynthJob(job_id="r", **spec))
    write_job(tmp_path / "b", SynthJob(job_id="r", compact=False, **spec))
    for d in (directory, tmp_path / "b" / "r"):
        first = sorted(d.glob("*.r1.*.jsonl"))[0]
        lines = first.read_bytes().splitlines(keepends=True)
        second = first.with_name(first.name.replace(".p1001.", ".p2001."))
        second.write_bytes(b"".join(lines[len(lines) // 2:]))  # the second life's file
        with open(first, "r+b") as fh:
            fh.truncate(len(b"".join(lines[: len(lines) // 2])))
        os.utime(first, ns=(1, 1))
    compact(directory / sorted(p.name for p in directory.glob("*.r1.*.jsonl"))[0])
    compact(directory / sorted(p.name for p in directory.glob("*.r1.*.jsonl"))[1])
    seg, raw = load_local(tmp_path / "a", "r", cache=False), load_local(tmp_path / "b", "r", cache=False)
    assert len(seg.rollups["steps"]) == 1 and len(seg.con.execute("SELECT * FROM events_unrolled LIMIT 1").fetchall()) == 1
    assert _summaries(seg) == _summaries(raw)
    q = "SELECT * FROM steps ORDER BY rank, step"
    assert repr(seg.con.execute(q).fetchall()) == repr(raw.con.execute(q).fetchall())
