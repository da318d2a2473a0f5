"""The probe's engine-thread side: ``Probe`` and its step slots.

The step path does nothing but read clocks and store into a preallocated slot of a
bounded ring; everything else (durations, encoding, sockets, captures' export) happens
in the probe's own threads.  Measured on the 2-core CI machine (``rltperf bench probe``):
about 1.3 µs per four-stage step with ``step.mark()`` and about 2.7 µs with the nested
``with step.stage()`` form — one ``perf_counter_ns()`` costs ~100 ns there.

A slot is reused every ``ring_size`` steps.  The publisher copies a finished slot and
checks its sequence number afterwards; a slot overwritten meanwhile (the publisher fell
a whole ring behind) counts as dropped, never as a corrupted record.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterable
from time import perf_counter_ns as _clk
from typing import Any

from engine_adapters.definitions.records import (
    FLAG_PROFILED,
    FLAG_PROFILER_WARMUP,
    STANDARD_STAGES,
    EngineInfo,
    RequestRecord,
    engine_info_from,
)
from engine_adapters.definitions.wire import DEFAULT_LISTEN, is_loopback, parse_hostport
from engine_adapters.probe.capture import (
    IDLE_TIMEOUT_S,
    SNAPSHOT_BUDGET_BYTES,
    SNAPSHOT_BUDGET_COUNT,
    CaptureController,
)

log = logging.getLogger("rltperf.probe")

MAX_MARKS = 64
"""Stage boundaries stored per step; more are ignored (and counted)."""

# A boundary stores the clock and the stage *name* (None = "between stages", the
# with-form's exit); the publisher thread maps names to indices, so the step path does
# no dictionary work.


class _StageCM:
    """Context manager for ``with step.stage(name):`` (one cached per slot and stage)."""

    __slots__ = ("name", "slot")

    def __init__(self, slot: StepSlot, name: str) -> None:
        self.slot = slot
        self.name = name

    def __enter__(self) -> _StageCM:
        sl = self.slot
        k = sl.k
        try:
            sl.t[k] = _clk()
            sl.ix[k] = self.name
        except IndexError:
            sl.overflow += 1
            return self
        sl.k = k + 1
        return self

    def __exit__(self, *exc: object) -> None:
        sl = self.slot
        k = sl.k
        try:
            sl.t[k] = _clk()
            sl.ix[k] = None
        except IndexError:
            sl.overflow += 1
            return
        sl.k = k + 1


class StepSlot:
    """One engine step being timed; returned by ``Probe.step()``.

    Use it as a context manager.  Inside, either nest ``with step.stage(name):`` blocks
    or call ``step.mark(name)`` at each stage boundary (a stage then lasts until the
    next mark or the end of the step; cheaper: one clock read per boundary).
    ``step.set(...)`` attaches analytic and scheduler facts (see ``StepRecord``).
    """

    __slots__ = (
        "_cms",
        "batch",
        "end",
        "extras",
        "flags",
        "ix",
        "k",
        "kind",
        "overflow",
        "probe",
        "seq",
        "start",
        "step_id",
        "t",
        "tokens",
    )

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.t = [0] * MAX_MARKS
        self.ix: list[str | None] = [None] * MAX_MARKS
        self.k = 0
        self.seq = -1
        self.step_id = -1
        self.start = 0
        self.end = 0
        self.kind = "decode"
        self.batch = 0
        self.tokens = 0
        self.extras: dict[str, Any] | None = None
        self.flags = 0
        self.overflow = 0
        self._cms: dict[str, _StageCM] = {}

    # -- engine-facing API -------------------------------------------------------------

    def mark(self, name: str) -> None:
        """Start stage ``name`` now (ending the previous one)."""
        k = self.k
        try:
            self.t[k] = _clk()
            self.ix[k] = name
        except IndexError:
            self.overflow += 1
            return
        self.k = k + 1

    def stage(self, name: str) -> _StageCM:
        """``with step.stage("forward"): ...`` times the block as stage ``name``."""
        try:
            return self._cms[name]
        except KeyError:
            cm = self._cms[name] = _StageCM(self, name)
            return cm

    def set(self, **facts: Any) -> None:
        """Attach facts to the step: any ``StepRecord`` field, e.g. ``bytes_read=...``.

        Also ``busy_events=[(start_event, end_event), ...]`` (CUDA events recorded
        around the step's device regions): the publisher thread reads their elapsed time
        once they complete, never synchronising the engine.
        """
        if self.extras is None:
            self.extras = facts
        else:
            self.extras.update(facts)

    def __enter__(self) -> StepSlot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.end = _clk()
        p = self.probe
        sid = self.step_id
        self.seq = sid
        p._w = sid + 1

    def finish(self) -> None:
        """End the step (for code that cannot use ``with``)."""
        self.__exit__(None, None, None)


class _ProfiledSlot(StepSlot):
    """A slot during a capture window: also emits profiler ranges and steps the profiler.

    Same layout as ``StepSlot`` (the capture swaps ``__class__`` on the slots it uses).
    """

    __slots__ = ()

    def mark(self, name: str) -> None:
        StepSlot.mark(self, name)
        self.probe._capture_ctl.range_mark(name)

    def stage(self, name: str) -> _StageCM:
        return _ProfiledStageCM(self, name)  # type: ignore[return-value]

    def __exit__(self, *exc: object) -> None:
        ctl = self.probe._capture_ctl
        ctl.range_close()
        StepSlot.__exit__(self)
        ctl.after_step(self)


class _ProfiledStageCM:
    __slots__ = ("inner", "name", "slot")

    def __init__(self, slot: StepSlot, name: str) -> None:
        self.slot = slot
        self.name = name
        self.inner = StepSlot.stage(slot, name)

    def __enter__(self) -> _ProfiledStageCM:
        self.inner.__enter__()
        self.slot.probe._capture_ctl.range_mark(self.name)
        return self

    def __exit__(self, *exc: object) -> None:
        self.slot.probe._capture_ctl.range_close()
        self.inner.__exit__()


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
            profile); the Hello then does not advertise ``capture``.
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
        captures: bool | str = True,
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
        if ring_size < 16 or ring_size & (ring_size - 1):
            raise ValueError(f"ring_size must be a power of two >= 16, not {ring_size}")
        self.engine_info = engine_info_from(engine_info, pid=os.getpid())
        self.token = token
        self.snapshot_root = os.path.abspath(os.fspath(snapshot_root))
        self._stage_names: list[str] = []
        self._stage_index: dict[str, int] = {}
        self._stage_lock = threading.Lock()
        for s in stages:
            self._register_stage(s)
        self._mask = ring_size - 1
        self._slots = [StepSlot(self) for _ in range(ring_size)]
        self._w = 0
        self._requests: deque[RequestRecord] = deque(maxlen=65536)
        self._requests_in = 0
        self.started_ns = _clk()
        self.closed = False
        self._armed = False  # set by the capture controller: step() takes the capture path

        self._capture_ctl = CaptureController(
            self,
            idle_timeout_s=capture_idle_timeout_s,
            budget_bytes=snapshot_budget_bytes,
            budget_count=snapshot_budget_count,
        )
        if captures is not True:
            self._capture_ctl.torch_error = captures or "this probe does not run captures"
        if warm_profiler:
            self._capture_ctl.warm()

        from engine_adapters.probe.server import Publisher

        self._publisher = Publisher(self, host, port, token)
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
                    self._publisher.post_device_sample,
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
        """Begin one engine step; use as ``with probe.step(...) as step:``."""
        if self._armed:
            return self._capture_ctl.begin_step(kind, batch, tokens)
        w = self._w
        sl = self._slots[w & self._mask]
        sl.seq = -1
        sl.step_id = w
        sl.kind = kind
        sl.batch = batch
        sl.tokens = tokens
        sl.extras = None
        sl.flags = 0
        sl.k = 0
        sl.start = _clk()
        return sl

    def _slot_for_capture(self, kind: str, batch: int, tokens: int, flags: int) -> StepSlot:
        w = self._w
        sl = self._slots[w & self._mask]
        sl.__class__ = _ProfiledSlot
        sl.seq = -1
        sl.step_id = w
        sl.kind = kind
        sl.batch = batch
        sl.tokens = tokens
        sl.extras = None
        sl.flags = flags
        sl.k = 0
        sl.start = _clk()
        return sl

    def _release_capture_slot(self, step_id: int) -> None:
        self._slots[step_id & self._mask].__class__ = StepSlot

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
        self._requests.append(
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
        self._requests_in += 1

    # -- stage table ---------------------------------------------------------------------

    def _register_stage(self, name: str) -> int:
        with self._stage_lock:
            idx = self._stage_index.get(name)
            if idx is None:
                if not isinstance(name, str) or not name:
                    raise ValueError(f"stage name must be a non-empty string, not {name!r}")
                idx = len(self._stage_names)
                self._stage_names.append(name)
                self._stage_index[name] = idx  # slots share this dict
            return idx

    @property
    def stage_names(self) -> list[str]:
        """Stage names by index, as in ``StepRecord.stage_ns``."""
        return list(self._stage_names)

    def in_step_since(self) -> int:
        """Start of the step running now (probe clock), or 0 between steps.  Read from
        the slot the engine is filling, by another thread, without touching the step
        path: a step is open when the slot of step ``_w`` has begun and not ended."""
        w = self._w
        sl = self._slots[w & self._mask]
        start = sl.start
        if sl.step_id == w and sl.seq == -1 and start > 0:
            return int(start)
        return 0

    @property
    def steps_total(self) -> int:
        """Steps finished since the probe started."""
        return self._w

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
