"""Ring reading, in the publisher thread: step slots become ``StepRecord`` batches.

Every tick the publisher asks ``RingReader.collect`` for what is new: the finished
steps since its cursor (``StepRing.read_since``; stage durations from the boundary
marks, ``FLAG_EXPORTING`` for steps that overlap an export, steps with CUDA events held
until the events complete), the finished requests, the device samples and the capture
replies other threads posted.  It keeps the recent step history (bundles'
``steps.jsonl``, the figures at a capture request) and makes the ``Stats`` heartbeats.
Observers (the Prometheus exporter) get every batch.  Socket serving is ``server.py``'s.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from time import perf_counter_ns as _clk
from typing import Any

import msgspec

from engine_adapters.definitions.records import (
    FLAG_EXPORTING,
    DeviceSample,
    Record,
    RequestRecord,
    Stats,
    StepRecord,
)
from engine_adapters.probe.job import ExportWindows
from engine_adapters.probe.ring import StageNames, StepRing, StepSlot

log = logging.getLogger("rltperf.probe")

__all__ = ["RequestInbox", "RingReader"]

HISTORY = 4096
"""Step records the reader keeps for bundles' ``steps.jsonl`` and live stats."""
ENERGY_HISTORY = 1200
"""Device samples with an energy reading kept for bundles (~10 min of a host and a GPU at 1 Hz)."""
PENDING_EVENTS_MAX_S = 2.0
"""A step whose CUDA events have not completed by then is sent with busy unknown."""
REQUESTS_QUEUED = 65536
"""Finished requests waiting for the reader; beyond this the oldest are dropped (counted)."""

_STEP_FIELDS = frozenset(StepRecord.__struct_fields__) - {
    "step_id",
    "start_ns",
    "end_ns",
    "kind",
    "stage_ns",
    "batch",
    "tokens",
}


class RequestInbox:
    """Finished requests from the engine thread (``Probe.request_done``) to the reader."""

    __slots__ = ("n_in", "q")

    def __init__(self, maxlen: int = REQUESTS_QUEUED) -> None:
        self.q: deque[RequestRecord] = deque(maxlen=maxlen)
        self.n_in = 0
        """Requests put in since the start (the reader counts what the deque dropped)."""


class RingReader:
    """Reads the ring and the probe's inboxes into record batches (publisher thread).

    Args:
        ring: the step ring.
        stages: stage names by index (names first seen in a step are registered here).
        export_windows: running and recent exports (their steps get ``FLAG_EXPORTING``).
        requests: the finished-request inbox.
    """

    def __init__(
        self, ring: StepRing, stages: StageNames, export_windows: ExportWindows, requests: RequestInbox
    ) -> None:
        self.ring = ring
        self.stages = stages
        self.export_windows = export_windows
        self.requests = requests
        self._r = 0  # next step id to read
        self.ring_dropped = 0
        """Step records lost because the reader fell a whole ring behind."""
        self.mark_overflow = 0
        self.last_step_id = -1
        self.requests_dropped = 0
        self._requests_read = 0
        self._ctrl_in: deque[Record] = deque()
        self._dev_in: deque[DeviceSample] = deque(maxlen=256)
        self._pending: deque[tuple[StepRecord, list[Any], int]] = deque()
        self._history: deque[StepRecord] = deque(maxlen=HISTORY)
        self._energy: deque[DeviceSample] = deque(maxlen=ENERGY_HISTORY)
        self.energy_na: str | None = None
        """The newest reason a device sample gave for having no energy counter."""
        self._hist_lock = threading.Lock()
        self._unknown_fields: set[str] = set()
        self._exporting = False
        self.last_device_sample: DeviceSample | None = None
        self._observers: list[Callable[[list[Record]], Any]] = []

    # -- inputs from other threads ---------------------------------------------------------

    def post_control(self, rec: Record) -> None:
        """Queue a control record (capture replies) for every subscriber (any thread)."""
        self._ctrl_in.append(rec)

    def post_device_sample(self, rec: DeviceSample) -> None:
        """Queue a device sample (sampler thread)."""
        self._dev_in.append(rec)

    def add_observer(self, fn: Callable[[list[Record]], Any]) -> None:
        """Call ``fn(records)`` in the publisher thread with every batch of records: the
        data (steps, requests, device samples) and the control records (capture results)."""
        self._observers.append(fn)

    def recent_steps(self) -> list[StepRecord]:
        """A copy of the recent step history (any thread)."""
        with self._hist_lock:
            return list(self._history)

    def recent_energy(self) -> list[DeviceSample]:
        """A copy of the recent device samples that carry an energy reading (any thread)."""
        with self._hist_lock:
            return list(self._energy)

    # -- publisher thread --------------------------------------------------------------------

    def collect(self) -> tuple[list[Record], list[Record]]:
        """(data, control): what is new since the last call; observers see both."""
        recs = self._drain()
        ctrl: list[Record] = []
        while self._ctrl_in:
            ctrl.append(self._ctrl_in.popleft())
        if self._observers and (recs or ctrl):
            batch = recs + ctrl if ctrl else recs
            for fn in self._observers:
                try:
                    fn(batch)
                except Exception:
                    log.exception("probe observer failed")
        return recs, ctrl

    def heartbeat(self, sub_dropped: int, subscribers: int) -> Stats:
        """A ``Stats`` now: steps so far, losses, and whether a step is running."""
        return Stats(
            ts_ns=_clk(),
            steps_total=self.ring.w,
            ring_dropped=self.ring_dropped,
            sub_dropped=sub_dropped,
            subscribers=subscribers,
            in_step_since_ns=self.ring.in_step_since(),
        )

    def _drain(self) -> list[Record]:
        out: list[Record] = []
        ready: list[StepRecord] = []
        self._exporting = bool(self.export_windows)
        got, self._r, lost = self.ring.read_since(self._r, self._to_record)
        self.ring_dropped += lost
        pending = self._pending
        for rec, events in got:
            if events or pending:
                pending.append((rec, events, _clk()))
            else:
                ready.append(rec)
        if pending:
            ready.extend(self._resolve_pending())
        if ready:
            with self._hist_lock:
                self._history.extend(ready)
            self.last_step_id = ready[-1].step_id
            out.extend(ready)
        inbox = self.requests
        q = inbox.q
        while q:
            out.append(q.popleft())
            self._requests_read += 1
        self.requests_dropped = max(0, inbox.n_in - self._requests_read - len(q))
        while self._dev_in:
            d = self._dev_in.popleft()
            self.last_device_sample = d
            if d.energy_j is not None:
                with self._hist_lock:
                    self._energy.append(d)
            elif d.energy_na:
                self.energy_na = d.energy_na
            out.append(d)
        return out

    def _to_record(self, sl: StepSlot, sid: int) -> tuple[StepRecord, list[Any]]:
        # Stage durations from the boundary marks: mark i lasts until mark i+1 (or the
        # step's end); a None name is "between stages" (the with-form's exit boundary).
        stages = self.stages
        stage = [0] * len(stages)
        k = sl.k
        end = sl.end
        start = sl.start
        if k:
            t = sl.t
            names = sl.ix
            prev_t = t[0]
            prev = names[0]
            for i in range(1, k + 1):
                ti = t[i] if i < k else end
                if prev is not None:
                    idx = stages.get(prev)
                    if idx is None:
                        idx = self._new_stage(prev)
                        if idx is not None and idx >= len(stage):
                            stage.extend([0] * (idx + 1 - len(stage)))
                    if idx is not None:
                        stage[idx] += ti - prev_t
                if i < k:
                    prev_t = ti
                    prev = names[i]
        if sl.overflow:
            self.mark_overflow += sl.overflow
            sl.overflow = 0
        flags = sl.flags
        if self._exporting and self.export_windows.overlap(start, end):
            flags |= FLAG_EXPORTING
        extras = sl.extras
        events: list[Any] = []
        if not extras:
            return (
                StepRecord(
                    step_id=sid,
                    start_ns=start,
                    end_ns=end,
                    kind=sl.kind,
                    stage_ns=stage,
                    batch=sl.batch,
                    tokens=sl.tokens,
                    flags=flags,
                ),
                events,
            )
        fields: dict[str, Any] = {}
        for key, val in extras.items():
            if key in _STEP_FIELDS:
                fields[key] = val
            elif key == "busy_events":
                events = list(val or ())
            elif key not in self._unknown_fields:
                self._unknown_fields.add(key)
                log.warning("probe: step field %r is not in the schema; ignored", key)
        if "flags" in fields:
            flags |= int(fields.pop("flags"))
        base: dict[str, Any] = {"step_id": sid, "start_ns": start, "end_ns": end, "kind": sl.kind,
                                "stage_ns": stage, "batch": sl.batch, "tokens": sl.tokens, "flags": flags}  # fmt: skip
        try:
            rec = StepRecord(**base, **fields)
        except TypeError as exc:  # a fact of the wrong type: keep the timing, drop the facts
            log.warning("probe: bad step facts %s: %s", sorted(fields), exc)
            rec = StepRecord(**base)
        return rec, events

    def _new_stage(self, name: Any) -> int | None:
        """Register a stage name first seen in a step (None for a bad name, warned once)."""
        try:
            return self.stages.register(name)
        except (ValueError, TypeError):
            key = f"stage:{name!r}"
            if key not in self._unknown_fields:
                self._unknown_fields.add(key)
                log.warning("probe: bad stage name %r ignored (names are non-empty strings)", name)
            return None

    def _resolve_pending(self) -> list[StepRecord]:
        """Release step records in order once their CUDA events have completed."""
        out: list[StepRecord] = []
        now = _clk()
        while self._pending:
            rec, events, queued = self._pending[0]
            if events:
                busy: int | None = 0
                try:
                    if not all(e1.query() for _, e1 in events):
                        if (now - queued) / 1e9 < PENDING_EVENTS_MAX_S:
                            break
                        busy = None
                    else:
                        busy = int(sum(e0.elapsed_time(e1) for e0, e1 in events) * 1e6)
                except Exception:
                    busy = None
                rec = msgspec.structs.replace(rec, busy_ns=busy)
            self._pending.popleft()
            out.append(rec)
        return out

    def live_stats(self) -> dict[str, Any]:
        """Figures at the moment a capture is requested (for ``meta.json``)."""
        hist = self.recent_steps()
        now = _clk()
        recent = [r for r in hist if now - r.end_ns < 5_000_000_000]
        out: dict[str, Any] = {
            "window_s": 5,
            "steps": len(recent),
            "steps_total": self.ring.w,
            "ring_dropped": self.ring_dropped,
        }
        if len(recent) >= 2:
            ms = sorted((r.end_ns - r.start_ns) / 1e6 for r in recent)
            out["step_ms_p50"] = round(ms[len(ms) // 2], 4)
            out["step_ms_p99"] = round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 4)
            span = (recent[-1].end_ns - recent[0].start_ns) / 1e9
            out["steps_per_s"] = round(len(recent) / span, 2) if span > 0 else None
        return out
