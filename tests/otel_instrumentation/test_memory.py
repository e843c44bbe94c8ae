"""Per-step memory samples: host RSS is read at most once per interval, dated to the step that ended."""

from __future__ import annotations

import os

import pytest

from jobtrace.identity import resolve_identity
from otel_instrumentation._recorder import _METRIC, Recorder
from otel_instrumentation._torch import memory_hook

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="host RSS is read from /proc")


def metric_items(interval_s: float, step_ms: list[float], cuda=None) -> list[tuple]:
    """Call the step-end hook as ``Span.__exit__`` does, at step ends ``step_ms`` apart (simulated clock)."""
    items: list[tuple] = []
    rec = Recorder(resolve_identity(job_id="mem", rank=0, world_size=1, env={}), emit=items.append)
    hook = memory_hook(rec, interval_s, cuda=cuda)
    now = 1_000_000_000_000
    for step, ms in enumerate(step_ms):
        now += int(ms * 1e6)
        rec.last_progress_ns = now
        hook(step)
    return [i for i in items if i[0] == _METRIC]


def run_steps(interval_s: float, step_ms: list[float]) -> list[tuple]:
    """The RSS samples of :func:`metric_items`."""
    return [i for i in metric_items(interval_s, step_ms) if "rss_bytes" in i[3]]


def test_rss_is_sampled_at_most_once_per_interval_and_dated_to_its_step():
    # 30 ms steps, 0.1 s interval: steps 0, 4, 8 (the first step end at or after each deadline).
    samples = run_steps(0.1, [30.0] * 10)
    assert [s[2] for s in samples] == [0, 4, 8]
    assert [s[1] for s in samples] == [1_000_000_000_000 + int(30e6) * (s[2] + 1) for s in samples]


def test_steps_longer_than_the_interval_are_each_sampled_and_zero_samples_every_step():
    assert [s[2] for s in run_steps(0.1, [150.0, 100.0, 400.0])] == [0, 1, 2]
    assert [s[2] for s in run_steps(0.0, [1.0] * 5)] == [0, 1, 2, 3, 4]


def test_the_sample_is_this_process_rss():
    (sample,) = run_steps(0.1, [1.0])
    psutil = pytest.importorskip("psutil", reason="psutil (dev extra) reads the process memory")
    rss = sample[3]["rss_bytes"]
    assert abs(rss - psutil.Process().memory_info().rss) < 0.05 * rss and rss > 1 << 20


class FakeCuda:
    """``torch.cuda``'s counters as the hook reads them, for a machine without a GPU: allocation grows 1 MiB a step."""

    def __init__(self) -> None:
        self.allocated = 0

    def is_initialized(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def memory_allocated(self, dev: int) -> int:
        self.allocated += 1 << 20
        return self.allocated

    def memory_reserved(self, dev: int) -> int:
        return 2 * self.allocated

    def max_memory_allocated(self, dev: int) -> int:
        return self.allocated


def test_cuda_counters_are_recorded_every_step_while_rss_waits_for_its_interval():
    metrics = metric_items(0.1, [30.0] * 5, cuda=FakeCuda())  # 30 ms steps
    assert [m[2] for m in metrics] == [0, 1, 2, 3, 4]
    assert [m[3]["cuda_allocated_bytes"] >> 20 for m in metrics] == [1, 2, 3, 4, 5]
    assert all(m[3]["cuda_reserved_bytes"] == 2 * m[3]["cuda_allocated_bytes"] for m in metrics)
    assert [m[2] for m in metrics if "rss_bytes" in m[3]] == [0, 4]


@pytest.mark.parametrize("nodes,expected", [((), False), (("nvidia0",), True), (("nvidia12",), True),
                                            (("dxg",), True), (("kfd",), True), (("nvidiactl",), False)])
def test_a_gpu_is_seen_by_its_device_node_without_asking_the_driver(monkeypatch, tmp_path, nodes, expected):
    """Without a GPU node the per-step CUDA check is skipped; torch is never asked (that would start the driver)."""
    import glob as globmod

    from otel_instrumentation import _torch

    for name in nodes:
        (tmp_path / name).touch()
    real_exists, real_glob = os.path.exists, globmod.glob
    monkeypatch.setattr(_torch.os.path, "exists",
                        lambda p: real_exists(str(p).replace("/dev/", f"{tmp_path}/", 1)) if str(p).startswith("/dev/") else real_exists(p))
    monkeypatch.setattr(_torch.glob, "glob",
                        lambda p: real_glob(p.replace("/dev/", f"{tmp_path}/", 1)) if p.startswith("/dev/") else real_glob(p))
    assert _torch._gpu_device_present() is expected
