"""FAKE ``pynvml`` (nvidia-ml-py) for tests on machines without an NVIDIA GPU.

This is a fake, not NVML: it stands in for the module only where the real library
cannot run (no driver here).  It is kept thin: every constant, ctypes structure and
error class is the *real* one from the installed ``pynvml``; only the functions that
would call into ``libnvidia-ml.so`` are replaced, and they return the shapes the real
bindings document (``c_nvmlUtilization_t``, ``c_nvmlMemory_t``, ``(value_type,
[c_nvmlSample_t])`` from ``nvmlDeviceGetSamples``, ``c_nvmlGpmSupport_t``, GPM sample
pointers, a filled ``c_nvmlGpmMetricsGet_t``) or raise the real ``NVMLError`` codes.
A function this fake does not define raises AttributeError, like an old nvidia-ml-py
without it; nothing falls through to the real library.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field
from typing import Any

import pynvml as _real


@dataclass
class FakeGpu:
    """What one fake GPU reports."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-11111111-2222-3333-4444-555555555555"
    util_gpu: int = 37
    util_mem: int = 12
    samples: list[tuple[int, int]] = field(default_factory=list)
    """Utilisation sample buffer: (timestamp µs, percent)."""
    mem_used: int = 20 << 30
    mem_total: int = 80 << 30
    sm_clock: int = 1980
    mem_clock: int = 2619
    power_mw: int = 350_000
    temp_c: int = 54
    pcie_kbs: tuple[int, int] = (1000, 2000)
    """(tx, rx) KB/s from nvmlDeviceGetPcieThroughput."""
    gpm: bool = True
    gpm_values: dict[int, float] = field(default_factory=dict)
    """GPM metric id -> value over the next interval (percent or MiB/s)."""
    nvlinks: int = 18
    util_supported: bool = True
    """False: nvmlDeviceGetUtilizationRates raises NOT_SUPPORTED (as on a MIG device)."""
    energy_mj: int | None = 1_000_000
    """nvmlDeviceGetTotalEnergyConsumption at the first call (mJ since the driver loaded);
    None: NOT_SUPPORTED (pre-Volta).  It then advances at ``power_mw`` per second of the
    fake's clock (``FakeNvml.clock``): a counter with a known rate."""


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


class FakeNvml:
    """A fake ``pynvml`` module object over a list of ``FakeGpu``."""

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.calls: dict[str, int] = {}
        self.inited = False
        self.gpm_snapshots: dict[int, tuple[int, dict[int, float]]] = {}
        self.gpm_allocated: list[Any] = []
        self.gpm_freed = 0
        self.clock: Any = time.monotonic
        """Seconds; the energy counter advances with it (a test may replace it)."""
        self._energy_t0: float | None = None

    # constants, structures and errors: the real module's
    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvml"):
            raise AttributeError(f"fake pynvml has no {name}")
        return getattr(_real, name)

    def _count(self, fn: str) -> None:
        self.calls[fn] = self.calls.get(fn, 0) + 1

    def _gpu(self, h: _Handle) -> FakeGpu:
        if not self.inited:
            raise _real.NVMLError(_real.NVML_ERROR_UNINITIALIZED)
        return self.gpus[h.index]

    # -- init -----------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._count("nvmlInit")
        if self.init_error is not None:
            raise _real.NVMLError(self.init_error)
        self.inited = True

    def nvmlShutdown(self) -> None:
        self._count("nvmlShutdown")
        self.inited = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> _Handle:
        if not 0 <= i < len(self.gpus):
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(i)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> _Handle:
        for i, g in enumerate(self.gpus):
            if g.uuid == uuid:
                return _Handle(i)
        raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, h: _Handle) -> str:
        return self._gpu(h).uuid

    def nvmlDeviceGetName(self, h: _Handle) -> str:
        return self._gpu(h).name

    # -- readings -------------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, h: _Handle) -> Any:
        self._count("nvmlDeviceGetUtilizationRates")
        g = self._gpu(h)
        if not g.util_supported:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        return _real.c_nvmlUtilization_t(gpu=g.util_gpu, memory=g.util_mem)

    def nvmlDeviceGetSamples(self, h: _Handle, sampling_type: int, last_seen: int) -> tuple[int, list[Any]]:
        self._count("nvmlDeviceGetSamples")
        g = self._gpu(h)
        if sampling_type != _real.NVML_GPU_UTILIZATION_SAMPLES:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        new = [(ts, v) for ts, v in g.samples if ts > last_seen]
        if not new:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)
        out = [_real.c_nvmlSample_t(timeStamp=ts, sampleValue=_real.c_nvmlValue_t(uiVal=v)) for ts, v in new]
        return _real.NVML_VALUE_TYPE_UNSIGNED_INT, out

    def nvmlDeviceGetMemoryInfo(self, h: _Handle) -> Any:
        g = self._gpu(h)
        return _real.c_nvmlMemory_t(total=g.mem_total, free=g.mem_total - g.mem_used, used=g.mem_used)

    def nvmlDeviceGetClockInfo(self, h: _Handle, kind: int) -> int:
        g = self._gpu(h)
        return {_real.NVML_CLOCK_SM: g.sm_clock, _real.NVML_CLOCK_MEM: g.mem_clock}[kind]

    def nvmlDeviceGetPowerUsage(self, h: _Handle) -> int:
        return self._gpu(h).power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h: _Handle) -> int:
        self._count("nvmlDeviceGetTotalEnergyConsumption")
        g = self._gpu(h)
        if g.energy_mj is None:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        t = self.clock()
        if self._energy_t0 is None:
            self._energy_t0 = t
        # mJ = mW x s; the driver's counter moves in whole mJ
        return int(g.energy_mj + g.power_mw * (t - self._energy_t0))

    def nvmlDeviceGetTemperature(self, h: _Handle, sensor: int) -> int:
        return self._gpu(h).temp_c

    def nvmlDeviceGetPcieThroughput(self, h: _Handle, counter: int) -> int:
        self._count("nvmlDeviceGetPcieThroughput")
        tx, rx = self._gpu(h).pcie_kbs
        return tx if counter == _real.NVML_PCIE_UTIL_TX_BYTES else rx

    def nvmlDeviceGetNvLinkState(self, h: _Handle, link: int) -> int:
        g = self._gpu(h)
        if g.nvlinks == 0:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        if link >= g.nvlinks:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return _real.NVML_FEATURE_ENABLED

    # -- GPM ------------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, h: _Handle) -> Any:
        s = _real.c_nvmlGpmSupport_t()
        s.version = _real.NVML_GPM_SUPPORT_VERSION
        s.isSupportedDevice = 1 if self._gpu(h).gpm else 0
        return s

    def nvmlGpmSampleAlloc(self) -> Any:
        self._count("nvmlGpmSampleAlloc")
        obj = _real.struct_c_nvmlGpmSample_t()
        self.gpm_allocated.append(obj)  # keep it alive: its address identifies the sample
        return ctypes.pointer(obj)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self.gpm_freed += 1

    def nvmlGpmSampleGet(self, h: _Handle, sample: Any) -> Any:
        self._count("nvmlGpmSampleGet")
        g = self._gpu(h)
        if not g.gpm:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        self.gpm_snapshots[ctypes.addressof(sample.contents)] = (h.index, dict(g.gpm_values))
        return sample

    def nvmlGpmMetricsGet(self, mg: Any) -> Any:
        self._count("nvmlGpmMetricsGet")
        if mg.version != _real.NVML_GPM_METRICS_GET_VERSION:
            raise _real.NVMLError(_real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        a = self.gpm_snapshots.get(ctypes.addressof(mg.sample1.contents))
        b = self.gpm_snapshots.get(ctypes.addressof(mg.sample2.contents))
        if a is None or b is None or a is b:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        values = b[1]  # the value over the interval ending at sample2
        for i in range(mg.numMetrics):
            m = mg.metrics[i]
            if m.metricId in values:
                m.value = values[m.metricId]
                m.nvmlReturn = _real.NVML_SUCCESS
            else:
                m.nvmlReturn = _real.NVML_ERROR_NOT_SUPPORTED
        return mg
