"""The capture side of a ``vllm+http://`` session: whether a capture can run, and starting one.

``CaptureSide`` is mixed into ``VllmSession`` (``adapter.py``); the capture itself runs
in ``capture.HttpCapture``'s thread.  The server's trace directory comes from
``--profiler-dir`` or, for a server on this host, from the rltperf plugin's
announcement (``announced.py``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from time import perf_counter_ns as _clk
from typing import Any

from engine_adapters.definitions.ranks import rank_name
from engine_adapters.definitions.records import (
    CaptureFailed,
    EngineInfo,
    MetricsSample,
    Record,
    Refused,
    TriggerInfo,
    to_builtins,
)
from engine_adapters.monitor.base import AdapterError, new_capture_id
from engine_adapters.monitor.vllm.announced import Announcement, find_all
from engine_adapters.monitor.vllm.capture import (
    PROFILER_FLAG_HELP,
    HttpCapture,
    profile_prefix,
    validate_request,
)
from engine_adapters.monitor.vllm.capture_job import HttpCaptureJob
from engine_adapters.monitor.vllm.http import HttpClient, ServerUnreachable
from engine_adapters.monitor.vllm.metrics import ScrapeError, parse_scrape
from engine_adapters.monitor.vllm.plugin_capture import CAPTURE_VIA_ENV, VIA_VLLM, PluginCapture


class CaptureSide:
    """Capture methods of ``VllmSession`` (the attributes below are the session's)."""

    base_url: str
    http: HttpClient
    info: EngineInfo | None
    profiler_available: bool | None
    profiler_dir: str | None
    profiler_dir_source: str | None
    announcement: Announcement | None
    announcement_why: str
    last_sample: MetricsSample | None
    _capture: HttpCapture | PluginCapture | None
    _lock: threading.Lock
    capture_via: str

    engine: str | None
    post: Callable[[Record], None]
    _refresh_announcement: Callable[[], None]

    def scrape_steps(self) -> dict[str, float] | None:
        """A fresh read of the server's cumulative engine steps by engine label (every
        engine of the server: vLLM's profiler profiles them all); None when unavailable."""
        try:
            status, body = self.http.request("GET", "/metrics")
            if status != 200:
                return None
            scrape = parse_scrape(body.decode("utf-8", "replace"), _clk())
        except (ServerUnreachable, ScrapeError):
            return None
        return dict(scrape.engine_steps) if scrape.steps() is not None else None

    def server_ranks(self) -> tuple[list[str] | None, dict[int, str]]:
        """Every worker rank of the server (``dp1-tp0``...; None: unknown) and its workers'
        pids by rank name, from the plugin's announcements (one per data-parallel engine)."""
        anns, _why = find_all(self.http.host, self.http.port)
        expected: list[str] = []
        pids: dict[int, str] = {}
        for a in anns:
            w_d, r_l = a.data.get("workers"), a.data.get("ranks")
            workers: dict[str, Any] = w_d if isinstance(w_d, dict) else {}
            names: list[Any] = r_l if isinstance(r_l, list) else list(workers)
            if not names:
                return None, pids
            for w in names:
                expected.append(rank_name(a.dp_rank, str(w)))
            for w, pid in workers.items():
                if isinstance(pid, int):
                    pids[pid] = rank_name(a.dp_rank, str(w))
        return (expected or None), pids

    def plugin_probe(self) -> str | None:
        """``HOST:PORT`` of the probe that captures this target's engine in vLLM's workers
        (the rltperf plugin's announcement), or None: vLLM's profiler is the path (no
        plugin here, ``capture_via`` is ``vllm``, or the target sums several engines,
        which only vLLM's profiler captures at once)."""
        if self.capture_via == VIA_VLLM:
            return None
        if self.announcement is None:
            self._refresh_announcement()
        ann = self.announcement
        if ann is None or not ann.probe:
            return None
        if self.engine is None and len(find_all(self.http.host, self.http.port)[0]) > 1:
            return None
        return ann.probe

    def capture_blocker(self) -> str | None:
        """Why a capture cannot run here, or None."""
        if self.engine not in (None, "0"):
            return (
                f"vLLM's profiler captures every engine of the server at once: capture from the server's "
                f"engine-0 target (vllm+{self.base_url}?engine=0, or the plain vllm+{self.base_url})"
            )
        if self.profiler_available is False and self.capture_via == VIA_VLLM:
            return (
                f"the vLLM server at {self.base_url} was started without --profiler-config, so it has no "
                f"/start_profile, and {CAPTURE_VIA_ENV}={VIA_VLLM} asks for vLLM's profiler (unset it to capture "
                f"through the rltperf plugin), or restart it with {PROFILER_FLAG_HELP}"
            )
        if self.profiler_available is False:
            return (
                f"the vLLM server at {self.base_url} was started without --profiler-config, so it has no "
                "/start_profile, and no rltperf plugin probe of this engine was found to capture in its workers "
                f"({self.announcement_why or 'none announced'}): install rltperf in the server's environment and "
                f"set RLTPERF_PROBE (no restart of a running server helps otherwise), or restart it with "
                f"{PROFILER_FLAG_HELP}"
            )
        if not self.profiler_dir:
            self._refresh_announcement()
        ann = self.announcement
        if not self.profiler_dir:
            if ann is not None:
                return (
                    f"the rltperf plugin in the server at {self.base_url} says it was started without "
                    f"--profiler-config; restart it with {PROFILER_FLAG_HELP}"
                )
            return (
                "rltperf needs the server's trace directory to gather the capture: pass --profiler-dir DIR "
                "(the torch_profiler_dir of the server's --profiler-config, as seen from this host); "
                f"it is found by itself for a server on this host with the rltperf plugin ({self.announcement_why})"
            )
        if not os.path.isdir(self.profiler_dir):
            given = (
                "--profiler-dir"
                if self.profiler_dir_source == "--profiler-dir"
                else "the server's torch_profiler_dir"
            )
            return (
                f"{given} {self.profiler_dir} is not a directory on this host: rltperf gathers vLLM's "
                "traces from the server's torch_profiler_dir (same host or a shared mount; --profiler-dir "
                "names where this host sees it)"
            )
        return None

    def _live(self) -> dict[str, Any]:
        s = self.last_sample
        if s is None or s.interval_s <= 0:
            return {}
        return {
            "source": s.source,
            "interval_s": round(s.interval_s, 3),
            "tokens_per_s": round(s.generation_tokens / s.interval_s, 3),
            "steps_per_s": round(s.steps / s.interval_s, 3),
            "running": s.running,
            "waiting": s.waiting,
            "kv_usage": s.kv_usage,
        }

    def capture_finished(self, cap: object) -> None:
        """The capture thread ``cap`` is done: another capture may start."""
        with self._lock:
            if self._capture is cap:
                self._capture = None

    def request_capture(
        self, steps: int, mode: str = "ops", label: str | None = None, trigger: TriggerInfo | None = None
    ) -> str:
        cid = new_capture_id()
        bad = validate_request(steps, mode, cid)
        if bad:
            self.post(Refused(reason=bad, capture_id=cid))
            return cid
        with self._lock:
            running = self._capture
            if running is not None:
                what = (f"{running.capture_id}: in the engine's workers" if isinstance(running, PluginCapture)
                        else f"{running.job.capture_id}: {running.job.state}")  # fmt: skip
                self.post(Refused(
                    reason=f"a capture is already running ({what}); one at a time",
                    capture_id=cid,
                ))  # fmt: skip
                return cid
            from engine_adapters.definitions.bundle import sanitize_label

            lab = sanitize_label(label)
            job = HttpCaptureJob(
                capture_id=cid, steps=steps, mode=mode, label=lab, prefix=profile_prefix(cid, lab),
                requested_ns=_clk(), live_at_trigger=self._live(),
                trigger=to_builtins(trigger) if trigger is not None else None,
            )  # fmt: skip
            probe = self.plugin_probe()
            if probe is not None:
                plug = PluginCapture(probe, self.post, self.capture_finished, os.environ.get("RLTPERF_TOKEN"))
                try:
                    pid = plug.request(steps, mode, lab or None, trigger)
                except AdapterError as exc:
                    if not self.profiler_available:
                        self.post(CaptureFailed(capture_id=cid, reason=(
                            f"the rltperf plugin's probe of this engine ({probe}) did not take the capture: {exc}")))  # fmt: skip
                        return cid
                else:
                    self._capture = plug
                    return pid
            cap = HttpCapture(self, job)  # type: ignore[arg-type]  # the VllmSession is a CaptureHost
            self._capture = cap
        cap.start()
        return cid
