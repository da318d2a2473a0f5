"""How long the monitor itself waited for a CPU: its own lateness, not the engine's.

On a server whose cores the engine keeps busy, the monitor is one more runnable process
among the engine's.  Beside a vLLM server loading both cores of a 2-core machine,
``rltperf attach`` waited 0.3-1.5 s for a core in its first seconds (``schedstat``),
and a new login's monitor more: its figures come late although nothing is wrong with
them (they are reckoned on the engine's clock).  The screen says so rather than look
slow or stuck.

The figure: the seconds the monitor's main thread (the one that draws) spent runnable
but not running, over the last ``WAIT_SPAN_S`` seconds: the second field of Linux's
``/proc/self/schedstat``, the thread-group leader's (the scheduler's own accounting, ns).  For a thread
that never sleeps, wall time = its CPU time + this wait (``test_own_wait`` holds it to
that).  None where the file does not exist (not Linux, or schedstat compiled out).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

WAIT_SPAN_S = 10.0
"""The span the wait is summed over (the default statistics window)."""
SHOW_WAIT_S = 0.5
"""The wait over the span from which the screen mentions it (5 % of the span: a busy
machine's ordinary wake-up latency is a few ms a second)."""
SHOWN_EVERY_S = 1.0
"""``shown`` reads the counter at most once a second and answers as before in between:
the figure is to 0.1 s over a 10 s span, and the status bar asks at every render tick
(2 Hz), also on a screen where nothing else changed (a ``/metrics`` target's ticks
between its once-a-second scrapes: the bar's tick cost ~180 µs there, read by wrappers
on the thread's CPU clock beside a loaded vLLM server, 2026-12-08)."""


def main_thread_wait_s(path: str = "/proc/self/schedstat") -> float | None:
    """Seconds this process's main thread has waited on a run queue so far (None: not
    available).  ``/proc/self/schedstat`` is the thread-group leader's: the main thread."""
    try:
        with open(path) as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class OwnWait:
    """The monitor's wait for a CPU over the last ``span_s`` seconds, from samples taken
    at each render tick (``sample``)."""

    def __init__(
        self,
        span_s: float = WAIT_SPAN_S,
        read: Callable[[], float | None] = main_thread_wait_s,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.span_s = span_s
        self._read = read
        self._clock = clock
        # The counter counts from the thread's start: as the span's first sample, zero now.
        # A monitor started on a loaded machine then says how long its start waited (the
        # bar exists from the process's first second): 2 s of its first 8 s, seen in tmux
        # beside three busy processes on its core.
        self._samples: deque[tuple[float, float]] = deque([(clock(), 0.0)])
        self._shown: tuple[float, float | None] | None = None
        """(when, what) ``shown`` last answered after reading the counter."""

    def sample(self) -> float | None:
        """Read the counter now; the wait over the last ``span_s`` seconds (or since the
        first sample, when that is more recent), None when the counter cannot be read."""
        v = self._read()
        if v is None:
            return None
        now = self._clock()
        s = self._samples
        s.append((now, v))
        # keep the newest sample at least span_s old, as the span's start
        while len(s) > 2 and s[1][0] <= now - self.span_s:
            s.popleft()
        return v - s[0][1]

    def shown(self) -> float | None:
        """``sample()`` to 0.1 s (the bar repaints only when its text changes), when it is
        worth a word on screen (``SHOW_WAIT_S`` or more); else None.  At most one reading
        each ``SHOWN_EVERY_S``: in between, the last answer."""
        now = self._clock()
        last = self._shown
        if last is not None and 0.0 <= now - last[0] < SHOWN_EVERY_S:
            return last[1]
        w = self.sample()
        answer = round(w, 1) if w is not None and w >= SHOW_WAIT_S else None
        self._shown = (now, answer)
        return answer
