"""The probe's engine-thread side: ``Probe``.

The step path (``Probe.step`` and the ``StepSlot`` it returns, ``ring.py``) does
nothing but read clocks and store into a preallocated slot of a bounded ring; everything
else happens in the probe's own threads: the publisher (``server.py``, serving what the
ring reader, ``reader.py``, collects), the capture export (``capture.py``,
``bundle.py``), the device sampler and the Prometheus exporter.  ``Probe`` builds and
wires them; none of them imports this module.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from time import perf_counter_ns as _clk
from typing import Any

from engine_adapters.definitions.records import (
    FLAG_PROFILED,
    FLAG_PROFILER_WARMUP,
    STANDARD_STAGES,
    EngineInfo,
    Record,
    RequestRecord,
    engine_info_from,
)
from engine_adapters.definitions.wire import DEFAULT_LISTEN, is_loopback, parse_hostport
from engine_adapters.probe.bundle import BundleWriter
from engine_adapters.probe.capture import (
    IDLE_TIMEOUT_S,
    SNAPSHOT_BUDGET_BYTES,
    SNAPSHOT_BUDGET_COUNT,
    CaptureController,
)
from engine_adapters.probe.job import ExportWindows
from engine_adapters.probe.reader import RequestInbox, RingReader
from engine_adapters.probe.ring import StageNames, StepRing, StepSlot
from engine_adapters.probe.server import Publisher

log = logging.getLogger("rltperf.probe")

__all__ = ["Probe", "StepSlot", "now_ns"]


class Probe:
    """In-engine probe: times steps, publishes records, runs bounded captures.

    Args:
        listen: ``host:port`` to listen on; port 0 picks a free port (see ``address``).
            Loopback by default; any other address needs ``token``.
        engine_info: ``EngineInfo`` or a dict of its fields (model, dtype, loop config,
            ``contract`` extras...).  Shown by the monitor and written into bundles.
        token: shared secret for non-loopback listening (default ``$RLTPERF_TOKEN``).
        snapshot_root: folder where capture bundles are written.
        ring_size: step slots in the ring (a power of two).
        stages: stage names known up front (others are added on first use).
        warm_profiler: pay the profiler's first-use initialisation now, not in the first
            capture (which would otherwise be flagged cold).
        sample_devices: run the ~1 Hz device sampler thread.
        prometheus_port: also serve Prometheus metrics on this port (None: off).
        captures: True to serve capture requests; a string refuses them with that
            reason (e.g. an engine whose compute runs in processes this probe cannot
            profile); the Hello then does not advertise ``capture``.  A callable builds
            the capture service instead of the probe's own controller (vLLM's workers
            profile, ``vllm/core_capture.py``): it is called with ``snapshot_root``,
            ``post``, ``writer`` (the probe's ``BundleWriter``), ``is_closed``,
            ``export_windows``, ``idle_timeout_s``, ``budget_bytes``, ``budget_count``.
        capture_idle_timeout_s: a capture window whose engine runs no step for this
            long ends with a partial bundle, and the next capture is accepted.
        snapshot_budget_bytes: bundles in ``snapshot_root`` may use this many bytes; a
            capture beyond it is refused with the reason (None: no limit).  Nothing is
            ever deleted to make room.
        snapshot_budget_count: at most this many bundles in ``snapshot_root`` (None: no
            limit).
    """

    def __init__(
        self,
        listen: str = DEFAULT_LISTEN,
        engine_info: EngineInfo | dict[str, Any] | None = None,
        *,
        token: str | None = None,
        snapshot_root: str | os.PathLike[str] = "snapshots",
        ring_size: int = 8192,
        stages: Iterable[str] = STANDARD_STAGES,
        warm_profiler: bool = True,
        sample_devices: bool = True,
        prometheus_port: int | None = None,
        captures: bool | str | Callable[..., Any] = True,
        capture_idle_timeout_s: float = IDLE_TIMEOUT_S,
        snapshot_budget_bytes: int | None = SNAPSHOT_BUDGET_BYTES,
        snapshot_budget_count: int | None = SNAPSHOT_BUDGET_COUNT,
    ) -> None:
        host, port = parse_hostport(listen)
        token = token if token is not None else (os.environ.get("RLTPERF_TOKEN") or None)
        if not is_loopback(host) and not token:
            raise ValueError(
                f"listening on {host!r} (not loopback) needs a token: pass --token or set RLTPERF_TOKEN"
            )
        self.ring = StepRing(ring_size)
        """The step ring (``ring.py``); readers use ``read_since`` / ``in_step_since``."""
        self.step = self.ring.step  # type: ignore[method-assign]  # the step path: no extra frame
        self.engine_info = engine_info_from(engine_info, pid=os.getpid())
        self.token = token
        self.snapshot_root = os.path.abspath(os.fspath(snapshot_root))
        self._stages = StageNames(stages)
        self._requests = RequestInbox()
        self.started_ns = _clk()
        self.closed = False

        exports = ExportWindows()
        self.reader = RingReader(self.ring, self._stages, exports, self._requests)
        """Ring reading (``reader.py``), run by the publisher thread."""
        writer = BundleWriter(
            self.snapshot_root,
            self.engine_info,
            lambda: self._stages.names,
            self.reader,
            self.reader.post_control,
        )
        self._capture_ctl: Any
        if callable(captures):
            self._capture_ctl = captures(
                snapshot_root=self.snapshot_root,
                post=self.reader.post_control,
                writer=writer,
                is_closed=lambda: self.closed,
                export_windows=exports,
                idle_timeout_s=capture_idle_timeout_s,
                budget_bytes=snapshot_budget_bytes,
                budget_count=snapshot_budget_count,
            )
        else:
            self._capture_ctl = CaptureController(
                self.ring,
                snapshot_root=self.snapshot_root,
                post=self.reader.post_control,
                export=writer.write,
                is_closed=lambda: self.closed,
                export_windows=exports,
                idle_timeout_s=capture_idle_timeout_s,
                budget_bytes=snapshot_budget_bytes,
                budget_count=snapshot_budget_count,
            )
            if captures is not True:
                self._capture_ctl.torch_error = captures or "this probe does not run captures"
            if warm_profiler:
                self._capture_ctl.warm()

        self._publisher = Publisher(
            self.reader, self._stages, self._capture_ctl, self.engine_info, self.started_ns, host, port, token
        )
        self.address = self._publisher.address
        """``host:port`` the probe listens on (the real port when 0 was asked for)."""
        self._sampler = None
        self._prometheus = None
        try:
            if prometheus_port is not None:
                from engine_adapters.probe.prometheus import PrometheusExporter

                self._prometheus = PrometheusExporter(self, prometheus_port)
            if sample_devices:
                from engine_adapters.probe.devices import SamplerThread

                info = self.engine_info
                self._sampler = SamplerThread(
                    self.reader.post_device_sample,
                    pid=os.getpid(),
                    devices=[info.device],
                    dtype=info.dtype,
                    prepare_ceiling=True,
                )
                self._sampler.start()
        except BaseException:
            # A half-built probe leaves no thread or listening socket behind.
            if self._prometheus is not None:
                self._prometheus.close()
            self._publisher._shutdown_sockets()
            raise
        self._publisher.start()
        log.info("rltperf probe listening on %s", self.address)

    # -- engine-thread hot path ----------------------------------------------------------

    def step(self, kind: str = "decode", batch: int = 0, tokens: int = 0) -> StepSlot:
        """Begin one engine step; use as ``with probe.step(...) as step:``.

        While a capture is armed or running, the capture takes the step (``ring.py``:
        the step observer).  Each probe replaces this method by its ring's ``step``, the
        same work without this call frame (the step path).
        """
        return self.ring.step(kind, batch, tokens)

    def request_done(
        self,
        req_id: str | int,
        arrival_ns: int,
        finish_ns: int,
        first_token_ns: int | None = None,
        prompt_tokens: int = 0,
        output_tokens: int = 0,
        status: str = "ok",
        preemptions: int = 0,
    ) -> None:
        """Report a finished, failed or aborted request (times: ``perf_counter_ns``)."""
        inbox = self._requests
        inbox.q.append(
            RequestRecord(
                req_id=str(req_id),
                arrival_ns=arrival_ns,
                finish_ns=finish_ns,
                first_token_ns=first_token_ns,
                prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
                status=status,
                preemptions=preemptions,
            )
        )
        inbox.n_in += 1

    # -- readers (any thread) -----------------------------------------------------------

    @property
    def captures(self) -> Any:
        """The capture service (the probe's ``CaptureController``, or what ``captures`` built)."""
        return self._capture_ctl

    @property
    def stage_names(self) -> list[str]:
        """Stage names by index, as in ``StepRecord.stage_ns``."""
        return self._stages.names

    def in_step_since(self) -> int:
        """Start of the step running now (probe clock), or 0 between steps."""
        return self.ring.in_step_since()

    @property
    def steps_total(self) -> int:
        """Steps finished since the probe started."""
        return self.ring.w

    @property
    def ring_dropped(self) -> int:
        """Step records lost because the publisher fell a whole ring behind."""
        return self.reader.ring_dropped

    def add_observer(self, fn: Callable[[list[Record]], Any]) -> None:
        """Call ``fn(records)`` in the publisher thread with every batch of records (steps,
        requests, device samples, capture replies); e.g. the Prometheus exporter."""
        self.reader.add_observer(fn)

    # -- lifecycle -----------------------------------------------------------------------

    def close(self, reason: str = "engine stopped", timeout: float = 10.0) -> None:
        """Stop the probe: finish a running export, say goodbye to subscribers, close."""
        if self.closed:
            return
        self.closed = True
        self._capture_ctl.close(timeout=timeout)
        if self._sampler is not None:
            self._sampler.stop()
        if self._prometheus is not None:
            self._prometheus.close()
        self._publisher.close(reason)

    def __enter__(self) -> Probe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def profiled_flags(warmup: bool) -> int:
    """Flags of a step inside a capture (profiler warm-up step or captured step)."""
    return FLAG_PROFILED | (FLAG_PROFILER_WARMUP if warmup else 0)


def now_ns() -> int:
    """The probe's clock (``perf_counter_ns``), for engines stamping request times."""
    return _clk()


def wall_minus_mono_ns() -> int:
    """Offset to turn probe monotonic times into wall-clock times."""
    return time.time_ns() - _clk()
