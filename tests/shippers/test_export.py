"""`jobtrace export`: a job in the embedded store, sent afterwards to a real server, reads back the same.

The job has the awkward parts a real store has: one rank's JSON lines pruned (only its
columnar segment is left) and one rank killed mid-write (a torn last line).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from jobtrace.cli import main
from jobtrace.store import segment_lines as _segment_lines
from jobtrace.synth import SynthJob, write_job
from queries import AnalysisConfig, analyze, load_local
from queries._backends import TimeRange, load_job
from shippers._export import _sources
from tests.servers.base import free_port


def make_store(root: Path, ranks: int = 4, steps: int = 30) -> tuple[str, Path]:
    job = SynthJob(job_id=f"exp-{uuid.uuid4().hex[:8]}", ranks=ranks, steps=steps, ranks_per_node=2,
                   slow_ranks={2: 1.8}, t0_ns=time.time_ns() - 900 * 10**9)
    directory = write_job(root, job)
    files = sorted(directory.glob("*.jsonl"))
    assert len(files) == ranks and all(_segment_for_name(f) for f in files)
    files[1].unlink()  # raw lines pruned: only the segment is left
    with open(files[-1], "ab") as fh:
        fh.write(b'{"ts": 1, "kind": "lo')  # the rank was killed mid-write
    return job.job_id, root


def _segment_for_name(path: Path) -> bool:
    return any(path.parent.glob(path.name + ".*.parquet"))


def export(job: str, data: Path, *args: str) -> tuple[int, dict]:
    res = CliRunner().invoke(main, ["export", job, "--data-dir", str(data), "--json", *args])
    return res.exit_code, (json.loads(res.stdout) if res.stdout.strip().startswith("{") else {"output": res.output})


def verdicts(report) -> list[tuple[str, list[int]]]:
    return sorted((f.kind, f.ranks) for f in report.findings if f.severity in ("error", "warning"))


class Server:
    """One backend of the parametrized tests: where export pushes, and the job as read back from it."""

    def __init__(self, backend: str, victorialogs, opensearch) -> None:
        self.backend, self._vl = backend, victorialogs
        self.push_url = victorialogs.url + "/insert/loki" if backend == "loki" else opensearch.url
        self._kind, self._url = (("victorialogs", victorialogs.url) if backend == "loki"
                                 else ("elasticsearch", opensearch.url))

    def read(self, job: str):
        if self.backend == "loki":
            self._vl.force_flush()
        return load_job(self._kind, job, url=self._url, time_range=TimeRange.parse("2h", None))


@pytest.fixture(params=["loki", "elasticsearch"])
def server(request, victorialogs, opensearch):
    return Server(request.param, victorialogs, opensearch)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(tmp_path_factory.mktemp("export"))


def test_a_pruned_rank_is_rebuilt_from_its_segment_line_for_line(tmp_path):
    job = SynthJob(job_id="seg", ranks=2, steps=12, logs_per_step=2)
    directory = write_job(tmp_path, job)
    for path in sorted(directory.glob("*.jsonl")):
        original = sorted(orjson.dumps(orjson.loads(line), option=orjson.OPT_SORT_KEYS)
                          for line in path.read_bytes().splitlines())
        (seg,) = [p for p, is_seg in _sources_without(directory, path) if is_seg]
        rebuilt = sorted(orjson.dumps(orjson.loads(line), option=orjson.OPT_SORT_KEYS)
                         for batch in _segment_lines(seg, batch=7) for line in batch)
        assert rebuilt == original and len(original) > 40


def _sources_without(directory: Path, path: Path) -> list[tuple[Path, bool]]:
    """The sources export would use if ``path``'s lines had been pruned."""
    hidden = path.with_name(path.name + ".hidden")
    path.rename(hidden)
    try:
        return [s for s in _sources(directory) if s[0].name.startswith(path.name)]
    finally:
        hidden.rename(path)


def test_an_unknown_job_is_an_error(tmp_path):
    code, out = export("no-such-job", tmp_path, "--to", "loki", "--url", "http://127.0.0.1:9")
    assert code == 3 and "no-such-job" in out["output"]


@pytest.mark.servers
def test_export_reads_back_the_same_job_and_verdicts(store, server):
    job, data = store
    code, summary = export(job, data, "--to", server.backend, "--url", server.push_url)
    assert code == 0, summary
    assert summary["files"] == 4 and summary["from_segments"] == 1 and summary["torn"] == 1
    assert summary["sent"] == summary["lines"] > 0 and summary["refused"] == 0 and summary["complete"]
    here = load_local(data, job)
    assert here.stats.events == summary["lines"]
    there = server.read(job)
    assert there.stats.events == here.stats.events
    found = verdicts(analyze(there, AnalysisConfig()))
    assert found == verdicts(analyze(here, AnalysisConfig()))
    assert any(kind == "slow_rank" and ranks == [2] for kind, ranks in found), found


@pytest.mark.servers
def test_a_dead_server_leaves_the_job_spooled_and_replay_finishes_it(tmp_path, victorialogs):
    job, data = make_store(tmp_path, ranks=3, steps=10)
    code, summary = export(job, data, "--to", "loki", "--url", f"http://127.0.0.1:{free_port()}", "--timeout", "2")
    assert code == 1 and not summary["complete"]
    assert summary["sent"] == 0 and summary["left_bytes"] > 0 and summary["unread_files"] == []
    res = CliRunner().invoke(main, ["replay", summary["spool"], "--to", "loki", "--url", victorialogs.url + "/insert/loki"])
    assert res.exit_code == 0, res.output
    assert f"{summary['lines']} events accepted" in res.output
    victorialogs.force_flush()
    there = load_job("victorialogs", job, url=victorialogs.url, time_range=TimeRange.parse("2h", None))
    assert there.stats.events == load_local(data, job).stats.events == summary["lines"]


@pytest.mark.servers
def test_a_corrupt_line_is_skipped_and_counted_as_the_reader_does(tmp_path, server):
    job, data = make_store(tmp_path, ranks=3, steps=8)
    first = sorted((data / job).glob("*.jsonl"))[0]
    lines = first.read_bytes().splitlines(keepends=True)
    lines[len(lines) // 2: len(lines) // 2] = [b"\x00\xffnot json at all {\n", b"[1, 2]\n"]
    first.write_bytes(b"".join(lines))
    code, summary = export(job, data, "--to", server.backend, "--url", server.push_url)
    assert code == 0 and summary["corrupt"] == 2 and summary["torn"] == 1 and summary["refused"] == 0
    here = load_local(data, job)
    assert summary["sent"] == summary["lines"] == here.stats.events
    there = server.read(job)
    assert there.stats.events == here.stats.events
