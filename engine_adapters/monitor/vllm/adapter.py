"""``vllm+http://host:port``: a live view of an unmodified vLLM server through its HTTP API.

The session scrapes ``/metrics`` at a steady interval (default 1 s) in one thread on one
keep-alive connection (``http.KeptConnection``; polls never overlap, the loop does not
drift: ``next += interval``) and turns each pair of scrapes into a ``MetricsSample``:
tokens, requests and engine steps gained, the queue and KV gauges, vLLM's byte/FLOP
estimates (``--enable-mfu-metrics``) and the latency histograms' new observations
(percentiles from them are histogram estimates).  It starts with a ``Hello`` whose
``EngineInfo`` comes from ``/version``, ``/v1/models`` and ``vllm:cache_config_info``.  It
invents no steps or requests: per-step timing needs the rltperf vLLM plugin
(``RLTPERF_PROBE``), attached with ``tcp://``.

Captures: on a server with the rltperf plugin (announced on this host), the engine's own
probe profiles N steps in vLLM's workers (``plugin_capture.py``: no ``--profiler-config``,
no restart); otherwise vLLM's own profiler (``capture.py``: ``/start_profile``).

``vllm+http://HOST:PORT?engine=N`` watches one engine of a data-parallel server (its
``engine``-labelled series only; ``engines.py``): one replica each, as separate servers.

Options: ``interval`` (s, default 1), ``profiler_dir`` (the server's
``torch_profiler_dir`` as seen from this host), ``snapshot_root`` (default
``snapshots``), ``loop_count`` (a looped model's passes, to correct vLLM's byte
estimate; default ``$RLTPERF_LOOP_COUNT``, else read from a local model's config.json),
``reconnect`` (default True), ``timeout`` (s per request, default 10; three timed-out
scrapes in a row count as a lost server), ``capture_via`` (``auto``: the plugin's capture
where announced, else vLLM's profiler; ``vllm``: vLLM's profiler; default
``$RLTPERF_VLLM_CAPTURE``, else ``auto``).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from time import perf_counter_ns as _clk
from typing import Any, ClassVar

import msgspec

from engine_adapters.definitions.records import (
    SCHEMA_VERSION,
    EngineInfo,
    Hello,
    MetricsSample,
    Record,
    SessionEvent,
)
from engine_adapters.monitor.base import (
    Adapter,
    AdapterConnectionError,
    AdapterTargetError,
    Reconnecting,
    Session,
)
from engine_adapters.monitor.vllm.announced import Announcement, find_all, merge
from engine_adapters.monitor.vllm.capture import (
    HttpCapture,
)
from engine_adapters.monitor.vllm.engines import ALL, split_target
from engine_adapters.monitor.vllm.http import HttpClient, ServerUnreachable
from engine_adapters.monitor.vllm.info import build_info, local_ceiling, loop_count_from, read_model_config
from engine_adapters.monitor.vllm.metrics import (
    CACHE_INFO,
    LmHead,
    MfuState,
    Scrape,
    ScrapeError,
    counters_went_back,
    derive,
    lm_head_from,
    parse_scrape,
)
from engine_adapters.monitor.vllm.plugin_capture import CAPTURE_VIA_ENV, VIA_AUTO, VIA_VLLM, PluginCapture
from engine_adapters.monitor.vllm.session_capture import CaptureSide

DEFAULT_INTERVAL_S = 1.0
BACKOFF_S = (0.5, 1.0, 2.0, 3.0)
SLOW_POLLS_BEFORE_LOST = 3
"""Consecutive /metrics timeouts before the server counts as lost (one slow answer does not)."""
ANNOUNCE_POLLS = 30
"""Polls after connecting during which a missing plugin announcement is looked for again."""
QUEUE_MAX = 4096
CLOSE_WAIT_S = 0.2
"""Longest ``close()`` waits for a capture thread, and for sending its ``/stop_profile``."""
_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]", "0.0.0.0")


class VllmSession(CaptureSide, Session):
    """A live session on one vLLM server (see the module docstring)."""

    def __init__(self, adapter: VllmAdapter) -> None:
        self.target = adapter.target
        self.adapter = adapter
        self.base_url = adapter.base_url
        self.engine: str | None = adapter.engine
        """The engine label this session keeps (None: the sum over the server's engines)."""
        self.http = HttpClient(adapter.base_url, timeout=adapter.timeout)
        self._scrapes = self.http.kept()  # the poll thread's own /metrics connection
        self.interval = adapter.interval
        self.profiler_dir: str | None = adapter.profiler_dir
        self.profiler_dir_source = "--profiler-dir" if adapter.profiler_dir else None
        self.announcement: Announcement | None = None
        """The rltperf plugin's announcement of this server (same host only), if any."""
        self.announcement_why = ""
        self.snapshot_root = os.path.abspath(adapter.snapshot_root)
        self.reconnect = adapter.reconnect
        self.capture_via = adapter.capture_via
        self.info: EngineInfo | None = None
        self.hello: Hello | None = None
        self.profiler_available: bool | None = None
        self.loop_count: int | None = adapter.loop_count
        self.loop_known = adapter.loop_count is not None
        self.adapter_loop_given = adapter.loop_count is not None
        self.last_sample: MetricsSample | None = None
        self.head: LmHead | None = None
        """The model's LM head (from a local config.json), for the looped-model correction."""
        self._q: queue.Queue[Record] = queue.Queue(QUEUE_MAX)
        self._dropped = 0
        self._stop = threading.Event()
        self._prev: Scrape | None = None
        self._mfu = MfuState()
        self._state = "connecting"
        self._ended = False
        self._lock = threading.Lock()
        self._capture: HttpCapture | PluginCapture | None = None
        self._thread: threading.Thread | None = None
        self._slow = 0
        self._last_error = ""
        self.polls = 0
        self.poll_errors = 0
        self.last_poll_s = 0.0

    # -- connection and metadata ---------------------------------------------------------------

    def open(self) -> None:
        """Reach the server, learn its metadata and take the first scrape (raises
        ``AdapterConnectionError``); then start the polling thread."""
        try:
            first = self._connect_once()
        except ServerUnreachable as exc:
            raise AdapterConnectionError(str(exc)) from None
        self._post(
            SessionEvent(state="connected", detail=f"connected to vLLM at {self.base_url}", ts_ns=_clk())
        )
        assert self.hello is not None
        self._post(self.hello)
        self._prev = first
        self._state = "connected"
        self._start_thread()

    def open_in_background(self) -> None:
        """Start the polling thread without a first connection: it connects (and retries,
        saying why in a ``SessionEvent``) by itself, so the caller never waits on the network."""
        self._state = "reconnecting"
        self._start_thread()

    def _start_thread(self) -> None:
        self._thread = threading.Thread(target=self._poll_loop, name="rltperf-vllm-poll", daemon=True)
        self._thread.start()

    def _connect_once(self) -> Scrape:
        status, body = self.http.request("GET", "/metrics")
        if status != 200:
            raise ServerUnreachable(
                f"{self.base_url}/metrics answered HTTP {status}: is this a vLLM server (and the right port)?"
            )
        try:
            scrape = parse_scrape(body.decode("utf-8", "replace"), _clk(), self.engine)
        except ScrapeError as exc:
            raise ServerUnreachable(f"{self.base_url}/metrics: {exc}") from None
        if self.engine is not None and self.engine not in scrape.engines:
            raise ServerUnreachable(
                f"{self.base_url}/metrics has no series labelled engine={self.engine!r}: the server's engines "
                "are those of its --data-parallel-size (engine=0, 1, ...)"
            )
        if not scrape.has_vllm:
            raise ServerUnreachable(
                f"{self.base_url}/metrics has no vllm:* metrics: this is not a vLLM server "
                "(or it runs with --disable-log-stats)"
            )
        version = None
        v = self.http.get_json("/version")
        if isinstance(v, dict):
            version = v.get("version")
        models_doc = self.http.get_json("/v1/models")
        models = models_doc.get("data", []) if isinstance(models_doc, dict) else []
        root = models[0].get("root") if models else None
        local = self.http.host in _LOOPBACK
        config = read_model_config(root) if local else None
        self.head = lm_head_from(config)
        loop_source = "given to rltperf"
        if self.loop_count is None or not self.adapter_loop_given:
            found = loop_count_from(config)
            self.loop_count = found
            self.loop_known = found is not None
            loop_source = f"from {root}/config.json"
        info = build_info(
            self.base_url,
            version,
            models,
            scrape.info.get(CACHE_INFO),
            self.loop_count,
            config,
            local,
            loop_source,
        )
        if self.engine is not None:  # the engine label is vLLM's DP rank of that engine
            info = msgspec.structs.replace(
                info, dp_rank=int(self.engine), contract={**info.contract, "engine_label": self.engine}
            )
        info = self._announced(info)
        self.profiler_available = self._has_profiler_routes()
        caps = ["metrics"]
        if self.profiler_available is not False:
            caps.append("capture")
        self.info = info
        self.hello = Hello(
            schema=SCHEMA_VERSION,
            engine=info,
            stage_names=[],
            probe_version="",
            wall_minus_mono_ns=time.time_ns() - _clk(),
            ceiling=local_ceiling() if local else None,
            started_ns=_clk(),
            capabilities=caps,
        )
        return scrape

    def _announced(self, info: EngineInfo) -> EngineInfo:
        """``info`` completed by the rltperf plugin's announcement of this server, whose
        profiler directory is used unless ``--profiler-dir`` was given (``announced.py``)."""
        anns, self.announcement_why = find_all(self.http.host, self.http.port)
        ann = anns[0] if anns else None
        if self.engine is not None:  # this engine's own announcement
            ann = next((a for a in anns if str(a.dp_rank) == self.engine), None)
            if ann is None and anns:
                self.announcement_why = f"no announcement of engine {self.engine} among {len(anns)}"
        self.announcement = ann
        if ann is None:
            return info
        if not self.adapter.profiler_dir:
            self.profiler_dir = ann.profiler_dir
            self.profiler_dir_source = ann.source() if ann.profiler_dir else None
        if not self.loop_known and "max_loops" in ann.engine:  # config.json not readable here
            self.loop_count = int(ann.engine["max_loops"] or 1)
            self.loop_known = True
        if self.engine is None and len(anns) > 1:  # the sum over engines: no one engine's identity
            info = msgspec.structs.replace(info, contract={
                **info.contract, "engines": f"{len(anns)} data-parallel engines, summed (?engine=N: one of them)"})  # fmt: skip
            return merge(info, ann, identity=False, others=anns[1:])
        return merge(info, ann)

    def _refresh_announcement(self) -> None:
        """Look again for the plugin's announcement (written when the engine's loop starts,
        which may follow the first answers); when it appears, say so with a new ``Hello``."""
        if self.announcement is not None or self.info is None or self.hello is None:
            return
        info = self._announced(self.info)
        if self.announcement is not None:
            self.info = info
            self.hello = msgspec.structs.replace(self.hello, engine=info)
            self._post(self.hello)

    def _has_profiler_routes(self) -> bool | None:
        """Whether the server serves /start_profile (from its OpenAPI schema; None: unknown)."""
        try:
            doc = self.http.get_json("/openapi.json")
        except ServerUnreachable:
            return None
        if not isinstance(doc, dict) or not isinstance(doc.get("paths"), dict):
            return None
        return "/start_profile" in doc["paths"]

    # -- polling thread ------------------------------------------------------------------------

    def post(self, rec: Record) -> None:
        """Queue a record for ``read()`` (the capture thread reports through this)."""
        self._post(rec)

    def _post(self, rec: Record) -> None:
        try:
            self._q.put_nowait(rec)
        except queue.Full:  # the reader stalled: drop the oldest sample, never block the poller
            try:
                self._q.get_nowait()
                self._dropped += 1
            except queue.Empty:
                pass
            try:
                self._q.put_nowait(rec)
            except queue.Full:
                self._dropped += 1

    def _poll_loop(self) -> None:
        # a session opened in the background connects at once
        nxt = time.monotonic() + (0.0 if self._state == "reconnecting" else self.interval)
        attempt = 0
        while not self._stop.is_set():
            delay = nxt - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                break
            t0 = time.monotonic()
            if self._state == "reconnecting":
                ok = self._try_reconnect()
                if not ok:
                    attempt += 1
                    nxt = time.monotonic() + BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]
                    continue
                attempt = 0
            else:
                self._poll_once()
            self.last_poll_s = time.monotonic() - t0
            # next += interval keeps the phase; a scrape that overran skips the missed ticks
            nxt += self.interval
            now = time.monotonic()
            if nxt < now:
                nxt += ((now - nxt) // self.interval + 1) * self.interval
        self._scrapes.close()

    def _poll_once(self) -> None:
        self.polls += 1
        try:
            status, body = self._scrapes.get("/metrics")
            if status != 200:
                raise ServerUnreachable(f"{self.base_url}/metrics answered HTTP {status}")
            cur = parse_scrape(body.decode("utf-8", "replace"), _clk(), self.engine)
        except (ServerUnreachable, ScrapeError) as exc:
            self.poll_errors += 1
            if isinstance(exc, ServerUnreachable) and exc.timed_out:
                # A busy server answers /metrics late; that is not a lost server.  The next
                # sample simply spans the longer interval.
                self._slow += 1
                if self._slow < SLOW_POLLS_BEFORE_LOST:
                    return
            self._lost(str(exc))
            return
        self._slow = 0
        prev = self._prev
        self._prev = cur
        if prev is None:
            return
        if counters_went_back(prev, cur):  # restarted between two scrapes: learn it anew
            self._mfu = MfuState()
            self._post(SessionEvent(state="connected", ts_ns=_clk(),
                                    detail="the vLLM server's counters went back: it restarted; figures start anew"))  # fmt: skip
            try:
                self._prev = self._connect_once()
                assert self.hello is not None
                self._post(self.hello)
            except ServerUnreachable as exc:
                self._lost(str(exc))
            return
        if self.polls <= ANNOUNCE_POLLS:
            self._refresh_announcement()
        sample = derive(prev, cur, self._mfu, float(self.loop_count or 1), self.loop_known, head=self.head)
        self.last_sample = sample
        self._post(sample)

    def _lost(self, why: str) -> None:
        self._prev = None
        if not self.reconnect:
            self._state = "ended"
            self._ended = True
            self._post(SessionEvent(state="ended", detail=why, ts_ns=_clk()))
            self._stop.set()
            return
        self._state = "reconnecting"
        self._post(SessionEvent(state="reconnecting", detail=why, ts_ns=_clk()))

    def _try_reconnect(self) -> bool:
        try:
            first = self._connect_once()
        except ServerUnreachable as exc:
            why = str(exc)
            if why != self._last_error and not self._stop.is_set():
                self._last_error = why
                self._post(SessionEvent(state="reconnecting", detail=why, ts_ns=_clk()))
            return False
        self._last_error = ""
        self._prev = first
        self._mfu = MfuState()
        self._state = "connected"
        self._post(
            SessionEvent(state="connected", detail=f"reconnected to vLLM at {self.base_url}", ts_ns=_clk())
        )
        assert self.hello is not None
        self._post(self.hello)
        return True

    # -- Session API ---------------------------------------------------------------------------

    def read(self, timeout: float) -> list[Record]:
        out: list[Record] = []
        try:
            out.append(self._q.get(timeout=max(0.0, timeout)))
        except queue.Empty:
            return out
        while True:
            try:
                out.append(self._q.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        """Stop polling and cancel a capture in flight, waiting at most ``CLOSE_WAIT_S``.

        Nothing here waits on the server: a scrape in flight ends on its own (daemon
        thread).  A capture that started the profiler and has not had its
        ``/stop_profile`` answered gets one sent without waiting for the answer (the
        server stops and exports on its own time; without the stop it would refuse the
        next capture with 409).  A stop the capture thread already sent makes this one
        a harmless repeat."""
        self._stop.set()
        cap = self._capture
        if isinstance(cap, PluginCapture):  # the engine's probe ends its own window
            cap.cancel.set()
            cap.join(CLOSE_WAIT_S)
        elif cap is not None:
            cap.cancel.set()
            cap.join(CLOSE_WAIT_S)
            job = cap.job
            if cap.is_alive() and job.started_ns is not None and not job.stop_sent:
                self.http.send_nowait("POST", "/stop_profile", timeout=CLOSE_WAIT_S)
        self._ended = True

    @property
    def ended(self) -> bool:
        return self._ended and self._q.empty()

    @property
    def state(self) -> str:
        """``connecting``, ``connected``, ``reconnecting`` or ``ended``."""
        return self._state


class VllmAdapter(Adapter, Reconnecting):
    """``vllm+http://HOST:PORT``: metrics, metadata and captures of a vLLM server over HTTP."""

    NAME: ClassVar[str] = "vllm"
    SCHEMES: ClassVar[tuple[str, ...]] = ("vllm+http://", "vllm+https://")
    TARGET_FORM: ClassVar[str] = "vllm+http://HOST:PORT"
    SUPPORTS_CAPTURE: ClassVar[bool] = True
    SUPPORTS_RECONNECT: ClassVar[bool] = True
    DESCRIPTION: ClassVar[str] = (
        "vLLM server over HTTP: /metrics rates, latency histograms (estimates), KV, MBU; captures via its profiler"
    )

    def __init__(self, target: str, **options: Any) -> None:
        super().__init__(target, **options)
        try:
            plain, engine = split_target(target)
        except ValueError as exc:
            raise AdapterTargetError(f"bad target {target!r}: {exc}") from None
        self.engine: str | None = None if engine == ALL else engine
        scheme, sep, rest = plain.partition("://")
        if not sep or scheme not in ("vllm+http", "vllm+https") or not rest.strip("/"):
            raise AdapterTargetError(f"bad target {target!r}: expected vllm+http://HOST:PORT")
        self.base_url = f"{scheme[len('vllm+') :]}://{rest.rstrip('/')}"
        try:
            HttpClient(self.base_url)
        except ValueError as exc:
            raise AdapterTargetError(f"bad target {target!r}: {exc}") from None
        try:
            self.interval = float(options.get("interval") or DEFAULT_INTERVAL_S)
            self.timeout = float(options.get("timeout") or 10.0)
            lc = options.get("loop_count") or os.environ.get("RLTPERF_LOOP_COUNT") or None
            self.loop_count: int | None = int(lc) if lc is not None else None
        except (TypeError, ValueError) as exc:
            raise AdapterTargetError(f"bad option for {target!r}: {exc}") from None
        if self.interval < 0.05:
            raise AdapterTargetError(f"interval {self.interval:g} s is too short (at least 0.05 s)")
        if self.loop_count is not None and self.loop_count < 1:
            raise AdapterTargetError(f"loop_count must be at least 1, not {self.loop_count}")
        pdir = options.get("profiler_dir")
        self.profiler_dir: str | None = os.path.abspath(os.path.expanduser(pdir)) if pdir else None
        self.snapshot_root: str = str(options.get("snapshot_root") or "snapshots")
        self.reconnect: bool = bool(options.get("reconnect", True))
        via = str(options.get("capture_via") or os.environ.get(CAPTURE_VIA_ENV) or VIA_AUTO)
        if via not in (VIA_AUTO, VIA_VLLM):
            raise AdapterTargetError(
                f"capture path {via!r} ({CAPTURE_VIA_ENV}) is not one of {VIA_AUTO!r} (the rltperf plugin's "
                f"capture in vLLM's workers where announced, else vLLM's profiler) or {VIA_VLLM!r} (vLLM's profiler)"
            )
        self.capture_via = via

    def connect(self) -> VllmSession:
        s = VllmSession(self)
        s.open()
        return s

    def session(self) -> VllmSession:
        """A session that connects in its own thread and retries until the server
        answers (``read()`` reports why it is not connected yet)."""
        s = VllmSession(self)
        s.open_in_background()
        return s


__all__ = ["VllmAdapter", "VllmSession"]
