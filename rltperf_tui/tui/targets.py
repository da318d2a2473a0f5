"""The screen's targets: what the app keeps per target (``TargetHandle``: the live
driver ``rltperf_tui.live.driver.LiveTarget`` plus what the screen adds), the ingest
worker that runs the driver's reader half, and the messages it posts.

The app (``app.py``) owns the workers and the screen; this module holds the per-target
state both share, so that a worker thread's contract (it runs the driver's reader half:
``session``, ``recorder`` under ``rec_lock``; and takes ``inflight`` slots) is read in
one place.  The UI thread runs the driver's model half (``ingest``).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from textual.message import Message
from textual.notifications import SeverityLevel
from textual.worker import Worker, get_current_worker

from engine_adapters.definitions.records import Record, SessionEvent
from engine_adapters.monitor.base import AdapterError
from rltperf_tui.live.aggregator import TargetStats
from rltperf_tui.live.driver import LiveTarget, TargetSpec, clock
from rltperf_tui.live.triggers import Fire, TriggerSet
from rltperf_tui.live.view import ViewSize
from rltperf_tui.live.window_stats import Window

__all__ = [
    "HUNG_AFTER_S",
    "READER_ALIVE_S",
    "CaptureRequested",
    "RecordsBatch",
    "TargetHandle",
    "TargetProblem",
    "TargetSpec",
    "clock",
]

BATCH_S = 0.25
"""The ingest worker posts at most one message per this many seconds (when records came),
and one per render period at the slower refresh rates (``batch_for``).

At 1 000 steps/s a message handled cost about a millisecond of the main thread whatever
its size (bench ingest: 0.053 -> see commit), and a wake of either thread ~0.2 ms."""


def batch_for(refresh_hz: float) -> float:
    """The batch period of a screen refreshed ``refresh_hz`` times a second: one batch a
    render tick (0.5 s at the default 2 Hz), and no less than ``BATCH_S``.  Each tick then
    draws data at most one batch old; a batch a quarter second at 2 Hz cost 9 % more of
    the monitor's CPU (1.84 % against 1.68 % of a core at 1 000 steps/s, ``bench ingest
    --baseline-root``, 3 rounds)."""
    return max(BATCH_S, min(0.5, 1.0 / refresh_hz))


MAX_INFLIGHT = 8
"""Batches that may wait in the app's message queue per target before the worker waits."""
READ_S = BATCH_S
"""Longest single blocking read of a session (the worker checks for cancellation between).

A session's read returns as soon as it has records, so this bounds only the waits of a
quiet stream: a worker that woke every 50 ms to find nothing cost a tenth of the
monitor's CPU on a /metrics target scraped once a second (``rltperf bench peers``).
Quitting does not wait for it (``MonitorApp.quit_now``)."""
IDLE_READ_S = 1.0
"""Longest read with nothing pending.  No batch is due then, so the worker waits for records
(a ``/metrics`` target sends one a scrape, and it is posted as soon as it comes).  At
``READ_S`` the worker of an idle vLLM server view woke 6.8 times a second for 0.97 ms of
CPU a second (per-thread ``schedstat``): a thread's wake costs ~0.1 ms on this kind of
machine."""
PACE_RECORDS = 2000
"""After a read that brought fewer than ``PACE_RECORDS`` records, the worker lets the
stream gather until the next batch is due (one read a batch) instead of waking at each of
the probe's 20 sends a second.  A wake of this thread costs ~0.2 ms of CPU here (per-thread
``schedstat``): at 1 000 steps/s it woke 14 times a second, 3.3 ms of CPU a second, when it
let the stream gather for at most 0.2 s at a time.  A stream under ~8 000 records/s is
paced so: at most ~2 000 records (~300 KB) wait between two reads, in the socket and in
the probe's queue for this subscriber (4 096 records, 2 MiB), which drops the oldest only
beyond that; a faster stream is read as it comes."""
HUNG_AFTER_S = 3.5
"""A probe target that sends nothing (not even its ~1 s heartbeat) this long is shown
as hung, its figures as stale."""
READER_ALIVE_S = IDLE_READ_S + 0.5
"""A worker whose newest read returned this recently is reading (an idle one returns
every ``IDLE_READ_S``); one that has not is stopped or starved of a CPU, and the silence
it saw ends at that read: the monitor, not the engine, was silent since.  Counting to now
instead, a monitor stopped for 10 s (SIGSTOP; Ctrl-Z then ``fg``) resumed saying its
healthy engine was "hung? no heartbeat for 10 s", its records waiting unread in the socket;
on a saturated 2-core server a command waited 2-9 s for a core to start."""


class TargetHandle(LiveTarget):
    """Everything the app keeps for one target: the live driver, and what the screen adds
    (the worker thread runs the driver's reader half and touches ``inflight``)."""

    def __init__(
        self,
        index: int,
        spec: TargetSpec,
        stats: TargetStats,
        triggers: TriggerSet | None = None,
        batch_s: float = BATCH_S,
    ) -> None:
        super().__init__(spec, stats, triggers)
        self.index = index
        self.batch_s = batch_s
        """Seconds between the batches its worker posts (``batch_for``)."""
        self.inflight = threading.Semaphore(MAX_INFLIGHT)
        self.posted = 0
        """Batches the worker posted (written by the worker thread only)."""
        self.handled = 0
        """Batches the app handled (written by the UI thread only)."""
        self.exporting_seen: dict[str, float] = {}
        self.capture_seen: dict[str, str] = {}
        self.last_state = stats.state
        self.dirty = True
        self.read_at = self.data_at = time.monotonic()
        """Monitor time the worker's newest read returned, and the newest read that brought
        records (both written by the worker thread only; ``READER_ALIVE_S``)."""
        self.view_size: ViewSize | None = None
        """The panel sizes its newest view was computed for."""
        self.empty_window: tuple[tuple[float, float | None, float | None], Window] | None = None
        """The window last computed while the target had no step or request (a metrics
        endpoint), by its parameters: it stays empty, and is not recomputed each tick."""
        self.held_s: float | None = None
        """The span its newest window covers when the step ring holds less than the window
        (``Window.ring_cut``: a stream faster than the ring keeps for it); else None."""


class RecordsBatch(Message):
    """Records read from one target in one batch (``batch_for``)."""

    def __init__(self, index: int, records: list[Record], slot: bool = False, final: bool = False) -> None:
        super().__init__()
        self.index = index
        self.records = records
        self.slot = slot
        """The sender took one of the target's ``inflight`` slots (released on handling)."""
        self.final = final
        """The session ended after these records."""


class CaptureRequested(Message):
    """A capture request reached a target's engine (``capture_id``), or did not (None,
    and ``error`` says why)."""

    def __init__(
        self,
        index: int,
        capture_id: str | None,
        mode: str,
        steps: int,
        fire: Fire | None = None,
        error: str = "",
    ) -> None:
        super().__init__()
        self.index = index
        self.capture_id = capture_id
        self.mode = mode
        self.steps = steps
        self.fire = fire
        """The trigger's fire that asked for it; None: a key press."""
        self.error = error


class TargetProblem(Message):
    """Something about one target a person should read (not a crash)."""

    def __init__(self, index: int, text: str, severity: SeverityLevel = "error") -> None:
        super().__init__()
        self.index = index
        self.text = text
        self.severity = severity


def slug(target: str) -> str:
    """A short file-name-safe name of a target (its last path part or host:port), for recordings."""
    s = re.sub(r"^[a-z+]+://", "", target)
    s = re.sub(r"[^A-Za-z0-9]+", "-", os.path.basename(s.rstrip("/")) or s).strip("-")
    return s[:40] or "target"


Post = Callable[[Message], object]
"""How a worker posts to the app (``App.post_message``, thread-safe)."""


def connect(h: TargetHandle, options: dict[str, Any], wait: bool, post: Post) -> bool:
    """Open the target's session in the worker (``LiveTarget.connect``); on failure post why."""
    try:
        h.connect(options, wait)
    except AdapterError as exc:
        post(RecordsBatch(h.index, [SessionEvent(state="error", detail=str(exc))]))
        return False
    return True


def ingest(h: TargetHandle, options: dict[str, Any], wait: bool, post: Post) -> None:
    """The worker of one target (a thread): the driver's reader half (connecting first
    when the command line did not), one ``RecordsBatch`` posted per batch (``TargetHandle.batch_s``)."""
    worker = get_current_worker()
    if h.session is None and not connect(h, options, wait, post):
        return
    session = h.session
    assert session is not None
    pending: list[Record] = []
    batch_s = h.batch_s
    next_flush = time.monotonic() + batch_s
    h.read_at = h.data_at = time.monotonic()  # connected now
    while not worker.is_cancelled:
        now = time.monotonic()
        # never a zero timeout: a reconnecting session would spin
        recs = h.read(max(0.01, min(READ_S, next_flush - now) if pending else IDLE_READ_S))
        now = h.read_at = time.monotonic()
        if recs:
            h.data_at = now
            pending.extend(recs)
        if h.recording_error is not None:
            post(TargetProblem(h.index, f"recording stopped: {h.recording_error}"))
            h.recording_error = None
        ended = session.ended
        if (pending and now >= next_flush) or ended:
            if not deliver(h, pending, worker, post, final=ended):
                return
            pending = []
        if now >= next_flush:
            next_flush += batch_s
            if next_flush < now:
                next_flush = now + batch_s
        if ended:
            return
        if 0 < len(recs) < PACE_RECORDS:
            time.sleep(max(0.0, next_flush - time.monotonic()))


def deliver(
    h: TargetHandle, recs: list[Record], worker: Worker[Any], post: Post, final: bool = False
) -> bool:
    """Post the batch, waiting for one of the target's ``inflight`` slots; False when the
    worker was cancelled meanwhile."""
    while not h.inflight.acquire(timeout=0.1):
        if worker.is_cancelled:
            return False
    h.posted += 1
    post(RecordsBatch(h.index, recs, slot=True, final=final))
    return True
