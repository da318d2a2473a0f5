"""Find monitor targets on a port range: vLLM servers and rltperf probes (``--auto``).

Two phases, both bounded:

1. *Which ports are open*: non-blocking connects to every port of the range at once
   (in batches under the process's file limit), answered by one ``select`` loop; a
   closed port on loopback refuses at once, a filtered one costs ``connect_timeout``.
2. *What answers there*, in a thread pool, ``timeout`` per port:

   - an HTTP GET of ``/metrics`` first (most open ports speak HTTP).  A 200 answer
     with ``vllm:`` families is a vLLM server (``vllm+http://``); its ``/v1/models``
     and ``/version`` say what it serves.  Any other HTTP answer is listed as "not a
     target" with what it was (an rltperf Prometheus exporter says so), and skipped.
   - a port that closes the connection without an HTTP answer (or gives none in
     time: a probe whose engine is busy starting) gets the probe's handshake (``ClientHello`` with ``RLTPERF_TOKEN`` or the given token): a ``Hello``
     is an rltperf probe (``tcp://``), a ``Refused`` a probe that wants a token.

An rltperf probe receiving the HTTP request closes that one connection (it logs the
bad frame, rate-limited).  No module here imports Textual.
"""

from __future__ import annotations

import errno
import http.client
import json
import os
import re
import resource
import selectors
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from engine_adapters.definitions.records import SCHEMA_VERSION, ClientHello, Hello, Refused
from engine_adapters.definitions.wire import FrameError, FrameReader, encode

MAX_PORTS = 1024
"""Largest range one ``--auto`` scans (a typo such as ``8000-80000`` is refused, not run)."""
CONNECT_TIMEOUT_S = 0.5
"""Longest wait for a port to accept (a filtered port on a remote host)."""
IDENTIFY_TIMEOUT_S = 1.0
"""Longest wait for an open port to say what it is (one request)."""
WORKERS = 32
"""Open ports identified at once."""

_RANGE = re.compile(r"^(?:(?P<host>\[[^\]]+\]|[^:\[\]]+):)?(?P<lo>\d+)(?:-(?P<hi>\d+))?$")


class RangeError(ValueError):
    """A port range that cannot be scanned; the message is a sentence for the user."""


@dataclass(frozen=True)
class PortRange:
    """Where to look: one host, ports ``lo`` to ``hi`` inclusive."""

    host: str
    lo: int
    hi: int

    @property
    def count(self) -> int:
        return self.hi - self.lo + 1

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.lo}-{self.hi}" if self.hi != self.lo else f"{host}:{self.lo}"


def parse_range(spec: str, max_ports: int = MAX_PORTS) -> PortRange:
    """``[HOST:]PORT-PORT`` (or one ``PORT``) → ``PortRange``; raises ``RangeError``.

    The host defaults to 127.0.0.1 and must resolve; IPv6 hosts go in brackets."""
    text = spec.strip()
    m = _RANGE.match(text)
    if not m:
        raise RangeError(
            f"bad --auto range {spec!r}: expected [HOST:]PORT-PORT, e.g. 8000-8100 or 10.0.0.5:8000-8007"
        )
    host = (m.group("host") or "127.0.0.1").strip("[]")
    lo = int(m.group("lo"))
    hi = int(m.group("hi")) if m.group("hi") is not None else lo
    for p in (lo, hi):
        if not 1 <= p <= 65535:
            raise RangeError(f"bad --auto range {spec!r}: port {p} is outside 1-65535")
    if hi < lo:
        raise RangeError(
            f"bad --auto range {spec!r}: the first port is above the last (did you mean {hi}-{lo}?)"
        )
    if hi - lo + 1 > max_ports:
        raise RangeError(
            f"bad --auto range {spec!r}: {hi - lo + 1} ports; at most {max_ports} are scanned at once "
            "(split the range)"
        )
    try:
        socket.getaddrinfo(host, lo, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise RangeError(f"bad --auto range {spec!r}: cannot resolve host {host!r}: {exc.strerror}") from None
    return PortRange(host, lo, hi)


@dataclass
class Found:
    """One open port and what answers there."""

    host: str
    port: int
    kind: str
    """``vllm``, ``probe``, ``probe-refused`` (a probe that wants a token) or ``other``."""
    what: str
    """What it is, in a few words (engine, model, version; or what else answered)."""
    target: str | None = None
    """The target string to attach to; None: not a target."""

    @property
    def attachable(self) -> bool:
        return self.target is not None


@dataclass
class ScanResult:
    """What one range held."""

    range: PortRange
    found: list[Found] = field(default_factory=list)
    """Every open port, in port order (targets and the rest)."""
    closed: int = 0
    """Ports that refused or did not accept within the connect timeout."""
    seconds: float = 0.0

    @property
    def targets(self) -> list[Found]:
        return [f for f in self.found if f.attachable]

    @property
    def others(self) -> list[Found]:
        return [f for f in self.found if not f.attachable]

    def describe_empty(self) -> str:
        """A sentence saying what was scanned when no target was found."""
        rest = ""
        if self.others:
            listed = ", ".join(f"{f.port} ({f.what})" for f in self.others[:8])
            more = f" and {len(self.others) - 8} more" if len(self.others) > 8 else ""
            rest = f"; open but not a target: {listed}{more}"
        return (
            f"no vLLM server or rltperf probe on {self.range} ({self.range.count} ports in "
            f"{self.seconds:.2f} s: {self.closed} closed{rest})"
        )


def _host_for_url(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def open_ports(host: str, ports: list[int], connect_timeout: float = CONNECT_TIMEOUT_S) -> list[int]:
    """The ports of ``ports`` that accept a TCP connection, by non-blocking connects
    answered in one ``select`` loop (batches kept under the file-descriptor limit)."""
    info = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    family, _, _, _, sockaddr = info[0]
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    batch = max(16, min(512, (soft - 64) // 2))
    found: list[int] = []
    for i in range(0, len(ports), batch):
        found.extend(_open_batch(family, str(sockaddr[0]), ports[i : i + batch], connect_timeout))
    return sorted(found)


def _open_batch(family: int, addr: str, ports: list[int], timeout: float) -> list[int]:
    sel = selectors.DefaultSelector()
    socks: dict[socket.socket, int] = {}
    found: list[int] = []
    try:
        for port in ports:
            s = socket.socket(family, socket.SOCK_STREAM)
            s.setblocking(False)
            rc = s.connect_ex((addr, port))
            if rc == 0:
                found.append(port)
                s.close()
            elif rc in (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN):
                socks[s] = port
                sel.register(s, selectors.EVENT_WRITE)
            else:
                s.close()
        deadline = time.monotonic() + timeout
        while socks:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for key, _ in sel.select(left):
                s = key.fileobj  # type: ignore[assignment]
                assert isinstance(s, socket.socket)
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    found.append(socks[s])
                sel.unregister(s)
                del socks[s]
                s.close()
    finally:
        for s in socks:
            s.close()
        sel.close()
    return found


# --------------------------------------------------------------------------- what answers


class _NotHttp(Exception):
    """The peer closed the connection or answered something that is not HTTP."""


def _get(host: str, port: int, path: str, timeout: float) -> tuple[int, bytes]:
    """One HTTP GET; raises ``_NotHttp`` for a peer that does not speak HTTP, ``OSError``
    (``TimeoutError`` included) when it does not answer."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(
            "GET", path, headers={"Accept": "*/*", "User-Agent": "rltperf --auto", "Connection": "close"}
        )
        resp = conn.getresponse()
        return resp.status, resp.read(4 << 20)
    except (http.client.BadStatusLine, ConnectionResetError, BrokenPipeError) as exc:
        raise _NotHttp(str(exc)) from None
    except http.client.HTTPException as exc:
        raise _NotHttp(str(exc)) from None
    finally:
        conn.close()


def _json(host: str, port: int, path: str, timeout: float) -> object:
    try:
        status, body = _get(host, port, path, timeout)
        return json.loads(body) if status == 200 else None
    except (OSError, _NotHttp, ValueError):
        return None


def _has_family(body: bytes, prefix: bytes) -> bool:
    return body.startswith(prefix) or b"\n" + prefix in body or b"# TYPE " + prefix in body


def _vllm_found(host: str, port: int, timeout: float) -> Found:
    models = _json(host, port, "/v1/models", timeout)
    names = []
    if isinstance(models, dict) and isinstance(models.get("data"), list):
        names = [str(m.get("id")) for m in models["data"] if isinstance(m, dict) and m.get("id")]
    version = _json(host, port, "/version", timeout)
    v = version.get("version") if isinstance(version, dict) else None
    what = "vLLM" + (f" {v}" if v else "") + (f" serving {', '.join(names)}" if names else "")
    return Found(host, port, "vllm", what, f"vllm+http://{_host_for_url(host)}:{port}")


def _http_other(host: str, port: int, status: int, body: bytes, timeout: float) -> Found:
    """An HTTP server that is not a vLLM with metrics: say what it is."""
    if status == 200 and _has_family(body, b"rltperf_"):
        return Found(host, port, "other", "rltperf Prometheus exporter (attach to its probe's tcp:// port)")
    models = _json(host, port, "/v1/models", timeout)
    if isinstance(models, dict) and isinstance(models.get("data"), list):
        owners = {str(m.get("owned_by")) for m in models["data"] if isinstance(m, dict)}
        if "vllm" in owners:
            return Found(
                host, port, "other", "vLLM without vllm:* metrics (--disable-log-stats?): cannot attach"
            )
        return Found(host, port, "other", "an OpenAI-compatible server that is not vLLM")
    why = f"HTTP {status} on /metrics" if status != 200 else "HTTP, /metrics without vllm:* metrics"
    return Found(host, port, "other", f"HTTP server, not vLLM ({why})")


def probe_hello(host: str, port: int, token: str | None, timeout: float) -> Hello | Refused | None:
    """The probe's answer to a ``ClientHello`` (None: nothing rltperf-like came back)."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return None
    deadline = time.monotonic() + timeout
    reader = FrameReader()
    try:
        sock.sendall(encode(ClientHello(schema=SCHEMA_VERSION, client="rltperf --auto", token=token)))
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            sock.settimeout(left)
            data = sock.recv(65536)
            if not data:
                return None
            for rec in reader.feed(data):
                if isinstance(rec, (Hello, Refused)):
                    return rec
    except (OSError, FrameError):
        return None
    finally:
        sock.close()


def identify(host: str, port: int, token: str | None = None, timeout: float = IDENTIFY_TIMEOUT_S) -> Found:
    """What answers on an open ``host:port`` (see the module docstring)."""
    silent = False
    try:
        status, body = _get(host, port, "/metrics", timeout)
    except _NotHttp:
        pass  # not HTTP: perhaps a probe
    except TimeoutError:
        # a probe busy starting its engine (a quick calibration, imports) may take longer
        # than ``timeout`` to close on the HTTP bytes; its hello is worth one more try
        silent = True
    except OSError as exc:
        return Found(host, port, "other", f"open, then {exc.strerror or type(exc).__name__}")
    else:
        if status == 200 and _has_family(body, b"vllm:"):
            return _vllm_found(host, port, timeout)
        return _http_other(host, port, status, body, timeout)
    rec = probe_hello(host, port, token, timeout)
    url = f"tcp://{_host_for_url(host)}:{port}"
    if isinstance(rec, Hello):
        e = rec.engine
        parts = [e.name]
        if e.model:
            parts.append(e.model)
        if e.random_weights:
            parts.append("RANDOM WEIGHTS")
        return Found(host, port, "probe", "rltperf probe: " + ", ".join(parts), url)
    if isinstance(rec, Refused):
        return Found(host, port, "probe-refused", f"rltperf probe that refused: {rec.reason}")
    if silent:
        return Found(host, port, "other", f"open, said nothing within {timeout:g} s")
    return Found(host, port, "other", "open, neither HTTP nor an rltperf probe")


def scan(
    rng: PortRange,
    token: str | None = None,
    timeout: float = IDENTIFY_TIMEOUT_S,
    connect_timeout: float = CONNECT_TIMEOUT_S,
) -> ScanResult:
    """Scan one range: every open port, identified (in port order)."""
    t0 = time.monotonic()
    token = token or os.environ.get("RLTPERF_TOKEN") or None
    ports = list(range(rng.lo, rng.hi + 1))
    opened = open_ports(rng.host, ports, connect_timeout)
    found: list[Found] = []
    if opened:
        with ThreadPoolExecutor(
            max_workers=min(WORKERS, len(opened)), thread_name_prefix="rltperf-auto"
        ) as ex:
            found = list(ex.map(lambda p: identify(rng.host, p, token, timeout), opened))
    return ScanResult(rng, found, closed=len(ports) - len(opened), seconds=time.monotonic() - t0)


__all__ = [
    "MAX_PORTS",
    "Found",
    "PortRange",
    "RangeError",
    "ScanResult",
    "identify",
    "open_ports",
    "parse_range",
    "probe_hello",
    "scan",
]
