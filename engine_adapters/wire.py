"""Framing: 4-byte big-endian length prefix + a msgpack body holding one record.

The same frames travel on the probe socket and fill a recording file.  Decoding uses one
reused typed ``msgspec.msgpack.Decoder``; anything wrong with a frame (oversize,
undecodable, unknown tag) raises ``FrameError`` whose message says what and why, so
the reader can close that one connection and log the reason.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

import msgspec

from engine_adapters.records import DATA_RECORDS, Batch, Record

DEFAULT_PORT = 7788
"""Default probe port."""
DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"
"""Default probe listen address (loopback only)."""
MAX_FRAME = 4 * 1024 * 1024
"""Largest frame body accepted, bytes. A step record is ~140 B; a Hello a few KB."""
MAX_BATCH = 1024
"""Records per ``Batch`` frame (~150 KB of step records)."""

_LEN = struct.Struct(">I")
HEADER_SIZE = _LEN.size


class FrameError(Exception):
    """A frame could not be read; the message says why (for the log and the screen)."""


_encoder = msgspec.msgpack.Encoder()
_decoder: msgspec.msgpack.Decoder[Record] = msgspec.msgpack.Decoder(Record)


def encode(rec: Record) -> bytes:
    """One record as a complete frame (prefix + body)."""
    body = _encoder.encode(rec)
    return _LEN.pack(len(body)) + body


class FrameEncoder:
    """Encodes many records into one reused buffer (no per-record allocation of the body)."""

    def __init__(self) -> None:
        self._enc = msgspec.msgpack.Encoder()
        self._buf = bytearray(64 * 1024)

    def encode_many(self, recs: Iterable[Record]) -> bytes:
        """Frames for ``recs`` concatenated, as bytes."""
        buf = self._buf
        pos = 0
        enc = self._enc.encode_into
        for rec in recs:
            start = pos + HEADER_SIZE
            enc(rec, buf, start)
            end = len(buf)
            _LEN.pack_into(buf, pos, end - start)
            pos = end
        out = bytes(buf[:pos])
        # encode_into may have grown the buffer; keep it from growing without bound.
        if len(buf) > 4 * 1024 * 1024:
            self._buf = bytearray(64 * 1024)
        else:
            del buf[pos:]
        return out

    def encode_batched(self, recs: Sequence[Record]) -> bytes:
        """Frames for ``recs``, runs of data records packed into ``Batch`` frames (order
        kept; control records stay single frames)."""
        out: list[Record] = []
        run: list[Record] = []
        for rec in recs:
            if isinstance(rec, DATA_RECORDS):
                run.append(rec)
                if len(run) >= MAX_BATCH:
                    out.append(Batch(records=run))  # type: ignore[arg-type]
                    run = []
                continue
            if run:
                out.append(Batch(records=run) if len(run) > 1 else run[0])  # type: ignore[arg-type]
                run = []
            out.append(rec)
        if run:
            out.append(Batch(records=run) if len(run) > 1 else run[0])  # type: ignore[arg-type]
        return self.encode_many(out)


def decode_body(body: bytes | memoryview) -> Record:
    """Decode one frame body (a ``Batch`` comes back as is); raises ``FrameError`` with
    the reason on a bad body."""
    try:
        return _decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise FrameError(f"bad record: {exc}") from None
    except msgspec.DecodeError as exc:
        raise FrameError(f"undecodable frame: {exc}") from None


class FrameReader:
    """Incremental frame splitter for a byte stream (socket or file).

    ``feed(data)`` returns the records completed by ``data``.  A ``FrameError`` leaves
    the reader unusable: the caller closes the stream.
    """

    __slots__ = ("_buf", "_decoder", "max_frame")

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self.max_frame = max_frame
        self._decoder = _decoder

    def feed(self, data: bytes | bytearray | memoryview) -> list[Record]:
        """Append ``data`` and return every complete record now available."""
        buf = self._buf
        buf += data
        out: list[Record] = []
        pos = 0
        n = len(buf)
        dec = self._decoder.decode
        mv = memoryview(buf)
        try:
            while n - pos >= HEADER_SIZE:
                (size,) = _LEN.unpack_from(buf, pos)
                if size > self.max_frame:
                    raise FrameError(f"frame of {size} bytes exceeds the {self.max_frame}-byte limit")
                if size == 0:
                    raise FrameError("empty frame")
                end = pos + HEADER_SIZE + size
                if end > n:
                    break
                try:
                    rec = dec(mv[pos + HEADER_SIZE : end])
                except msgspec.ValidationError as exc:
                    raise FrameError(f"bad record: {exc}") from None
                except msgspec.DecodeError as exc:
                    raise FrameError(f"undecodable frame: {exc}") from None
                if type(rec) is Batch:
                    out.extend(rec.records)
                else:
                    out.append(rec)
                pos = end
        finally:
            mv.release()
            if pos:
                del buf[:pos]
        return out

    @property
    def pending(self) -> int:
        """Bytes buffered that do not yet form a whole frame."""
        return len(self._buf)


def parse_hostport(addr: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """``"host:port"``, ``"[::1]:port"``, ``"host"`` or ``":port"`` → (host, port).

    Raises ``ValueError`` with a message naming the bad part.
    """
    addr = addr.strip()
    if not addr:
        raise ValueError("empty address")
    if addr.startswith("["):
        host, _, rest = addr[1:].partition("]")
        port_s = rest[1:] if rest.startswith(":") else ""
    elif addr.count(":") == 1:
        host, _, port_s = addr.partition(":")
    elif ":" in addr:  # bare IPv6
        host, port_s = addr, ""
    else:
        host, port_s = addr, ""
    host = host or "127.0.0.1"
    if not port_s:
        return host, default_port
    try:
        port = int(port_s)
    except ValueError:
        raise ValueError(f"bad port {port_s!r} in address {addr!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} out of range in address {addr!r}")
    return host, port


def is_loopback(host: str) -> bool:
    """True when ``host`` names only this machine."""
    import ipaddress

    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
