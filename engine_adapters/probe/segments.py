"""A capture window profiled in segments, so no step boundary pays for the whole window.

Stopping ``torch.profiler`` post-processes every event it collected, in C++ with the GIL
held, on the thread that started it (torch 2.13's ``_disable_profiler``; no torch call
ends collection without it, and the state is thread-local).  Timed here on a loop of
``linear`` operators: ~2.5 us per event in ops mode, ~5 us in full mode, plus ~1 ms to
start a session.  One session over an 8-step window put all of it in the gap after the
last step (``rltperf bench capture``): 32-52 ms (ops) and 210-222 ms (full) on the
reference engine,
against a limit of 3 x the median step + 20 ms (issue 20 §1).

``SegmentedProfile`` runs the window as consecutive sessions of whole steps instead.  The
first active segment holds one step; its stop cost sets the length of the next ones, so
that each boundary's stop stays near ``budget_ms`` (``segment_steps``).  Each boundary
closes the step's ``ProfilerStep#k`` range, stops the segment, starts the next and opens
``ProfilerStep#k+1``: the profiler's own work falls between spans, as with torch's
schedule the span covers the gap before its step.  It has the interface the capture
paths use of ``torch.profiler.profile`` with ``schedule(wait=0, warmup=1, active=N)``:
``start`` prepares (the warm-up step records nothing), each ``step`` ends one step,
after the N-th the last segment is stopped and ``done`` is set; ``stop`` ends a window
early.  The export thread writes each segment's trace and frees it (``save_parts``); a
child process merges the traces and builds the operator table (``export_child.py``).
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from time import perf_counter_ns as _clk
from typing import Any

log = logging.getLogger("rltperf.probe.segments")

SEGMENT_BUDGET_MS = 8.0
"""The stop cost a segment aims at: well under the 20 ms slack of the capture limit."""


def open_range(name: str) -> Any:
    """A ``record_function`` range entered now, or None when it could not be (a range is
    never worth an error on the step loop)."""
    try:
        from torch.autograd.profiler import record_function

        rf = record_function(name)
        rf.__enter__()
        return rf
    except Exception:
        return None


def close_range(rf: Any) -> None:
    """Exit a range from ``open_range`` (None: nothing), never raising."""
    if rf is not None:
        try:
            rf.__exit__(None, None, None)
        except Exception:
            pass


def segment_steps(stop_ms: float, steps_in_segment: int, remaining: int, budget_ms: float) -> int:
    """Steps in the next segment: as many as keep its stop near ``budget_ms``, given that
    the last segment of ``steps_in_segment`` steps took ``stop_ms`` to stop (the cost
    grows with the events, i.e. with the steps); at least 1, at most ``remaining``."""
    if remaining <= 0:
        return 0
    per_step = stop_ms / max(1, steps_in_segment)
    n = int(budget_ms // per_step) if per_step > 0 else remaining
    return max(1, min(remaining, n))


class SegmentedProfile:
    """One capture window (one warm-up step, then ``steps`` active ones) profiled as
    consecutive ``torch.profiler.profile`` sessions.

    Args:
        steps: active steps in the window.
        make: returns a new, unstarted ``torch.profiler.profile`` (no schedule).
        budget_ms: target stop cost of one segment (``segment_steps``).
    """

    def __init__(self, steps: int, make: Any, budget_ms: float = SEGMENT_BUDGET_MS) -> None:
        self.steps = steps
        self.make = make
        self.budget_ms = budget_ms
        self.segments: list[Any] = []  # stopped sessions that recorded, in order
        self.unused: list[Any] = []  # a session stopped before it recorded (window ended in warm-up)
        self.current: Any = None  # the running (or, before the first step, prepared) session
        self.recording = False  # whether ``current`` records (it is only prepared in the warm-up)
        self.step_num = 0  # steps ended, the warm-up one included
        self.seg_len = 1  # steps the current segment is to hold
        self.seg_start = 1  # step_num at which the current segment started
        self.done = False
        self.stop_ms: list[float] = []  # each recorded segment's stop (ms), in order
        self._range: Any = None

    # -- the window (engine thread) ------------------------------------------------------------

    def start(self) -> None:
        """Prepare the first session (the warm-up step runs while it is prepared)."""
        p = self.make()
        p.prepare_trace()
        self.current = p

    def step(self) -> None:
        """One step ended (the first is the warm-up); stops the window after the last."""
        if self.done or self.current is None:
            return
        self.step_num += 1
        if self.step_num == 1:  # warm-up over: record from here
            self.current.start_trace()
            self.recording = True
            self.seg_start = 1
            self._open_span()
            return
        active_done = self.step_num - 1
        seg_done = self.step_num - self.seg_start
        if active_done < self.steps and seg_done < self.seg_len:
            self._close_span()
            self._open_span()
            return
        self._close_span()
        ms = self._stop_current()
        if active_done >= self.steps:
            self.done = True
            return
        self.seg_len = segment_steps(ms, seg_done, self.steps - active_done, self.budget_ms)
        p = self.make()
        p.start()
        self.current, self.recording = p, True
        self.seg_start = self.step_num
        self._open_span()

    def stop(self) -> None:
        """End the window now (early: a cancel, the engine stopping); idempotent."""
        self._close_span()
        if self.current is not None:
            self._stop_current()
        self.done = True

    def _stop_current(self) -> float:
        p, self.current = self.current, None
        recorded, self.recording = self.recording, False
        t0 = _clk()
        try:
            if not recorded:  # prepared only: Kineto's state is let go by a start and a stop
                p.start_trace()
            p.stop()
        finally:
            ms = (_clk() - t0) / 1e6
            if recorded:
                self.stop_ms.append(ms)
                self.segments.append(p)
            else:
                self.unused.append(p)
        return ms

    def _open_span(self) -> None:
        self._range = open_range(f"ProfilerStep#{self.step_num}")

    def _close_span(self) -> None:
        rf, self._range = self._range, None
        close_range(rf)

    # -- results (export thread or child) ----------------------------------------------------------

    def save_parts(self, folder: str, pause_s: float = 0.0) -> list[str]:
        """Each segment's Chrome trace into ``folder`` (``.segment-<i>.json``), each
        segment's results freed as soon as it is written.  Kineto's writer and the free
        each hold the GIL for one segment (~9 and ~11 ms for a full-mode step here), and
        an engine thread that lets the GIL go in every operator would lose it again at
        each: after each hold this thread sleeps twice as long (at least ``pause_s``), so
        the engine runs at least two thirds of the time.  Returns the files written, in
        order; a segment Kineto did not write (a full disk: it says so on its own log
        only) is left out."""

        def hold(fn: Any, *args: Any) -> None:
            t0 = _clk()
            try:
                fn(*args)
            finally:
                if pause_s > 0:
                    time.sleep(max(pause_s, 2 * (_clk() - t0) / 1e9))

        parts = []
        todo, self.segments = self.segments, []
        for i, p in enumerate(todo):
            part = os.path.join(folder, f".segment-{i}.json")
            try:
                hold(p.export_chrome_trace, part)
            finally:
                hold(release_results, p)
            if os.path.exists(part):
                parts.append(part)
        return parts

    def release(self, pause_s: float = 0.0) -> None:
        """Free every segment's results (``export.release_results`` on each), sleeping
        ``pause_s`` between two (the GIL goes to the engine thread there)."""
        todo, self.segments, self.unused = [*self.segments, *self.unused], [], []
        for i, p in enumerate(todo):
            if i and pause_s > 0:
                time.sleep(pause_s)
            release_results(p)


RELEASE_PAUSE_S = 0.002
"""An export thread's pause between freeing two segments' results (``release_results``)."""


def release_results(prof: Any, pause_s: float = 0.0) -> bool:
    """Free a stopped profiler's results now (any thread); True when they are gone.

    Freeing holds the GIL: ~15 ms per step of a full-mode window here (every event's
    shapes and stacks).  A segmented window (``segments.SegmentedProfile``) is freed one
    segment at a time, sleeping ``pause_s`` between two (an export thread passes
    ``RELEASE_PAUSE_S``) so the engine thread takes the GIL back in between.

    ``torch.profiler.profile`` refers to itself (its ``action_map`` holds its own bound
    methods), so dropping the last reference to it frees nothing: its results (every
    event and the Kineto trace, held by ``prof.profiler``) wait for a full pass of the
    cyclic garbage collector, which a long-running engine makes rarely.  Each capture
    left ~16 MB of the reference engine's RSS behind (issue 20 §2), and the pass that
    finally came would free them all at once, on whatever thread it ran.  Cutting
    ``prof.profiler`` frees them here; clearing ``action_map`` frees the rest.
    """
    if prof is None:
        return True
    if isinstance(prof, SegmentedProfile):  # each of its sessions, through this function
        prof.release(pause_s)
        return True
    inner = getattr(prof, "profiler", None)
    if inner is None:
        return True
    try:
        gone = weakref.ref(inner)
    except TypeError:
        gone = None
    del inner
    try:
        prof.profiler = None
        prof.action_map = {}
    except Exception as exc:  # a torch whose profile refuses the assignment
        log.warning("profiler results not released (%s): left to the garbage collector", exc)
        return False
    if gone is not None and gone() is not None:
        log.warning("profiler results still referenced after release: left to the garbage collector")
        return False
    return True
