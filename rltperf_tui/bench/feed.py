"""What the capture benches read: the plugin's or probe's records of one session, and the
limit a capture's steps and gaps are held to.  Used by ``capture.py`` and
``capture_vllm.py`` (and the tests that hold captures to the same limit)."""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

LIMIT_FACTOR, LIMIT_MS = 3.0, 20.0
"""A step or gap over LIMIT_FACTOR × the median unprofiled step + LIMIT_MS is a stall."""


def unprofiled_steps_ms(steps: list[Any], before_ns: int, keep: int = 400) -> list[float]:
    """Times (ms) of the last ``keep`` steps before ``before_ns`` that no capture, export
    or warm-up touched: the baseline a capture's steps are compared with."""
    from engine_adapters.definitions.records import FLAG_EXPORTING, FLAG_PROFILED, FLAG_WARMUP

    return [
        (r.end_ns - r.start_ns) / 1e6
        for r in steps
        if r.end_ns < before_ns and not r.flags & (FLAG_PROFILED | FLAG_EXPORTING | FLAG_WARMUP)
    ][-keep:]


def unprofiled_median_ms(steps: list[Any], before_ns: int) -> float | None:
    """Median of ``unprofiled_steps_ms`` (None: no such step)."""
    base = unprofiled_steps_ms(steps, before_ns)
    return statistics.median(base) if base else None


def limit_ms(median_ms: float | None) -> float | None:
    """The stall limit for a median unprofiled step of ``median_ms``."""
    return LIMIT_FACTOR * median_ms + LIMIT_MS if median_ms is not None else None


class Feed:
    """The session's records: step history, latest RSS, and the replies to one capture."""

    def __init__(self, session: Any, pid: int | None) -> None:
        self.session = session
        self.pid = pid
        self.history: list[Any] = []
        self.rss: int | None = None

    def read(self, seconds: float, until: Any = None) -> Any:
        """Read for ``seconds`` (or until ``until(record)`` is true); the matching record.

        The batch the matching record came in is kept whole: the step records after it in
        that batch are history too (dropping them left a hole that read as a stall of the
        engine right after a capture's answer)."""
        from engine_adapters.definitions.records import DeviceSample, StepRecord

        end = time.monotonic() + seconds
        found = None
        while found is None and time.monotonic() < end:
            for r in self.session.read(min(0.2, max(0.01, end - time.monotonic()))):
                if isinstance(r, StepRecord):
                    self.history.append(r)
                elif isinstance(r, DeviceSample) and r.proc_rss:
                    self.rss = r.proc_rss
                elif found is None and until is not None and until(r):
                    found = r
        return found

    def rss_bytes(self) -> int | None:
        """The engine's resident memory now: /proc when local, else the probe's last sample."""
        if self.pid is not None:
            try:
                with open(f"/proc/{self.pid}/statm", encoding="ascii") as f:
                    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            except OSError:
                pass
        return self.rss

    def capture(self, mode: str, steps: int, after_s: float = 1.0) -> tuple[Any, int]:
        """One capture; (its reply, or None after 300 s; client send time).  Then
        ``after_s`` more of the stream: the steps that overlap the export's end."""
        from engine_adapters.definitions.records import CaptureDone, CaptureFailed, Refused

        t_send = time.perf_counter_ns()
        cid = self.session.request_capture(steps, mode, "bench")
        result = self.read(
            300,  # a low-priority export child on a busy box is slow
            lambda r: (
                isinstance(r, (CaptureDone, CaptureFailed, Refused)) and getattr(r, "capture_id", None) == cid
            ),
        )
        self.read(after_s)  # the steps that overlap the export's end arrive a little later
        return result, t_send
