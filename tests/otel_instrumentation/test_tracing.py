"""init_tracing in a live process: logs, spans, metrics, OpenTelemetry context, bad environments."""

from __future__ import annotations

import logging
import signal
import subprocess
import textwrap
import time

import pytest

import otel_instrumentation as oi
from tests.conftest import PYTHON, python_env, read_events


def events_of(tracing, tmp_path, kind=None):
    tracing.force_flush()
    evs = read_events(tmp_path / "test-job")
    return [e for e in evs if kind is None or e["kind"] == kind]


def wait_for(condition, timeout_s: float = 10.0) -> bool:
    """Poll ``condition`` (the heartbeat thread acts every 0.2 s; a loaded machine may delay it)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class TestLogsAndSpans:
    def test_every_log_line_carries_job_trace_and_active_span(self, tracing, tmp_path):
        """A plain logger.info inside a phase is stored with the job's trace id and the phase's span id."""
        log = logging.getLogger("user.code")
        with oi.step(3), oi.phase("forward") as fwd:
            log.info("step %d loss %.4f", 3, 0.25)
        logs = [e for e in events_of(tracing, tmp_path, "log") if e["logger"] == "user.code"]
        assert len(logs) == 1
        ev = logs[0]
        assert ev["msg"] == "step 3 loss 0.2500"
        assert ev["trace_id"] == tracing.identity.trace_id == oi.trace_id_for_job("test-job")
        assert ev["span_id"] == f"{fwd.span_id:016x}" and ev["step"] == 3
        assert (ev["job"], ev["rank"], ev["world"], ev["pid"]) == ("test-job", 0, 1, tracing.identity.pid)

    def test_spans_nest_step_phase_user(self, tracing, tmp_path):
        """phase → parent step → parent the job root, and durations are positive."""
        with oi.step(0) as st, oi.phase("backward") as ph, oi.span("bucket"):
            time.sleep(0.001)
        spans = {e["name"]: e for e in events_of(tracing, tmp_path, "span")}
        assert spans["bucket"]["parent_id"] == spans["backward"]["span_id"] == f"{ph.span_id:016x}"
        assert spans["backward"]["parent_id"] == spans["step"]["span_id"] == f"{st.span_id:016x}"
        assert spans["step"]["parent_id"] == f"{tracing.recorder.root_span_id:016x}"
        assert spans["bucket"]["dur"] >= 1_000_000 and spans["step"]["cat"] == "step"
        assert spans["backward"]["start"] >= spans["step"]["start"]

    def test_exception_inside_a_span_is_recorded_on_the_span(self, tracing, tmp_path):
        with pytest.raises(ZeroDivisionError), oi.phase("forward"):
            1 / 0
        (span,) = events_of(tracing, tmp_path, "span")
        assert span["attrs"]["error"].startswith("ZeroDivisionError")

    def test_exc_info_is_kept_as_a_traceback(self, tracing, tmp_path):
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logging.getLogger("x").exception("failed")
        (ev,) = [e for e in events_of(tracing, tmp_path, "log") if e["logger"] == "x"]
        assert "RuntimeError: boom" in ev["exc"] and ev["level"] == "ERROR"

    def test_mutable_log_arguments_are_formatted_at_call_time(self, tracing, tmp_path):
        """A list argument changed after the call is logged as it was when logged."""
        values = [1, 2]
        logging.getLogger("x").info("values %s", values)
        values.append(3)
        (ev,) = [e for e in events_of(tracing, tmp_path, "log") if e["logger"] == "x"]
        assert ev["msg"] == "values [1, 2]"

    def test_non_propagating_library_logger_is_captured(self, tracing, tmp_path):
        """DeepSpeed/Transformers-style loggers with propagate=False still reach the store."""
        lib = logging.getLogger("fake_deepspeed")
        lib.propagate = False
        lib.setLevel(logging.INFO)
        assert wait_for(lambda: tracing.handler in lib.handlers)  # the heartbeat attaches to loggers created later
        lib.info("ds message")
        msgs = [e["msg"] for e in events_of(tracing, tmp_path, "log")]
        assert "ds message" in msgs

    def test_a_logger_that_propagates_again_is_captured_once(self, tracing, tmp_path):
        """A library that turns propagation back on must not have its records stored twice."""
        lib = logging.getLogger("fake_transformers")
        lib.propagate = False
        lib.setLevel(logging.INFO)
        assert wait_for(lambda: tracing.handler in lib.handlers)  # the heartbeat attaches it...
        lib.propagate = True
        assert wait_for(lambda: tracing.handler not in lib.handlers)  # ... and takes it off again
        lib.info("once")
        msgs = [e["msg"] for e in events_of(tracing, tmp_path, "log")]
        assert msgs.count("once") == 1

    def test_a_filter_on_the_handler_is_honoured_and_the_exporters_warnings_stay_out(self, tracing, tmp_path):
        drop_secret = type("DropSecret", (logging.Filter,), {"filter": lambda self, r: "secret" not in r.getMessage()})()
        tracing.handler.addFilter(drop_secret)
        logging.getLogger("x").warning("a secret value")
        logging.getLogger("x").warning("kept while filtered")
        tracing.handler.removeFilter(drop_secret)
        logging.getLogger("x").warning("another secret, no filter now")
        logging.getLogger("jobtrace.export").warning("sink failed")  # must not loop back into the queue
        msgs = [e["msg"] for e in events_of(tracing, tmp_path, "log")]
        assert "kept while filtered" in msgs and "another secret, no filter now" in msgs
        assert "a secret value" not in msgs and "sink failed" not in msgs

    def test_metrics_keep_nan_and_convert_tensors_like(self, tracing, tmp_path):
        class Scalar:
            def item(self):
                return 1.5

        oi.log_metrics(4, loss=float("nan"), lr=Scalar(), tokens=128)
        (ev,) = [e for e in events_of(tracing, tmp_path, "metric") if "loss" in e["metrics"]]
        assert ev["metrics"] == {"loss": "NaN", "lr": 1.5, "tokens": 128} and ev["step"] == 4

    def test_the_package_helpers_take_arguments_and_attributes(self, tracing, tmp_path):
        """``oi.step``/``phase``/``span``/``log_metrics`` with attributes and without a step: what the
        compiled recorder's entry points (bound to the package while it traces) must record alike."""
        with oi.step(5, tokens=3) as st:
            with oi.phase("forward", micro=2), oi.span("bucket", k="v"):
                oi.log_metrics(loss=1.0)
            with oi.phase("forward"):  # the shared object, not the one with attributes
                pass
            oi.log_metrics()
        spans = events_of(tracing, tmp_path, "span")
        attrs = {(e["name"], e["cat"]): e.get("attrs") for e in spans}
        assert attrs[("step", "step")] == {"tokens": 3} and attrs[("bucket", "user")] == {"k": "v"}
        forwards = [e for e in spans if e["name"] == "forward"]
        assert [e.get("attrs") for e in forwards] == [{"micro": 2}, None]
        assert all(e["step"] == 5 and e["parent_id"] == f"{st.span_id:016x}" for e in forwards)
        metrics = [e for e in events_of(tracing, tmp_path, "metric") if e["step"] == 5]
        assert [m["metrics"] for m in metrics] == [{"loss": 1.0}, {}]

    def test_the_package_helpers_are_the_recorders_entry_points_only_while_it_traces(self, tracing):
        """A script that kept ``oi.phase`` from a traced run gets the null span after shutdown, and
        its metrics are dropped, not queued where nothing exports them."""
        from otel_instrumentation import _setup

        entry = tracing.recorder.entry_points()
        for name in ("step", "phase", "span", "log_metrics"):
            assert getattr(oi, name) == entry.get(name, getattr(_setup, name))
        held = (oi.step, oi.phase, oi.span, oi.log_metrics)
        tracing.shutdown()
        for name in ("step", "phase", "span", "log_metrics"):
            assert getattr(oi, name) is getattr(_setup, name)
        step, phase, span, log_metrics = held
        assert step(1) is phase("forward") is span("x", k=1) is _setup._NULL_SPAN
        log_metrics(1, loss=0.5)
        assert tracing.stats()["queued"] == 0

    def test_heartbeats_report_the_current_span(self, tracing, tmp_path):
        with oi.step(1), oi.phase("forward"):
            time.sleep(0.5)
        beats = events_of(tracing, tmp_path, "heartbeat")
        assert any(b.get("attrs", {}).get("in_span") == "forward" for b in beats)

    @pytest.mark.parametrize("configure", ["", "logging.basicConfig(level=logging.INFO)"])
    def test_console_line_carries_rank_and_trace(self, tmp_path, configure):
        """With or without the script's own basicConfig, console lines show job, rank, trace and span."""
        proc = run_child(
            f"""
            import logging, otel_instrumentation as oi
            {configure}
            t = oi.init_tracing("console", data_dir="store", torch=False)
            logging.getLogger("y").warning("visible")
            logging.getLogger("y").info("info line")
            """, tmp_path)
        trace = oi.trace_id_for_job("console")
        line = [ln for ln in proc.stderr.splitlines() if "visible" in ln][0]
        assert f"trace={trace}" in line and "rank=0" in line and "job=console" in line
        # INFO is captured either way, but only printed when the script asked for it
        assert ("info line" in proc.stderr) == bool(configure)


    def test_console_context_follows_the_span_and_sets_fields_only_where_read(self, tracing):
        """The console line's context is made once per span (cached) but must change with it; the
        record gets the filter's fields where the wrapped formatter could read them."""
        from otel_instrumentation._logging import TraceContextFormatter

        def line(inner):
            record = logging.LogRecord("x", logging.INFO, __file__, 1, "m %d", (1,), None)
            return TraceContextFormatter(inner, tracing.recorder).format(record), record

        plain = logging.Formatter("%(message)s")
        with oi.step(0):
            with oi.phase("forward") as a:
                in_a, rec_a = line(plain)
            with oi.phase("backward") as b:
                in_b, _ = line(plain)
        assert in_a == f"[job=test-job rank=0 trace={tracing.identity.trace_id} span={a.span_id:016x}] m 1"
        assert in_b.startswith(f"[job=test-job rank=0 trace={tracing.identity.trace_id} span={b.span_id:016x}] ")
        assert not hasattr(rec_a, "trace_id")
        named, rec_named = line(logging.Formatter("%(trace_id)s %(message)s"))
        assert named.endswith(f"] {tracing.identity.trace_id} m 1") and rec_named.rank == 0

        class Everything(logging.Formatter):
            def format(self, record):
                return ",".join(sorted(k for k in vars(record) if k in ("job_id", "span_id", "trace_id")))

        assert line(Everything())[0].endswith("] job_id,span_id,trace_id")


class TestOpenTelemetry:
    def test_user_otel_span_joins_the_job_trace_under_our_innermost_span(self, tracing, tmp_path):
        """A span started with the OTel API gets the job's TraceID, nests under whichever of our
        spans is innermost when it starts (the context is resolved then, not attached per span),
        and is recorded as an event too."""
        from opentelemetry import trace

        tracer = trace.get_tracer("user")
        with tracer.start_as_current_span("setup") as before:
            pass
        with oi.step(0) as st:
            with oi.phase("forward") as ph, tracer.start_as_current_span("attention") as s:
                ctx = s.get_span_context()
                with tracer.start_as_current_span("softmax") as inner:
                    pass
            with tracer.start_as_current_span("between") as between:
                pass
        assert f"{ctx.trace_id:032x}" == tracing.identity.trace_id
        assert s.parent.span_id == ph.span_id and inner.parent.span_id == ctx.span_id
        assert between.parent.span_id == st.span_id
        assert before.parent.span_id == tracing.recorder.root_span_id
        names = [e["name"] for e in events_of(tracing, tmp_path, "span")]
        assert {"attention", "softmax", "between", "setup"} <= set(names)

    @pytest.mark.parametrize("mode", ["step", "none"])
    def test_otel_context_modes(self, tmp_path, mode):
        proc = run_child(
            f"""
            import otel_instrumentation as oi
            from opentelemetry import trace
            t = oi.init_tracing("ctx", data_dir="store", torch=False, otel_context={mode!r})
            with oi.step(0) as st:
                with oi.phase("forward"):
                    with trace.get_tracer("u").start_as_current_span("x") as s:
                        pass
            print("RESULT", s.parent.span_id == st.span_id if s.parent else None,
                  f"{{s.get_span_context().trace_id:032x}}" == t.identity.trace_id)
            """, tmp_path)
        assert proc.returncode == 0, proc.stderr
        result = proc.stdout.split("RESULT ")[1].split()
        assert result == (["True", "True"] if mode == "step" else ["None", "False"])

    def test_resource_follows_semantic_conventions(self, tracing):
        from opentelemetry import trace

        attrs = trace.get_tracer_provider().resource.attributes
        assert attrs["service.namespace"] == "jobtrace" and "host.name" in attrs and "process.pid" in attrs


def run_child(code: str, tmp_path, timeout=60, **env) -> subprocess.CompletedProcess:
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.run([PYTHON, str(script)], env=python_env(**env), capture_output=True, text=True,
                          timeout=timeout, cwd=tmp_path)


class TestProcessLifecycle:
    def test_uncaught_exception_is_recorded_and_flushed(self, tmp_path):
        proc = run_child(
            """
            import logging, otel_instrumentation as oi
            oi.init_tracing("crash", data_dir="store", torch=False)
            logging.getLogger("t").info("before")
            raise ValueError("the bug")
            """, tmp_path)
        assert proc.returncode == 1 and "ValueError: the bug" in proc.stderr
        evs = read_events(tmp_path / "store" / "crash")
        crit = [e for e in evs if e.get("level") == "CRITICAL"]
        assert crit and "ValueError: the bug" in crit[0]["exc"]
        assert any(e.get("msg") == "before" for e in evs)

    def test_sigterm_flushes_and_still_terminates(self, tmp_path):
        script = tmp_path / "child.py"
        script.write_text(textwrap.dedent(
            """
            import logging, time, otel_instrumentation as oi
            oi.init_tracing("term", data_dir="store", torch=False, flush_interval_s=60)
            for i in range(1000):
                logging.getLogger("t").info("line %d", i)
            print("ready", flush=True)
            time.sleep(60)
            """))
        proc = subprocess.Popen([PYTHON, str(script)], env=python_env(), cwd=tmp_path, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM
        msgs = [e.get("msg") for e in read_events(tmp_path / "store" / "term")]
        assert sum(1 for m in msgs if m and m.startswith("line ")) == 1000
        assert "received SIGTERM; flushing and exiting" in msgs

    def test_sigkill_mid_run_leaves_a_readable_store_and_a_torn_line_is_counted(self, tmp_path):
        """SIGKILL while events stream; then the file is cut mid-line as a crash during a write leaves it."""
        from queries import load_local

        script = tmp_path / "child.py"
        script.write_text(textwrap.dedent(
            """
            import logging, otel_instrumentation as oi
            oi.init_tracing("killed", data_dir="store", torch=False, flush_interval_s=0.05)
            i = 0
            while True:
                with oi.step(i):
                    logging.getLogger("t").info("step %d", i)
                i += 1
                if i == 2000:
                    print("ready", flush=True)
            """))
        proc = subprocess.Popen([PYTHON, str(script)], env=python_env(), cwd=tmp_path, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        # Killed once its first 2,000 steps are on disk, however long a busy machine makes that (a fixed sleep
        # was too short with a CPU hog on each core).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            files = list((tmp_path / "store" / "killed").glob("*.jsonl"))
            if files and files[0].read_bytes().count(b"\n") > 4000:  # a span and a log line a step
                break
            time.sleep(0.05)
        proc.kill()
        proc.wait(timeout=30)
        (path,) = (tmp_path / "store" / "killed").glob("*.jsonl")
        data = path.read_bytes()
        whole = data[: data.rstrip(b"\n").rfind(b"\n") + 1]
        complete = whole.count(b"\n")
        path.write_bytes(whole + data[len(whole): len(whole) + 40].rstrip(b"\n")[:40])
        job = load_local(tmp_path / "store", "killed")
        assert job.stats.events == complete > 2000
        assert job.stats.torn_lines == 1 and job.stats.skipped == {"torn last line (crash mid-write)": 1}

    def test_the_flush_interval_comes_from_the_environment_and_an_argument_wins(self, tmp_path):
        """JOBTRACE_FLUSH_INTERVAL_S=60: a record logged stays queued (nothing written after 1.5 s, where the
        default 1 s would have written it) until shutdown; the argument beats the variable; a bad value is named."""
        proc = run_child(
            """
            import glob, logging, time, otel_instrumentation as oi
            t = oi.init_tracing("slowflush", data_dir="store", torch=False)
            logging.getLogger("t").info("queued")
            time.sleep(1.5)
            written = sum(open(p).read().count("queued") for p in glob.glob("store/slowflush/*.jsonl"))
            t.shutdown()
            after = sum(open(p).read().count("queued") for p in glob.glob("store/slowflush/*.jsonl"))
            print(written, after)
            """, tmp_path, JOBTRACE_FLUSH_INTERVAL_S="60")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == ["0", "1"]
        proc = run_child(
            """
            import glob, logging, time, otel_instrumentation as oi
            oi.init_tracing("fastflush", data_dir="store", torch=False, flush_interval_s=0.05)
            logging.getLogger("t").info("soon")
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if any("soon" in open(p).read() for p in glob.glob("store/fastflush/*.jsonl")):
                    print("written before shutdown")
                    break
                time.sleep(0.05)
            """, tmp_path, JOBTRACE_FLUSH_INTERVAL_S="60")
        assert proc.returncode == 0 and "written before shutdown" in proc.stdout, proc.stderr
        proc = run_child("import otel_instrumentation as oi; oi.init_tracing('x', data_dir='store', torch=False)",
                         tmp_path, JOBTRACE_FLUSH_INTERVAL_S="soon")
        assert proc.returncode != 0 and "JOBTRACE_FLUSH_INTERVAL_S='soon' is not a number" in proc.stderr

    def test_no_launcher_variables_runs_as_a_single_rank(self, tmp_path):
        proc = run_child(
            """
            import otel_instrumentation as oi
            t = oi.init_tracing(data_dir="store", torch=False)
            print(t.identity.rank, t.identity.world_size, t.identity.job_id)
            """, tmp_path)
        rank, world, job = proc.stdout.split()
        assert proc.returncode == 0 and (rank, world) == ("0", "1") and job.startswith("local-")
        assert (tmp_path / "store" / job).is_dir()

    def test_unwritable_data_dir_warns_clearly_and_training_continues(self, tmp_path):
        """A store path that cannot be created: a clear message, events go to the temp dir, exit 0."""
        (tmp_path / "afile").write_text("not a directory")
        proc = run_child(
            """
            import logging, otel_instrumentation as oi
            t = oi.init_tracing("nodir", data_dir="afile/store", torch=False)
            logging.getLogger("t").info("training goes on")
            t.shutdown()
            print("trained")
            """, tmp_path)
        assert proc.returncode == 0 and "trained" in proc.stdout
        assert "cannot write the embedded store" in proc.stderr and "Training continues" in proc.stderr

    def test_unwritable_data_dir_raises_in_strict_mode(self, tmp_path):
        (tmp_path / "afile").write_text("x")
        proc = run_child(
            """
            import otel_instrumentation as oi
            from jobtrace.errors import ConfigError
            try:
                oi.init_tracing("nodir", data_dir="afile/store", torch=False, strict=True)
            except ConfigError as e:
                print("ConfigError:", e)
            """, tmp_path)
        assert "ConfigError: cannot write the embedded store" in proc.stdout

    def test_conflicting_launcher_variables_are_logged(self, tmp_path):
        proc = run_child(
            """
            import otel_instrumentation as oi
            t = oi.init_tracing(data_dir="store", torch=False)
            print(t.identity.rank)
            """, tmp_path, RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", TORCHELASTIC_RUN_ID="c", SLURM_PROCID="5",
            SLURM_NTASKS="8", SLURM_JOB_ID="77")
        assert proc.stdout.strip() == "1"
        assert "slurm says 5" in proc.stderr

    def test_helpers_are_harmless_without_init(self, tmp_path):
        proc = run_child(
            """
            import otel_instrumentation as oi
            with oi.step(1):
                with oi.phase("forward"):
                    oi.log_metrics(loss=1.0)
            print("ok")
            """, tmp_path)
        assert proc.stdout.strip() == "ok"
