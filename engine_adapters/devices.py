"""Device sampling in the probe's own thread (~1 Hz; never on the step path).

Host side through psutil (the engine process's CPU and RSS, per-core CPU, memory).
GPUs through NVML (``nvidia-ml-py``, imported as ``pynvml``) where a driver exists; with
no NVIDIA driver the sampler says so once and the CPU is the device.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from time import perf_counter_ns as _clk

import psutil

from engine_adapters.records import DeviceSample

log = logging.getLogger("rltperf.devices")

SAMPLE_PERIOD_S = 1.0


class HostSampler:
    """psutil readings of the host and one process."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.proc.cpu_percent(None)
        psutil.cpu_percent(None, percpu=True)
        from engine_adapters.probe.contract import cpu_model

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
        )


class SamplerThread(threading.Thread):
    """Calls ``sink(DeviceSample)`` about once a second for the host and each GPU."""

    def __init__(
        self, sink: Callable[[DeviceSample], None], pid: int, period_s: float = SAMPLE_PERIOD_S
    ) -> None:
        super().__init__(name="rltperf-devices", daemon=True)
        self.sink = sink
        self.pid = pid
        self.period_s = period_s
        self._stop_ev = threading.Event()

    def run(self) -> None:
        try:
            host = HostSampler(self.pid)
        except Exception as exc:
            log.warning("device sampler disabled: %s", exc)
            return
        first = True
        nxt = time.monotonic()
        while not self._stop_ev.is_set():
            try:
                s = host.sample()
                if first:
                    s = _with_note(s, "no NVIDIA driver found: the CPU is the device")
                    first = False
                self.sink(s)
            except Exception:
                log.exception("device sample failed")
            # Timed loops do not drift: next += period; sleep(max(0, next - now)).
            nxt += self.period_s
            self._stop_ev.wait(max(0.0, nxt - time.monotonic()))

    def stop(self) -> None:
        """Stop sampling (returns at once)."""
        self._stop_ev.set()


def _with_note(s: DeviceSample, note: str) -> DeviceSample:
    import msgspec

    return msgspec.structs.replace(s, note=note)
