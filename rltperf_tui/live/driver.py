"""The one live driver: a target's session turned into records, a recording, a
``TargetStats``, trigger fires and capture requests.

Every consumer of a live (or replayed) target drives it through ``LiveTarget``: the
screen (``rltperf_tui.tui``: the ingest worker reads, the UI thread ingests), ``rltperf
watch``, ``--jsonl`` (``rltperf_tui.commands.headless``) and ``rltperf record``.  They
differ only in how they schedule the two halves and what they show:

- the **reader** half (``connect``, ``read``: one thread at a time) reads the session and
  writes what it read to the target's recording, if one runs;
- the **model** half (``ingest``, ``check_window``, the capture bookkeeping: one thread,
  the one that reads ``stats``) adds records to ``stats``, decides whether the stream
  ended, checks the trigger rules and follows the captures they asked for.

A capture is *busy* (``capture_busy``, the one definition: triggers do not capture
meanwhile, the screen keeps repainting) while a request is on its way or the engine
reports one requested, armed, capturing or exporting.  No Textual here.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine_adapters.definitions.records import (
    CaptureDone,
    CaptureFailed,
    Ceiling,
    Record,
    Refused,
    SessionEvent,
    StageTable,
    StepRecord,
)
from engine_adapters.monitor.base import Adapter, AdapterError, Reconnecting, ReplayControl, Session
from engine_adapters.monitor.recording import RecordingError
from engine_adapters.monitor.registry import adapter_for
from rltperf_tui.live.aggregator import TargetStats
from rltperf_tui.live.triggers import STEP_FIGURES, Fire, TriggerSet

BUSY_STATES = frozenset({"requested", "armed", "capturing", "exporting"})
"""Capture states during which a target's capture is busy (``LiveTarget.capture_busy``)."""
ENDED_STATES = frozenset({"ended", "error"})
"""``SessionEvent`` states after which a target sends nothing more."""
FLUSH_S = 1.0
"""A recording is flushed to the OS about this often."""


@dataclass
class TargetSpec:
    """A target for the monitor, optionally already connected (by the command line)."""

    target: str
    """The target as the user gave it."""
    session: Session | None = None
    """An open session; None: the reader connects (and retries if it can)."""
    adapter: Adapter | None = None
    """The adapter; None: built from ``target`` with ``adapter_for``."""
    note: str = ""
    """A line shown in the target's header (e.g. the demo engine's pid and log file)."""
    waiting_text: str = ""
    """Shown until the target first answers, instead of the connection error."""


class RecordSink(Protocol):
    """Where a target's stream is recorded (``RecordingWriter``, ``watch``'s rotating files)."""

    @property
    def records(self) -> int:
        """Records written so far."""
        ...

    def write(self, recs: list[Record]) -> None:
        """Append records (raises ``RecordingError``)."""
        ...

    def flush(self) -> None:
        """Push buffered records to the OS (raises ``RecordingError``)."""
        ...

    def close(self) -> None:
        """Finish the recording."""
        ...


def peak_override(peak_gbps: float | None, peak_gflops: float | None) -> Ceiling | None:
    """The ``--peak-gbps`` / ``--peak-gflops`` flags as the ceiling every target uses, or None."""
    if peak_gbps is None and peak_gflops is None:
        return None
    return Ceiling(device="", peak_bw_gbps=peak_gbps, peak_gflops=peak_gflops, source="--peak-gbps flag")


def new_stats(history_steps: int = 32768, override: Ceiling | None = None) -> TargetStats:
    """A target's aggregate keeping ``history_steps`` steps (at least 1024)."""
    return TargetStats(capacity=max(1024, history_steps), peak_override=override)


@dataclass
class CaptureOutcome:
    """How a capture a trigger asked for ended (found by ``LiveTarget.ingest``)."""

    fire: Fire
    """The fire that asked for it."""
    capture_id: str
    saved: bool
    """True: a bundle was written; False: the engine refused it or it failed."""
    bundle: str | None = None
    steps_captured: int | None = None
    reason: str | None = None
    """Why it failed (None when saved)."""

    def as_dict(self) -> dict[str, Any]:
        """The fire and what became of it (a ``watch`` report event)."""
        if self.saved:
            return {**self.fire.as_dict(), "capture_id": self.capture_id, "bundle": self.bundle,
                    "result": "saved", "steps_captured": self.steps_captured}  # fmt: skip
        return {
            **self.fire.as_dict(),
            "capture_id": self.capture_id,
            "result": "failed",
            "reason": self.reason,
        }


@dataclass
class Ingested:
    """What one batch of records set off (``LiveTarget.ingest``)."""

    fires: list[Fire] = field(default_factory=list)
    """Per-step trigger rules broken by the batch's steps."""
    outcomes: list[CaptureOutcome] = field(default_factory=list)
    """Triggered captures that ended in the batch."""


class LiveTarget:
    """One target driven: its session, recording, aggregate, trigger rules and captures."""

    def __init__(
        self, spec: TargetSpec, stats: TargetStats | None = None, triggers: TriggerSet | None = None
    ) -> None:
        self.spec = spec
        self.target = spec.target
        """The target as the user gave it."""
        self.adapter: Adapter | None = spec.adapter
        self.session: Session | None = spec.session
        self.note = spec.note
        self.stats = stats if stats is not None else new_stats()
        self.triggers = triggers
        """Trigger rules of this target (``--trigger``), with their state."""
        if triggers is not None:
            # a recording shows where the rules fire; only a live engine can capture
            triggers.can_capture = self.live
        self.fire_marks: deque[int] = deque(maxlen=64)
        """Probe times at which a trigger rule fired (the timeline marks them)."""
        self.rec_lock = threading.Lock()
        self.recorder: RecordSink | None = None
        self.recording_path: str | None = None
        self.recording_error: str | None = None
        """Why the recording stopped by itself (a full disk...), until a consumer reads it."""
        self.last_flush = 0.0
        self.ended = False
        """No more records will come (the session ended or failed)."""
        self.end_reason = ""
        """Why it ended, once ``ended``."""
        self.asking = 0
        """Capture requests on their way to the engine (sent, no capture id back yet)."""
        self.triggered: dict[str, Fire] = {}
        """Capture id -> the fire that asked for it, until its bundle or failure arrives."""

    # -- what the target is ------------------------------------------------------------------

    @property
    def live(self) -> bool:
        """False for a recording being replayed."""
        if self.adapter is not None:
            return bool(self.adapter.IS_LIVE)
        return not isinstance(self.session, ReplayControl)

    @property
    def supports_capture(self) -> bool:
        """Whether the adapter can run captures."""
        return self.adapter is not None and bool(self.adapter.SUPPORTS_CAPTURE)

    @property
    def can_capture_now(self) -> bool:
        """A live, capture-capable target that is connected and has not ended."""
        return (
            self.live
            and self.supports_capture
            and self.session is not None
            and self.stats.state == "connected"
            and not self.ended
        )

    def replay_text(self) -> str | None:
        """``replay 00:12.3 / 01:05.0 · 2× ▶`` (position / length in the recording's own
        time, speed, playing/paused/ended) for a replay, None for a live target."""
        s = self.session
        if not isinstance(s, ReplayControl):
            return None
        speed = float(s.speed)
        sp = "as fast as read" if speed == 0 else f"{speed:g}×"
        length = s.length_ns
        total = clock(length) if length is not None else "…"
        where = f"{clock(s.elapsed_ns())} / {total} · "
        if s.ended:
            return f"replay {where}{sp}, ended"
        return f"replay {where}{sp} " + ("❚❚ paused" if s.paused else "▶")

    # -- the reader half -----------------------------------------------------------------------

    def connect(self, options: dict[str, Any], wait: bool) -> Session:
        """Open the session (raises ``AdapterError``).  With ``wait``, a target that can
        reconnect gets a session that connects, and retries, in its own thread: a
        connection attempt against a hung server may take seconds, and a quitting monitor
        must not wait for it."""
        if self.session is None:
            if self.adapter is None:
                self.adapter = adapter_for(self.target, **options)
            if wait and isinstance(self.adapter, Reconnecting):
                self.session = self.adapter.session()
            else:
                self.session = self.adapter.connect()
        return self.session

    def read(self, timeout: float) -> list[Record]:
        """Records the session has within ``timeout`` seconds, written to the recording
        (if one runs) before they are returned."""
        assert self.session is not None, "connect() first"
        recs = self.session.read(timeout)
        if self.recorder is not None:
            self._record(recs)
        return recs

    def _record(self, recs: list[Record]) -> None:
        # session-local events are not part of the stream a recording replays
        keep: list[Record] = [r for r in recs if not isinstance(r, SessionEvent)]
        with self.rec_lock:
            sink = self.recorder
            if sink is None:
                return
            try:
                if keep:
                    sink.write(keep)
                now = time.monotonic()
                if now - self.last_flush >= FLUSH_S:
                    sink.flush()
                    self.last_flush = now
            except RecordingError as exc:
                sink.close()
                self.recorder = None
                self.recording_error = str(exc)

    def start_recording(self, sink: RecordSink, path: str | None = None) -> None:
        """Record from now on into ``sink``; a stream already under way starts with its
        hello (and stage table), so the recording reads on its own."""
        hello = self.stats.hello
        if hello is not None:
            head: list[Record] = [hello]
            if list(hello.stage_names) != self.stats.stage_names:
                head.append(StageTable(stage_names=list(self.stats.stage_names)))
            try:
                sink.write(head)
            except RecordingError:
                sink.close()
                raise
        with self.rec_lock:
            self.recorder = sink
            self.recording_path = path
            self.recording_error = None
            self.last_flush = time.monotonic()

    def stop_recording(self) -> tuple[RecordSink | None, str | None]:
        """Stop recording; the sink (closed) and its path, or (None, None)."""
        with self.rec_lock:
            sink, self.recorder = self.recorder, None
            path, self.recording_path = self.recording_path, None
        if sink is not None:
            sink.close()
        return sink, path

    # -- the model half ------------------------------------------------------------------------

    def ingest(self, recs: list[Record], *, final: bool = False, check: bool = True) -> Ingested:
        """Add records (stream order) to ``stats``; find the end of the stream, the
        triggered captures that ended, and (``check``) the per-step rules they break.
        ``final``: the session said it ended after these records."""
        out = Ingested()
        if recs:
            self.stats.add(recs)
            for r in recs:
                if isinstance(r, SessionEvent) and r.state in ENDED_STATES and not self.ended:
                    self.ended = True
                    self.end_reason = r.detail or "the target ended"
            if self.triggered:
                out.outcomes = self._outcomes(recs)
            trig = self.triggers
            if check and trig is not None and any(r.figure in STEP_FIGURES for r in trig.rules):
                steps = [r for r in recs if isinstance(r, StepRecord)]
                if steps:
                    out.fires = trig.check_steps(steps, busy=self.capture_busy)
                    self.fire_marks.extend(f.ts_ns for f in out.fires)
        if final and not self.ended:
            self.ended = True
            self.end_reason = self.stats.state_detail or "the target ended"
        return out

    def poll(self, timeout: float, *, check: bool = True) -> Ingested:
        """``read`` then ``ingest``, in one thread (``watch``, ``--jsonl``, ``record``)."""
        recs = self.read(timeout)
        assert self.session is not None
        return self.ingest(recs, final=self.session.ended, check=check)

    def _outcomes(self, recs: list[Record]) -> list[CaptureOutcome]:
        out = []
        for r in recs:
            if isinstance(r, (CaptureDone, CaptureFailed, Refused)) and r.capture_id in self.triggered:
                f = self.triggered.pop(r.capture_id)
                if isinstance(r, CaptureDone):
                    out.append(CaptureOutcome(f, r.capture_id, True, r.bundle, r.steps_captured))
                else:
                    out.append(CaptureOutcome(f, r.capture_id, False, reason=r.reason))
        return out

    def check_window(self, window: Any) -> list[Fire]:
        """The window rules over ``window`` (the ``Window`` of ``stats`` just computed),
        for a live target that has steps and has not ended; a stale window (the figures
        held over a blind one, ``Window.stale_s``) fires nothing: they were checked when
        they were current."""
        trig = self.triggers
        if trig is None or not self.live or self.ended or not self.stats.steps.n:
            return []
        if getattr(window, "stale_s", None) is not None:
            return []
        if all(r.per_step for r in trig.rules):
            return []
        fires = trig.check_window(window, self.stats.vouched_ns, busy=self.capture_busy)
        self.fire_marks.extend(f.ts_ns for f in fires)
        return fires

    # -- captures ------------------------------------------------------------------------------

    @property
    def capture_busy(self) -> bool:
        """A capture is on its way or under way: requested (by this monitor, or
        acknowledged by the engine), armed, capturing or exporting."""
        return self.asking > 0 or any(c.state in BUSY_STATES for c in self.stats.captures.values())

    def begin_capture(self) -> None:
        """A capture request is about to be sent (model thread; ``capture_sent`` or
        ``capture_not_sent`` follows)."""
        self.asking += 1

    def send_capture(self, steps: int, mode: str, fire: Fire | None = None) -> str:
        """Send a capture request and return its id (any thread; blocks on the network;
        raises ``AdapterError``)."""
        session = self.session
        if session is None:
            raise AdapterError("not connected")
        if fire is None:
            return session.request_capture(steps, mode)
        return session.request_capture(steps, mode, f"trigger-{fire.rule.figure}", trigger=fire.info())

    def capture_sent(self, capture_id: str, mode: str, steps: int, fire: Fire | None = None) -> None:
        """The engine took the request ``capture_id`` (model thread)."""
        self.asking = max(0, self.asking - 1)
        captures = self.stats.captures
        if capture_id not in captures:  # the engine's reply may have come in first
            self.stats.note_capture_request(capture_id, mode, steps, time.perf_counter_ns())
        if fire is not None:
            captures[capture_id].trigger = f"{fire.rule.text} ({fire.value:.4g})"
            fire.capture_id = capture_id
            self.triggered[capture_id] = fire

    def capture_not_sent(self) -> None:
        """The request failed on its way (model thread)."""
        self.asking = max(0, self.asking - 1)

    def request_capture(self, steps: int, mode: str, fire: Fire | None = None) -> str:
        """Ask for a capture and note it, in one thread (raises ``AdapterError``)."""
        self.begin_capture()
        try:
            cid = self.send_capture(steps, mode, fire)
        except AdapterError:
            self.capture_not_sent()
            raise
        self.capture_sent(cid, mode, steps, fire)
        return cid


def capture_targets(source: LiveTarget, targets: list[Any], every: bool) -> list[Any]:
    """The targets a fire of ``source`` captures on: ``source`` alone, or (``every``:
    ``--trigger-all``) every target that can capture now."""
    return [t for t in (targets if every else [source]) if t.can_capture_now]


def clock(ns: int) -> str:
    """``01:05.0`` (``1:02:03.4`` from an hour on): a position in a recording."""
    tenths = max(0, int(ns // 100_000_000))
    s, t = divmod(tenths, 10)
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}.{t}" if h else f"{m:02d}:{sec:02d}.{t}"
