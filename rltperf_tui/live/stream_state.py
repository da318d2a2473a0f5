"""One target's connection and capture state: what the stream says besides its steps.

``TargetStats`` (``rltperf_tui.live.aggregator``) composes this with the numpy step windows
(``rltperf_tui.live.step_windows``).  Both share one ``StreamClock``: the heartbeats handled
here and the steps ingested there move the same window end (``w1``), defined in
``engine_adapters.definitions.figures``.  No Textual, no numpy.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine_adapters.definitions.energy import energy_kind
from engine_adapters.definitions.records import (
    Bye,
    CaptureDone,
    CaptureExporting,
    CaptureFailed,
    CaptureProgress,
    CaptureStarted,
    DeviceSample,
    EngineInfo,
    Hello,
    Record,
    Refused,
    SessionEvent,
    StageTable,
    Stats,
)

ENERGY_READINGS = 36_000
"""Energy counter readings kept per device: 10 h at the probe's 1 Hz (a whole recording's
power is over the readings kept; ``energy.window_energy`` divides by the time they cover)."""

CAPTURE_EVENTS = (CaptureStarted, CaptureProgress, CaptureExporting, CaptureDone, CaptureFailed)
"""The records that move a capture along (``StreamState.capture_event``)."""


@dataclass
class StreamClock:
    """The stream's data time (probe clock), moved by steps, heartbeats and goodbyes.

    ``vouched_ns`` is the window end ``w1``; ``first_ns`` bounds ``w0``
    (``engine_adapters.definitions.figures``)."""

    now_ns: int = 0
    """The newest timestamp of any record."""
    first_ns: int | None = None
    """The stream's first timestamp (a heartbeat or a step start), probe clock."""
    vouched_ns: int = 0
    """The newest moment the data vouches for (``engine_adapters.definitions.figures``)."""
    in_step_since_ns: int = 0
    """The newest heartbeat found the engine inside a step begun then (0: between steps)."""
    last_end_ns: int | None = None
    """End of the newest step."""

    def seen(self, t_ns: int) -> None:
        """A timestamp of the stream: the earliest one is the stream's start."""
        if self.first_ns is None or t_ns < self.first_ns:
            self.first_ns = t_ns

    def heartbeat(self, ts_ns: int, in_step_since_ns: int) -> None:
        """A ``Stats`` heartbeat taken at ``ts_ns``, inside a step begun at
        ``in_step_since_ns`` (0: between steps)."""
        self.now_ns = max(self.now_ns, ts_ns)
        self.seen(ts_ns)
        since = in_step_since_ns
        if since > 0 and (self.last_end_ns is None or since >= self.last_end_ns):
            # inside a step: the heartbeat vouches for the time up to its start only
            self.in_step_since_ns = since
            self.vouched_ns = max(self.vouched_ns, min(since, ts_ns))
        else:  # between steps (or an older probe that does not say)
            self.in_step_since_ns = 0
            self.vouched_ns = max(self.vouched_ns, ts_ns)

    def steps_ended(self, first_start_ns: int, last_end_ns: int) -> None:
        """A batch of steps from ``first_start_ns`` to ``last_end_ns`` arrived."""
        self.last_end_ns = last_end_ns
        if last_end_ns > self.now_ns:
            self.now_ns = last_end_ns
        if last_end_ns > self.vouched_ns:
            self.vouched_ns = last_end_ns
        if self.first_ns is None or first_start_ns < self.first_ns:
            self.seen(first_start_ns)
        if self.in_step_since_ns and last_end_ns >= self.in_step_since_ns:
            self.in_step_since_ns = 0

    def window_bounds(self, seconds: float | None) -> tuple[int, int]:
        """``(w0, w1)`` of the window over the last ``seconds`` (None: the whole stream),
        probe clock: ``w1`` is the newest moment the data vouches for, ``w0`` never before
        the stream's first timestamp (``engine_adapters.definitions.figures``)."""
        w1 = self.vouched_ns
        first = self.first_ns if self.first_ns is not None else w1
        w0 = first if seconds is None else max(first, w1 - int(seconds * 1e9))
        return min(w0, w1), w1

    @property
    def quiet_s(self) -> float:
        """Data time since the newest step ended while the engine was between steps
        (0 while steps come, or while a step is running)."""
        if self.last_end_ns is None or self.in_step_since_ns:
            return 0.0
        return max(0.0, (self.vouched_ns - self.last_end_ns) / 1e9)


@dataclass
class CaptureView:
    """What the monitor knows of one capture."""

    capture_id: str
    mode: str
    steps: int
    state: str = "requested"  # requested, armed, capturing, exporting, saved, failed, refused
    steps_done: int = 0
    first_step: int | None = None
    bundle: str | None = None
    trace_bytes: int | None = None
    events: int | None = None
    export_s: float | None = None
    error: str | None = None
    cold: bool = False
    exporting_since_ns: int | None = None
    requested_ns: int = 0
    note: str | None = None
    """From ``CaptureDone.note``: e.g. the engine could not honour the requested mode."""
    trigger: str | None = None
    """The trigger rule (and value) that asked for this capture; None: a key press."""
    via: str | None = None
    """From ``CaptureDone.via``: the path the capture took (rltperf in vLLM's workers,
    vLLM's own profiler); None: the engine's own probe."""


@dataclass
class StreamState:
    """Connection, engine identity, heartbeats, devices and captures of one target."""

    clock: StreamClock = field(default_factory=StreamClock)
    info: EngineInfo | None = None
    hello: Hello | None = None
    stage_names: list[str] = field(default_factory=list)
    state: str = "connecting"
    state_detail: str = ""
    dropped_ring: int = 0
    dropped_sub: int = 0
    steps_total: int | None = None
    devices: dict[tuple[str, int], DeviceSample] = field(default_factory=dict)
    device_notes: list[str] = field(default_factory=list)
    captures: dict[str, CaptureView] = field(default_factory=dict)
    messages: deque[str] = field(default_factory=lambda: deque(maxlen=20))
    ended: bool = False
    """The probe said goodbye."""
    gpu_util: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=600))
    dram_util: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=600))
    energy: dict[tuple[str, int], deque[tuple[int, float]]] = field(default_factory=dict)
    """Each device's energy counter readings ``(ts_ns, joules)``, the newest ``ENERGY_READINGS``."""
    energy_source: dict[str, str] = field(default_factory=dict)
    """The energy counter's source by device kind (``nvml``, ``rapl``)."""
    energy_na: dict[str, str] = field(default_factory=dict)
    """Why a device kind has no energy counter (the newest reason said)."""

    def add(self, r: Record) -> bool:
        """Take one record that is not a step or a request; False: not one of this
        state's records (the caller handles it)."""
        if isinstance(r, Stats):
            self.dropped_ring = r.ring_dropped
            self.dropped_sub = r.sub_dropped
            self.steps_total = r.steps_total
            self.clock.heartbeat(r.ts_ns, r.in_step_since_ns)
        elif isinstance(r, DeviceSample):
            self.devices[(r.kind, r.index)] = r
            if r.note and r.note not in self.device_notes:
                self.device_notes.append(r.note)
            if r.gpu_util is not None:
                self.gpu_util.append((r.ts_ns, r.gpu_util))
            if r.dram_bw_util is not None:
                self.dram_util.append((r.ts_ns, r.dram_bw_util))
            if r.energy_j is not None:
                key = (r.kind, r.index)
                q = self.energy.get(key)
                if q is None:
                    q = self.energy[key] = deque(maxlen=ENERGY_READINGS)
                q.append((r.ts_ns, r.energy_j))
                self.energy_source[r.kind] = r.energy_source or "?"
            elif r.energy_na:
                self.energy_na[r.kind] = r.energy_na
        elif isinstance(r, Hello):
            self.hello = r
            self.info = r.engine
            self.stage_names = list(r.stage_names)
        elif isinstance(r, StageTable):
            self.stage_names = list(r.stage_names)
        elif isinstance(r, SessionEvent):
            self.state = r.state
            self.state_detail = r.detail
            if r.detail:
                self.messages.append(r.detail)
        elif isinstance(r, Bye):
            self.messages.append(f"engine: {r.reason}")
            self.ended = True
            if r.ts_ns > 0:
                clock = self.clock
                clock.vouched_ns = max(clock.vouched_ns, r.ts_ns)
                clock.now_ns = max(clock.now_ns, r.ts_ns)
        elif isinstance(r, CAPTURE_EVENTS):
            self.capture_event(r)
        elif isinstance(r, Refused):
            if r.capture_id and r.capture_id in self.captures:
                c = self.captures[r.capture_id]
                c.state = "refused"
                c.error = r.reason
            self.messages.append(f"refused: {r.reason}")
        else:
            return False
        return True

    def note_capture_request(self, capture_id: str, mode: str, steps: int, now_ns: int = 0) -> CaptureView:
        """The monitor asked for a capture (before the engine answers)."""
        c = CaptureView(capture_id=capture_id, mode=mode, steps=steps, state="armed", requested_ns=now_ns)
        self.captures[capture_id] = c
        return c

    def capture_event(self, r: Any) -> None:
        """A capture record (``CAPTURE_EVENTS``) moves its capture along."""
        c = self.captures.get(r.capture_id)
        if c is None:  # requested by another client: still show it
            steps = getattr(r, "steps", getattr(r, "steps_requested", 0))
            c = self.captures[r.capture_id] = CaptureView(
                capture_id=r.capture_id, mode=getattr(r, "mode", "?"), steps=steps
            )
        if isinstance(r, CaptureStarted):
            c.state, c.first_step, c.cold, c.mode, c.steps = (
                "capturing",
                r.first_step,
                r.cold,
                r.mode,
                r.steps,
            )
        elif isinstance(r, CaptureProgress):
            # 0 of N before the window started: the engine's acknowledgement (armed)
            armed = r.steps_done == 0 and c.first_step is None
            c.state, c.steps_done = ("armed" if armed else "capturing"), r.steps_done
        elif isinstance(r, CaptureExporting):
            c.state, c.exporting_since_ns, c.steps_done = "exporting", r.since_ns, c.steps
        elif isinstance(r, CaptureDone):
            c.state = "saved"
            c.bundle, c.trace_bytes, c.events, c.export_s = r.bundle, r.trace_bytes, r.events, r.export_s
            c.steps_done = r.steps_captured
            c.note = r.note
            c.via = r.via
        elif isinstance(r, CaptureFailed):
            c.state, c.error, c.bundle = "failed", r.reason, r.bundle

    def energy_device(self) -> str:
        """The device kind whose energy the figures are: ``cuda`` when the engine has a
        sampled GPU, else ``cpu`` (a GPU engine's host CPU is not its device)."""
        return energy_kind(k for k, _ in self.devices)

    def energy_readings(self, since_ns: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """The energy device's counter readings, one ``(ts_ns, joules)`` pair of arrays per
        device of that kind (``figures.window_figures``'s ``energy``); empty: none.
        ``since_ns``: only the readings from the last one at or before it (a live window
        needs a dozen, not the hours kept)."""
        kind = self.energy_device()
        out = []
        for (k, _i), q in sorted(self.energy.items()):
            if k != kind or not q:
                continue
            if since_ns is None:
                rows = list(q)
            else:
                rows = []
                for row in reversed(q):
                    rows.append(row)
                    if row[0] <= since_ns:
                        break
                rows.reverse()
            a = np.array(rows, dtype=np.float64)
            out.append((a[:, 0], a[:, 1]))
        return out

    def energy_why(self) -> str | None:
        """Why the energy device has no counter (None: it has one, or nothing was said yet)."""
        kind = self.energy_device()
        if any(k == kind for k, _ in self.energy):
            return None
        return self.energy_na.get(kind)

    def gpu_util_mean(self, seconds: float = 10.0) -> float | None:
        """Mean NVML utilisation over the window (coarse cross-check), None without a GPU."""
        lo = self.clock.now_ns - int(seconds * 1e9)
        vals = [v for t, v in self.gpu_util if t >= lo]
        return sum(vals) / len(vals) if vals else None
