"""The node's GPUs through NVML (``nvidia-ml-py``), sampled by the sidecar at each scrape, never by a rank.

Per GPU (labels ``node``, ``gpu``, ``uuid``, ``model``): utilisation, memory used and total, power,
temperature, SM clock, the clock-event (throttle) reasons that are active, ECC error counts (volatile,
corrected and uncorrected), PCIe and NVLink throughput. Xid events reach NVML only through an event set
that a process must hold open; the sidecar counts them from the kernel log instead, where every Xid is
printed (``jobtrace_node_kernel_events_total{kind="gpu_xid"}``, :mod:`metrics._exporter`).

The NVML module is a seam (:class:`GpuSampler` takes it): the real ``pynvml`` by default, so that tests
can drive the sampling without a GPU; the real path runs in ``tests/gpu/check.py`` where a GPU is lent.
Where there is no GPU or no driver, NVML's init fails once, the reason is kept, and nothing is sampled.
A call a GPU does not support (NVLink on a PCIe card, ECC on a consumer card) is left out for that GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

__all__ = ["GpuReading", "GpuSampler"]

_REASONS = (("gpu_idle", "nvmlClocksEventReasonGpuIdle"), ("applications_clocks", "nvmlClocksEventReasonApplicationsClocksSetting"),
            ("sw_power_cap", "nvmlClocksEventReasonSwPowerCap"), ("hw_slowdown", "nvmlClocksEventReasonHwSlowdown"),
            ("sync_boost", "nvmlClocksEventReasonSyncBoost"), ("sw_thermal", "nvmlClocksEventReasonSwThermalSlowdown"),
            ("hw_thermal", "nvmlClocksEventReasonHwThermalSlowdown"),
            ("hw_power_brake", "nvmlClocksEventReasonHwPowerBrakeSlowdown"))
"""Clock-event reasons by a label value, and the NVML bit constant of each."""


@dataclass(frozen=True)
class GpuReading:
    """One metric of one GPU: series name, the GPU's labels plus any of its own, the value."""

    name: str
    labels: dict[str, str]
    value: float


class GpuSampler:
    """Reads every GPU of this node through ``nvml`` (the ``pynvml`` module, or anything with its API)."""

    def __init__(self, nvml: Any = None, node: str = "") -> None:
        self.node = node
        self.error: str | None = None
        self._nvml = nvml
        self._ready = False

    def _init(self) -> bool:
        if self._ready or self.error is not None:
            return self._ready
        try:
            if self._nvml is None:
                import pynvml  # type: ignore[import-untyped]

                self._nvml = pynvml
            self._nvml.nvmlInit()
            self._ready = True
        except ImportError:
            self.error = "nvidia-ml-py is not installed (pip install 'jobtrace[gpu]')"
        except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, _DriverNotLoaded…: no GPU here
            self.error = f"NVML: {exc}"
        return self._ready

    def sample(self) -> list[GpuReading]:
        """Every reading of every GPU now; none where NVML cannot start (``self.error`` says why)."""
        if not self._init():
            return []
        nv = self._nvml
        out: list[GpuReading] = []
        for index in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            labels = {"node": self.node, "gpu": str(index), "uuid": _text(nv.nvmlDeviceGetUUID(handle)),
                      "model": _text(nv.nvmlDeviceGetName(handle))}
            out += list(self._device(nv, handle, labels))
        return out

    def _device(self, nv: Any, h: Any, labels: dict[str, str]) -> Iterator[GpuReading]:
        def read(name: str, call: Callable[[], float], **extra: str) -> Iterator[GpuReading]:
            try:
                value = float(call())
            except Exception:  # noqa: BLE001 - not supported on this GPU: leave the series out
                return
            yield GpuReading(name, {**labels, **extra}, value)

        util = _maybe(lambda: nv.nvmlDeviceGetUtilizationRates(h))
        if util is not None:
            yield GpuReading("jobtrace_gpu_utilization_ratio", labels, util.gpu / 100.0)
            yield GpuReading("jobtrace_gpu_memory_utilization_ratio", labels, util.memory / 100.0)
        mem = _maybe(lambda: nv.nvmlDeviceGetMemoryInfo(h))
        if mem is not None:
            yield GpuReading("jobtrace_gpu_memory_used_bytes", labels, float(mem.used))
            yield GpuReading("jobtrace_gpu_memory_total_bytes", labels, float(mem.total))
        yield from read("jobtrace_gpu_power_watts", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0)
        yield from read("jobtrace_gpu_temperature_celsius", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        yield from read("jobtrace_gpu_sm_clock_hertz", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM) * 1e6)
        reasons = _maybe(lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h))
        if reasons is not None:
            for label, constant in _REASONS:
                bit = getattr(nv, constant, None)
                if bit is not None:
                    yield GpuReading("jobtrace_gpu_clock_event_active", {**labels, "reason": label},
                                     1.0 if reasons & bit else 0.0)
        def ecc(error_type: str) -> float:
            return float(nv.nvmlDeviceGetTotalEccErrors(h, getattr(nv, error_type), nv.NVML_VOLATILE_ECC))

        def pcie(counter: str) -> float:  # NVML gives KB/s over its last 20 ms
            return float(nv.nvmlDeviceGetPcieThroughput(h, getattr(nv, counter))) * 1024.0

        for kind, error_type in (("corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
                                 ("uncorrected", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED")):
            yield from read("jobtrace_gpu_ecc_errors_total", partial(ecc, error_type), type=kind)
        for direction, counter in (("tx", "NVML_PCIE_UTIL_TX_BYTES"), ("rx", "NVML_PCIE_UTIL_RX_BYTES")):
            yield from read("jobtrace_gpu_pcie_bytes_per_second", partial(pcie, counter), direction=direction)
        fields = _maybe(lambda: nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                                                                nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX]))
        for direction, value in zip(("tx", "rx"), fields or [], strict=False):
            if getattr(value, "nvmlReturn", 0) == 0:  # KiB counted since the driver loaded, all links
                yield GpuReading("jobtrace_gpu_nvlink_bytes_total", {**labels, "direction": direction},
                                 float(value.value.ullVal) * 1024.0)


def _maybe(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception:  # noqa: BLE001 - not supported on this GPU
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
