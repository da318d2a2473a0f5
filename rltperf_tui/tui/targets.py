"""The monitor's targets: what the command line gives (``TargetSpec``), what the app
keeps per target (``TargetHandle``), and the messages the ingest workers post.

The app (``app.py``) owns the workers and the screen; this module holds the per-target
state both share, so that a worker thread's contract (it touches only ``session``,
``recorder`` under ``rec_lock``, and ``inflight``) is read in one place.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from textual.message import Message
from textual.notifications import SeverityLevel
from textual.worker import Worker, get_current_worker

from engine_adapters.definitions.records import Record, SessionEvent
from engine_adapters.monitor.base import Adapter, AdapterError, Reconnecting, ReplayControl, Session
from engine_adapters.monitor.recording import RecordingError, RecordingWriter
from engine_adapters.monitor.registry import adapter_for
from rltperf_tui.live.aggregator import TargetStats
from rltperf_tui.live.triggers import TriggerSet

BATCH_S = 0.25
"""The ingest worker posts one message per this many seconds (when records came).

A quarter second keeps every render tick (2 Hz) fed with fresh data while the handler
runs 4 times a second, not 10: at 1 000 steps/s a message handled cost about a
millisecond of the main thread whatever its size (bench ingest: 0.053 -> see commit)."""
MAX_INFLIGHT = 8
"""Batches that may wait in the app's message queue per target before the worker waits."""
READ_S = 0.05
"""Longest single blocking read of a session (the worker checks for cancellation between)."""
FLUSH_S = 1.0
"""Recordings are flushed to the OS about this often."""
HUNG_AFTER_S = 3.5
"""A probe target that sends nothing (not even its ~1 s heartbeat) this long is shown
as hung, its figures as stale."""


@dataclass
class TargetSpec:
    """A target for the monitor, optionally already connected (by the command line)."""

    target: str
    """The target as the user gave it."""
    session: Session | None = None
    """An open session; None: the ingest worker connects (and retries if it can)."""
    adapter: Adapter | None = None
    """The adapter; None: built from ``target`` with ``adapter_for``."""
    note: str = ""
    """A line shown in the target's header (e.g. the demo engine's pid and log file)."""
    waiting_text: str = ""
    """Shown until the target first answers, instead of the connection error."""


class TargetHandle:
    """Everything the app keeps for one target (the worker thread touches only
    ``session``, ``recorder`` under ``rec_lock``, and ``inflight``)."""

    def __init__(self, index: int, spec: TargetSpec, stats: TargetStats) -> None:
        self.index = index
        self.target = spec.target
        self.spec = spec
        self.adapter: Adapter | None = spec.adapter
        self.session: Session | None = spec.session
        self.stats = stats
        self.note = spec.note
        self.inflight = threading.Semaphore(MAX_INFLIGHT)
        self.posted = 0
        """Batches the worker posted (written by the worker thread only)."""
        self.handled = 0
        """Batches the app handled (written by the UI thread only)."""
        self.rec_lock = threading.Lock()
        self.recorder: RecordingWriter | None = None
        self.recording_path: str | None = None
        self.last_flush = 0.0
        self.exporting_seen: dict[str, float] = {}
        self.capture_seen: dict[str, str] = {}
        self.last_state = stats.state
        self.dirty = True
        self.last_heard = time.monotonic()
        """Monitor time the newest batch of this target's records arrived."""
        self.triggers: TriggerSet | None = None
        """Trigger rules of this target (``--trigger``), with their state."""
        self.fire_marks: deque[int] = deque(maxlen=64)
        """Probe times at which a trigger asked for a capture (the timeline marks them)."""

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


def clock(ns: int) -> str:
    """``01:05.0`` (``1:02:03.4`` from an hour on): a position in a recording."""
    tenths = max(0, int(ns // 100_000_000))
    s, t = divmod(tenths, 10)
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}.{t}" if h else f"{m:02d}:{sec:02d}.{t}"


class RecordsBatch(Message):
    """Records read from one target in one ~250 ms batch."""

    def __init__(self, index: int, records: list[Record], slot: bool = False) -> None:
        super().__init__()
        self.index = index
        self.records = records
        self.slot = slot
        """The sender took one of the target's ``inflight`` slots (released on handling)."""


class CaptureRequested(Message):
    """A capture request reached a target's engine."""

    def __init__(
        self, index: int, capture_id: str, mode: str, steps: int, trigger: str | None = None
    ) -> None:
        super().__init__()
        self.index = index
        self.capture_id = capture_id
        self.mode = mode
        self.steps = steps
        self.trigger = trigger


class TargetProblem(Message):
    """Something about one target a person should read (not a crash)."""

    def __init__(self, index: int, text: str, severity: SeverityLevel = "error") -> None:
        super().__init__()
        self.index = index
        self.text = text
        self.severity = severity


def slug(target: str) -> str:
    s = re.sub(r"^[a-z+]+://", "", target)
    s = re.sub(r"[^A-Za-z0-9]+", "-", os.path.basename(s.rstrip("/")) or s).strip("-")
    return s[:40] or "target"


Post = Callable[[Message], object]
"""How a worker posts to the app (``App.post_message``, thread-safe)."""


def connect(h: TargetHandle, options: dict[str, Any], wait: bool, post: Post) -> Session | None:
    """Open the target's session in the worker; on failure post why and maybe retry.

    A target that retries gets a session that connects in its own thread: a
    connection attempt against a hung server may take seconds, and a quitting app
    must not wait for it (Textual waits for every thread worker on exit)."""
    try:
        if h.adapter is None:
            h.adapter = adapter_for(h.target, **options)
        if wait and isinstance(h.adapter, Reconnecting):
            return h.adapter.session()
        return h.adapter.connect()
    except AdapterError as exc:
        post(RecordsBatch(h.index, [SessionEvent(state="error", detail=str(exc))]))
        return None


def ingest(h: TargetHandle, options: dict[str, Any], wait: bool, post: Post) -> None:
    """The worker of one target (a thread): read its session (connecting first when the
    command line did not) and post one ``RecordsBatch`` per ~250 ms batch."""
    worker = get_current_worker()
    session = h.session
    if session is None:
        session = connect(h, options, wait, post)
        if session is None:
            return
        h.session = session
    pending: list[Record] = []
    next_flush = time.monotonic() + BATCH_S
    while not worker.is_cancelled:
        now = time.monotonic()
        # never a zero timeout: a reconnecting session would spin
        recs = session.read(max(0.01, min(READ_S, next_flush - now)))
        if recs:
            pending.extend(recs)
        now = time.monotonic()
        ended = session.ended
        if pending and (now >= next_flush or ended):
            if not deliver(h, pending, worker, post):
                return
            pending = []
        if now >= next_flush:
            next_flush += BATCH_S
            if next_flush < now:
                next_flush = now + BATCH_S
        if ended:
            return


def deliver(h: TargetHandle, recs: list[Record], worker: Worker[Any], post: Post) -> bool:
    """Write the batch to the target's recording (if one runs) and post it, waiting for
    one of the target's ``inflight`` slots; False when the worker was cancelled meanwhile."""
    with h.rec_lock:
        if h.recorder is not None:
            try:
                h.recorder.write(recs)
                now = time.monotonic()
                if now - h.last_flush >= FLUSH_S:
                    h.recorder.flush()
                    h.last_flush = now
            except RecordingError as exc:
                h.recorder.close()
                h.recorder = None
                post(TargetProblem(h.index, f"recording stopped: {exc}"))
    while not h.inflight.acquire(timeout=0.1):
        if worker.is_cancelled:
            return False
    h.posted += 1
    post(RecordsBatch(h.index, recs, slot=True))
    return True
