"""A ``vllm+http://`` target's capture through the rltperf plugin: the engine's own probe
profiles N steps in vLLM's workers (``engine_adapters/probe/vllm/core_capture.py``: no
``--profiler-config``, no restart, no server-wide stop), and this thread follows it.

The plugin announces each engine's probe (``announced.py``); the session asks that
probe for the capture over a connection of its own and posts the capture's records
(started, progress, exporting, done or failed) as they come, under the probe's capture
id.  The bundle is the engine core's: it is written where that engine's probe writes
(``RLTPERF_SNAPSHOTS`` of the server, or its working directory's ``snapshots/``), and
``CaptureDone.via`` says which path the capture took.

vLLM's own profiler (``capture.py``) stays the path for a server without the plugin, or
when asked for (``VIA_VLLM``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from engine_adapters.definitions.records import (
    CaptureDone,
    CaptureExporting,
    CaptureFailed,
    CaptureProgress,
    CaptureStarted,
    Record,
    Refused,
    SessionEvent,
    TriggerInfo,
)
from engine_adapters.monitor.base import AdapterError
from engine_adapters.monitor.tcp import ProbeAdapter, ProbeSession

log = logging.getLogger("rltperf.vllm.plugin_capture")

CAPTURE_VIA_ENV = "RLTPERF_VLLM_CAPTURE"
"""Environment variable (``vllm+http://`` adapter option ``capture_via``): which path a capture takes."""
VIA_VLLM = "vllm"
"""``capture_via`` that asks for vLLM's own profiler even where the plugin could capture."""
VIA_AUTO = "auto"
"""``capture_via`` (the default): the plugin's capture where announced, else vLLM's profiler."""
FOLLOW_TIMEOUT_S = 600.0
"""Longest a capture is followed (the engine core ends its own: idle timeout, export wait)."""
_ENDS = (CaptureDone, CaptureFailed, Refused)
_STATES = (CaptureStarted, CaptureProgress, CaptureExporting, *_ENDS)


class PluginCapture(threading.Thread):
    """One capture asked of an engine's probe (``probe``: ``HOST:PORT``), its records
    posted with ``post``; ``finished(self)`` is called when it ends, whatever the end."""

    def __init__(
        self,
        probe: str,
        post: Callable[[Record], None],
        finished: Callable[[object], None],
        token: str | None,
    ) -> None:
        super().__init__(name=f"rltperf-plugin-capture-{probe}", daemon=True)
        self.probe = probe
        self.post = post
        self.finished = finished
        self.token = token
        self.cancel = threading.Event()
        self.capture_id = ""
        self.session: ProbeSession | None = None

    def request(self, steps: int, mode: str, label: str | None, trigger: TriggerInfo | None) -> str:
        """Connect to the probe and send the request (the caller's thread); returns the
        capture id.  Raises ``AdapterError`` when the probe cannot be reached."""
        self.session = ProbeAdapter(f"tcp://{self.probe}", reconnect=False, token=self.token,
                                    client="rltperf vllm+http capture").connect()  # fmt: skip
        try:
            self.capture_id = self.session.request_capture(steps, mode, label, trigger)
        except AdapterError:
            self.session.close()
            raise
        self.start()
        return self.capture_id

    def run(self) -> None:
        cid, s = self.capture_id, self.session
        assert s is not None
        deadline = time.monotonic() + FOLLOW_TIMEOUT_S
        try:
            while not self.cancel.is_set():
                if time.monotonic() > deadline:
                    self.post(CaptureFailed(capture_id=cid, reason=(
                        f"no result from the engine's probe at {self.probe} within {FOLLOW_TIMEOUT_S:.0f} s")))  # fmt: skip
                    return
                for r in s.read(0.2):
                    if isinstance(r, _STATES) and r.capture_id == cid:
                        self.post(r)
                        if isinstance(r, _ENDS):
                            return
                    elif isinstance(r, SessionEvent) and r.state == "ended":
                        self.post(CaptureFailed(capture_id=cid, reason=(
                            f"the engine's probe at {self.probe} closed during the capture: {r.detail}")))  # fmt: skip
                        return
                if s.ended:
                    self.post(CaptureFailed(capture_id=cid, reason=(
                        f"the engine's probe at {self.probe} closed during the capture")))  # fmt: skip
                    return
        except Exception as exc:  # a bug guard: the person still gets a sentence
            log.exception("plugin capture follower crashed")
            self.post(CaptureFailed(capture_id=cid, reason=f"capture crashed: {type(exc).__name__}: {exc}"))
        finally:
            s.close()
            self.finished(self)
