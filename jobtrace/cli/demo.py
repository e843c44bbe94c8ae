"""``jobtrace demo``: a real torch.distributed job with an injected fault (:mod:`jobtrace.demo`), then its report."""

from __future__ import annotations

import shlex
import time
from typing import Any

import click

from jobtrace import config
from jobtrace.errors import JobtraceError

from .exitcodes import Command
from .trace import report_and_exit

__all__ = ["demo"]


def _compiled_hooks(console: Any) -> None:
    """Build the compiled process-group hooks once, where a C++ compiler is (tracing never builds them in a job);
    without them the Python hooks record the same collectives, at more cost (docs/tracing.md)."""
    import shutil

    from otel_instrumentation import native_hooks

    if not config.get_bool(config.NATIVE_HOOKS, default=True) or native_hooks.built_path() is not None:
        return
    if shutil.which("c++") is None and shutil.which("g++") is None:
        console.print("note: no C++ compiler: collectives are recorded by the Python hooks")
        return
    console.print("building the compiled process-group hooks for this torch (once, about 20 s)...")
    try:
        native_hooks.build()
    except Exception as exc:  # noqa: BLE001 - the demo runs without them
        console.print(f"note: the compiled hooks did not build ({type(exc).__name__}: {str(exc)[:200]}); "
                      "the Python hooks record the collectives")


@click.command(cls=Command)
@click.option("--ranks", type=click.IntRange(2, 64), default=4, show_default=True)
@click.option("--steps", type=click.IntRange(3), default=30, show_default=True)
@click.option("--slow-rank", type=click.IntRange(0), multiple=True, help="Make this rank slow (repeatable).")
@click.option("--slow-ms", type=click.FloatRange(0), default=40.0, show_default=True, help="Extra forward time of a slow rank.")
@click.option("--hang-rank", type=click.IntRange(0), default=None, help="Make this rank hang forever.")
@click.option("--hang-step", type=click.IntRange(1), default=8, show_default=True)
@click.option("--nan-step", type=click.IntRange(1), default=None, help="Make rank 0's loss NaN from this step.")
@click.option("--ranks-per-node", type=click.IntRange(0), default=0, help="Simulate nodes of this many ranks.")
@click.option("--ddp", "wrap", flag_value="ddp", help="Wrap the model in DistributedDataParallel (its reducer's "
              "all-reduces are what jobtrace records).")
@click.option("--fsdp", "wrap", flag_value="fsdp", help="Shard the model with FSDP2 (fully_shard).")
@click.option("--no-marks", is_flag=True, help="No oi.step/oi.phase in the script: steps and phases come from the "
              "optimizer, module and backward hooks.")
@click.option("--job-id", default=None, help="Default: demo-<time>.")
@click.option("--data-dir", envvar=config.DATA_DIR, default="jobtrace-data", show_default=True)
@click.option("--verbose", is_flag=True, help="Show the training job's own output.")
@click.option("--json", "as_json", is_flag=True)
def demo(ranks: int, steps: int, slow_rank: tuple[int, ...], slow_ms: float, hang_rank: int | None, hang_step: int,
         nan_step: int | None, ranks_per_node: int, wrap: str | None, no_marks: bool, job_id: str | None, data_dir: str,
         verbose: bool, as_json: bool) -> None:
    """Run a real torch.distributed job (gloo, CPU) with an injected fault, then trace it.

    \b
    Examples:
      jobtrace demo --slow-rank 2                  # a straggler
      jobtrace demo --hang-rank 1 --hang-step 8    # a hang, named within seconds
      jobtrace demo --nan-step 10 --ddp
      jobtrace demo --ranks 8 --ranks-per-node 4 --json

    Exit status: 0 healthy, 1 problem found (the injected fault, as it should be), 2 usage error,
    3 error (torch missing, job not found), 4 internal error (rerun with --debug).
    """
    from rich.console import Console
    from rich.markup import escape

    from jobtrace.demo import DemoConfig, run_job
    from queries import AnalysisConfig, analyze, load_local

    for r in (*slow_rank, *( [hang_rank] if hang_rank is not None else [])):
        if not 0 <= r < ranks:
            raise click.BadParameter(f"rank {r} is not in 0..{ranks - 1}")
    console = Console(stderr=as_json)
    job_id = job_id or time.strftime("demo-%Y%m%d-%H%M%S")
    cfg = DemoConfig(job_id=job_id, data_dir=data_dir, ranks=ranks, steps=steps, slow_ranks=list(slow_rank),
                     slow_ms=slow_ms, hang_rank=hang_rank, hang_step=hang_step, nan_step=nan_step,
                     ranks_per_node=ranks_per_node, wrap=wrap or "none", marks=not no_marks,
                     quiet=not verbose)
    how = {"ddp": ", DistributedDataParallel", "fsdp": ", FSDP2"}.get(wrap or "", "")
    console.print(f"[bold]jobtrace demo[/]: job {escape(job_id)}, {ranks} ranks{how}, {steps} steps, "
                  f"{escape(cfg.faults())}")
    try:
        import torch  # noqa: F401
    except ImportError:
        raise JobtraceError("the demo needs torch: pip install 'jobtrace[torch]'") from None
    _compiled_hooks(console)
    t0 = time.monotonic()
    rc = run_job(cfg)
    console.print(f"job {'stopped after a stall' if rc == -1 else f'exited with {rc}'} in {time.monotonic() - t0:.1f}s; "
                  f"tracing it: trace-job {escape(shlex.quote(job_id))} --data-dir {escape(shlex.quote(data_dir))}" + (f" --stall-threshold {cfg.stall_s:g}" if hang_rank is not None else ""))
    report = analyze(load_local(data_dir, job_id), AnalysisConfig(stall_s=cfg.stall_s if hang_rank is not None else 300.0))
    report_and_exit(report, as_json)
