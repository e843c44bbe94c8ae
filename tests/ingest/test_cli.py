"""`jobtrace ingest`: inputs of every kind, the summary, sinks, follow mode, and trace-job afterwards."""

from __future__ import annotations

import gzip
import threading
import time
from datetime import timedelta

import orjson
import pytest
from click.testing import CliRunner

from ingest import IngestConfig, Ingestor, open_sink
from jobtrace.cli import main
from jobtrace.errors import ConfigError
from queries import analyze, load_local
from tests.ingest import fixtures as fx


def rank_lines(rank: int, steps: int = 8, slow: bool = False) -> list[str]:
    out = []
    for s in range(steps):
        t = fx.T0 + timedelta(milliseconds=100 * s)
        fwd, wait = (45.0, 2.0) if slow else (5.0, 42.0)
        out.append(t.strftime("%Y-%m-%d %H:%M:%S") + f",{t.microsecond // 1000:03d} INFO train: step {s} loss "
                   f"{1.0 / (s + 1):.4f} time 60.0ms (data 1.0ms forward {fwd}ms backward 5.0ms allreduce {wait}ms "
                   f"optimizer 2.0ms)")
    return out


class TestIngestCommand:
    def test_plain_gzip_zstd_and_stdin_inputs_then_trace_job(self, tmp_path):
        """Four ranks from four kinds of input; the summary counts lines and events; trace-job names rank 2."""
        zstd = pytest.importorskip("zstandard", reason="zstandard (the ingest extra) reads .zst logs")
        logs = tmp_path / "logs"
        logs.mkdir()
        (logs / "rank0.log").write_text("\n".join(rank_lines(0)) + "\n")
        with gzip.open(logs / "rank1.log.gz", "wt") as fh:
            fh.write("\n".join(rank_lines(1)) + "\n")
        (logs / "rank2.log.zst").write_bytes(zstd.ZstdCompressor().compress(("\n".join(rank_lines(2, slow=True)) + "\n").encode()))
        stdin = "\n".join(rank_lines(3)) + "\n\n"
        store = tmp_path / "store"
        res = CliRunner().invoke(main, ["ingest", str(logs / "*.log*"), "-", "--job", "cli", "--data-dir", str(store),
                                        "--rank", "3", "--json"], input=stdin)
        assert res.exit_code == 0, res.output
        summary = orjson.loads(res.output)
        assert 33 == summary["lines"] and 32 == summary["parsed"] and {"blank line": 1} == summary["skipped"]
        assert 4 * 8 == summary["events"]["metric"] and 4 * 8 * 6 == summary["events"]["span"]
        report = analyze(load_local(store, "cli"))
        assert ["slow_rank"] == [f.kind for f in report.findings] and [2] == report.findings[0].ranks

        text = CliRunner().invoke(main, ["ingest", str(logs / "rank0.log"), "--job", "cli2", "--data-dir", str(store)])
        assert text.exit_code == 0 and "lines parsed: 8" in text.output and "trace-job cli2" in text.output

    def test_a_second_ingest_is_a_no_op_append_adds_and_the_old_overwrite_replaces(self, tmp_path):
        (tmp_path / "rank0.log").write_text("\n".join(rank_lines(0)) + "\n")
        args = ["ingest", str(tmp_path / "rank0.log"), "--job", "j", "--data-dir", str(tmp_path / "s"), "-q"]
        CliRunner().invoke(main, args)
        once = load_local(tmp_path / "s", "j").stats.events
        assert "nothing new" in CliRunner().invoke(main, args).output
        assert once == load_local(tmp_path / "s", "j").stats.events
        CliRunner().invoke(main, args + ["--append"])
        assert 2 * once == load_local(tmp_path / "s", "j").stats.events
        CliRunner().invoke(main, args + ["--overwrite"])  # the old spelling of --replace
        assert once == load_local(tmp_path / "s", "j").stats.events

    @pytest.mark.servers
    def test_to_loki_into_a_real_victorialogs_gives_the_same_verdict(self, tmp_path, victorialogs):
        """The same logs ingested locally and through the Loki shipper: same events, same slow rank."""
        from queries import analyze
        from queries._backends import TimeRange
        from queries._victorialogs import load_victorialogs

        logs = tmp_path / "logs"
        logs.mkdir()
        for r in range(3):
            (logs / f"rank{r}.log").write_text("\n".join(rank_lines(r, slow=r == 1)) + "\n")
        local = CliRunner().invoke(main, ["ingest", str(logs), "--job", "to-vl", "--data-dir", str(tmp_path / "s"), "-q"])
        assert local.exit_code == 0, local.output
        res = CliRunner().invoke(main, ["ingest", str(logs), "--job", "to-vl", "--to", "loki", "--url",
                                        victorialogs.url + "/insert/loki", "--data-dir", str(tmp_path / "s2"), "-q"])
        assert res.exit_code == 0, res.output
        victorialogs.force_flush()
        t0 = int(fx.T0.timestamp() * 1e9)
        remote = load_victorialogs("to-vl", url=victorialogs.url, time_range=TimeRange(t0 - 3600 * 10**9, t0 + 3600 * 10**9))
        here = load_local(tmp_path / "s", "to-vl")
        assert remote.stats.events == here.stats.events > 0
        verdicts = [[(f.kind, f.ranks) for f in analyze(j).findings if f.severity != "info"] for j in (here, remote)]
        assert verdicts[0] == verdicts[1] and ("slow_rank", [1]) in verdicts[0]

    def test_a_server_sink_without_url_is_a_clear_error(self, tmp_path, monkeypatch):
        monkeypatch.delenv("JOBTRACE_LOKI_URL", raising=False)
        (tmp_path / "a.log").write_text("hello\n")
        res = CliRunner().invoke(main, ["ingest", str(tmp_path / "a.log"), "--job", "j", "--to", "loki",
                                        "--data-dir", str(tmp_path)])
        assert res.exit_code == 3 and "JOBTRACE_LOKI_URL" in res.output
        with pytest.raises(ConfigError):
            open_sink("loki", "j", data_dir=tmp_path)

    def test_usage_errors(self, tmp_path):
        assert CliRunner().invoke(main, ["ingest", "--job", "j"]).exit_code == 2
        res = CliRunner().invoke(main, ["ingest", str(tmp_path / "missing.log"), "--job", "j"])
        assert res.exit_code == 3 and "no such file" in res.output
        res = CliRunner().invoke(main, ["ingest", str(tmp_path), "--job", "j", "--rank-from-filename", "("])
        assert res.exit_code == 2


def test_follow_mode_reads_a_growing_file_until_idle(tmp_path):
    """Lines appended while the ingest runs are read; it stops after --idle-exit seconds without new lines."""
    path = tmp_path / "rank0.log"
    lines = rank_lines(0, steps=6)
    path.write_text(lines[0] + "\n")

    def writer():
        for line in lines[1:]:
            time.sleep(0.15)
            with open(path, "a") as fh:
                fh.write(line + "\n")

    t = threading.Thread(target=writer)
    t.start()
    summary = Ingestor(IngestConfig(job="f", follow=True, idle_exit_s=1.0, poll_s=0.05),
                       open_sink("local", "f", data_dir=tmp_path / "s")).run([str(path)])
    t.join()
    assert 6 == summary.lines == summary.parsed
    assert 6 == analyze(load_local(tmp_path / "s", "f")).steps


def test_rank_from_filename_regex(tmp_path):
    (tmp_path / "job-gpu07-of-16.txt").write_text("step 1 loss 2 time 3ms\n")
    caps = {}
    Ingestor(IngestConfig(job="r", rank_from_filename=r"gpu(?P<rank>\d+)"),
             lambda n, r: caps.setdefault((n, r), __import__("ingest").MemorySink())).run([str(tmp_path)])
    assert [("unknown", 7)] == list(caps)
