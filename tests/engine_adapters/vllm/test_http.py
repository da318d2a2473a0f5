"""The vLLM adapter's HTTP client against a real HTTP/1.1 server on a loopback socket
(``http.server``): a session's scrapes share one keep-alive connection
(``KeptConnection``), survive the server dropping it or restarting, and never read a
late answer as the next one's."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from engine_adapters.monitor.vllm.http import HttpClient, ServerUnreachable


class Counting(ThreadingHTTPServer):
    """Answers every GET with the number of requests it has had (``1``, ``2``, ...);
    counts the connections it accepted.  ``close_each``: answers with ``Connection:
    close``; ``slow``: seconds the next answer waits (once)."""

    daemon_threads = True

    def __init__(self, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.requests = 0
        self.connections = 0
        self.close_each = False
        self.slow = 0.0
        self.lock = threading.Lock()
        self.open: list[socket.socket] = []
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def stop(self) -> None:
        """Stop as a process that exits does: the listening socket and every open
        connection close."""
        self.shutdown()
        self.server_close()
        for sock in self.open:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Counting

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections += 1
            self.server.open.append(self.connection)

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.requests += 1
            n, delay, self.server.slow = self.server.requests, self.server.slow, 0.0
        if delay:
            time.sleep(delay)
        body = str(n).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        if self.server.close_each:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Counting]:
    s = Counting()
    try:
        yield s
    finally:
        s.stop()


def test_scrapes_share_one_connection(server: Counting) -> None:
    kept = HttpClient(f"http://127.0.0.1:{server.port}", timeout=5).kept()
    answers = [kept.get("/metrics") for _ in range(5)]
    kept.close()
    assert answers == [(200, str(i).encode()) for i in range(1, 6)]
    assert server.connections == 1 and kept.connections == 1
    # the client's one-off requests still open one connection each
    client = HttpClient(f"http://127.0.0.1:{server.port}", timeout=5)
    assert [client.request("GET", "/x")[1] for _ in range(2)] == [b"6", b"7"]
    assert server.connections == 3


def test_a_server_that_closes_each_connection_still_answers_every_scrape(server: Counting) -> None:
    server.close_each = True
    kept = HttpClient(f"http://127.0.0.1:{server.port}", timeout=5).kept()
    assert [kept.get("/metrics")[1] for _ in range(4)] == [b"1", b"2", b"3", b"4"]
    assert server.connections == 4 == kept.connections


def test_a_restarted_server_answers_the_first_scrape_after_it() -> None:
    first = Counting()
    port = first.port
    kept = HttpClient(f"http://127.0.0.1:{port}", timeout=5).kept()
    try:
        assert kept.get("/metrics") == (200, b"1")
        first.stop()  # the kept connection is now dead
        with pytest.raises(ServerUnreachable, match="connection refused"):
            kept.get("/metrics")
        again = Counting(port)
        try:
            assert kept.get("/metrics") == (200, b"1")  # the new server's first request
            assert again.connections == 1
        finally:
            again.stop()
    finally:
        kept.close()


def test_a_connection_dropped_unannounced_is_replaced_without_an_error(server: Counting) -> None:
    """As when a proxy or the server's idle timeout closed it between two scrapes."""
    kept = HttpClient(f"http://127.0.0.1:{server.port}", timeout=5).kept()
    assert kept.get("/metrics")[1] == b"1"
    server.open[0].shutdown(socket.SHUT_RDWR)  # the server's end of the kept connection
    time.sleep(0.1)
    assert kept.get("/metrics")[1] == b"2"  # sent again on a new connection
    assert kept.connections == server.connections == 2
    kept.close()


def test_a_late_answer_is_never_read_as_the_next_one(server: Counting) -> None:
    kept = HttpClient(f"http://127.0.0.1:{server.port}", timeout=0.3).kept()
    assert kept.get("/metrics")[1] == b"1"
    server.slow = 1.0
    with pytest.raises(ServerUnreachable) as exc:
        kept.get("/metrics")  # request 2 answers after the timeout
    assert exc.value.timed_out
    time.sleep(1.0)  # its answer has come by now, on the connection that timed out
    assert kept.get("/metrics")[1] == b"3"  # not "2": that connection was closed
    assert kept.connections == 2
