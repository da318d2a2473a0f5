"""Probe client adapter: ``tcp://host:port`` — a live stream from an in-engine probe."""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from typing import Any, ClassVar

from engine_adapters.definitions.records import (
    SCHEMA_VERSION,
    Bye,
    Capture,
    ClientHello,
    EngineInfo,
    Hello,
    Record,
    Refused,
    SessionEvent,
    TriggerInfo,
)
from engine_adapters.definitions.wire import FrameError, FrameReader, encode, parse_hostport
from engine_adapters.monitor.base import (
    Adapter,
    AdapterConnectionError,
    AdapterTargetError,
    Reconnecting,
    Session,
    new_capture_id,
)

CONNECT_TIMEOUT_S = 3.0
HELLO_TIMEOUT_S = 5.0
BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 3.0)
SEND_TIMEOUT_S = 1.0
"""Longest wait to hand a capture request to the socket."""
RECV_BYTES = 1 << 18
"""Most bytes one ``recv_into`` takes (a quarter second of a 1 000 step/s stream is ~35 KB)."""


def _clk() -> int:
    return time.perf_counter_ns()


class _Attempt(threading.Thread):
    """One background connection attempt of a reconnecting ``ProbeSession``."""

    def __init__(self, session: ProbeSession) -> None:
        super().__init__(name=f"rltperf-connect-{session.host}:{session.port}", daemon=True)
        self.session = session
        self.done = threading.Event()
        self.result: tuple[socket.socket, FrameReader, Hello, list[Record]] | None = None
        self.error = ""

    def run(self) -> None:
        try:
            self.result = self.session._handshake()
        except AdapterConnectionError as exc:
            self.error = str(exc)
        except Exception as exc:  # a bug guard: the session keeps retrying with a sentence
            self.error = f"connection attempt failed: {type(exc).__name__}: {exc}"
        finally:
            if self.result is not None and self.session._closed:
                self.result[0].close()
                self.result = None
                self.error = "session closed"
            self.done.set()


class ProbeSession(Session):
    """A subscription to one probe; reconnects by itself when ``reconnect`` is set."""

    def __init__(
        self, target: str, host: str, port: int, token: str | None, reconnect: bool, client: str
    ) -> None:
        self.target = target
        self.host = host
        self.port = port
        self.token = token
        self.reconnect = reconnect
        self.client = client
        self.info: EngineInfo | None = None
        self.hello: Hello | None = None
        self._sock: socket.socket | None = None
        self._reader = FrameReader()
        self._rbuf = memoryview(bytearray(RECV_BYTES))
        """Where each ``recv_into`` lands (a fresh 256 KiB ``recv`` per wake-up cost the
        reader thread ~1.5 ms/s at 1 000 steps/s: allocated, faulted in, shrunk)."""
        self._send_lock = threading.Lock()
        self._closed = False
        self._ended = False
        self._attempt = 0
        self._next_try = 0.0
        self._state = "connecting"
        self._pending: list[Record] = []
        self._attempt_thread: _Attempt | None = None
        self.last_error = ""

    # -- connection ----------------------------------------------------------------------------

    def _describe(self, exc: BaseException) -> str:
        where = f"{self.host}:{self.port}"
        if isinstance(exc, ConnectionRefusedError):
            return f"nothing listens on {where} (connection refused): is the engine running with its probe there?"
        if isinstance(exc, (socket.timeout, TimeoutError)):
            return f"{where} did not answer within {CONNECT_TIMEOUT_S:.0f} s (wrong address or a firewall?)"
        if isinstance(exc, socket.gaierror):
            return f"cannot resolve host {self.host!r}: {exc.strerror}"
        return f"cannot connect to {where}: {exc}"

    def open(self) -> list[Record]:
        """Connect and read the hello; raises ``AdapterConnectionError``."""
        return self._adopt(*self._handshake())

    def _adopt(
        self, sock: socket.socket, reader: FrameReader, hello: Hello, first: list[Record]
    ) -> list[Record]:
        """Make a finished handshake this session's connection."""
        if self._closed:  # closed while a background attempt was under way
            sock.close()
            return []
        sock.settimeout(None)
        sock.setblocking(False)
        self._sock = sock
        self._reader = reader
        self.hello = hello
        self.info = hello.engine
        self._attempt = 0
        self._state = "connected"
        self._ended = False
        return [
            SessionEvent(state="connected", detail=f"connected to {self.host}:{self.port}", ts_ns=_clk()),
            *first,
        ]

    def _handshake(self) -> tuple[socket.socket, FrameReader, Hello, list[Record]]:
        """Connect and read the hello without touching the session's state (so it can
        run in a background thread); raises ``AdapterConnectionError``."""
        try:
            sock = socket.create_connection((self.host, self.port), timeout=CONNECT_TIMEOUT_S)
        except OSError as exc:
            raise AdapterConnectionError(self._describe(exc)) from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(encode(ClientHello(schema=SCHEMA_VERSION, client=self.client, token=self.token)))
            reader = FrameReader()
            deadline = time.monotonic() + HELLO_TIMEOUT_S
            first: list[Record] = []
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AdapterConnectionError(
                        f"{self.host}:{self.port} accepted the connection but sent no rltperf hello "
                        f"within {HELLO_TIMEOUT_S:.0f} s: is it an rltperf probe?"
                    )
                sock.settimeout(left)
                try:
                    data = sock.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    raise AdapterConnectionError(
                        f"{self.host}:{self.port} closed the connection during the hello"
                    )
                try:
                    first.extend(reader.feed(data))
                except FrameError as exc:
                    raise AdapterConnectionError(
                        f"{self.host}:{self.port} does not speak the rltperf protocol ({exc})"
                    ) from None
                for i, rec in enumerate(first):
                    if isinstance(rec, Refused):
                        raise AdapterConnectionError(f"the probe refused the connection: {rec.reason}")
                    if isinstance(rec, Hello):
                        if rec.schema != SCHEMA_VERSION:
                            raise AdapterConnectionError(
                                f"the probe speaks schema {rec.schema}, this monitor {SCHEMA_VERSION}: "
                                "upgrade the older side"
                            )
                        return sock, reader, rec, first[i:]
        except AdapterConnectionError:
            sock.close()
            raise
        except OSError as exc:
            sock.close()
            raise AdapterConnectionError(self._describe(exc)) from None

    def _drop(self, why: str) -> list[Record]:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None
        self.last_error = why
        if not self.reconnect or self._closed:
            self._ended = True
            self._state = "ended"
            return [SessionEvent(state="ended", detail=why, ts_ns=_clk())]
        self._state = "reconnecting"
        self._attempt = 0
        self._next_try = time.monotonic() + BACKOFF_S[0]
        return [SessionEvent(state="reconnecting", detail=why, ts_ns=_clk())]

    # -- Session API -----------------------------------------------------------------------------

    def read(self, timeout: float) -> list[Record]:
        if self._pending:
            first, self._pending = self._pending, []
            return first
        if self._closed or self._ended:
            time.sleep(min(timeout, 0.05))
            return []
        sock = self._sock
        if sock is None:
            return self._read_reconnecting(timeout)
        try:
            r, _, _ = select.select([sock], [], [], timeout)
        except (OSError, ValueError):
            return self._drop("connection lost")
        if not r:
            return []
        out: list[Record] = []
        buf = self._rbuf
        for _ in range(64):  # read what is there, bounded
            try:
                got = sock.recv_into(buf)
            except BlockingIOError:
                break
            except OSError as exc:
                return out + self._drop(f"connection lost: {exc}")
            if not got:
                return out + self._drop("the probe closed the connection (engine stopped?)")
            try:
                out.extend(self._reader.feed(buf[:got]))  # feed copies what it keeps
            except FrameError as exc:
                return out + self._drop(f"bad frame from the probe: {exc}")
            if got < RECV_BYTES:
                break
        for rec in out:
            if isinstance(rec, Bye):
                out.extend(self._drop(f"the engine said goodbye: {rec.reason}"))
                break
        return out

    def _read_reconnecting(self, timeout: float) -> list[Record]:
        """One bounded step of reconnecting.  The attempt (connect and hello: up to
        ``CONNECT_TIMEOUT_S + HELLO_TIMEOUT_S`` against a hung peer) runs in a daemon
        thread, so ``read`` never blocks longer than ``timeout`` and a closing monitor
        never waits for it."""
        attempt = self._attempt_thread
        if attempt is None:
            now = time.monotonic()
            if now < self._next_try:
                time.sleep(min(timeout, self._next_try - now))
                return []
            attempt = _Attempt(self)
            self._attempt_thread = attempt
            attempt.start()
        if not attempt.done.wait(timeout):
            return []
        self._attempt_thread = None
        if attempt.result is not None:
            return self._adopt(*attempt.result)
        self._attempt += 1
        self._next_try = time.monotonic() + BACKOFF_S[min(self._attempt, len(BACKOFF_S) - 1)]
        why = attempt.error
        if why != self.last_error:
            self.last_error = why
            return [SessionEvent(state="reconnecting", detail=why, ts_ns=_clk())]
        return []

    def request_capture(
        self, steps: int, mode: str = "ops", label: str | None = None, trigger: TriggerInfo | None = None
    ) -> str:
        cid = new_capture_id()
        frame = encode(
            Capture(capture_id=cid, steps=steps, mode=mode, label=label, token=self.token, trigger=trigger)
        )
        with self._send_lock:
            sock = self._sock
            if sock is None:
                raise AdapterConnectionError(f"not connected to {self.host}:{self.port}: {self.last_error}")
            try:
                sock.settimeout(SEND_TIMEOUT_S)  # a peer that stopped reading must not hold the caller
                sock.sendall(frame)
            except OSError as exc:
                raise AdapterConnectionError(f"cannot send the capture request: {exc}") from None
            finally:
                try:
                    sock.setblocking(False)
                except OSError:
                    pass
        return cid

    def close(self) -> None:
        self._closed = True
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None

    @property
    def ended(self) -> bool:
        return self._ended or self._closed

    @property
    def state(self) -> str:
        """``connecting``, ``connected``, ``reconnecting`` or ``ended``."""
        return self._state


class ProbeAdapter(Adapter, Reconnecting):
    """``tcp://host:port``: subscribe to an rltperf probe inside an engine."""

    NAME: ClassVar[str] = "tcp"
    SCHEMES: ClassVar[tuple[str, ...]] = ("tcp://",)
    TARGET_FORM: ClassVar[str] = "tcp://HOST:PORT"
    SUPPORTS_CAPTURE: ClassVar[bool] = True
    SUPPORTS_RECONNECT: ClassVar[bool] = True
    DESCRIPTION: ClassVar[str] = (
        "live stream from an rltperf probe (reference engine, vLLM plugin, your engine)"
    )

    def __init__(self, target: str, **options: Any) -> None:
        super().__init__(target, **options)
        rest = target[len("tcp://") :] if target.startswith("tcp://") else target
        rest = rest.rstrip("/")
        try:
            self.host, self.port = parse_hostport(rest)
        except ValueError as exc:
            raise AdapterTargetError(f"bad target {target!r}: {exc} (expected tcp://HOST:PORT)") from None
        self.token: str | None = options.get("token") or os.environ.get("RLTPERF_TOKEN") or None
        self.reconnect: bool = bool(options.get("reconnect", True))
        self.client: str = str(options.get("client", "rltperf"))

    def session(self) -> ProbeSession:
        """A session object not yet connected (``read()`` connects and retries)."""
        return ProbeSession(self.target, self.host, self.port, self.token, self.reconnect, self.client)

    def connect(self) -> ProbeSession:
        s = self.session()
        s._pending = s.open()  # the first read() returns the hello
        return s
