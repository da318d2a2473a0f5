"""Framing: 4-byte big-endian length prefix + a msgpack body holding one record.

The same frames travel on the probe socket and fill a recording file.  Decoding uses one
reused typed ``msgspec.msgpack.Decoder``; anything wrong with a frame (oversize,
undecodable, unknown tag) raises ``FrameError`` whose message says what and why, so
the reader can close that one connection and log the reason.
"""

from __future__ import annotations

import re
import struct
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import msgspec

from engine_adapters.definitions.records import DATA_RECORDS, Batch, Record

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


def _flatten_into(out: list[Record], rec: Record) -> None:
    """Append a decoded frame's records: a ``Batch``'s own, or the record itself (no
    reader above this module ever sees a ``Batch``)."""
    if type(rec) is Batch:
        out.extend(rec.records)
    else:
        out.append(rec)


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
                _flatten_into(out, rec)
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


# -- reading damaged streams (recordings) ---------------------------------------------------

# Every frame body is a tagged array: an array header, then the tag as a short string.  A
# resynchronising reader only tries offsets where that pattern starts (found with one
# regex search instead of a Python loop over every byte).
_TAGS = sorted(t.__struct_config__.tag for t in typing.get_args(Record))
_BODY_START = re.compile(
    b"(?:[\x90-\x9f]|\xdc..|\xdd....)(?:"
    + b"|".join(re.escape(msgspec.msgpack.encode(t)) for t in _TAGS)
    + b")",
    re.DOTALL,
)
_BODY_PREFIX = 5 + 1 + max(len(t) for t in _TAGS)
"""Bytes of a body needed to tell whether it starts like a record."""
_TRUNCATED = -1


def _skip(b: bytes | bytearray, i: int, n: int) -> int | None:
    """Offset just past the msgpack object starting at ``b[i]``; ``_TRUNCATED`` when it
    runs past ``n``; None when the bytes are not msgpack (0xc1, the never-used byte)."""
    todo = 1
    while todo:
        if i >= n:
            return _TRUNCATED
        t = b[i]
        todo -= 1
        if t <= 0x7F or t >= 0xE0:  # fixints
            i += 1
        elif t <= 0x8F:  # fixmap
            todo += 2 * (t & 0x0F)
            i += 1
        elif t <= 0x9F:  # fixarray
            todo += t & 0x0F
            i += 1
        elif t <= 0xBF:  # fixstr
            i += 1 + (t & 0x1F)
        elif t in (0xC0, 0xC2, 0xC3):  # nil, false, true
            i += 1
        elif t == 0xC1:
            return None
        else:
            w = _WIDTH.get(t)
            if w is not None:  # fixed-width number or fixext
                i += w
                continue
            k, extra, mult = _VAR[t]  # length field bytes, bytes after it, items per count
            if i + 1 + k > n:
                return _TRUNCATED
            count = int.from_bytes(b[i + 1 : i + 1 + k], "big")
            if mult:
                todo += mult * count
                i += 1 + k
            else:
                i += 1 + k + extra + count
    return _TRUNCATED if i > n else i


_WIDTH = {0xCA: 5, 0xCB: 9, 0xCC: 2, 0xCD: 3, 0xCE: 5, 0xCF: 9, 0xD0: 2, 0xD1: 3, 0xD2: 5, 0xD3: 9}
_WIDTH.update({0xD4: 3, 0xD5: 4, 0xD6: 6, 0xD7: 10, 0xD8: 18})
_VAR = {
    0xC4: (1, 0, 0), 0xC5: (2, 0, 0), 0xC6: (4, 0, 0),  # bin
    0xC7: (1, 1, 0), 0xC8: (2, 1, 0), 0xC9: (4, 1, 0),  # ext (type byte after the length)
    0xD9: (1, 0, 0), 0xDA: (2, 0, 0), 0xDB: (4, 0, 0),  # str
    0xDC: (2, 0, 1), 0xDD: (4, 0, 1),  # array
    0xDE: (2, 0, 2), 0xDF: (4, 0, 2),  # map
}  # fmt: skip


@dataclass
class Damage:
    """One run of bytes a ``RecoveringFrameReader`` could not read as whole frames."""

    offset: int
    """Stream offset of its first byte (a file offset for a recording)."""
    size: int
    """Its length in bytes."""
    reason: str
    """Why the frame that starts it could not be read (the first error there)."""
    recovered: int = 0
    """Records found whole inside it (those of a damaged ``Batch``) and kept."""


class RecoveringFrameReader:
    """Frame splitter for a stored stream that may be damaged: it never raises.

    A frame that cannot be read (a flipped length byte, a flipped body byte, garbage) is
    skipped: the reader resynchronises on the next offset where a plausible length is
    followed by a body that decodes as a record.  Whole records found inside the skipped
    bytes (the rest of a damaged ``Batch``, a frame whose length prefix was damaged) are
    kept.  Every skipped run is listed in ``damage`` with its stream offset; call
    ``finish()`` at the end of the stream.  The format has no checksum: a flip that
    leaves well-typed msgpack (a changed number) cannot be seen.
    """

    def __init__(self, max_frame: int = MAX_FRAME, offset: int = 0) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()
        self._base = offset  # stream offset of _buf[0]
        self.damage: list[Damage] = []
        """Skipped runs of bytes, in stream order (adjacent runs merged)."""
        self.truncated_bytes = 0
        """Bytes at the end of the stream that begin a frame but stop short (a cut-off
        write); set by ``finish()``; not counted in ``damage``."""
        self.truncated_recovered = 0
        """Whole records found inside that cut-off frame and kept."""

    @property
    def skipped_bytes(self) -> int:
        """Bytes in damaged runs (not read as whole frames)."""
        return sum(d.size for d in self.damage)

    @property
    def recovered_records(self) -> int:
        """Records kept from inside damaged runs."""
        return sum(d.recovered for d in self.damage)

    @property
    def pending(self) -> int:
        """Bytes buffered and not yet resolved."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Record]:
        """Append ``data`` and return every record now resolved, in stream order."""
        self._buf += data
        return self._drain(final=False)

    def finish(self) -> list[Record]:
        """End of the stream: resolve what is buffered (a cut-off tail, trailing garbage)."""
        out = self._drain(final=True)
        self._buf.clear()
        return out

    def _frame_at(self, pos: int, n: int, final: bool) -> tuple[int, Record | None, str]:
        """(end, record, why) for a frame at ``pos``: a record; or end 0 = wait for more
        data; or record None with the reason it is bad (end = its declared end or 0)."""
        buf = self._buf
        if n - pos < HEADER_SIZE:
            return (0, None, "") if not final else (n, None, "a cut-off frame header")
        (size,) = _LEN.unpack_from(buf, pos)
        if size == 0:
            return -1, None, "empty frame"
        if size > self.max_frame:
            return -1, None, f"frame length {size} exceeds the {self.max_frame}-byte limit"
        end = pos + HEADER_SIZE + size
        if end > n:
            have = n - pos - HEADER_SIZE
            looks_like = have < _BODY_PREFIX or _BODY_START.match(buf, pos + HEADER_SIZE) is not None
            if not looks_like:
                return -1, None, "not a frame"
            return (end, None, "a cut-off frame") if final else (0, None, "")
        try:
            # A copy, not a memoryview: an exception must not pin an export of the buffer.
            return end, _decoder.decode(buf[pos + HEADER_SIZE : end]), ""
        except msgspec.ValidationError as exc:
            return -1, None, f"bad record: {exc}"
        except msgspec.DecodeError as exc:
            return -1, None, f"undecodable frame: {exc}"

    def _next_frame(self, start: int, n: int, final: bool) -> tuple[int, bool]:
        """The next frame start at or after ``start``: (offset, True) for a good frame or
        one still arriving; (how far the search could decide, False) when none was found
        (no frame starts before that offset)."""
        buf = self._buf
        i = start + HEADER_SIZE
        while True:
            m = _BODY_START.search(buf, i)
            if m is None:
                return (n if final else max(start, n - HEADER_SIZE - _BODY_PREFIX)), False
            f = m.start() - HEADER_SIZE
            end, rec, _why = self._frame_at(f, n, final)
            if rec is not None or end == 0:
                return f, True
            i = m.start() + 1

    def _salvage(self, a: int, b: int, final: bool) -> tuple[list[Record], int]:
        """Whole records inside the damaged bytes ``[a, b)`` and how far that was decided
        (short of ``b`` when a record may continue past the data read so far)."""
        buf = self._buf
        out: list[Record] = []
        i = a
        while True:
            m = _BODY_START.search(buf, i, b)
            if m is None:
                return out, b if final else max(i, b - _BODY_PREFIX)
            s = m.start()
            e = _skip(buf, s, b)
            if e == _TRUNCATED and not final:
                return out, s
            if e is not None and e > 0:
                try:
                    rec = _decoder.decode(buf[s:e])
                except (msgspec.ValidationError, msgspec.DecodeError):
                    pass
                else:
                    _flatten_into(out, rec)
                    i = e
                    continue
            i = s + 1

    def _skip_run(self, a: int, b: int, why: str, recovered: int) -> None:
        off = self._base + a
        last = self.damage[-1] if self.damage else None
        if last is not None and last.offset + last.size == off:
            last.size += b - a
            last.recovered += recovered
        else:
            self.damage.append(Damage(offset=off, size=b - a, reason=why, recovered=recovered))

    def _drain(self, final: bool) -> list[Record]:
        buf = self._buf
        n = len(buf)
        out: list[Record] = []
        pos = 0
        try:
            while pos < n:
                end, rec, why = self._frame_at(pos, n, final)
                if rec is not None:
                    _flatten_into(out, rec)
                    pos = end
                    continue
                if end == 0:
                    break  # a frame still arriving
                stop, found = self._next_frame(pos + 1, n, final)
                if not found and final and why in ("a cut-off frame", "a cut-off frame header"):
                    recs, _ = self._salvage(pos, n, final=True)
                    out.extend(recs)
                    self.truncated_bytes = n - pos
                    self.truncated_recovered = len(recs)
                    pos = n
                    break
                recs, upto = self._salvage(pos, stop, final or found)
                if upto <= pos:
                    break  # nothing decided yet: wait for more data
                out.extend(recs)
                self._skip_run(pos, upto, why, len(recs))
                pos = upto
        finally:
            if pos:
                del buf[:pos]
                self._base += pos
        return out


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
