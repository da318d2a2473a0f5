"""A small HTTP client for the vLLM server (standard library only).

Every call returns ``(status, body)`` or raises ``ServerUnreachable`` whose message is a
sentence for the screen.  ``HttpClient.request`` opens one connection per call (any
thread: captures, metadata).  The one call made again and again, a session's ``/metrics``
scrape, goes through a ``KeptConnection`` of its poll thread instead: HTTP/1.1
keep-alive saves the connect and the close, about a quarter of a scrape's GET in CPU
time (0.84 -> 0.60 ms against a vLLM server on loopback).
"""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any
from urllib.parse import urlsplit


class ServerUnreachable(Exception):
    """The server could not be reached or did not answer in time."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out
        """True when the server accepted the connection but answered too slowly."""


class HttpClient:
    """Calls to one ``http(s)://host:port`` base URL."""

    def __init__(self, base_url: str, timeout: float = 5.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.timeout = timeout
        self.base_url = f"{parts.scheme}://{parts.netloc}{self.prefix}"

    def request(
        self, method: str, path: str, body: Any = None, timeout: float | None = None
    ) -> tuple[int, bytes]:
        """One request on a connection of its own; ``body`` (if any) is sent as JSON."""
        conn = self.connection(timeout)
        try:
            return self.exchange(conn, method, path, body, timeout)
        finally:
            conn.close()

    def connection(self, timeout: float | None = None) -> http.client.HTTPConnection:
        """A new, unopened connection to the server (it connects on its first request)."""
        conn_cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return conn_cls(self.host, self.port, timeout=timeout or self.timeout)

    def kept(self) -> KeptConnection:
        """A keep-alive connection for one thread's repeated GETs (``KeptConnection``)."""
        return KeptConnection(self)

    def exchange(
        self, conn: http.client.HTTPConnection, method: str, path: str, body: Any, timeout: float | None
    ) -> tuple[int, bytes]:
        """Send one request on ``conn`` and read the whole answer; every failure is a
        ``ServerUnreachable`` (the caller closes ``conn``)."""
        headers = {"Accept": "*/*", "User-Agent": "rltperf"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        where = f"{self.base_url}{path}"
        try:
            conn.request(method, self.prefix + path, body=data, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        except ConnectionRefusedError:
            raise ServerUnreachable(
                f"nothing listens at {self.base_url} (connection refused): is the vLLM server running there?"
            ) from None
        except TimeoutError:
            raise ServerUnreachable(
                f"{where} did not answer within {timeout or self.timeout:g} s", timed_out=True
            ) from None
        except socket.gaierror as exc:
            raise ServerUnreachable(f"cannot resolve host {self.host!r}: {exc.strerror}") from None
        except (OSError, http.client.HTTPException) as exc:
            raise ServerUnreachable(f"{method} {where} failed: {type(exc).__name__}: {exc}") from None

    def send_nowait(self, method: str, path: str, timeout: float = 0.2) -> bool:
        """Send a body-less request and close without reading the answer (the server
        still handles it); every step bounded by ``timeout``.  True when it was sent."""
        try:
            with socket.create_connection((self.host, self.port), timeout=timeout) as sock:
                if self.scheme == "https":
                    import ssl

                    ctx = ssl.create_default_context()
                    with ctx.wrap_socket(sock, server_hostname=self.host) as tls:
                        tls.sendall(self._request_bytes(method, path))
                else:
                    sock.sendall(self._request_bytes(method, path))
                return True
        except OSError:
            return False

    def _request_bytes(self, method: str, path: str) -> bytes:
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return (
            f"{method} {self.prefix}{path} HTTP/1.1\r\nHost: {host}:{self.port}\r\n"
            "User-Agent: rltperf\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        ).encode()

    def get_json(self, path: str, timeout: float | None = None) -> Any:
        """GET ``path`` and decode JSON; None on a non-200 answer or bad JSON."""
        status, body = self.request("GET", path, timeout=timeout)
        if status != 200:
            return None
        try:
            return json.loads(body)
        except ValueError:
            return None


class KeptConnection:
    """One keep-alive connection to the server for a thread that asks again and again (a
    session's poll loop; not shared between threads).

    ``get`` reuses the connection while the server keeps it open.  A kept connection
    the server has dropped since (its idle timeout, a restart) fails at once on the next
    request; that request is sent again, once, on a new connection, so a restarted
    server answers the first scrape after it as with a fresh connection.  Any other
    failure (a timeout above all: a late answer must never be read as the next one's)
    closes the connection and raises, and the next call connects afresh.
    """

    def __init__(self, client: HttpClient) -> None:
        self.client = client
        self._conn: http.client.HTTPConnection | None = None
        self.connections = 0
        """Connections opened so far."""

    def get(self, path: str) -> tuple[int, bytes]:
        """GET ``path`` (the client's timeout): ``(status, body)`` or ``ServerUnreachable``."""
        reused = self._conn is not None
        try:
            return self._get(path)
        except ServerUnreachable as exc:  # (``_get`` closed the connection)
            if not reused or exc.timed_out:
                raise
        return self._get(path)  # the kept connection had gone stale: once more, afresh

    def _get(self, path: str) -> tuple[int, bytes]:
        if self._conn is None:
            self._conn = self.client.connection()
            self.connections += 1
        try:
            status, body = self.client.exchange(self._conn, "GET", path, None, None)
        except ServerUnreachable:
            self.close()
            raise
        if self._conn.sock is None:  # the server said Connection: close
            self.close()
        return status, body

    def close(self) -> None:
        """Close the connection (the next ``get`` opens a new one)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def error_text(body: bytes, limit: int = 300) -> str:
    """The server's error message from a JSON or text error body, shortened."""
    text = body.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return text[:limit]
    if isinstance(data, dict):
        for key in ("message", "detail", "error"):
            v = data.get(key)
            if isinstance(v, dict):
                v = v.get("message", v)
            if v:
                return str(v)[:limit]
    return text[:limit]
