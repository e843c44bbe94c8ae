"""The tracing-overhead benchmark still runs: every case, at a tiny size, gives its figures.

The figures themselves are not judged here (speed is measured by the benchmark, never
asserted by a test); a case that no longer runs against the code it measures is what
this catches, as a changed internal signature once broke the collective case unseen.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

from tests.compiled import need_native

pytest.importorskip("torch", reason="the benchmark's cases train the demo's model")

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_overhead", ROOT / "benchmarks" / "bench_overhead.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_overhead"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("bench_overhead", None)


def _figures(result: dict[str, float]) -> None:
    assert result and all(isinstance(v, (int, float)) and math.isfinite(v) for v in result.values()), result


@pytest.mark.parametrize("case,recorder", [("null", None), ("file", None), ("otel_bridge", None)] + [
    (case, recorder) for case in ("jobtrace", "spans", "collective") for recorder in ("native", "python")])
def test_each_micro_case_gives_its_figures(bench, case, recorder):
    if recorder == "native":
        need_native()
    result = bench.run_case(case, 2000, recorder)
    _figures(result)
    times = {k: v for k, v in result.items() if k.endswith("_us")}
    assert times and all(v > 0 for v in times.values()), result
    if case == "jobtrace":
        assert result["spilled"] == 0


def test_the_one_process_step_case_gives_its_figures(bench):
    need_native()
    result = bench.run_case("demo_step", 2000, "native", hidden=64, blocks=2, block_steps=5, helpers=True)
    _figures(result)
    assert result["step_cpu_us"] > 0 and result["traced_cpu_us"] > 0


@pytest.mark.torchjob
@pytest.mark.parametrize("recorder", ["native", "python"])
def test_the_demo_job_cases_give_their_figures(bench, recorder):
    if recorder == "native":
        need_native()
    blocks = bench.demo_blocks(1, 3, recorder=recorder)
    _figures(blocks)
    assert blocks["pairs"] == 3 and blocks["wall_plain_us"] > 0 and blocks["export_us"] >= 0
    calls = bench.demo_calls(2, "--steps", "40", "--export-steps", "20", recorder=recorder)
    export = ("export (drain, write)",) if recorder == "native" else ("export, encoded", "export, no encoding")
    assert calls.startswith({"native": "NativeRecorder", "python": "Recorder"}[recorder]), calls
    for site in ("step enter", "backward exit", "all_reduce record", "log_metrics", "logger.info",
                 "training thread", *export):
        assert site in calls, calls
