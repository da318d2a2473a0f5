"""Device sampling in the probe's own thread (~1 Hz; never on the step path).

Host side through psutil: the engine process's CPU share and RSS, per-core CPU, memory
(one ``DeviceSample`` of kind ``cpu``).  GPUs through NVML (``nvidia-ml-py``, imported as
``pynvml``) where a driver exists: one ``DeviceSample`` of kind ``cuda`` per GPU the
engine uses, indexed by its CUDA ordinal.  With no NVIDIA driver the sampler says so in
``DeviceSample.note`` and the CPU is the device.

What is read per GPU and tick (each a single cheap NVML query):

- ``nvmlDeviceGetUtilizationRates``: gpu % (share of the driver's sample period with a
  kernel running) and memory % (share with device memory read or written);
- ``nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES, last_seen)``: the finer
  utilisation samples the driver buffered since the previous tick;
- GPM (Hopper and newer; ``nvmlGpmQueryDeviceSupport``): two samples kept alive and
  reused, one ``nvmlGpmSampleGet`` per tick, ``nvmlGpmMetricsGet`` over the interval
  since the previous tick: DRAM bandwidth utilisation, SM occupancy, any-tensor
  utilisation, PCIe and NVLink MiB/s;
- memory used/total, SM and memory clocks, power, temperature;
- energy: ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since the driver loaded), and on
  the host the CPU packages' RAPL counters (``rapl.py``); what they mean and how a
  window turns them into watts and joules per token: ``definitions/energy.py``;
- PCIe throughput without GPM through ``nvmlDeviceGetPcieThroughput``, which blocks
  ~20 ms while it counts: read every ``PCIE_EVERY`` ticks and repeated in between.

Never read: process lists (milliseconds each, and they hold a driver lock).  A call the
device does not support (``NVML_ERROR_NOT_SUPPORTED``, an old driver without the
function, no permission) is never retried and its field stays ``None`` (shown N/A);
a transient error gives ``None`` for that tick only.  Never zero for "unknown" (nvitop's
``NA`` idiom).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from time import perf_counter_ns as _clk
from typing import Any

import msgspec
import psutil

from engine_adapters.definitions.records import DeviceSample
from engine_adapters.probe.gpu import (
    GpuSampler,
    _no_driver_reason,
    cuda_ordinals,
    visible_handles,
)
from engine_adapters.probe.rapl import RaplReader

log = logging.getLogger("rltperf.devices")

SAMPLE_PERIOD_S = 1.0
"""Seconds between samples."""
NOTE_REPEAT_S = 5.0
"""A standing note is repeated this often, so a monitor that attaches later still sees it
(the monitor shows each distinct note once)."""


class HostSampler:
    """psutil readings of the host and one process, and the CPU packages' RAPL energy.

    Args:
        pid: the engine process.
        powercap: where RAPL's zones are (None: ``rapl.powercap_root()``).
    """

    def __init__(self, pid: int, powercap: str | None = None) -> None:
        self.rapl = RaplReader(powercap)
        self.energy_na: str | None = self.rapl.reason
        """Why the CPU sample has no energy (set by the sampler thread with NVML's reason too)."""
        self.proc = psutil.Process(pid)
        self.proc.cpu_percent(None)
        psutil.cpu_percent(None, percpu=True)
        from engine_adapters.definitions.contract import cpu_model

        self.name = cpu_model()

    def sample(self) -> DeviceSample:
        """One reading (CPU shares are over the time since the previous call)."""
        try:
            with self.proc.oneshot():
                proc_cpu = self.proc.cpu_percent(None) / 100.0
                rss = self.proc.memory_info().rss
        except psutil.Error:
            proc_cpu, rss = None, None
        vm = psutil.virtual_memory()
        energy = self.rapl.read_j()
        return DeviceSample(
            ts_ns=_clk(),
            index=0,
            kind="cpu",
            name=self.name,
            proc_cpu=proc_cpu,
            proc_rss=rss,
            host_cpu=[c / 100.0 for c in psutil.cpu_percent(None, percpu=True)],
            host_mem_used=vm.total - vm.available,
            host_mem_total=vm.total,
            energy_j=energy,
            energy_source="rapl" if energy is not None else None,
            energy_na=None if energy is not None else self.energy_na or "RAPL did not answer this time",
        )


# --------------------------------------------------------------------------- NVML


class NvmlSampler:
    """Opens NVML and samples the GPUs the engine uses.

    Args:
        devices: the engine's device strings (``["cuda:0"]``; ``["cpu"]``: no GPU is
            sampled; None: every GPU visible to this process).
        nvml: the ``pynvml`` module (a test passes a fake); imported when None.

    ``note`` says why no GPU is sampled (no driver, CPU engine...), else None;
    ``notes()`` gathers the standing per-GPU notes too.
    """

    def __init__(self, devices: Sequence[str | None] | None = None, nvml: Any = None) -> None:
        self.gpus: list[GpuSampler] = []
        self.note: str | None = None
        self.no_gpu_reason: str | None = None
        """Why no GPU is sampled, in a few words (``no NVIDIA driver (...)``), else None."""
        self.nvml = nvml
        self._inited = False
        wanted = cuda_ordinals(devices)
        if self.nvml is None:
            try:
                import pynvml

                self.nvml = pynvml
            except ImportError:
                self.note = self._cpu_note(wanted, "nvidia-ml-py (pynvml) is not installed")
                return
        nv = self.nvml
        try:
            nv.nvmlInit()
            self._inited = True
        except Exception as exc:
            self.note = self._cpu_note(wanted, _no_driver_reason(nv, exc))
            return
        try:
            handles = visible_handles(nv)
        except Exception as exc:
            self.note = self._cpu_note(wanted, f"NVML could not list GPUs ({exc})")
            return
        if wanted == []:
            self.no_gpu_reason = "the engine runs on the CPU"
            self.note = f"the engine runs on the CPU: the CPU is the device ({len(handles)} NVIDIA GPU(s) present, not sampled)"
            return
        ordinals = list(range(len(handles))) if wanted is None else wanted
        missing = [i for i in ordinals if i >= len(handles)]
        if missing:
            self.note = (
                f"cuda:{missing[0]} is not among the {len(handles)} GPU(s) visible here "
                "(check CUDA_VISIBLE_DEVICES): it is not sampled"
            )
        for i in ordinals:
            if i < len(handles):
                try:
                    self.gpus.append(GpuSampler(nv, handles[i], i))
                except Exception as exc:
                    log.warning("GPU %d: cannot sample (%s)", i, exc)
        if os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID" and len({g.name for g in self.gpus}) > 1:
            extra = (
                "mixed GPU models: CUDA's default device order (fastest first) may differ from NVML's; "
                "set CUDA_DEVICE_ORDER=PCI_BUS_ID so cuda:N is the GPU sampled as N"
            )
            self.note = f"{self.note}; {extra}" if self.note else extra

    def _cpu_note(self, wanted: list[int] | None, reason: str) -> str:
        self.no_gpu_reason = reason
        if wanted:
            return f"{reason}: GPU utilisation, memory and clocks are not available (N/A)"
        return f"{reason}: the CPU is the device"

    def notes(self) -> list[str]:
        """Standing notes: why no GPU is sampled, and per-GPU capability gaps."""
        out = [self.note] if self.note else []
        for g in self.gpus:
            out.extend(g.notes)
        return out

    def sample(self) -> list[DeviceSample]:
        """One reading of each sampled GPU."""
        return [g.sample() for g in self.gpus]

    def close(self) -> None:
        """Free GPM samples and shut NVML down."""
        for g in self.gpus:
            g.close()
        self.gpus = []
        if self._inited:
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()
            self._inited = False


# --------------------------------------------------------------------------- thread


class SamplerThread(threading.Thread):
    """Calls ``sink(DeviceSample)`` about once a second for the host and each GPU.

    Args:
        sink: receives each sample (called in this thread).
        pid: the engine process (its CPU share and RSS are sampled).
        period_s: seconds between samples (drift-free: ``next += period``).
        devices: the engine's device strings (``["cuda:0"]``, ``["cpu"]``); None: all
            visible GPUs, if any.
        dtype: the engine's dtype, for the ceiling.
        nvml: a ``pynvml``-like module (tests pass a fake); None imports ``pynvml``.
        prepare_ceiling: resolve the engine device's ceiling now, in the constructor
            (on a CPU with nothing cached that is the quick calibration, ~0.3 s once per
            machine), so it is measured before the engine loop competes with it and the
            probe's hello never waits for it.
        powercap: where the CPU packages' RAPL zones are (None: ``rapl.powercap_root()``).
    """

    def __init__(
        self,
        sink: Callable[[DeviceSample], None],
        pid: int,
        period_s: float = SAMPLE_PERIOD_S,
        *,
        devices: Sequence[str | None] | None = None,
        dtype: str | None = None,
        nvml: Any = None,
        prepare_ceiling: bool = False,
        powercap: str | None = None,
    ) -> None:
        super().__init__(name="rltperf-devices", daemon=True)
        self.sink = sink
        self.pid = pid
        self.period_s = period_s
        self.devices = list(devices) if devices is not None else None
        self.nvml = nvml
        self.powercap = powercap
        self._stop_ev = threading.Event()
        if prepare_ceiling:
            try:
                from engine_adapters.definitions.ceilings import ceiling_for

                dev = self.devices[0] if self.devices else None
                ceiling_for(dev, dtype)
            except Exception as exc:
                log.warning("could not prepare the device ceiling: %s", exc)

    def run(self) -> None:
        try:
            host = HostSampler(self.pid, self.powercap)
        except Exception as exc:
            log.warning("device sampler disabled: %s", exc)
            return
        gpus: NvmlSampler | None = None
        try:
            gpus = NvmlSampler(self.devices, self.nvml)
        except Exception as exc:
            log.warning("GPU sampling disabled: %s", exc)
        if host.rapl.reason:
            why = gpus.no_gpu_reason if gpus is not None else "GPU sampling failed to start"
            host.energy_na = f"{why}; {host.rapl.reason}" if why else host.rapl.reason
        note: str | None = None
        note_due = 0.0
        nxt = time.monotonic()
        try:
            while not self._stop_ev.is_set():
                try:
                    now = time.monotonic()
                    notes = gpus.notes() if gpus else ["GPU sampling failed to start: the CPU is the device"]
                    joined = "; ".join(notes) or None
                    if joined != note:  # new or changed: log it once, send it now
                        note, note_due = joined, now
                        if note:
                            log.info("device sampler: %s", note)
                    s = host.sample()
                    if note and now >= note_due:
                        s = msgspec.structs.replace(s, note=note)
                        note_due = now + NOTE_REPEAT_S
                    self.sink(s)
                    if gpus is not None:
                        for g in gpus.sample():
                            self.sink(g)
                except Exception:
                    log.exception("device sample failed")
                # Timed loops do not drift: next += period; sleep(max(0, next - now)).
                nxt += self.period_s
                now = time.monotonic()
                if nxt < now - self.period_s:  # fell far behind (suspended): skip, don't burst
                    nxt = now
                self._stop_ev.wait(max(0.0, nxt - now))
        finally:
            if gpus is not None:
                gpus.close()

    def stop(self) -> None:
        """Stop sampling (returns at once)."""
        self._stop_ev.set()
