"""The probe's publisher thread: serves the ring reader's records to subscribers.

One thread, one ``selectors`` loop, non-blocking sockets.  Every tick (``TICK_S``) it
takes what the ring reader (``reader.py``) collected — steps, requests, device samples,
capture replies — encodes each record once, and queues the frames to every subscriber.
Each subscriber (``subscriber.py``) has two queues: *control* (hello, stats, capture
replies; never dropped, bounded: at most one ``Stats`` waits, encoded when it is sent,
and a subscriber with ``MAX_CTRL_FRAMES`` unsent replies is closed) and *data* (steps,
requests, device samples; bounded — when a subscriber does not read, its oldest data is
dropped and counted, and the count reaches it in the next ``Stats``).  A client sending
more than ``MAX_REQUESTS_PER_S`` requests a second is closed with the reason logged.
Nothing here can block or raise into the engine thread.
"""

from __future__ import annotations

import errno
import hmac
import logging
import selectors
import socket
import threading
import time
from time import perf_counter_ns as _clk
from typing import Any, Protocol

from engine_adapters import __version__
from engine_adapters.definitions.records import (
    SCHEMA_VERSION,
    Bye,
    Capture,
    ClientHello,
    EngineInfo,
    Hello,
    Ping,
    Record,
    Refused,
    StageTable,
)
from engine_adapters.definitions.wire import FrameEncoder, FrameError, encode
from engine_adapters.probe.reader import RingReader
from engine_adapters.probe.ring import StageNames
from engine_adapters.probe.subscriber import Subscriber

log = logging.getLogger("rltperf.probe")

TICK_S = 0.05
"""Publisher period: latency from step end to frame sent is at most about this
(the screen refreshes at 2-4 Hz; a shorter period costs the engine GIL time)."""
CLIENT_READ = 4096
"""Bytes read from a client per turn: a client sends a hello and a few requests a
minute, and a flood is cut off after ``MAX_REQUESTS_PER_S`` requests, not after
decoding whatever it managed to push into the socket."""
MAX_SUBSCRIBERS = 64
"""Subscribers (after their hello) served at once."""
MAX_PENDING = 256
"""Connections waiting for their hello; beyond this the oldest is dropped."""
STATS_EVERY_S = 1.0
DATA_QUEUE_RECORDS = 4096
"""Data records queued per subscriber before the oldest are dropped."""
DATA_QUEUE_BYTES = 2 * 1024 * 1024
MAX_CTRL_FRAMES = 256
"""Control frames queued per subscriber; one more closes it (it reads nothing)."""
MAX_REQUESTS_PER_S = 100
"""Requests (pings, captures) a client may send in one second; more closes it.  The
monitor sends a few a minute; a flood would cost the engine GIL time in this thread."""
SNDBUF = 256 * 1024
"""Kernel send buffer per subscriber: small, so a stalled reader shows as drops soon."""
LOG_BURST = 10
"""Warnings about bad connections per minute before they are only counted."""


class CaptureService(Protocol):
    """What the publisher needs of the capture controller (``capture.py``)."""

    torch_error: str | None

    def request(self, cap: Capture, live: dict[str, Any]) -> Refused | None: ...

    def check_timeout(self) -> None: ...


class Publisher(threading.Thread):
    """Serves the probe's records over TCP (see module docstring).

    Args:
        reader: the ring reader whose batches are served (and whose heartbeats).
        stages: stage names (the Hello; a ``StageTable`` when a name is added).
        captures: the capture controller (requests, timeouts, whether captures run).
        engine_info: the engine (the Hello).
        started_ns: when the probe started (probe clock; the Hello).
        host, port: where to listen (port 0: any free port; see ``address``).
        token: shared secret clients must present, or None.
    """

    def __init__(
        self,
        reader: RingReader,
        stages: StageNames,
        captures: CaptureService,
        engine_info: EngineInfo,
        started_ns: int,
        host: str,
        port: int,
        token: str | None,
    ) -> None:
        super().__init__(name="rltperf-publisher", daemon=True)
        self.reader = reader
        self.stages = stages
        self.captures = captures
        self.engine_info = engine_info
        self.started_ns = started_ns
        self.token = token
        try:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self._lsock = socket.create_server((host, port), family=family, backlog=128)
        except OSError as exc:
            hint = (
                " (another engine or probe is there; use --listen HOST:0 for any free port)"
                if exc.errno == errno.EADDRINUSE
                else ""
            )
            raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}{hint}") from None
        self._lsock.setblocking(False)
        h, p = self._lsock.getsockname()[:2]
        self.address = f"[{h}]:{p}" if ":" in h else f"{h}:{p}"
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._lsock, selectors.EVENT_READ, None)
        self._subs: list[Subscriber] = []
        self._stop_ev = threading.Event()
        self._enc = FrameEncoder()
        self._n_stages_sent = len(stages)
        self._last_stats = time.monotonic()
        self._hello_cache: bytes | None = None
        self._log_window_start = time.monotonic()
        self._log_count = 0
        self._log_suppressed = 0

    @property
    def ring_dropped(self) -> int:
        """Step records lost because the reader fell a whole ring behind."""
        return self.reader.ring_dropped

    # -- thread ------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            while not self._stop_ev.is_set():
                try:
                    events = self._sel.select(TICK_S)
                except OSError:
                    events = []
                for key, mask in events:
                    sub = key.data
                    if sub is None:
                        self._accept()
                        continue
                    if mask & selectors.EVENT_READ:
                        self._read(sub)
                    if mask & selectors.EVENT_WRITE and sub.sock.fileno() >= 0:
                        self._flush(sub)
                self._tick()
        except Exception:  # never take the engine down; say why and stop publishing
            log.exception("rltperf publisher crashed; the engine continues without monitoring")
        finally:
            self._shutdown_sockets()

    def _tick(self) -> None:
        recs, ctrl = self.reader.collect()
        if recs:
            blob = self._enc.encode_batched(recs)
            n = len(recs)
            for sub in self._subs:
                if sub.authed and not sub.closing:
                    self._queue_data(sub, blob, n)
        for rec in ctrl:
            self._broadcast_ctrl(encode(rec))
        names = self.stages.names
        if len(names) != self._n_stages_sent:
            self._n_stages_sent = len(names)
            self._hello_cache = None
            self._broadcast_ctrl(encode(StageTable(stage_names=names)))
        now = time.monotonic()
        if now - self._last_stats >= STATS_EVERY_S:
            self._last_stats = now
            for sub in self._subs:
                if sub.authed:
                    self._send_stats(sub)
            self.captures.check_timeout()
        for sub in list(self._subs):
            if not sub.authed and now > sub.hello_deadline:
                self._close_sub(sub, "no ClientHello within 5 s")
                continue
            self._flush(sub)

    # -- sockets -------------------------------------------------------------------------------

    def _accept(self) -> None:
        # Drain the accept queue: under GIL pressure this thread may run only every few
        # milliseconds, and one accept per turn would let a burst of connects overflow it.
        for _ in range(256):
            try:
                sock, addr = self._lsock.accept()
            except OSError:
                return
            self._accept_one(sock, addr)

    def _accept_one(self, sock: socket.socket, addr: Any) -> None:
        peer = f"{addr[0]}:{addr[1]}"
        pending = [x for x in self._subs if not x.authed]
        if len(pending) >= MAX_PENDING:  # a connect flood: drop the oldest un-greeted one
            self._close_sub(pending[0], "too many connections without a hello", level=logging.DEBUG)
        sock.setblocking(False)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        sub = Subscriber(sock, peer)
        self._subs.append(sub)
        self._sel.register(sock, selectors.EVENT_READ, sub)

    def _read(self, sub: Subscriber) -> None:
        try:
            data = sub.sock.recv(CLIENT_READ)
        except BlockingIOError:
            return
        except ConnectionResetError:
            # a monitor that quit with stream data unread (its kernel resets): a client
            # going away, like a clean disconnect, not a fault worth the engine's log
            self._close_sub(sub, "client went away (connection reset)", level=logging.INFO)
            return
        except OSError as exc:
            self._close_sub(sub, f"receive failed: {exc}")
            return
        if not data:
            self._close_sub(sub, "client disconnected", level=logging.INFO)
            return
        if sub.closing:
            return
        try:
            recs = sub.reader.feed(data)
        except FrameError as exc:
            self._close_sub(sub, f"bad frame: {exc}")
            return
        for rec in recs:
            if not self._handle(sub, rec):
                return

    def _handle(self, sub: Subscriber, rec: Record) -> bool:
        if not sub.authed:
            if not isinstance(rec, ClientHello):
                self._close_sub(sub, f"expected ClientHello first, got {type(rec).__name__}")
                return False
            if rec.schema != SCHEMA_VERSION:
                self._refuse_and_close(
                    sub, f"schema {rec.schema} not supported: this probe speaks schema {SCHEMA_VERSION}"
                )
                return False
            if self.token is not None and not _same(rec.token, self.token):
                self._refuse_and_close(
                    sub, "wrong or missing token (the probe requires --token / RLTPERF_TOKEN)"
                )
                return False
            if sum(1 for x in self._subs if x.authed) >= MAX_SUBSCRIBERS:
                self._refuse_and_close(sub, f"too many subscribers ({MAX_SUBSCRIBERS})")
                return False
            sub.authed = True
            sub.token = rec.token
            self._queue_ctrl(sub, self._hello())
            self._send_stats(sub)  # the stream's first timestamp: where a recording begins
            log.info("subscriber %s attached (%s)", sub.addr, rec.client)
            return True
        now = time.monotonic()
        if now - sub.req_window >= 1.0:
            sub.req_window, sub.req_count = now, 0
        sub.req_count += 1
        if sub.req_count > MAX_REQUESTS_PER_S:
            self._close_sub(
                sub,
                f"flooding: more than {MAX_REQUESTS_PER_S} requests in one second "
                f"({type(rec).__name__}; replies unread: {len(sub.ctrl)})",
            )
            return False
        if isinstance(rec, Capture):
            if self.token is not None and not _same(rec.token, self.token):
                return self._queue_ctrl(
                    sub,
                    encode(
                        Refused(reason="capture refused: wrong or missing token", capture_id=rec.capture_id)
                    ),
                )
            refused = self.captures.request(rec, self.reader.live_stats())
            if refused is not None:
                return self._queue_ctrl(sub, encode(refused))
            return True
        if isinstance(rec, Ping):
            self._send_stats(sub)
            return True
        self._close_sub(sub, f"unexpected {type(rec).__name__} from a client")
        return False

    def _hello(self) -> bytes:
        if self._hello_cache is None:
            from engine_adapters.definitions.ceilings import ceiling_for

            info = self.engine_info
            caps = ["device_samples"]
            if not self.captures.torch_error:
                caps.append("capture")
            self._hello_cache = encode(
                Hello(
                    schema=SCHEMA_VERSION,
                    engine=info,
                    stage_names=self.stages.names,
                    probe_version=__version__,
                    wall_minus_mono_ns=time.time_ns() - _clk(),
                    ceiling=ceiling_for(info.device, info.dtype),
                    started_ns=self.started_ns,
                    capabilities=caps,
                )
            )
        return self._hello_cache

    def _refuse_and_close(self, sub: Subscriber, reason: str) -> None:
        self._log_limited("refusing %s: %s", sub.addr, reason)
        sub.ctrl.append(encode(Refused(reason=reason)))  # before the hello: the queue is short
        sub.closing = True
        sub.hello_deadline = time.monotonic() + 1.0  # flush the refusal, then close
        self._flush(sub)
        if sub.out is None and not sub.ctrl:
            self._close_sub(sub, reason, level=logging.DEBUG)

    def _send_stats(self, sub: Subscriber) -> None:
        # Coalesced: one Stats waits at most, and it is encoded when sent (fresh figures).
        if not sub.stats_queued:
            sub.stats_queued = True
            sub.ctrl.append(None)

    def _stats_frame(self, sub: Subscriber) -> bytes:
        sub.stats_queued = False
        return encode(self.reader.heartbeat(sub.dropped, sum(1 for s in self._subs if s.authed)))

    def _queue_ctrl(self, sub: Subscriber, frame: bytes) -> bool:
        """Queue a control frame; False (and the subscriber closed) when its control
        queue is full: replies are never dropped, so one that reads none must go."""
        if len(sub.ctrl) >= MAX_CTRL_FRAMES:
            self._close_sub(sub, f"{len(sub.ctrl)} control replies unread: the client does not read")
            return False
        sub.ctrl.append(frame)
        return True

    def _broadcast_ctrl(self, frame: bytes) -> None:
        for sub in list(self._subs):
            if sub.authed and not sub.closing:
                self._queue_ctrl(sub, frame)

    def _queue_data(self, sub: Subscriber, blob: bytes, n: int) -> None:
        sub.data.append((blob, n))
        sub.data_bytes += len(blob)
        sub.data_records += n
        while len(sub.data) > 1 and (
            sub.data_records > DATA_QUEUE_RECORDS or sub.data_bytes > DATA_QUEUE_BYTES
        ):
            old, c = sub.data.popleft()
            sub.data_bytes -= len(old)
            sub.data_records -= c
            sub.dropped += c

    def _flush(self, sub: Subscriber) -> None:
        sock = sub.sock
        while True:
            if sub.out is None:
                if sub.ctrl:
                    frame = sub.ctrl.popleft()
                    sub.out = memoryview(frame if frame is not None else self._stats_frame(sub))
                elif sub.data:
                    blob, c = sub.data.popleft()
                    sub.data_bytes -= len(blob)
                    sub.data_records -= c
                    sub.out = memoryview(blob)
                else:
                    break
            try:
                n = sock.send(sub.out)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self._close_sub(sub, f"send failed: {exc}", level=logging.INFO)
                return
            out = sub.out[n:]
            sub.out = out if len(out) else None
        pending = sub.out is not None
        if sub.closing and not pending and not sub.ctrl:
            self._close_sub(sub, "refused", level=logging.DEBUG)
            return
        if sub.closing and time.monotonic() > sub.hello_deadline:
            self._close_sub(sub, "refused (unread)", level=logging.DEBUG)
            return
        if pending != sub.want_write:
            sub.want_write = pending
            ev = selectors.EVENT_READ | (selectors.EVENT_WRITE if pending else 0)
            try:
                self._sel.modify(sock, ev, sub)
            except (KeyError, ValueError, OSError):
                pass

    def _close_sub(self, sub: Subscriber, reason: str, level: int = logging.WARNING) -> None:
        if sub not in self._subs:
            return
        if level >= logging.WARNING:
            self._log_limited("closing connection from %s: %s", sub.addr, reason)
        else:
            log.log(level, "closing connection from %s: %s", sub.addr, reason)
        self._subs.remove(sub)
        try:
            self._sel.unregister(sub.sock)
        except (KeyError, ValueError, OSError):
            pass
        try:
            sub.sock.close()
        except OSError:
            pass

    def _log_limited(self, fmt: str, *args: Any) -> None:
        """Warn at most LOG_BURST times a minute: a flood of bad connections must not
        flood the engine's log (or block on a full stderr pipe)."""
        now = time.monotonic()
        if now - self._log_window_start > 60:
            if self._log_suppressed:
                log.warning(
                    "%d more connections were closed for bad input in the last minute", self._log_suppressed
                )
            self._log_window_start = now
            self._log_count = 0
            self._log_suppressed = 0
        if self._log_count < LOG_BURST:
            self._log_count += 1
            log.warning(fmt, *args)
        else:
            self._log_suppressed += 1

    # -- shutdown --------------------------------------------------------------------------------

    def close(self, reason: str) -> None:
        """Send what is left, then ``Bye``, to every subscriber (best effort, ≤ 1 s) and
        stop the thread."""
        self._bye_reason = reason
        self._bye_deadline = time.monotonic() + 1.0
        self._stop_ev.set()
        if self.is_alive():
            self.join(2.0)
        else:
            self._shutdown_sockets()

    def _shutdown_sockets(self) -> None:
        # Flush what is left — the last steps and requests, then the Bye, in that order
        # (a monitor stops reading at the Bye) — for a short while.
        try:
            self._tick()
        except Exception:
            pass
        bye = encode(Bye(reason=getattr(self, "_bye_reason", "probe closed"), ts_ns=_clk()))
        for sub in self._subs:
            if sub.authed and not sub.closing:
                sub.data.append((bye, 0))  # after all data, never dropped (last in the queue)
        deadline = getattr(self, "_bye_deadline", time.monotonic())
        while time.monotonic() < deadline and any(s.out is not None or s.ctrl or s.data for s in self._subs):
            for sub in list(self._subs):
                self._flush(sub)
            time.sleep(0.01)
        for sub in list(self._subs):
            self._close_sub(sub, "probe closed", level=logging.DEBUG)
        try:
            self._sel.unregister(self._lsock)
        except (KeyError, ValueError, OSError):
            pass
        self._lsock.close()
        self._sel.close()


def _same(a: str | None, b: str) -> bool:
    return a is not None and hmac.compare_digest(a.encode(), b.encode())
