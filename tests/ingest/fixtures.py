"""Log lines built with the frameworks' own format strings (only the strings, not their code).

Each builder names the source file and function whose format string it reproduces.
Where the producing code is installed (torch's ChildFailedError), the real class
renders the text instead.
"""

from __future__ import annotations

from datetime import datetime

T0 = datetime(2026, 1, 5, 12, 0, 0)


# ---- Megatron-LM ------------------------------------------------------------------
def megatron_iteration(iteration: int, *, train_iters: int = 1000, consumed: int = 0, elapsed_ms: float = 1000.0,
                       lr: float = 1.5e-4, batch: int = 256, losses: dict[str, float] | None = None,
                       loss_scale: float = 1.0, grad_norm: float | None = 1.25, params_norm: float | None = None,
                       num_zeros: int | None = None, skipped: int = 0, nan: int = 0, throughput: float | None = None,
                       when: datetime | None = None, with_fraction: bool = True) -> str:
    """NVIDIA/Megatron-LM megatron/training/training.py::training_log (log_string)."""
    when = when or T0
    fmt = '%Y-%m-%d %H:%M:%S.%f' if with_fraction else '%Y-%m-%d %H:%M:%S'
    log_string = f" [{when.strftime(fmt)}]"
    log_string += f' iteration {iteration:8d}/{train_iters:8d} |'
    log_string += f' consumed samples: {consumed:12d} |'
    log_string += f' elapsed time per iteration (ms): {elapsed_ms:.1f} |'
    if throughput is not None:
        log_string += f' throughput per GPU (TFLOP/s/GPU): {throughput:.1f} |'
    log_string += f' learning rate: {lr:.6E} |'
    log_string += f' global batch size: {batch:5d} |'
    for key, avg in (losses if losses is not None else {"lm loss": 2.5}).items():
        if avg >= 0.0:  # training_log drops a NaN average (the comparison is False)
            log_string += f' {key}: {avg:.6E} |'
    log_string += f' loss scale: {loss_scale:.1f} |'
    if grad_norm is not None:
        log_string += f' grad norm: {grad_norm:.3f} |'
    if num_zeros is not None:
        log_string += f' num zeros: {num_zeros} |'
    if params_norm is not None:
        log_string += f' params norm: {params_norm:.3f} |'
    log_string += f' number of skipped iterations: {skipped:3d} |'
    log_string += f' number of nan iterations: {nan:3d} |'
    return log_string


def megatron_timers_minmax(times: dict[str, tuple[float, float]]) -> list[str]:
    """NVIDIA/Megatron-LM megatron/core/timers.py::Timers._get_global_min_max_time_string."""
    output_string = '(min, max) time across ranks (ms):'
    for name, (min_time, max_time) in times.items():
        output_string += '\n    {}: ({:.2f}, {:.2f})'.format((name + ' ').ljust(48, '.'), min_time, max_time)
    return output_string.split("\n")


def megatron_timers_all(times: dict[str, dict[int, float]]) -> list[str]:
    """NVIDIA/Megatron-LM megatron/core/timers.py::Timers._get_all_ranks_time_string."""
    output_string = 'times across ranks (ms):'
    for name, per_rank in times.items():
        output_string += f'\n  {name}:'
        for rank, t in sorted(per_rank.items()):
            output_string += f'\n     rank {rank:2d}: {t:.2f}'
    return output_string.split("\n")


def megatron_straggler(when: datetime, rtt: tuple[tuple[float, int], tuple[float, int]],
                       etpt: tuple[tuple[float, int], tuple[float, int]]) -> str:
    """NVIDIA/Megatron-LM megatron/core/utils.py::StragglerDetector.report (and _ValueWithRank.__str__)."""
    def vr(value: float, rank: int, unit: str = "") -> str:
        return f"{value:.2f}{unit}/{rank}"

    now = f"[{when.strftime('%Y-%m-%d %H:%M:%S')}]"
    return (f"{now} | "
            f"MnRtt/Rnk: {vr(rtt[0][0], rtt[0][1], 'ms')} | "
            f"MxRtt/Rnk: {vr(rtt[1][0], rtt[1][1], 'ms')} | "
            f"MnPwr/Rnk: {vr(601796, 8, 'W')} | "
            f"MxPwr/Rnk: {vr(683801, 18, 'W')} | "
            f"MnTmp/Rnk: {vr(52, 0, 'C')} | "
            f"MxTmp/Rnk: {vr(65, 21, 'C')} | "
            f"MnUtl/Rnk: {vr(97, 8, '%')} | "
            f"MxUtl/Rnk: {vr(100, 6, '%')} | "
            f"MnClk/Rnk: {vr(1950, 28, 'MHz')} | "
            f"MxClk/Rnk: {vr(1980, 0, 'MHz')} | "
            f"MnDRtt/Rnk: {vr(14.27, 23, 'ms')} | "
            f"MxDRtt/Rnk: {vr(34.65, 3, 'ms')} | "
            f"MnEtpt/Rnk: {etpt[0][0]:.2f}TF/{etpt[0][1]} | "
            f"MxEtpt/Rnk: {etpt[1][0]:.2f}TF/{etpt[1][1]}")


def megatron_straggler_bottom(values: list[tuple[float, int]]) -> str:
    """NVIDIA/Megatron-LM megatron/core/utils.py::StragglerDetector.report (mmcnt > 1)."""
    line = f"^^^^ Bottom {len(values)} Ranks with lowest  Etpt(TF):"
    for v, r in values:
        line += f" {v:.2f}/{r},"
    return line


def python_default_logging(level: str, name: str, message: str) -> str:
    """CPython Lib/logging/__init__.py BASIC_FORMAT "%(levelname)s:%(name)s:%(message)s"."""
    return "%s:%s:%s" % (level, name, message)


# ---- DeepSpeed --------------------------------------------------------------------
def deepspeed_logger(when: datetime, level: str, filename: str, lineno: int, func: str, message: str) -> str:
    """microsoft/DeepSpeed deepspeed/utils/logging.py::LoggerFactory.create_logger format
    "[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] %(message)s" (asctime: logging's default)."""
    asctime = when.strftime("%Y-%m-%d %H:%M:%S") + ",%03d" % (when.microsecond // 1000)
    return "[%s] [%s] [%s:%d:%s] %s" % (asctime, level, filename, lineno, func, message)


def deepspeed_log_dist(rank: int, message: str) -> str:
    """microsoft/DeepSpeed deepspeed/utils/logging.py::log_dist."""
    return f"[Rank {rank}] {message}"


def deepspeed_progress(step: int, skipped: int, lr: list[float], mom: list[tuple[float, float]]) -> str:
    """microsoft/DeepSpeed deepspeed/runtime/engine.py::DeepSpeedEngine._report_progress."""
    return f"step={step}, skipped={skipped}, lr={lr}, mom={mom}"


def deepspeed_timers(values: dict[str, float]) -> str:
    """microsoft/DeepSpeed deepspeed/utils/timer.py::SynchronizedWallClockTimer.log."""
    string = "time (ms)"
    for name, elapsed_time in values.items():
        string += f" | {name}: {elapsed_time:.2f}"
    return string


def deepspeed_throughput(epoch: int, micro: int, global_step: int, avg: float, curr: float, mem: float,
                         max_mem: float) -> str:
    """microsoft/DeepSpeed deepspeed/utils/timer.py::ThroughputTimer.stop."""
    return (f"epoch={epoch}/micro_step={micro}/global_step={global_step}, RunningAvgSamplesPerSec={avg}, CurrSamplesPerSec={curr}, "
            f"MemAllocated={mem}GB, MaxMemAllocated={max_mem}GB")


def deepspeed_overflow(rank: int, cur_scale: float, next_scale: float) -> str:
    """microsoft/DeepSpeed deepspeed/runtime/fp16/loss_scaler.py::DynamicLossScaler.update_scale (fp16)."""
    overflow_msg = f"[deepspeed] OVERFLOW! Rank {rank} Skipping step."
    overflow_msg += f" Attempted loss scale: {int(cur_scale)}, reducing to {int(next_scale)}"
    return overflow_msg


def deepspeed_scale_up(prev: float, cur: float) -> str:
    """microsoft/DeepSpeed deepspeed/runtime/fp16/fused_optimizer.py::FP16_Optimizer._update_scale."""
    return f"Increasing dynamic loss scale from {prev} to {cur}"


def deepspeed_exit(cmd: list[str], code: int) -> str:
    """microsoft/DeepSpeed deepspeed/launcher/launch.py::sigkill_handler."""
    return f"{cmd} exits with return code = {code}"


# ---- Hugging Face / tqdm ------------------------------------------------------------
def hf_logs_dict_old(logs: dict[str, float]) -> str:
    """huggingface/transformers src/transformers/trainer_callback.py::ProgressCallback.on_log (<4.46): str(logs)."""
    return str(logs)


def hf_logs_dict_new(logs: dict[str, float]) -> str:
    """huggingface/transformers src/transformers/trainer_callback.py::ProgressCallback.on_log (>=4.46):
    floats as f"{v:.4g}", then str(shallow_logs)."""
    shallow_logs = {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in logs.items()}
    return str(shallow_logs)


def _format_interval(t: float) -> str:
    """tqdm/std.py::tqdm.format_interval."""
    mins, s = divmod(int(t), 60)
    h, m = divmod(mins, 60)
    return f'{h:d}:{m:02d}:{s:02d}' if h else f'{m:02d}:{s:02d}'


def tqdm_meter(n: int, total: int, elapsed: float, rate: float | None, desc: str = "") -> str:
    """tqdm/std.py::tqdm.format_meter (unit 'it', no unit_scale, ncols unknown → 10-char bar)."""
    unit = "it"
    inv_rate = 1 / rate if rate else None
    rate_noinv_fmt = (f'{rate:5.2f}' if rate else '?') + unit + '/s'
    rate_inv_fmt = (f'{inv_rate:5.2f}' if inv_rate else '?') + 's/' + unit
    rate_fmt = rate_inv_fmt if inv_rate and inv_rate > 1 else rate_noinv_fmt
    remaining = (total - n) / rate if rate and total else 0
    remaining_str = _format_interval(remaining) if rate else '?'
    l_bar = (desc + ": ") if desc else ''
    r_bar = '| {0}/{1} [{2}<{3}, {4}{5}]'.format(n, total, _format_interval(elapsed), remaining_str, rate_fmt, '')
    frac = n / total
    l_bar += f'{frac * 100:3.0f}%|'
    filled = int(frac * 10)
    bar = "█" * filled + " " * (10 - filled)
    return l_bar + bar + r_bar


# ---- torch / NCCL -----------------------------------------------------------------
def child_failed_error(name: str, failures: dict[int, tuple[int, int, int]]) -> str:
    """torch/distributed/elastic/multiprocessing/errors/__init__.py::ChildFailedError.format_msg (the real class).

    ``failures``: global rank → (local_rank, pid, exitcode).
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    procs = {r: ProcessFailure(local_rank=lr, pid=pid, exitcode=code, error_file="/nonexistent/error.json")
             for r, (lr, pid, code) in failures.items()}
    for i, p in enumerate(procs.values()):
        p.timestamp = int(T0.timestamp()) + i  # the first failure is the root cause
    return ChildFailedError(name, procs).format_msg()


def nccl_info(host: str, pid: int, tid: int, dev: int, msg: str) -> str:
    """NVIDIA/nccl src/debug.cc::ncclDebugLogV: "%s:%d:%d " then "[%d] NCCL INFO %s"."""
    return "%s:%d:%d " % (host, pid, tid) + "[%d] NCCL INFO %s" % (dev, msg)


def nccl_warn(host: str, pid: int, tid: int, dev: int, file: str, line: int, func: str, msg: str,
              when: datetime | None = None) -> str:
    """NVIDIA/nccl src/debug.cc::ncclDebugLogV: WARN lines (optional "[%F %T] " timestamp, on by default for WARN)."""
    ts = when.strftime("[%Y-%m-%d %H:%M:%S] ") if when else ""
    return ts + "%s:%d:%d " % (host, pid, tid) + "[%d] %s:%d (%s) NCCL WARN %s" % (dev, file, line, func, msg)


def c10_log_prefix(rank: int | None, severity: str, when: datetime, file: str, line: int) -> str:
    """pytorch c10/util/Logging.cpp::MessageLogger::MessageLogger (non-glog build, torch >= 2.2)."""
    prefix = f"[rank{rank}]:" if rank is not None else ""
    return (prefix + "[" + severity + str(when.month * 100 + when.day) + " " + when.strftime("%H:%M:%S") + "."
            + "%09d" % 123456789 + " " + file + ":" + str(line) + "] ")


def nccl_watchdog(rank: int, seq: int, op_type: str, numel: int, timeout_ms: int, elapsed_ms: int,
                  pg: tuple[int, str] | None = None) -> str:
    """pytorch torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp::WorkNCCL::checkTimeout and operator<<(WorkNCCL)."""
    prefix = f"[PG ID {pg[0]} PG GUID {pg[1]} Rank {rank}] " if pg else f"[Rank {rank}] "
    work = (f"WorkNCCL(SeqNum={seq}, OpType={op_type}, NumelIn={numel}, NumelOut={numel}, "
            f"Timeout(ms)={timeout_ms})")
    return prefix + "Watchdog caught collective operation timeout: " + work + f" ran for {elapsed_ms} milliseconds before timing out."


def cuda_oom(tried: str, gpu: int, total: str, free: str, pid: int, in_use: str, allocated: str, reserved: str) -> str:
    """pytorch c10/cuda/CUDACachingAllocator.cpp::DeviceCachingAllocator::malloc (OutOfMemoryError message)."""
    return ("CUDA out of memory. Tried to allocate " + tried + ". GPU " + str(gpu) + " has a total capacity of " + total
            + " of which " + free + " is free. " + f"Process {pid} has {in_use} memory in use. "
            + "Of the allocated memory " + allocated + " is allocated by PyTorch, and " + reserved
            + " is reserved by PyTorch but unallocated." + " If reserved but unallocated memory is large try setting"
            + " PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid" + " fragmentation.  See documentation for"
            + " Memory Management " + " (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def python_traceback(exc: BaseException) -> list[str]:
    """CPython traceback.format_exception of a real raised exception."""
    import traceback

    return "".join(traceback.format_exception(exc)).rstrip("\n").split("\n")


def srun_label(task: int, width: int, line: str) -> str:
    """SLURM srun --label: the task id right-aligned to the width of the largest id, then ': '."""
    return f"{task:>{width}}: {line}"


def torchrun_tee(role: str, local_rank: int, line: str) -> str:
    """torch/distributed/elastic/multiprocessing/tail_log.py::TailLog: header f"[{name}{local_rank}]:"."""
    return f"[{role}{local_rank}]:{line}"

