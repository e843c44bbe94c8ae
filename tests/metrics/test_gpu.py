"""GPU telemetry through NVML, and the node's kernel events, as the sidecar serves them.

* The real ``pynvml`` on this machine (no GPU, no driver): nothing is sampled, and why is kept.
* NVML driven through the sampler's seam: the device calls answer with ``pynvml``'s own ctypes structures
  and constants and raise its own ``NVMLError_NotSupported`` where a GPU lacks a feature (the real NVML
  path runs in tests/gpu/check.py when a GPU is lent).
* A real kernel OOM kill (a process over its memory cgroup's limit) is counted from the kernel log.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is part of jobtrace[gpu]")
pytest.importorskip("prometheus_client", reason="jobtrace[metrics]")

from metrics import GpuSampler, StoreMetrics  # noqa: E402


def samples(collector: StoreMetrics) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in collector.collect() for s in f.samples}


def test_nothing_is_sampled_where_there_is_no_gpu(tmp_path):
    sampler = GpuSampler(node="n")  # the real pynvml: this machine has no NVIDIA driver
    assert sampler.sample() == [] and "NVML" in (sampler.error or "")
    got = samples(StoreMetrics(tmp_path, gpus=sampler))
    assert got[("jobtrace_exporter_gpus_sampled", ())] == 0
    assert not [k for k in got if k[0].startswith("jobtrace_gpu_")]


class SeamNvml:
    """pynvml's constants and structures; two GPUs' answers. GPU 1 is a PCIe card: no NVLink, no ECC."""

    def __getattr__(self, name):
        return getattr(pynvml, name)  # NVML_* constants, nvmlClocksEventReason* bits, NVMLError classes

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h}000"

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H100 80GB HBM3" if h == 0 else "NVIDIA L40S"

    def nvmlDeviceGetUtilizationRates(self, h):
        return pynvml.c_nvmlUtilization_t(gpu=87 if h == 0 else 5, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h):
        return pynvml.c_nvmlMemory_t(total=80 << 30, free=20 << 30, used=60 << 30)

    def nvmlDeviceGetPowerUsage(self, h):
        return 612_345  # milliwatts

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return 71

    def nvmlDeviceGetClockInfo(self, h, clock):
        assert clock == pynvml.NVML_CLOCK_SM
        return 1980  # MHz

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwThermalSlowdown if h == 0 else 0

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        if h == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        assert counter == pynvml.NVML_VOLATILE_ECC
        return 3 if kind == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else 1

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        return 2048 if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else 1024  # KB/s

    def nvmlDeviceGetFieldValues(self, h, fields):
        if h == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        out = []
        for i, f in enumerate(fields):
            v = pynvml.c_nvmlFieldValue_t()
            v.fieldId, v.nvmlReturn = f, pynvml.NVML_SUCCESS
            v.value.ullVal = (5 + i) * 1024 * 1024  # KiB since the driver loaded
            out.append(v)
        return out


def test_every_gpu_reading_through_the_seam_with_what_a_gpu_lacks_left_out(tmp_path):
    got = samples(StoreMetrics(tmp_path, gpus=GpuSampler(SeamNvml(), node="gpu-node-1")))

    def one(name, gpu, **extra):
        labels = {"node": "gpu-node-1", "gpu": str(gpu), "uuid": f"GPU-{gpu}000",
                  "model": "NVIDIA H100 80GB HBM3" if gpu == 0 else "NVIDIA L40S", **extra}
        return got[(name, tuple(sorted(labels.items())))]

    assert one("jobtrace_gpu_utilization_ratio", 0) == 0.87 and one("jobtrace_gpu_utilization_ratio", 1) == 0.05
    assert one("jobtrace_gpu_memory_used_bytes", 0) == 60 << 30 and one("jobtrace_gpu_memory_total_bytes", 1) == 80 << 30
    assert one("jobtrace_gpu_power_watts", 0) == pytest.approx(612.345)
    assert one("jobtrace_gpu_temperature_celsius", 1) == 71 and one("jobtrace_gpu_sm_clock_hertz", 0) == 1.98e9
    assert one("jobtrace_gpu_clock_event_active", 0, reason="sw_power_cap") == 1
    assert one("jobtrace_gpu_clock_event_active", 0, reason="hw_thermal") == 1
    assert one("jobtrace_gpu_clock_event_active", 0, reason="gpu_idle") == 0
    assert one("jobtrace_gpu_ecc_errors_total", 0, type="uncorrected") == 1
    assert one("jobtrace_gpu_pcie_bytes_per_second", 0, direction="tx") == 2048 * 1024
    assert one("jobtrace_gpu_nvlink_bytes_total", 0, direction="rx") == 6 * 1024 ** 3
    assert not [k for k in got if k[0] in ("jobtrace_gpu_ecc_errors_total", "jobtrace_gpu_nvlink_bytes_total")
                and ("gpu", "1") in k[1]]  # GPU 1 does not support them: no series, no zero
    assert got[("jobtrace_exporter_gpus_sampled", ())] == 2


def test_a_real_kernel_oom_kill_is_counted(tmp_path):
    from queries import read_kernel_log
    from tests.queries.test_outside import memory_cgroup

    try:
        read_kernel_log(time.time_ns() - 10**9, time.time_ns())
    except OSError:
        pytest.skip(reason="the kernel log is not readable here")
    if os.geteuid() != 0:
        pytest.skip(reason="needs root for a memory cgroup")
    collector = StoreMetrics(tmp_path, kernel_log=True, node="n")
    before = samples(collector).get(("jobtrace_node_kernel_events_total", (("kind", "host_oom"), ("node", "n"))), 0)
    with memory_cgroup(f"jobtrace-metrics-{os.getpid()}", 64 << 20) as group:
        hog = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.stdin.readline(); "
                                "x = [bytearray(8 << 20) for _ in range(64)]"], stdin=subprocess.PIPE)
        (group / "cgroup.procs").write_text(str(hog.pid))
        hog.communicate(b"go\n", timeout=60)
        assert hog.returncode == -9  # the kernel's OOM killer
    deadline, after = time.monotonic() + 10, before
    while time.monotonic() < deadline and after == before:
        after = samples(collector).get(("jobtrace_node_kernel_events_total", (("kind", "host_oom"), ("node", "n"))), 0)
        time.sleep(0.2)
    assert after > before
    assert samples(collector)[("jobtrace_exporter_kernel_log_readable", ())] == 1
