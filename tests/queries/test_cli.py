"""The trace-job command: report, JSON, exit codes, on synthetic stores."""

from __future__ import annotations

import subprocess

import orjson

from jobtrace.synth import SynthJob, write_job
from tests.conftest import PYTHON, python_env


def trace_job(*args, cwd=None):
    return subprocess.run([PYTHON, "-m", "jobtrace.cli", "trace", *args], capture_output=True, text=True,
                          env=python_env(COLUMNS="200"), cwd=cwd, timeout=120)


class TestExitCodes:
    def test_healthy_job_exits_0(self, tmp_path):
        write_job(tmp_path, SynthJob(job_id="ok", ranks=8, steps=30))
        proc = trace_job("ok", "--data-dir", str(tmp_path))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "HEALTHY" in proc.stdout and "no slow, stalled or failing rank" in proc.stdout

    def test_problem_exits_1_and_names_the_rank(self, tmp_path):
        write_job(tmp_path, SynthJob(job_id="slow", ranks=16, steps=40, slow_ranks={11: 1.9}))
        proc = trace_job("slow", "--data-dir", str(tmp_path))
        assert proc.returncode == 1
        assert "rank 11 on node node0001" in proc.stdout and "1.9×" in proc.stdout

    def test_unknown_job_exits_3_and_lists_known_jobs(self, tmp_path):
        write_job(tmp_path, SynthJob(job_id="known", ranks=2, steps=5))
        proc = trace_job("nope", "--data-dir", str(tmp_path))
        assert proc.returncode == 3 and "no events for job 'nope'" in proc.stderr and "known" in proc.stderr

    def test_a_job_of_only_a_torn_line_exits_3_and_says_so(self, tmp_path):
        (tmp_path / "torn").mkdir()
        (tmp_path / "torn" / "torn.r0.p123.jsonl").write_text('{"kind": "log", "job_id": "torn", "ra')
        proc = trace_job("torn", "--data-dir", str(tmp_path))
        assert proc.returncode == 3 and "no readable rank events (lines skipped: 1 torn" in proc.stderr, proc.stderr

    def test_bad_option_exits_2(self, tmp_path):
        assert trace_job("x", "--stall-threshold", "soon").returncode == 2


class TestJsonReport:
    def test_json_names_the_stalled_rank_and_the_wavefront(self, tmp_path):
        write_job(tmp_path, SynthJob(job_id="hang", ranks=8, steps=50, hang_rank=5, hang_step=20, hang_s=400))
        proc = trace_job("hang", "--data-dir", str(tmp_path), "--json")
        assert proc.returncode == 1
        report = orjson.loads(proc.stdout)
        (stall,) = [f for f in report["findings"] if f["kind"] == "stalled_rank"]
        assert stall["ranks"] == [5] and stall["details"]["last_step"] == 20
        assert "all_reduce #21" in stall["details"]["wavefront"]
        assert report["healthy"] is False and report["ranks"] == 8

    def test_stall_threshold_is_configurable(self, tmp_path):
        """A 400 s stall is not a stall when the threshold is 10 minutes."""
        write_job(tmp_path, SynthJob(job_id="hang", ranks=4, steps=30, hang_rank=1, hang_step=10, hang_s=400))
        proc = trace_job("hang", "--data-dir", str(tmp_path), "--json", "--stall-threshold", "600")
        kinds = [f["kind"] for f in orjson.loads(proc.stdout)["findings"]]
        assert "stalled_rank" not in kinds

    def test_nan_and_spike(self, tmp_path):
        write_job(tmp_path, SynthJob(job_id="nan", ranks=4, steps=30, nan_step=17))
        report = orjson.loads(trace_job("nan", "--data-dir", str(tmp_path), "--json").stdout)
        (nan,) = [f for f in report["findings"] if f["kind"] == "nan_loss"]
        assert nan["steps"] == [17] and nan["ranks"] == [0, 1, 2, 3]


class TestLossSpike:
    def test_spike_of_10x_is_found_at_its_step(self, tmp_path):
        import orjson as oj

        directory = write_job(tmp_path, SynthJob(job_id="spike", ranks=2, steps=30))
        path = sorted(directory.glob("*.r0.*"))[0]
        lines = []
        for line in path.read_bytes().splitlines():
            ev = oj.loads(line)
            if ev["kind"] == "metric" and ev["step"] == 22:
                ev["metrics"]["loss"] = 50.0
            lines.append(oj.dumps(ev))
        path.write_bytes(b"\n".join(lines) + b"\n")
        report = oj.loads(trace_job("spike", "--data-dir", str(tmp_path), "--json").stdout)
        spikes = [f for f in report["findings"] if f["kind"] == "loss_spike"]
        assert [s["steps"] for s in spikes] == [[22]] and spikes[0]["ranks"] == [0]


def test_exported_members_are_exactly_the_public_api():
    """Each package's __all__ is sorted and holds only what it imports."""
    import otel_instrumentation
    import queries
    import shippers

    for mod in (otel_instrumentation, queries, shippers):
        assert mod.__all__ == sorted(mod.__all__)
        assert all(hasattr(mod, name) for name in mod.__all__)


class TestColumnarCache:
    def test_a_finished_job_is_cached_and_the_cache_gives_the_same_report(self, tmp_path, monkeypatch):
        """Second read comes from Parquet; any new line invalidates the cache."""
        import os

        import queries._store as store
        from queries import analyze, load_local

        monkeypatch.setattr(store, "_SETTLED_S", 0.0)
        # a killed job: no rank left a segment, so its first read parses every line
        directory = write_job(tmp_path, SynthJob(job_id="c", ranks=8, steps=30, slow_ranks={5: 2.0}, compact=False))
        first = analyze(load_local(tmp_path, "c"))
        assert len(list((directory / ".cache").glob("events-*.parquet"))) == 1
        job = load_local(tmp_path, "c")
        kind = job.con.execute("SELECT table_type FROM information_schema.tables WHERE table_name='events'").fetchone()
        assert kind == ("VIEW",)
        second = analyze(job)
        assert [f.summary for f in second.findings] == [f.summary for f in first.findings]
        assert second.events == first.events
        path = sorted(directory.glob("*.jsonl"))[0]
        with open(path, "ab") as fh:
            fh.write(b'{"ts":1,"kind":"log","job":"c","trace_id":"x","msg":"late"}\n')
        os.utime(path, ns=(1, 1))
        assert load_local(tmp_path, "c").stats.events == first.events + 1

    def test_a_running_job_is_not_cached(self, tmp_path):
        from queries import load_local

        directory = write_job(tmp_path, SynthJob(job_id="live", ranks=2, steps=5, compact=False))
        for p in directory.glob("*.jsonl"):
            p.touch()
        load_local(tmp_path, "live")
        assert not (directory / ".cache").exists()
