"""``load_job``'s table of backends (a server's loader imported only when used) and what the loaders share."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from jobtrace.errors import ConfigError
from jobtrace.synth import SynthJob, write_job
from queries import BACKENDS, TimeRange, load_job
from queries._backends import LOADERS

SERVER_MODULES = ("queries._loki", "queries._victorialogs", "queries._elasticsearch")


def test_the_backends_are_the_loaders_table_in_its_order():
    assert BACKENDS == ("local", "loki", "victorialogs", "elasticsearch", "archive") == tuple(LOADERS)


def test_an_unknown_backend_is_a_config_error_naming_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown backend 'nope'; choose one of local, loki, victorialogs, elasticsearch, archive"):
        load_job("nope", "j")


def test_a_server_loader_gets_the_url_the_range_and_its_own_options(monkeypatch):
    import queries._elasticsearch
    import queries._loki
    import queries._victorialogs

    calls = []
    rng = TimeRange.parse("2h", None)
    for module, name in ((queries._loki, "load_loki"), (queries._victorialogs, "load_victorialogs"),
                         (queries._elasticsearch, "load_elasticsearch")):
        monkeypatch.setattr(module, name, lambda job_id, name=name, **kw: calls.append((name, job_id, kw)) or name)
    assert load_job("loki", "j", url="http://l", time_range=rng, limit=5) == "load_loki"
    assert load_job("victorialogs", "j", data_dir="ignored", url="http://v", parallel=2) == "load_victorialogs"
    assert load_job("elasticsearch", "j", time_range=rng, namespace="ns", whole=True) == "load_elasticsearch"
    (_, _, loki), (_, _, vl), (_, _, es) = calls
    assert loki == {"url": "http://l", "time_range": rng, "limit": 5, "whole": False}  # packs may stand for ranks
    assert es == {"url": None, "time_range": rng, "namespace": "ns", "whole": True}
    assert set(vl) == {"url", "time_range", "parallel", "whole"} and vl["whole"] is False  # the server aggregates
    week = vl["time_range"]  # no range given: the last seven days
    assert isinstance(week, TimeRange) and abs((week.end_ns - week.start_ns) - 7 * 86400 * 10**9) < 10**9


def test_the_embedded_store_takes_the_data_dir_and_ignores_server_options(tmp_path):
    write_job(tmp_path, SynthJob(job_id="loaders", ranks=2, steps=3))
    job = load_job("local", "loaders", data_dir=str(tmp_path), url="http://unused", limit=1)
    assert job.job_id == "loaders" and job.con.execute("SELECT count(DISTINCT rank) FROM events").fetchone() == (2,)


def test_reading_the_embedded_store_imports_no_server_loader(tmp_path):
    write_job(tmp_path, SynthJob(job_id="lazy", ranks=1, steps=2))
    code = textwrap.dedent(f"""
        import sys
        from queries import load_job
        load_job("local", "lazy", data_dir={str(tmp_path)!r})
        print(sorted(m for m in {SERVER_MODULES!r} if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_events_wrapped_in_server_lines_are_parsed_counted_and_filtered(tmp_path):
    """VictoriaLogs' ``{"_msg": "<event>"}`` lines: DuckDB parses them; other jobs' and junk lines are counted."""
    import json

    from queries._store import ReadStats, load_wrapped_events

    event = {"ts": 5, "kind": "span", "job": "j", "rank": 1, "attrs": {"seq": 3}, "dur": 7, "step": 2, "name": "x"}
    lines = [{"_msg": json.dumps(event)}, {"_msg": json.dumps(event | {"job": "other"})},
             {"_msg": json.dumps({"kind": "log", "job": "j"})},  # no time: not a valid event
             {"_msg": "plain text, not an event"}, {"_msg": json.dumps([1, 2])}]
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + "garbage\n")
    job, unparsed = load_wrapped_events("j", [str(path)], "_msg", "here", ReadStats())
    assert job.con.execute("SELECT ts, kind, rank, step, dur, attrs->>'seq' FROM events").fetchall() == [
        (5, "span", 1, 2, 7, "3")]
    assert unparsed == 3  # the text, the list and the line that is not JSON
    assert job.stats.lines == 6 and job.stats.events == 1
    assert job.stats.skipped == {"not a jobtrace event of this job": 1, "not a valid event": 1}
    good = tmp_path / "b.jsonl"
    good.write_text(json.dumps(lines[0]) + "\n")
    job, unparsed = load_wrapped_events("j", [str(good)], "_msg", "here", ReadStats(), lines=1)  # counted by the caller
    assert (unparsed, job.stats.lines, job.stats.events, job.stats.skipped) == (0, 1, 1, {})
    empty, none = load_wrapped_events("j", [], "_msg", "here", ReadStats())
    assert none == 0 and empty.con.execute("SELECT count(*) FROM events").fetchone() == (0,)


def test_progress_is_drawn_on_a_terminal_only_and_cleared():
    import io

    from queries._reading import Progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty, pipe = Terminal(), io.StringIO()
    for stream in (tty, pipe):
        progress = Progress("reading from X", 3, after_s=0.0, stream=stream)
        progress.step(2**20)
        progress.step(2**20)
        progress.close()
    assert "\rreading from X: 2/3 queries, 2.0 MiB" in tty.getvalue() and tty.getvalue().endswith("\r")
    assert pipe.getvalue() == ""  # a pipe or a CI log never gets carriage returns
    quiet = Terminal()
    progress = Progress("reading from X", 3, after_s=3600.0, stream=quiet)
    progress.step()
    progress.close()
    assert quiet.getvalue() == ""  # a quick read stays silent


def test_rank_slices_cover_every_rank_once_within_the_budget():
    from queries._reading import rank_slices

    counts = {r: 100 for r in range(64)} | {70: 5_000}  # a gap (64-69) and one huge rank
    slices = rank_slices(counts, max_events=1_000, at_least=4)
    assert slices[0][0] == 0 and slices[-1][1] == 71
    assert all(a[1] == b[0] for a, b in zip(slices, slices[1:], strict=False))  # contiguous, no overlap
    for lo, hi in slices:
        inside = [n for r, n in counts.items() if lo <= r < hi]
        assert sum(inside) <= 1_000 or len(inside) == 1  # only a rank alone may pass the budget
    assert len(rank_slices({r: 10 for r in range(8)}, max_events=10**9, at_least=4)) == 4  # split for parallel reads
    assert rank_slices({}, 1_000, 4) == []
