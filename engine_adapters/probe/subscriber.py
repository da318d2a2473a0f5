"""One subscriber connection of the publisher (``server.py``): its socket, its frame
reader, its control and data queues, and its request-rate window."""

from __future__ import annotations

import socket
import time
from collections import deque

from engine_adapters.definitions.wire import FrameReader

MAX_CLIENT_FRAME = 64 * 1024
"""Clients only send small control frames."""
HELLO_TIMEOUT_S = 5.0
"""A connection that sends no ``ClientHello`` within this is closed."""


class Subscriber:
    """One connection: its frame reader, its two queues and its request budget."""

    __slots__ = (
        "addr",
        "authed",
        "closing",
        "ctrl",
        "data",
        "data_bytes",
        "data_records",
        "dropped",
        "hello_deadline",
        "out",
        "reader",
        "req_count",
        "req_window",
        "sock",
        "stats_queued",
        "token",
        "want_write",
    )

    def __init__(self, sock: socket.socket, addr: str) -> None:
        self.sock = sock
        self.addr = addr
        self.reader = FrameReader(MAX_CLIENT_FRAME)
        self.authed = False
        self.closing = False
        self.ctrl: deque[bytes | None] = deque()  # None: a Stats, encoded when it is sent
        self.stats_queued = False
        self.req_count = 0
        self.req_window = 0.0
        self.data: deque[tuple[bytes, int]] = deque()
        self.data_bytes = 0
        self.data_records = 0
        self.dropped = 0
        self.out: memoryview | None = None
        self.hello_deadline = time.monotonic() + HELLO_TIMEOUT_S
        self.token: str | None = None
        self.want_write = False
