"""The monitor without a screen: one JSON object per target per refresh, one per line.

``rltperf attach … --jsonl`` and ``rltperf record … --jsonl FILE|-`` stream what the
screen shows as JSON lines, for scripts.  Each object is ``summary --json``'s object
(``rltperf_tui.analysis.summary.summarize``, called here, so the keys are the same by
construction) over the last ``--window`` seconds, plus ``target``, ``timestamp`` (UTC,
ISO 8601), ``state`` (connected, reconnecting, ended) and, on a target's last object,
``reason`` (why it ended).

Every line is flushed as it is written.  A reader that leaves (``| head -3``) ends the
stream quietly (exit 0); Ctrl-C, SIGTERM or SIGHUP writes each target's last object
(reason "interrupted") and exits 0 (``stop_signals``); when every target has gone away (engine stopped, server
lost; without ``--wait``) the last objects say why and the exit status is
``EXIT_TARGETS_ENDED``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import IO, Any

from rltperf_tui.analysis.summary import summarize
from rltperf_tui.commands.stop_signals import on_stop_signals, raise_interrupt
from rltperf_tui.live.driver import LiveTarget

EXIT_TARGETS_ENDED = 1
"""Exit status when every target went away (each one's last object says why)."""
EXTRA_KEYS = ("target", "timestamp", "state", "reason")
"""Keys a stream object has beyond ``summary --json``'s (``reason``: last object only)."""
READ_S = 0.05
"""Longest single blocking read of one session."""


def _finite(v: Any) -> Any:
    """NaN and infinities become null: the stream is strict JSON."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class LineWriter:
    """JSON lines to a text stream, each flushed; ``closed`` once the reader left."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.closed = False
        self.lines = 0

    def write(self, obj: dict[str, Any]) -> bool:
        """Write one object; False when the reader has gone (a closed pipe)."""
        if self.closed:
            return False
        try:
            self.stream.write(json.dumps(_finite(obj), separators=(",", ":")) + "\n")
            self.stream.flush()
        except (BrokenPipeError, ValueError):  # ValueError: the stream was closed
            self._reader_left()
            return False
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.EIO):  # EIO: a terminal that hung up
                raise
            self._reader_left()
            return False
        self.lines += 1
        return True

    def _reader_left(self) -> None:
        self.closed = True
        # Python flushes stdout again at exit; point it at /dev/null so that flush has
        # nowhere to fail ("Exception ignored ... BrokenPipeError" otherwise).
        with contextlib.suppress(OSError, ValueError, AttributeError):
            if self.stream is sys.stdout:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


class Stream:
    """Targets read in turn (each a ``LiveTarget``: its recording, if one runs, is written
    as it is read); every ``1 / refresh_hz`` seconds an object per target."""

    def __init__(
        self,
        targets: Sequence[LiveTarget],
        out: LineWriter,
        *,
        window_s: float = 10.0,
        refresh_hz: float = 2.0,
        slo_ttft_ms: float | None = None,
        slo_tpot_ms: float | None = None,
    ) -> None:
        self.targets = list(targets)
        self.out = out
        self.window_s = window_s
        self.period = 1.0 / refresh_hz
        self.slo = (slo_ttft_ms, slo_tpot_ms)

    def object_for(self, t: LiveTarget, reason: str | None = None) -> dict[str, Any]:
        """The stream object of one target now (``summary --json``'s keys + ``EXTRA_KEYS``)."""
        summary = summarize(t.stats, self.slo[0], self.slo[1], window_s=self.window_s)
        head: dict[str, Any] = {"target": t.target, "timestamp": _utc_now(), "state": t.stats.state}
        if reason is not None:
            head["state"] = "ended"
            head["reason"] = reason
        return {**head, **summary}

    def run(self, duration: float | None = None, is_done: Callable[[], bool] | None = None) -> int:
        """Stream until ``duration``, the reader leaves, Ctrl-C/SIGTERM/SIGHUP, or every target
        ended; returns the exit status (0, or ``EXIT_TARGETS_ENDED``)."""
        t0 = time.monotonic()
        next_tick = t0 + self.period
        with on_stop_signals(raise_interrupt):  # kill, timeout or a hang-up: as Ctrl-C
            return self._run(t0, next_tick, duration, is_done)

    def _run(
        self, t0: float, next_tick: float, duration: float | None, is_done: Callable[[], bool] | None
    ) -> int:
        try:
            while True:
                live = [t for t in self.targets if not t.ended]
                now = time.monotonic()
                each = max(0.005, min(READ_S, (next_tick - now) / max(1, len(live))))
                for t in self.targets:
                    if t.ended:
                        continue
                    t.poll(each)
                    if t.ended and not self.out.write(self.object_for(t, t.end_reason)):
                        return 0
                if all(t.ended for t in self.targets):
                    return EXIT_TARGETS_ENDED
                now = time.monotonic()
                if now >= next_tick:
                    for t in self.targets:
                        if not t.ended and not self.out.write(self.object_for(t)):
                            return 0
                    next_tick += self.period
                    if next_tick < now:
                        next_tick = now + self.period
                if (duration is not None and now - t0 >= duration) or (is_done is not None and is_done()):
                    return 0
        except KeyboardInterrupt:
            for t in self.targets:
                if not t.ended and not self.out.write(self.object_for(t, "interrupted")):
                    break
            return 0

    def close(self) -> None:
        """Stop each target's recording and close its session."""
        for t in self.targets:
            t.stop_recording()
            if t.session is not None:
                with contextlib.suppress(Exception):
                    t.session.close()


__all__ = ["EXIT_TARGETS_ENDED", "EXTRA_KEYS", "LineWriter", "Stream"]
