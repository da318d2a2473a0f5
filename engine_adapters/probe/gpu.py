"""NVML readings of one GPU (``GpuSampler``) and which GPUs the engine uses.

Part of the device sampler (``devices.py``, whose docstring lists what is read and
why); everything here runs in the sampler's thread, never on the step path.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from time import perf_counter_ns as _clk
from typing import Any

from engine_adapters.definitions.records import DeviceSample

log = logging.getLogger("rltperf.devices")

PCIE_EVERY = 5
"""Ticks between reads of ``nvmlDeviceGetPcieThroughput`` (a 20 ms call) on GPUs without GPM."""
_MIB = 1 << 20
# GPM metric ids by DeviceSample field; looked up on the module at run time.
_GPM_FIELDS = (
    ("dram_bw_util", "NVML_GPM_METRIC_DRAM_BW_UTIL", 0.01),  # percent -> fraction
    ("sm_occupancy", "NVML_GPM_METRIC_SM_OCCUPANCY", 0.01),
    ("tensor_util", "NVML_GPM_METRIC_ANY_TENSOR_UTIL", 0.01),
    ("pcie_tx_bps", "NVML_GPM_METRIC_PCIE_TX_PER_SEC", float(_MIB)),  # MiB/s -> B/s
    ("pcie_rx_bps", "NVML_GPM_METRIC_PCIE_RX_PER_SEC", float(_MIB)),
    ("_nvlink_rx", "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", float(_MIB)),
    ("_nvlink_tx", "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", float(_MIB)),
)


def _err_value(exc: BaseException) -> int | None:
    v = getattr(exc, "value", None)
    return v if isinstance(v, int) else None


def _permanent_codes(nvml: Any) -> set[int]:
    """NVML error codes that mean "this device/driver will never answer this call"."""
    names = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_NO_PERMISSION")
    return {int(getattr(nvml, n)) for n in names if hasattr(nvml, n)}


def _no_driver_reason(nvml: Any, exc: BaseException) -> str:
    code = _err_value(exc)
    if code is not None and code == getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", -1):
        return "no NVIDIA driver (libnvidia-ml.so.1 not found)"
    if code is not None and code == getattr(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", -1):
        return "NVIDIA driver not loaded"
    return f"NVML unavailable ({exc})"


def cuda_ordinals(devices: Sequence[str | None] | None) -> list[int] | None:
    """CUDA ordinals named by device strings (``cuda``, ``cuda:1``); None when none was named
    (the engine did not say), ``[]`` when the engine runs on something else (``cpu``)."""
    if not devices or all(d is None for d in devices):
        return None
    out: list[int] = []
    for d in devices:
        if d is None:
            continue
        kind, _, idx = str(d).partition(":")
        if kind == "cuda":
            out.append(int(idx) if idx.isdigit() else 0)
    return sorted(set(out))


def visible_handles(nvml: Any) -> list[Any]:
    """NVML handles of the GPUs CUDA shows this process, in CUDA ordinal order.

    NVML ignores ``CUDA_VISIBLE_DEVICES``; CUDA does not, so the engine's ``cuda:0`` is
    the first entry of that list (an index or a ``GPU-``/``MIG-`` UUID or UUID prefix;
    CUDA stops at the first entry it cannot resolve or repeats, and so does this; the
    same parse as torch's own ``torch.cuda._get_nvml_device_index``).
    """
    n = int(nvml.nvmlDeviceGetCount())
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
    uuids: list[str] | None = None
    out: list[Any] = []
    seen: set[Any] = set()
    for tok in (t.strip() for t in env.split(",")):
        key: Any
        if tok.lstrip("+-").isdigit():
            i = int(tok)
            if not 0 <= i < n or i in seen:
                break
            key, handle = i, nvml.nvmlDeviceGetHandleByIndex(i)
        elif tok.startswith("MIG-"):
            try:
                key, handle = tok, nvml.nvmlDeviceGetHandleByUUID(tok)
            except Exception:
                break
        elif tok:
            if uuids is None:
                uuids = [str(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))) for i in range(n)]
            want = tok if tok.startswith("GPU-") else f"GPU-{tok}"
            matches = [i for i, u in enumerate(uuids) if u.startswith(want)]
            if len(matches) != 1 or matches[0] in seen:  # unknown or ambiguous prefix
                break
            key, handle = matches[0], nvml.nvmlDeviceGetHandleByIndex(matches[0])
        else:
            break
        seen.add(key)
        out.append(handle)
    return out


class GpuSampler:
    """NVML readings of one GPU; unsupported calls are remembered and skipped."""

    def __init__(self, nvml: Any, handle: Any, index: int) -> None:
        self.nvml = nvml
        self.h = handle
        self.index = index
        self._permanent = _permanent_codes(nvml)
        self.unsupported: set[str] = set()
        """Capabilities found missing (never asked again)."""
        name = self._call("name", self._fn("nvmlDeviceGetName"), handle)
        if isinstance(name, bytes):
            name = name.decode(errors="replace")
        self.name = str(name or f"GPU {index}")
        self._tick = 0
        self._pcie: tuple[float | None, float | None] = (None, None)
        self.notes: list[str] = []
        # utilisation samples: start from "now" so the first tick holds only new ones
        self._last_us = 0
        first = self._samples()
        if first:
            self._last_us = max(ts for ts, _ in first)
        # NVLink present at all?  (no links: throughput is N/A, not 0)
        self.has_nvlink = self._nvlink_present()
        # GPM
        self._gpm: list[Any] | None = None
        self._gpm_ids: list[tuple[str, int, float]] = []
        self._setup_gpm()
        if self._gpm is None:
            self.notes.append(
                f"GPU {index} ({self.name}): no GPM, so no hardware DRAM-bandwidth reading "
                "(shown N/A; MBU is the analytic figure)"
            )

    # -- helpers ---------------------------------------------------------------------------

    def _call(self, cap: str, fn: Callable[..., Any] | None, *args: Any) -> Any:
        """``fn(*args)``, or None when the capability is missing (remembered) or the call
        failed this time."""
        if cap in self.unsupported or fn is None:
            return None
        try:
            return fn(*args)
        except AttributeError:
            self.unsupported.add(cap)
        except Exception as exc:
            code = _err_value(exc)
            if code is not None and code in self._permanent:
                self.unsupported.add(cap)
                log.info("GPU %d: %s not available (%s)", self.index, cap, exc)
            else:
                log.debug("GPU %d: %s failed: %s", self.index, cap, exc)
        return None

    def _fn(self, name: str) -> Callable[..., Any] | None:
        return getattr(self.nvml, name, None)

    def _samples(self) -> list[tuple[int, float]] | None:
        """Utilisation samples newer than the last seen: [(timestamp µs, fraction)]."""
        nv = self.nvml
        if "util_samples" in self.unsupported:
            return None
        try:
            vtype, samples = nv.nvmlDeviceGetSamples(self.h, nv.NVML_GPU_UTILIZATION_SAMPLES, self._last_us)
        except AttributeError:
            self.unsupported.add("util_samples")
            return None
        except Exception as exc:
            code = _err_value(exc)
            if code == getattr(nv, "NVML_ERROR_NOT_FOUND", -1):
                return []  # no new samples since last_seen
            if code is not None and code in self._permanent:
                self.unsupported.add("util_samples")
            return None
        field = {
            getattr(nv, "NVML_VALUE_TYPE_DOUBLE", 0): "dVal",
            getattr(nv, "NVML_VALUE_TYPE_UNSIGNED_INT", 1): "uiVal",
            getattr(nv, "NVML_VALUE_TYPE_UNSIGNED_LONG", 2): "ulVal",
            getattr(nv, "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", 3): "ullVal",
            getattr(nv, "NVML_VALUE_TYPE_SIGNED_LONG_LONG", 4): "sllVal",
            getattr(nv, "NVML_VALUE_TYPE_SIGNED_INT", 5): "siVal",
        }.get(vtype, "uiVal")
        out = [(int(s.timeStamp), float(getattr(s.sampleValue, field)) / 100.0) for s in samples]
        out = [(ts, v) for ts, v in out if ts > self._last_us]
        out.sort()
        return out

    def _nvlink_present(self) -> bool:
        fn = self._fn("nvmlDeviceGetNvLinkState")
        if fn is None:
            return False
        for link in range(int(getattr(self.nvml, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                if fn(self.h, link):
                    return True
            except Exception:
                return False
        return False

    def _setup_gpm(self) -> None:
        nv = self.nvml
        try:
            support = nv.nvmlGpmQueryDeviceSupport(self.h)
            if not getattr(support, "isSupportedDevice", 0):
                return
            samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
        except Exception as exc:
            log.info("GPU %d: GPM not available (%s)", self.index, exc)
            return
        try:
            nv.nvmlGpmSampleGet(self.h, samples[0])
        except Exception as exc:
            self.notes.append(f"GPU {self.index}: GPM sample failed ({exc})")
            self._free(samples)
            return
        self._gpm = samples
        self._gpm_ids = [
            (fld, int(getattr(nv, const)), scale) for fld, const, scale in _GPM_FIELDS if hasattr(nv, const)
        ]

    def _free(self, samples: list[Any]) -> None:
        for s in samples:
            with contextlib.suppress(Exception):
                self.nvml.nvmlGpmSampleFree(s)

    def _gpm_failed(self, exc: BaseException) -> None:
        code = _err_value(exc)
        if code is not None and code in self._permanent and self._gpm is not None:
            self.notes.append(f"GPU {self.index}: GPM stopped answering ({exc}); DRAM bandwidth N/A")
            self._free(self._gpm)
            self._gpm = None
        else:
            log.debug("GPU %d: GPM read failed: %s", self.index, exc)

    def _gpm_read(self) -> dict[str, float | None]:
        """GPM metrics over the interval since the previous tick (takes one GPM sample)."""
        nv = self.nvml
        assert self._gpm is not None
        prev, cur = self._gpm
        try:
            nv.nvmlGpmSampleGet(self.h, cur)
        except Exception as exc:
            self._gpm_failed(exc)
            return {}
        self._gpm = [cur, prev]  # the newer sample starts the next interval
        try:
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(self._gpm_ids)
            mg.sample1 = prev
            mg.sample2 = cur
            for i, (_f, mid, _s) in enumerate(self._gpm_ids):
                mg.metrics[i].metricId = mid
            nv.nvmlGpmMetricsGet(mg)
        except Exception as exc:
            self._gpm_failed(exc)
            return {}
        ok = getattr(nv, "NVML_SUCCESS", 0)
        out: dict[str, float | None] = {}
        for i, (fld, _mid, scale) in enumerate(self._gpm_ids):
            m = mg.metrics[i]
            out[fld] = float(m.value) * scale if int(m.nvmlReturn) == ok else None
        return out

    # -- sampling --------------------------------------------------------------------------

    def sample(self) -> DeviceSample:
        """One reading of this GPU."""
        nv = self.nvml
        h = self.h
        self._tick += 1
        util = self._call("util", self._fn("nvmlDeviceGetUtilizationRates"), h)
        samples = self._samples()
        if samples:
            self._last_us = samples[-1][0]
        mem = self._call("memory", self._fn("nvmlDeviceGetMemoryInfo"), h)
        sm_clk = self._call(
            "sm_clock", self._fn("nvmlDeviceGetClockInfo"), h, getattr(nv, "NVML_CLOCK_SM", 1)
        )
        mem_clk = self._call(
            "mem_clock", self._fn("nvmlDeviceGetClockInfo"), h, getattr(nv, "NVML_CLOCK_MEM", 2)
        )
        power_mw = self._call("power", self._fn("nvmlDeviceGetPowerUsage"), h)
        temp = self._call(
            "temp", self._fn("nvmlDeviceGetTemperature"), h, getattr(nv, "NVML_TEMPERATURE_GPU", 0)
        )
        energy_mj = self._call("energy", self._fn("nvmlDeviceGetTotalEnergyConsumption"), h)
        gpm = self._gpm_read() if self._gpm is not None else {}
        pcie_tx, pcie_rx = gpm.get("pcie_tx_bps"), gpm.get("pcie_rx_bps")
        if self._gpm is None and (self._tick == 1 or self._tick % PCIE_EVERY == 0):
            fn = self._fn("nvmlDeviceGetPcieThroughput")
            tx = self._call("pcie", fn, h, getattr(nv, "NVML_PCIE_UTIL_TX_BYTES", 0))
            rx = self._call("pcie", fn, h, getattr(nv, "NVML_PCIE_UTIL_RX_BYTES", 1))
            # NVML reports KB/s; like nvitop we read it as KiB/s.
            self._pcie = (tx * 1024.0 if tx is not None else None, rx * 1024.0 if rx is not None else None)
        if self._gpm is None:
            pcie_tx, pcie_rx = self._pcie
        nvl: float | None = None
        if self.has_nvlink:
            rx_, tx_ = gpm.get("_nvlink_rx"), gpm.get("_nvlink_tx")
            nvl = rx_ + tx_ if rx_ is not None and tx_ is not None else None
        return DeviceSample(
            ts_ns=_clk(),
            index=self.index,
            kind="cuda",
            name=self.name,
            gpu_util=util.gpu / 100.0 if util is not None else None,
            mem_util=util.memory / 100.0 if util is not None else None,
            util_samples=[v for _, v in samples] if samples is not None else None,
            dram_bw_util=gpm.get("dram_bw_util"),
            sm_occupancy=gpm.get("sm_occupancy"),
            tensor_util=gpm.get("tensor_util"),
            mem_used=int(mem.used) if mem is not None else None,
            mem_total=int(mem.total) if mem is not None else None,
            sm_clock_mhz=float(sm_clk) if sm_clk is not None else None,
            mem_clock_mhz=float(mem_clk) if mem_clk is not None else None,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            temp_c=float(temp) if temp is not None else None,
            pcie_tx_bps=pcie_tx,
            pcie_rx_bps=pcie_rx,
            nvlink_bps=nvl,
            energy_j=energy_mj / 1000.0 if energy_mj is not None else None,
            energy_source="nvml" if energy_mj is not None else None,
            energy_na=None if energy_mj is not None else self._energy_na(),
        )

    def _energy_na(self) -> str:
        if "energy" in self.unsupported:
            return f"GPU {self.index} ({self.name}): NVML has no energy counter (Volta or newer needed)"
        return f"GPU {self.index}: the energy counter did not answer this time"

    def close(self) -> None:
        """Free the GPM samples."""
        if self._gpm is not None:
            self._free(self._gpm)
            self._gpm = None
