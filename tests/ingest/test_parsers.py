"""Each parser on lines built from the frameworks' real format strings (see fixtures.py)."""

from __future__ import annotations

import os
from datetime import timedelta

import orjson
import pytest

from tests.ingest import fixtures as fx

NS = 1_000_000_000
T0_NS = int(fx.T0.replace(tzinfo=__import__("datetime").timezone.utc).timestamp()) * NS


class TestMegatron:
    def test_iteration_lines_become_step_spans_and_metrics(self, ingest_files):
        """Each iteration line gives a step span of its elapsed time ending at the line, and every field as a metric."""
        lines = [fx.megatron_iteration(i, consumed=256 * i, elapsed_ms=1234.5, losses={"lm loss": 2.5 - i / 10},
                                       throughput=155.3, when=fx.T0 + timedelta(seconds=1.2345 * i), params_norm=250.0)
                 for i in range(1, 6)]
        summary, cap = ingest_files({"train.log": lines})
        assert {"megatron": 5} == summary.lines_by_parser
        steps = cap.of("span", cat="step")
        assert [1, 2, 3, 4, 5] == [s["step"] for s in steps]
        first = steps[0]
        assert 1_234_500_000 == first["dur"]
        assert T0_NS + 1_234_500_000 == first["ts"]
        assert first["ts"] - first["dur"] == first["start"]
        m = cap.of("metric", step=3)[0]["metrics"]
        assert pytest.approx(2.2) == m["loss"] and pytest.approx(2.2) == m["lm_loss"]
        assert 1.5e-4 == m["lr"] and 256.0 == m["global_batch_size"] and 1.25 == m["grad_norm"]
        assert 155.3 == m["tflops_per_gpu"] and 250.0 == m["params_norm"] and 0.0 == m["nan_iters"]
        assert pytest.approx(256 / 1.2345, rel=1e-3) == m["samples_per_s"]

    def test_nan_iteration_reports_nan_loss(self, ingest_files):
        """training_log drops a NaN loss average and counts a nan iteration: the metric says loss NaN."""
        lines = [fx.megatron_iteration(10, losses={"lm loss": float("nan")}, nan=1, skipped=1)]
        _, cap = ingest_files({"train.log": lines})
        m = cap.of("metric")[0]["metrics"]
        assert "NaN" == m["loss"] and 1.0 == m["nan_iters"] and 1.0 == m["skipped_iters"]

    def test_old_format_without_fraction_and_srun_labels(self, ingest_files):
        """Second-resolution timestamps and `srun -l` labels (the rank printing) are understood."""
        lines = [fx.srun_label(7, 1, fx.megatron_iteration(i, when=fx.T0 + timedelta(seconds=i), with_fraction=False))
                 for i in range(1, 4)]
        _, cap = ingest_files({"job.out": lines})
        steps = cap.of("span", cat="step")
        assert {7} == {s["rank"] for s in steps}
        assert T0_NS + 2 * NS == steps[1]["ts"]

    def test_all_ranks_timer_table_gives_per_rank_compute_and_collective_spans(self, ingest_files):
        """A `times across ranks` table becomes phase/collective spans for every rank, and steps for the others."""
        lines = [fx.megatron_iteration(20, elapsed_ms=500.0)]
        lines += fx.megatron_timers_all({
            "forward-backward": {0: 300.0, 1: 450.0},
            "all-grads-sync": {0: 150.0, 1: 2.0},
            "optimizer": {0: 40.0, 1: 40.0},
            "batch-generator": {0: 5.0, 1: 5.0},
        })
        summary, cap = ingest_files({"rank0.log": lines})
        assert 0 == summary.skipped_total
        coll = {e["rank"]: e for e in cap.of("span", cat="collective")}
        assert {0: 150_000_000, 1: 2_000_000} == {r: e["dur"] for r, e in coll.items()}
        assert "all_reduce" == coll[1]["attrs"]["op"] and 20 == coll[1]["attrs"]["seq"]
        steps = {e["rank"]: e for e in cap.of("span", cat="step")}
        assert {0, 1} == set(steps) and 500_000_000 == steps[1]["dur"]
        data = cap.of("span", name="data")
        assert 2 == len(data)

    def test_minmax_timers_become_metrics(self, ingest_files):
        lines = [fx.megatron_iteration(5)] + fx.megatron_timers_minmax({"forward-backward": (100.25, 130.5),
                                                                          "optimizer": (10.0, 12.0)})
        _, cap = ingest_files({"train.log": lines})
        m = [e for e in cap.of("metric") if "timer_max_ms/forward-backward" in e["metrics"]][0]
        assert 5 == m["step"] and 130.5 == m["metrics"]["timer_max_ms/forward-backward"]
        assert 100.25 == m["metrics"]["timer_min_ms/forward-backward"]

    def test_straggler_detector_lines(self, ingest_files):
        lines = [fx.python_default_logging("INFO", "megatron.core.utils", fx.megatron_straggler(
                     fx.T0, ((3453.08, 8), (3468.20, 0)), ((296.02, 0), (297.32, 8)))),
                 fx.python_default_logging("INFO", "megatron.core.utils", fx.megatron_straggler_bottom(
                     [(296.02, 0), (296.17, 2), (296.23, 1)]))]
        _, cap = ingest_files({"train.log": lines})
        m = cap.of("metric")[0]["metrics"]
        assert 3468.2 == m["straggler_max_rtt_ms"] and 0.0 == m["straggler_max_rtt_ms_rank"]
        assert 8.0 == m["straggler_min_rtt_ms_rank"] and 297.32 == m["straggler_max_etpt_tflops"]
        etpt = {e["rank"]: e["metrics"]["etpt_tflops"] for e in cap.of("metric") if "etpt_tflops" in e["metrics"]}
        assert {0: 296.02, 2: 296.17, 1: 296.23} == etpt


class TestDeepSpeed:
    def _line(self, t, msg, level="INFO", where=("engine.py", 2489, "_report_progress")):
        return fx.deepspeed_logger(fx.T0 + timedelta(milliseconds=t), level, *where, msg)

    def test_progress_lines_give_steps_from_consecutive_timestamps(self, ingest_files):
        lines = [self._line(250 * i, fx.deepspeed_log_dist(0, fx.deepspeed_progress(i, 0, [1e-4], [(0.9, 0.999)])))
                 for i in range(1, 5)]
        _, cap = ingest_files({"ds.log": lines})
        steps = cap.of("span", cat="step")
        assert [2, 3, 4] == [s["step"] for s in steps]
        assert {250_000_000} == {s["dur"] for s in steps}
        assert 1e-4 == cap.of("metric", step=3)[0]["metrics"]["lr"]
        log = cap.of("log")[0]
        assert "engine.py:2489:_report_progress" == log["logger"] and "INFO" == log["level"]

    def test_wall_clock_breakdown_gives_phases_and_allreduce(self, ingest_files):
        lines = [self._line(0, fx.deepspeed_log_dist(0, fx.deepspeed_progress(10, 0, [1e-4], [(0.9, 0.999)]))),
                 self._line(100, fx.deepspeed_log_dist(0, fx.deepspeed_progress(11, 0, [1e-4], [(0.9, 0.999)]))),
                 self._line(101, fx.deepspeed_log_dist(0, fx.deepspeed_timers(
                     {"fwd": 30.0, "bwd": 50.0, "bwd_inner": 35.0, "bwd_allreduce": 15.0, "step": 10.0})),
                     where=("logging.py", 128, "log_dist"))]
        _, cap = ingest_files({"ds.log": lines})
        spans = {e["name"]: e for e in cap.of("span") if e["step"] == 11 and e["cat"] != "step"}
        assert {"forward": 30_000_000, "backward": 35_000_000, "all_reduce": 15_000_000, "optimizer": 10_000_000} == \
            {k: v["dur"] for k, v in spans.items()}
        assert "collective" == spans["all_reduce"]["cat"]
        step = cap.of("span", cat="step", step=11)[0]
        assert step["span_id"] == spans["forward"]["parent_id"]

    def test_throughput_overflow_and_scale_messages(self, ingest_files):
        lines = [self._line(0, fx.deepspeed_throughput(0, 20, 10, 123.456, 130.5, 1.23, 2.34)),
                 self._line(1, fx.deepspeed_overflow(0, 65536, 32768), where=("loss_scaler.py", 183, "update_scale")),
                 self._line(2, fx.deepspeed_scale_up(32768.0, 65536.0), where=("fused_optimizer.py", 401, "_update_scale")),
                 self._line(3, fx.deepspeed_exit(["python", "train.py"], 1), level="ERROR",
                            where=("launch.py", 325, "sigkill_handler"))]
        _, cap = ingest_files({"ds.log": lines})
        metrics = [e["metrics"] for e in cap.of("metric")]
        assert 130.5 == metrics[0]["samples_per_s"] and 10 == cap.of("metric")[0]["step"]
        assert 32768.0 == metrics[1]["loss_scale"] and 1.0 == metrics[1]["overflow"]
        assert 65536.0 == metrics[2]["loss_scale"]
        assert [1] == [e["attrs"]["exit_code"] for e in cap.of("log") if "exit_code" in (e.get("attrs") or {})]
        assert "WARNING" in {e["level"] for e in cap.of("log")}

    def test_pdsh_host_prefixes_split_nodes(self, ingest_files):
        lines = []
        for i in range(1, 4):
            for host in ("worker-0", "worker-1"):
                lines.append(f"{host}: " + self._line(100 * i, fx.deepspeed_log_dist(
                    0 if host == "worker-0" else 8, fx.deepspeed_progress(i, 0, [1e-4], [(0.9, 0.999)]))))
        summary, cap = ingest_files({"launcher.out": lines}, align=False)
        assert {"worker-0", "worker-1"} == {e["node"] for e in cap.events}
        assert {0, 8} == {e["rank"] for e in cap.of("span", cat="step")}


class TestHuggingFace:
    def test_metric_dicts_old_and_new_formats_with_tqdm_steps(self, ingest_files):
        segs = [fx.tqdm_meter(n, 100, n * 0.5, 2.0) for n in range(0, 11)]
        lines = ["\r".join(segs[:6]), fx.hf_logs_dict_old({"loss": 2.3456, "grad_norm": 1.5, "learning_rate": 4.5e-05,
                                                           "epoch": 0.05}),
                 "\r".join(segs[6:]), fx.hf_logs_dict_new({"loss": 2.1, "grad_norm": 1.25, "learning_rate": 4e-05,
                                                           "epoch": 0.1}),
                 fx.hf_logs_dict_new({"train_runtime": 12.5, "train_samples_per_second": 80.0,
                                      "train_steps_per_second": 8.0, "train_loss": 2.2, "epoch": 0.1})]
        summary, cap = ingest_files({"hf.log": lines})
        loss = [e for e in cap.of("metric") if "loss" in e["metrics"]]
        assert [(5, 2.3456), (10, 2.1)] == [(e["step"], e["metrics"]["loss"]) for e in loss]
        assert 4e-05 == loss[1]["metrics"]["lr"]
        steps = cap.of("span", cat="step")
        assert list(range(1, 11)) == [s["step"] for s in steps]
        assert {500_000_000} == {s["dur"] for s in steps}
        assert all(s["est"] for s in steps)
        assert summary.skipped.get("progress bar start") == 1
        assert 2.2 == [e for e in cap.of("metric") if "train_loss" in e["metrics"]][0]["metrics"]["train_loss"]

    def test_slow_rate_uses_seconds_per_iteration(self, ingest_files):
        lines = ["\r".join(fx.tqdm_meter(n, 10, n * 4.0, 0.25, desc="Training") for n in range(0, 3))]
        _, cap = ingest_files({"hf.log": lines})
        assert {4_000_000_000} == {s["dur"] for s in cap.of("span", cat="step")}
        assert "s/it" in fx.tqdm_meter(1, 10, 4.0, 0.25)


class TestTorchDistributed:
    def test_elastic_failure_summary_names_root_cause(self, ingest_files):
        pytest.importorskip("torch", reason="torch is part of the test dependencies (jobtrace[torch])")
        text = fx.child_failed_error("train.py", {2: (2, 4242, 1), 3: (3, 4243, -15)})
        lines = [fx.python_default_logging("ERROR", "torch.distributed.elastic.multiprocessing.api",
                                           "failed (exitcode: 1) local_rank: 2 (pid: 4242) of binary: /usr/bin/python")]
        lines += text.split("\n")
        summary, cap = ingest_files({"torchrun.log": lines})
        fails = [e for e in cap.of("log") if e.get("logger") == "torch.distributed.elastic"]
        root = [e for e in fails if e["attrs"]["root_cause"]][0]
        assert 2 == root["rank"] and 1 == root["attrs"]["exit_code"] and 4242 == root["attrs"]["pid"]
        assert root["attrs"]["host"] and root["node"] == root["attrs"]["host"]
        other = [e for e in fails if not e["attrs"]["root_cause"]][0]
        assert 3 == other["rank"] and "SIGTERM" == other["attrs"]["signal"]
        assert summary.lines_by_parser["torchelastic"] >= 10

    def test_nccl_info_warn_and_c10_watchdog_timeout(self, ingest_files):
        lines = [
            fx.nccl_info("node-a", 4242, 4300, 0, "NCCL_SOCKET_IFNAME set by environment to eth0"),
            "",
            fx.nccl_warn("node-a", 4242, 4300, 0, "transport/net.cc", 1034, "recvProxyProgress",
                         "NET/Socket : peer 10.0.0.2<51234> shutdown", when=fx.T0),
            fx.c10_log_prefix(1, "E", fx.T0 + timedelta(minutes=10), "ProcessGroupNCCL.cpp", 632)
            + fx.nccl_watchdog(1, 117, "ALLREDUCE", 26214400, 600000, 600046, pg=(0, "0(default_pg)")),
        ]
        summary, cap = ingest_files({"rank1.log": lines}, year=2026)
        nccl = [e for e in cap.of("log") if e.get("logger") == "nccl"]
        assert ["INFO", "WARNING"] == [e["level"] for e in nccl]
        assert "node-a" == nccl[1]["attrs"]["nccl_host"] and "transport/net.cc:1034" == nccl[1]["attrs"]["src"]
        assert T0_NS == nccl[1]["ts"]
        wd = [e for e in cap.of("log") if (e.get("attrs") or {}).get("timed_out")][0]
        assert ("all_reduce", 117, 600000, 600046) == (wd["attrs"]["op"], wd["attrs"]["seq"], wd["attrs"]["timeout_ms"],
                                                        wd["attrs"]["elapsed_ms"])
        assert T0_NS + 600 * NS == wd["ts"] and "ERROR" == wd["level"] and 1 == wd["rank"]
        span = cap.of("span", cat="collective")[0]
        assert 600046 * 1_000_000 == span["dur"] and span["ts"] - span["dur"] == span["start"]
        assert {"blank line": 1} == summary.skipped

    def test_traceback_is_one_event_with_oom_details(self, ingest_files):
        try:
            try:
                raise KeyError("batch")
            except KeyError as inner:
                raise RuntimeError(fx.cuda_oom("2.00 GiB", 0, "79.15 GiB", "1.23 GiB", 4242, "77.90 GiB",
                                               "75.00 GiB", "1.50 GiB")) from inner
        except RuntimeError as exc:
            tb = fx.python_traceback(exc)
        lines = [fx.torchrun_tee("default", 1, "step 3 loss 1.0")] + [fx.torchrun_tee("default", 1, t) for t in tb]
        lines += [fx.torchrun_tee("default", 0, "step 3 loss 1.1")]
        summary, cap = ingest_files({"all.log": lines})
        errs = [e for e in cap.of("log") if e["level"] == "ERROR"]
        assert 1 == len(errs)
        e = errs[0]
        assert 1 == e["rank"] and "RuntimeError" == e["attrs"]["exc_type"] and e["attrs"]["oom"]
        assert 2 * (1 << 30) == e["attrs"]["tried_bytes"] and 0 == e["attrs"]["gpu"]
        assert e["exc"].count("Traceback (most recent call last):") == 2
        assert len(tb) == summary.lines_by_parser["traceback"]
        assert {0, 1} == {x["rank"] for x in cap.of("metric")}

    def test_interleaved_srun_tracebacks_stay_per_rank(self, ingest_files):
        try:
            raise ValueError("bad shape")
        except ValueError as exc:
            tb = fx.python_traceback(exc)
        lines = []
        for i, t in enumerate(tb):
            lines.append(fx.srun_label(0, 2, t))
            lines.append(fx.srun_label(12, 2, fx.python_default_logging("INFO", "train", f"step {i} loss 0.5")))
        _, cap = ingest_files({"slurm-123.out": lines})
        errors = [e for e in cap.of("log") if e["level"] == "ERROR"]
        assert [0] == [e["rank"] for e in errors]
        assert "ValueError: bad shape" == errors[0]["msg"]
        assert len(tb) == 1 + errors[0]["exc"].count("\n")
        assert len(tb) == len([e for e in cap.of("log") if e["rank"] == 12])


class TestGeneric:
    def test_plain_logging_step_lines_with_breakdown(self, ingest_files):
        lines = [f"2026-01-05 12:00:0{i},000 - INFO - __main__ - step {i} loss {2 - i * 0.1:.4f} lr 0.001 "
                 f"grad_norm 1.1 time 120.0ms (data 4.0ms forward 60.0ms backward 40.0ms allreduce 12.0ms "
                 f"optimizer 4.0ms)" for i in range(3)]
        _, cap = ingest_files({"rank3.log": lines})
        assert {3} == {e["rank"] for e in cap.events}
        step = cap.of("span", cat="step", step=1)[0]
        assert 120_000_000 == step["dur"] and T0_NS + NS == step["ts"]
        coll = cap.of("span", cat="collective", step=1)[0]
        assert 12_000_000 == coll["dur"] and "all_reduce" == coll["attrs"]["op"]
        assert 0.001 == cap.of("metric", step=2)[0]["metrics"]["lr"]
        assert "__main__" == cap.of("log")[0]["logger"]


class TestOddNumbers:
    """Patterns that admit '-', '.' or '1.2.3' where a number goes: the line is still parsed, never a parser error."""

    def test_deepspeed_overflow_and_scale_lines_with_a_dash_for_a_number(self, ingest_files):
        summary, cap = ingest_files({"ds.log": [
            "[2024-03-01 10:00:00,000] [INFO] [loss_scaler.py:183:update_scale] "
            "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1, reducing to -",
            "[2024-03-01 10:00:01,000] [INFO] [loss_scaler.py:190:update_scale] "
            "Reducing dynamic loss scale from 1 to -",
        ]})
        assert summary.parser_errors == {}
        metrics = [e["metrics"] for e in cap.events if e["kind"] == "metric"]
        assert metrics == [{"overflow": 1.0, "attempted_loss_scale": 1.0}]


def test_a_text_log_that_starts_with_the_gzip_magic_is_read_as_text(ingest_files):
    summary, cap = ingest_files({"odd.log": b"\x1f\x8bnot gzip at all\nsecond line\n"})
    assert summary.lines == 2 and summary.errors == []
    assert [e["msg"] for e in cap.events if e["kind"] == "log"][-1] == "second line"


def test_span_ids_are_counted_per_ingest(tmp_path):
    """Two ingests in one process share no span-id count: the same input gives the same ids."""
    from ingest import IngestConfig, Ingestor, MemorySink

    path = tmp_path / "steps.log"
    path.write_text("".join(f"step {n} loss 2.5 time 30ms\n" for n in range(1, 4)))
    runs = []
    for native in (False, None, False):
        sinks: dict = {}
        Ingestor(IngestConfig(job="ids", native=native), lambda n, r, sinks=sinks: sinks.setdefault((n, r), MemorySink())
                 ).run([str(path)])
        runs.append({k: list(v.lines) for k, v in sinks.items()})
    assert b'"span_id"' in b"".join(runs[0][next(iter(runs[0]))])
    assert runs[0] == runs[1] == runs[2]
    # Another file ingested into the same job gets ids of its own, not the first file's again.
    other = tmp_path / "more-steps.log"
    other.write_text(path.read_text())
    sinks = {}
    Ingestor(IngestConfig(job="ids"), lambda n, r: sinks.setdefault((n, r), MemorySink())).run([str(other)])

    def ids(run):
        return {orjson.loads(x)["span_id"] for lines in run.values() for x in lines if b'"span_id"' in x}

    first, second = ids(runs[0]), ids({k: list(v.lines) for k, v in sinks.items()})
    assert first and second and not first & second


@pytest.mark.parametrize("native", [False, None])
def test_unstamped_streams_take_their_neighbours_time_not_the_mtime(tmp_path, native):
    """A stream (or file) without one stamped line gets the job's own time, marked ``est``: never the
    file's mtime, which for a copied log can be years after its lines (issue 19)."""
    from ingest import IngestConfig, Ingestor, MemorySink

    stamped = [f"0: 2024-05-01 10:00:{s:02d},250 - root - INFO - step {s} loss 2.5" for s in range(1, 6)]
    unstamped = [f"1: rank one says {i}" for i in range(3)]  # srun label 1, no time on any line
    mixed = tmp_path / "a-mixed.log"
    mixed.write_text("\n".join(unstamped[:1] + stamped[:3] + unstamped[1:] + stamped[3:]) + "\n")
    bare = tmp_path / "b-bare.log"
    bare.write_text("".join(f"a line with no time {i}\n" for i in range(4)))
    years_later = 1_950_000_000  # 2031
    for p in (mixed, bare):
        os.utime(p, (years_later, years_later))
    sinks: dict = {}
    summary = Ingestor(IngestConfig(job="neighbours", native=native),
                       lambda n, r: sinks.setdefault((n, r), MemorySink())).run([str(mixed), str(bare)])
    events = [orjson.loads(x) for s in sinks.values() for x in s.lines]
    first, last = 1714557601_250_000_000, 1714557605_250_000_000  # 2024-05-01 10:00:01.25 and :05.25 UTC
    own = [e for e in events if "rank one says" in str(e.get("msg"))]
    bare_events = [e for e in events if "no time" in str(e.get("msg"))]
    assert len(own) == 3 and len(bare_events) == 4
    for e in own + bare_events:  # within the job's stamps (a few ns after the last one, in file order)
        assert first <= e["ts"] <= last + 10 and e.get("est") is True, e
    assert [e["ts"] for e in bare_events] == sorted({e["ts"] for e in bare_events})
    assert summary.mtime_ts == 0 and summary.estimated_ts >= 7


def test_a_job_with_no_stamp_at_all_says_it_used_the_mtime(tmp_path):
    from ingest import IngestConfig, Ingestor, MemorySink

    bare = tmp_path / "bare.log"
    bare.write_text("one\ntwo\n")
    os.utime(bare, (1_950_000_000, 1_950_000_000))
    sinks: dict = {}
    summary = Ingestor(IngestConfig(job="no-stamps"), lambda n, r: sinks.setdefault((n, r), MemorySink())
                       ).run([str(bare)])
    events = [orjson.loads(x) for s in sinks.values() for x in s.lines]
    assert [e["ts"] for e in events] == [1_950_000_000 * 10**9 + 1, 1_950_000_000 * 10**9 + 2]
    assert summary.mtime_ts == 2 and all(e["est"] for e in events)
