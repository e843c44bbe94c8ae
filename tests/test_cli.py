"""The command line as a whole: one exit-code mapping for every command, --debug, --version,
--backend, no silent fallback to the local store, and a cheap `jobtrace --help`."""

from __future__ import annotations

import sys

import click
import pytest
from click.testing import CliRunner

from jobtrace.cli import main, trace_job
from jobtrace.cli.exitcodes import (
    EXIT_ERROR,
    EXIT_HEALTHY,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_PROBLEM,
    EXIT_USAGE,
    exit_code_for,
)
from jobtrace.errors import (
    BackendUnavailable,
    ConfigError,
    JobNotFound,
    JobtraceError,
    QueryError,
    Refused,
    StoreError,
)
from jobtrace.synth import SynthJob, write_job


@pytest.fixture
def store(tmp_path):
    """A healthy job and a job with a slow rank, in one embedded store."""
    write_job(tmp_path, SynthJob(job_id="ok", ranks=4, steps=20))
    write_job(tmp_path, SynthJob(job_id="slow", ranks=4, steps=20, slow_ranks={2: 2.0}))
    return tmp_path


def run(cmd, *args):
    return CliRunner().invoke(cmd, [str(a) for a in args])


class TestExitCodes:
    def test_healthy_job_exits_0(self, store):
        res = run(trace_job, "ok", "--data-dir", store)
        assert res.exit_code == EXIT_HEALTHY == 0, res.output

    def test_a_problem_exits_1(self, store):
        res = run(trace_job, "slow", "--data-dir", store)
        assert res.exit_code == EXIT_PROBLEM == 1, res.output
        assert "rank 2" in res.stdout

    def test_a_bad_option_exits_2(self, store):
        assert run(trace_job, "ok", "--stall-threshold", "soon").exit_code == EXIT_USAGE == 2
        assert run(main, "trace", "ok", "--no-such-option").exit_code == 2
        assert run(main, "no-such-command").exit_code == 2

    def test_a_bad_time_option_exits_2_with_its_message(self, store):
        res = run(trace_job, "ok", "--backend", "loki", "--url", "http://127.0.0.1:9", "--since", "whenever")
        assert res.exit_code == 2 and "cannot read time 'whenever'" in res.stderr

    def test_a_missing_job_exits_3(self, store):
        res = run(trace_job, "nope", "--data-dir", store)
        assert res.exit_code == EXIT_ERROR == 3
        assert res.stderr.startswith("error: no events for job 'nope'") and "Traceback" not in res.output

    def test_an_unreachable_backend_exits_3(self, store):
        res = run(trace_job, "ok", "--backend", "loki", "--url", "http://127.0.0.1:9")
        assert res.exit_code == 3 and "127.0.0.1:9" in res.stderr

    def test_a_bug_exits_4_with_one_line_and_no_traceback(self, store, monkeypatch):
        import queries

        def broken(*_a, **_k):
            raise KeyError("rank_summary")

        monkeypatch.setattr(queries, "trace_job", broken)
        res = run(trace_job, "ok", "--data-dir", store)
        assert res.exit_code == EXIT_INTERNAL == 4
        assert res.stdout == "" and "Traceback" not in res.stderr
        (line,) = res.stderr.splitlines()
        assert line == ("error: internal error (a bug in jobtrace): KeyError: 'rank_summary'; "
                        "rerun with --debug for the traceback")

    @pytest.mark.parametrize("argv", [("trace", "ok", "--debug"), ("--debug", "trace", "ok")])
    def test_with_debug_a_bug_shows_its_traceback(self, store, monkeypatch, argv):
        """`--debug` works before the command (the group's) and after it (every command's)."""
        import queries

        def broken(*_a, **_k):
            raise KeyError("rank_summary")

        monkeypatch.setattr(queries, "trace_job", broken)
        res = run(main, *argv, "--data-dir", store)
        assert res.exit_code == 4
        assert res.stderr.startswith("Traceback (most recent call last):")
        assert "in broken" in res.stderr and "KeyError: 'rank_summary'" in res.stderr
        assert res.stderr.splitlines()[-1] == "error: internal error (a bug in jobtrace): KeyError: 'rank_summary'"

    def test_with_debug_a_jobtrace_error_keeps_its_code_and_shows_where(self, store):
        res = run(trace_job, "nope", "--data-dir", store, "--debug")
        assert res.exit_code == 3 and "Traceback" in res.stderr and "JobNotFound" in res.stderr

    def test_ctrl_c_is_not_a_finding(self, store, monkeypatch):
        import queries

        def interrupted(*_a, **_k):
            raise KeyboardInterrupt

        monkeypatch.setattr(queries, "trace_job", interrupted)
        assert run(trace_job, "ok", "--data-dir", store).exit_code == EXIT_INTERRUPTED

    def test_a_refusal_exits_1_and_force_overrides_it(self, store):
        res = run(main, "golden", "slow", "--data-dir", store)
        assert res.exit_code == 1 and "is not known-good" in res.stderr and "slow_rank" in res.stderr
        assert run(main, "golden", "slow", "--data-dir", store, "--force").exit_code == 0
        assert run(main, "golden", "ok", "--data-dir", store).exit_code == 0
        assert run(main, "golden", "nope", "--data-dir", store).exit_code == 3

    def test_the_other_commands_share_the_mapping(self, store, monkeypatch):
        import queries

        assert run(main, "jobs", "--data-dir", store).stdout.split() == ["ok", "slow"]
        monkeypatch.setattr(queries, "list_local_jobs", lambda _d: 1 / 0)
        res = run(main, "jobs", "--data-dir", store)
        assert res.exit_code == 4 and "ZeroDivisionError: division by zero" in res.stderr

    @pytest.mark.parametrize("exc,code", [
        (ConfigError("x"), 3), (Refused("x"), 1), (JobNotFound("x"), 3), (QueryError("x"), 3), (StoreError("x"), 3),
        (BackendUnavailable("x"), 3), (JobtraceError("x"), 3), (ValueError("x"), 4), (RuntimeError("x"), 4),
        (KeyboardInterrupt(), 130), (click.UsageError("x"), 2), (click.BadParameter("x"), 2),
        (click.FileError("f"), 3), (click.exceptions.Exit(1), 1),
    ])
    def test_one_table_from_the_exception_tree(self, exc, code):
        assert exit_code_for(exc) == code

    def test_every_command_documents_its_exit_status(self):
        commands = {"trace-job": trace_job, **main.commands}
        assert set(commands) >= {"trace-job", "trace", "ingest", "export", "replay", "jobs", "golden", "setup", "demo"}
        for name, cmd in [("jobtrace", main), *commands.items()]:
            text = " ".join(run(cmd, "--help").output.split())
            assert "Exit status: 0" in text and "4 internal error" in text, name
            assert "--debug" in text, name


class TestLazyImports:
    HEAVY = ("duckdb", "torch", "queries", "shippers", "ingest", "kibana", "loki", "rich", "requests", "orjson",
             "otel_instrumentation", "opentelemetry")

    @pytest.mark.parametrize("entry,argv", [("main", ["--help"]), ("main", ["trace", "--help"]),
                                            ("main", ["ingest", "--help"]), ("main", ["export", "--help"]),
                                            ("trace_job_main", ["--help"])])
    def test_help_imports_no_heavy_module(self, entry, argv):
        """`jobtrace --help` (and a command's) reads only click and the core: no DuckDB, torch or backend code."""
        import json
        import subprocess

        from tests.conftest import PYTHON, python_env

        code = (f"import sys, json\nsys.argv = ['x', *{argv!r}]\nfrom jobtrace.cli import {entry}\n"
                f"try:\n    {entry}()\nexcept SystemExit as e:\n    code = e.code\n"
                "print(json.dumps([code, sorted(sys.modules)]), file=sys.stderr)")
        proc = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=python_env(), timeout=120)
        code, modules = json.loads(proc.stderr.strip().splitlines()[-1])
        assert code in (0, None) and "Usage:" in proc.stdout
        loaded = sorted({m.split(".")[0] for m in modules} & set(self.HEAVY))
        assert loaded == [], loaded

    def test_the_ingest_targets_are_the_ingest_packages(self):
        import ingest
        from jobtrace.cli.ingest import INGEST_TARGETS

        assert INGEST_TARGETS == ingest.SINK_KINDS


class TestVersion:
    @pytest.mark.parametrize("cmd", [main, trace_job])
    def test_version_names_the_release_and_the_compiled_parts(self, cmd, monkeypatch):
        import types

        import jobtrace

        fake = types.ModuleType("jobtrace_native")
        fake.__version__ = "9.9.9"  # type: ignore[attr-defined]
        fake.Recorder = fake.FastLane = object  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "jobtrace_native", fake)
        res = run(cmd, "--version")
        assert res.exit_code == 0
        assert res.stdout.splitlines() == [f"jobtrace {jobtrace.__version__}",
                                           "compiled parts: present (jobtrace_native 9.9.9: Recorder, FastLane)"]

    @pytest.mark.parametrize("cmd", [main, trace_job])
    def test_version_says_when_the_compiled_parts_are_absent(self, cmd, monkeypatch):
        monkeypatch.setitem(sys.modules, "jobtrace_native", None)  # import fails, as when not built
        res = run(cmd, "--version")
        assert res.exit_code == 0 and "compiled parts: absent" in res.stdout and "pure-Python" in res.stdout


class TestBackendOption:
    @pytest.mark.parametrize("spelling", ["--backend", "--to"])
    def test_export_takes_backend_and_the_old_to(self, tmp_path, spelling):
        res = run(main, "export", "nope", spelling, "loki", "--url", "http://127.0.0.1:9", "--data-dir", tmp_path)
        assert res.exit_code == 3 and "no job 'nope'" in res.stderr

    def test_the_backend_is_required_where_there_is_no_default(self, tmp_path):
        res = run(main, "export", "x", "--data-dir", tmp_path)
        assert res.exit_code == 2 and "Missing option '--backend'" in res.stderr
        assert run(main, "replay", tmp_path).exit_code == 2

    def test_two_different_spellings_are_a_usage_error(self, tmp_path):
        res = run(main, "replay", tmp_path, "--backend", "loki", "--to", "elasticsearch")
        assert res.exit_code == 2 and "old spelling" in res.stderr

    @pytest.mark.parametrize("spelling", ["--backend", "--to"])
    def test_ingest_takes_both_spellings(self, tmp_path, spelling):
        log = tmp_path / "a.log"
        log.write_text("2026-01-05 12:00:00,250 - INFO - __main__ - step 1 loss 1.5\n")
        res = run(main, "ingest", log, "--job", "j", spelling, "local", "--data-dir", tmp_path / "d", "-q")
        assert res.exit_code == 0, res.output
        assert (tmp_path / "d" / "j").is_dir()

    def test_help_shows_only_backend(self):
        for name in ("export", "replay", "ingest"):
            text = run(main, name, "--help").output
            assert "--backend" in text and "--to" not in text, name


class TestVictoriaLogsShipping:
    """`--backend victorialogs` for export, replay and ingest: the Loki shipper on VictoriaLogs' `/insert/loki`."""

    def test_the_choices_are_the_shippers_and_the_sinks(self):
        import ingest
        import shippers
        from jobtrace.cli.store import SHIP_TO

        assert SHIP_TO == shippers.SHIPPER_BACKENDS and ("local", *SHIP_TO) == ingest.SINK_KINDS

    def test_the_shipper_is_configured_from_jobtrace_vl(self, tmp_path, monkeypatch):
        from shippers import ProcessInfo, open_shipper

        monkeypatch.setenv("JOBTRACE_VL_URL", "http://vl:9428")
        monkeypatch.setenv("JOBTRACE_VL_TENANT", "12:34")
        monkeypatch.setenv("JOBTRACE_LOKI_URL", "http://loki:3100")
        shipper = open_shipper("victorialogs", ProcessInfo("j", "n0", 0, 1, tmp_path))
        try:
            assert shipper.encoder.url == "http://vl:9428/insert/loki/api/v1/push?disable_message_parsing=1"
            assert "X-Scope-OrgID" not in shipper.encoder._headers
            session = shipper.transport._session.headers
            assert session["AccountID"] == "12" and session["ProjectID"] == "34"
            assert shipper.spool.dir == tmp_path / "victorialogs-r0"
        finally:
            shipper.close()

    def test_without_a_url_it_names_the_variable(self, tmp_path, monkeypatch):
        monkeypatch.delenv("JOBTRACE_VL_URL", raising=False)
        write_job(tmp_path, SynthJob(job_id="j", ranks=2, steps=5))
        res = run(main, "export", "j", "--backend", "victorialogs", "--data-dir", tmp_path)
        assert res.exit_code == 3 and "JOBTRACE_VL_URL" in res.stderr

    @pytest.mark.servers
    def test_export_then_trace_job_on_victorialogs_gives_the_local_verdict(self, tmp_path, victorialogs):
        import json
        import time
        import uuid

        job = f"vl-{uuid.uuid4().hex[:8]}"
        write_job(tmp_path, SynthJob(job_id=job, ranks=4, steps=20, slow_ranks={1: 2.0},
                                     t0_ns=time.time_ns() - 900 * 10**9))
        res = run(main, "export", job, "--backend", "victorialogs", "--url", victorialogs.url,
                  "--data-dir", tmp_path, "--json")
        assert res.exit_code == 0, res.output
        summary = json.loads(res.stdout)
        assert summary["backend"] == "victorialogs" and summary["complete"] and summary["sent"] == summary["lines"]
        victorialogs.force_flush()
        there = run(trace_job, job, "--backend", "victorialogs", "--url", victorialogs.url, "--since", "2h", "--json")
        here = run(trace_job, job, "--data-dir", tmp_path, "--json")
        assert there.exit_code == here.exit_code == 1, there.output
        kinds = [sorted((f["kind"], f["ranks"]) for f in json.loads(r.stdout)["findings"]) for r in (here, there)]
        assert kinds[0] == kinds[1] and ("slow_rank", [1]) in kinds[0]

    @pytest.mark.servers
    def test_ingest_to_victorialogs_reads_back(self, tmp_path, victorialogs):
        import uuid

        from queries import TimeRange, load_job

        job = f"vl-ingest-{uuid.uuid4().hex[:8]}"
        log = tmp_path / "rank0.log"
        log.write_text("".join(f"2026-01-05 12:00:0{s},250 - INFO - __main__ - step {s} loss 1.5\n" for s in range(5)))
        res = run(main, "ingest", log, "--job", job, "--backend", "victorialogs", "--url", victorialogs.url,
                  "--data-dir", tmp_path / "d")
        assert res.exit_code == 0, res.output
        assert f"next: trace-job {job} --backend victorialogs" in " ".join(res.stdout.split())
        victorialogs.force_flush()
        t0 = 1_767_614_400 * 10**9  # 2026-01-05 12:00 UTC
        there = load_job("victorialogs", job, url=victorialogs.url, time_range=TimeRange(t0 - 3600 * 10**9, t0 + 3600 * 10**9))
        assert there.stats.events > 0


class TestNoFallbackToTheLocalStore:
    """A job missing from the named server is not looked for in the embedded store."""

    @pytest.fixture
    def empty_loki(self, monkeypatch):
        """`--backend loki` answered by the Loki stand-in of tests/loki, holding nothing."""
        import queries
        from shippers import InMemoryTransport
        from tests.loki.fake_loki import FakeLoki

        fake, real = FakeLoki(), queries.load_job

        def load_job(backend, job_id, **kw):
            assert backend == "loki"
            return real(backend, job_id, transport=InMemoryTransport(fake), **kw)

        monkeypatch.setattr(queries, "load_job", load_job)
        return fake

    def test_a_job_only_in_the_local_store_is_not_found_on_loki(self, store, empty_loki):
        res = run(trace_job, "slow", "--backend", "loki", "--url", "http://loki:3100", "--data-dir", store)
        assert res.exit_code == 3, res.output
        assert "no events for job 'slow' in Loki at http://loki:3100" in res.stderr and res.stdout == ""
        assert empty_loki.queries  # Loki was asked, and only Loki

    def test_with_dumps_the_report_is_the_dumps_alone_and_says_so(self, store, empty_loki):
        import json

        from tests.queries.test_diagnosis import _write_fr

        _write_fr(store / "fr", ranks=4, stuck=2)
        res = run(trace_job, "slow", "--backend", "loki", "--url", "http://loki:3100", "--data-dir", store,
                  "--flight-recorder", store / "fr", "--stall-threshold", "0.5", "--json")
        assert res.exit_code == 1, res.output
        assert "note: no events for job 'slow' in Loki" in res.stderr and "Flight Recorder dumps alone" in res.stderr
        kinds = {f["kind"]: f["ranks"] for f in json.loads(res.stdout)["findings"]}
        assert kinds.get("stalled_rank") == [2] and "slow_rank" not in kinds  # the local store's slow rank is not in

    def test_the_local_backend_still_makes_a_job_of_dumps_alone(self, store):
        import json

        from tests.queries.test_diagnosis import _write_fr

        _write_fr(store / "fr", ranks=4, stuck=2)
        res = run(trace_job, "frjob", "--data-dir", store, "--flight-recorder", store / "fr", "--stall-threshold", "0.5",
                  "--json")
        assert res.exit_code == 1 and "note:" not in res.stderr
        assert [f["ranks"] for f in json.loads(res.stdout)["findings"] if f["kind"] == "stalled_rank"] == [[2]]


@pytest.mark.parametrize("args", [
    ["--stall-threshold", "-5"], ["--stall-threshold", "0"], ["--slow-factor", "0"], ["--slow-factor", "1"],
])
def test_trace_job_refuses_thresholds_that_flag_everything(store, args):
    """``--stall-threshold -5`` flagged every finished rank and ``--slow-factor 0`` every rank (issue 20)."""
    res = run(trace_job, "demo", "--data-dir", store, *args)
    assert res.exit_code == 2 and "is not in the range" in res.output, res.output
    assert "stalled" not in res.output


@pytest.mark.parametrize("args", [
    ["ingest", "x.log", "--world-size", "0"], ["ingest", "x.log", "--rank", "-1"], ["ingest", "x.log", "--year", "20"],
    ["ingest", "x.log", "--idle-exit", "0"], ["demo", "--hang-step", "0"], ["demo", "--slow-ms", "-1"],
])
def test_numeric_options_out_of_range_are_usage_errors(args):
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2 and "is not in the range" in res.output, res.output


def test_a_glob_that_matches_nothing_is_an_error_not_an_empty_job(tmp_path):
    """It exited 0 with "next: trace-job g1", which then exited 3 (issue 20)."""
    (tmp_path / "rank0.log").write_text("step 1 loss 2.5 time 30ms\n")
    for paths, says in (([str(tmp_path / "nothing*.log")], "no file matches"),
                        ([str(tmp_path / "rank0.log"), str(tmp_path / "rank1*.log")], "no file matches"),
                        ([str(tmp_path / "empty")], "no input files")):
        (tmp_path / "empty").mkdir(exist_ok=True)
        res = CliRunner().invoke(main, ["ingest", *paths, "--job", "g1", "--data-dir", str(tmp_path / "d")])
        assert res.exit_code == EXIT_ERROR and says in res.output and "next: trace-job" not in res.output, res.output


def test_control_characters_of_log_text_reach_the_terminal_written_out(tmp_path):
    """A log line's ``ESC]0;…BEL`` (retitle) and ``ESC[2J`` (clear) are shown as ``\\x1b…``, not sent (issue 20)."""
    log = tmp_path / "rank0.log"
    log.write_text("2024-05-01 10:00:00,000 - root - INFO - step 1 loss 2.5 time 30ms\n"
                   "Traceback (most recent call last):\n  File \"train.py\", line 1, in <module>\n"
                   "RuntimeError: \x1b]0;pwned\x07\x1b[2J boom\n")
    data = str(tmp_path / "d")
    assert CliRunner().invoke(main, ["ingest", str(log), "--job", "esc", "--data-dir", data, "-q"]).exit_code == 0
    res = run(trace_job, "esc", "--data-dir", data)
    assert res.exit_code == EXIT_PROBLEM, res.output
    assert "\x1b" not in res.output and "\x07" not in res.output
    assert "\\x1b]0;pwned\\x07\\x1b[2J boom" in res.output
