"""Replay adapter: a recording file played back as a session, with pause and speed."""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any, ClassVar

from engine_adapters.definitions.records import (
    DeviceSample,
    EngineInfo,
    Hello,
    MetricsSample,
    Record,
    RequestRecord,
    SessionEvent,
    Stats,
    StepRecord,
)
from engine_adapters.monitor.base import (
    Adapter,
    AdapterConnectionError,
    AdapterTargetError,
    ReplayControl,
    Session,
)
from engine_adapters.monitor.recording import SUFFIX, RecordingError, RecordingReader


def record_time(rec: Record) -> int | None:
    """The data time of a record (monotonic ns), or None for records without one."""
    if isinstance(rec, StepRecord):
        return rec.end_ns
    if isinstance(rec, RequestRecord):
        return rec.finish_ns
    if isinstance(rec, (DeviceSample, Stats, MetricsSample)):
        return rec.ts_ns
    return None


class ReplaySession(Session, ReplayControl):
    """Plays a recording.  ``speed`` 1.0 = real time, 0 = as fast as it can be read."""

    def __init__(self, path: str, speed: float = 1.0, loop: bool = False) -> None:
        self.target = path
        self.path = path
        self.loop = loop
        self._speed = max(0.0, float(speed))
        self._lock = threading.Lock()
        self._paused = False
        self._ended = False
        self._reader = RecordingReader(path)
        self.header = self._reader.header
        self._iter: Iterator[list[Record]] = self._reader.chunks()
        self._buf: deque[Record] = deque()
        self.info: EngineInfo | None = None
        self._t0_data: int | None = None  # data time at replay start
        self._t0_wall = 0.0
        self._pause_wall: float | None = None
        self.position_ns: int | None = None
        self.start_ns: int | None = None
        """Data time where the recording starts (its earliest timed record)."""
        self.length_ns: int | None = None
        """Data time the recording spans; None until the background scan has read it."""
        self._lo_ns: int | None = None
        self._hi_ns: int | None = None
        self._sent_open = False
        threading.Thread(target=self._measure, name="rltperf-replay-length", daemon=True).start()

    def _measure(self) -> None:
        """Read the recording once on the side for its span (files have no index): a
        daemon thread, so a long file never delays the replay or quitting."""
        lo = hi = None
        try:
            with RecordingReader(self.path) as reader:
                for rec in reader.records():
                    t = record_time(rec)
                    if t is None:
                        continue
                    if lo is None or t < lo:
                        lo = t
                    if hi is None or t > hi:
                        hi = t
        except (RecordingError, OSError):
            return
        if lo is not None and hi is not None:
            self.start_ns = lo
            self.length_ns = hi - lo
        else:
            self.length_ns = 0

    def elapsed_ns(self) -> int:
        """How far into the recording the replay is (data time since its start)."""
        if self.position_ns is None or self.start_ns is None:
            return 0
        if self._ended and self.length_ns is not None:
            return self.length_ns
        pos = self.position_ns - self.start_ns
        if self.length_ns is not None:
            pos = min(pos, self.length_ns)
        return max(0, pos)

    # -- controls --------------------------------------------------------------------------

    @property
    def speed(self) -> float:
        """Playback speed (1.0 real time; 0 as fast as possible)."""
        return self._speed

    def set_speed(self, speed: float) -> None:
        """Change speed without jumping: the clock re-anchors at the current position."""
        with self._lock:
            self._reanchor()
            self._speed = max(0.0, float(speed))

    @property
    def paused(self) -> bool:
        """Whether playback is paused."""
        return self._paused

    def toggle_pause(self) -> bool:
        """Pause or resume; returns the new paused state."""
        with self._lock:
            if self._paused:
                if self._pause_wall is not None:
                    self._t0_wall += time.monotonic() - self._pause_wall
                self._pause_wall = None
                self._paused = False
            else:
                self._pause_wall = time.monotonic()
                self._paused = True
            return self._paused

    def _reanchor(self) -> None:
        if self.position_ns is not None and self._t0_data is not None:
            self._t0_data = self.position_ns
            self._t0_wall = time.monotonic()

    def _clock_data_ns(self) -> float:
        """The data time the replay clock has reached."""
        if self._t0_data is None:
            return float("-inf")
        if self._speed == 0:
            return float("inf")
        now = self._pause_wall if self._paused and self._pause_wall is not None else time.monotonic()
        return self._t0_data + (now - self._t0_wall) * 1e9 * self._speed

    # -- Session ---------------------------------------------------------------------------

    def _fill(self) -> bool:
        if self._buf:
            return True
        for chunk in self._iter:
            self._buf.extend(chunk)
            return True
        return False

    def read(self, timeout: float) -> list[Record]:
        out: list[Record] = []
        if not self._sent_open:
            self._sent_open = True
            out.append(SessionEvent(state="connected", detail=f"replaying {os.path.basename(self.path)}"))
        if self._ended:
            time.sleep(min(timeout, 0.05))
            return out
        deadline = time.monotonic() + timeout
        limit = 20000  # bound one batch
        while len(out) < limit:
            if not self._fill():
                if self.loop:
                    self._restart()
                    continue
                self._ended = True
                if self._lo_ns is not None and self._hi_ns is not None:  # read it all: the span is known
                    self.start_ns, self.length_ns = self._lo_ns, self._hi_ns - self._lo_ns
                detail = "end of recording"
                if self._reader.warning:
                    detail += f" (damaged: {self._reader.warning})"
                out.append(SessionEvent(state="ended", detail=detail))
                break
            rec = self._buf[0]
            t = record_time(rec)
            with self._lock:
                if t is not None and self._t0_data is None:
                    self._t0_data = t
                    self._t0_wall = time.monotonic()
                clock = self._clock_data_ns()
            if t is not None and t > clock:
                if out:
                    break
                wait = min(deadline - time.monotonic(), (t - clock) / 1e9 / max(self._speed, 1e-9))
                if self._paused:
                    wait = deadline - time.monotonic()
                if wait > 0:
                    time.sleep(min(wait, 0.05))
                if time.monotonic() >= deadline:
                    break
                continue
            self._buf.popleft()
            if isinstance(rec, Hello):
                self.info = rec.engine
            if t is not None:
                self.position_ns = t
                if self.start_ns is None:
                    self.start_ns = t
                self._lo_ns = t if self._lo_ns is None else min(self._lo_ns, t)
                self._hi_ns = t if self._hi_ns is None else max(self._hi_ns, t)
            out.append(rec)
        return out

    def _restart(self) -> None:
        self._reader.close()
        self._reader = RecordingReader(self.path)
        self._iter = self._reader.chunks()
        self._t0_data = None

    def close(self) -> None:
        self._ended = True
        self._reader.close()

    @property
    def ended(self) -> bool:
        return self._ended


class ReplayAdapter(Adapter):
    """A recording file (``.rltrec``): the same screen over recorded data."""

    NAME: ClassVar[str] = "replay"
    SCHEMES: ClassVar[tuple[str, ...]] = ("replay://", "file://")
    SUFFIXES: ClassVar[tuple[str, ...]] = (SUFFIX,)
    TARGET_FORM: ClassVar[str] = "a recording file"
    IS_LIVE: ClassVar[bool] = False
    DESCRIPTION: ClassVar[str] = "a recording made by `rltperf record` or the `r` key"

    def __init__(self, target: str, **options: Any) -> None:
        super().__init__(target, **options)
        path = target
        for s in self.SCHEMES:
            if path.startswith(s):
                path = path[len(s) :]
        if not path:
            raise AdapterTargetError("replay needs a file path")
        self.path = path
        self.speed = float(options.get("speed", 1.0))
        self.loop = bool(options.get("loop", False))

    @classmethod
    def accepts(cls, target: str) -> bool:
        """A ``replay://`` or ``file://`` target, or any existing path without a scheme
        (a recording is known by its header, not its name; a missing ``x.rltrec`` is
        refused here so that the registry says it is neither a target nor a file)."""
        if cls.scheme_of(target) is not None:
            return True
        return "://" not in target and os.path.exists(target)

    def connect(self) -> ReplaySession:
        try:
            return ReplaySession(self.path, speed=self.speed, loop=self.loop)
        except RecordingError as exc:
            raise AdapterConnectionError(str(exc)) from None
