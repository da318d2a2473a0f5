"""Recording files (``.rltrec``): a header, then the same frames as the wire.

Layout: the 8 magic bytes ``RLTREC1\\n``, one length-prefixed msgpack map (the header:
``format``, ``schema``, ``created_utc``, ``target``, ``rltperf_version``, ``host``), then
frames of records exactly as the probe sends them (the stream's ``Hello`` first).  A file
cut short (a crash, a full disk) reads up to its last whole frame; a damaged file reads
every frame it can (see ``RecordingReader``).
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from typing import IO, Any

import msgspec

from engine_adapters import __version__
from engine_adapters.definitions.records import SCHEMA_VERSION, Record, SessionEvent
from engine_adapters.definitions.wire import Damage, FrameEncoder, RecoveringFrameReader

MAGIC = b"RLTREC1\n"
FORMAT = 1
SUFFIX = ".rltrec"


class RecordingError(Exception):
    """The file is not a readable recording; the message says why."""


class RecordingWriter:
    """Appends records to a new recording file (refuses to overwrite one)."""

    def __init__(self, path: str | os.PathLike[str], target: str = "", overwrite: bool = False) -> None:
        self.path = os.fspath(path)
        mode = "wb" if overwrite else "xb"
        try:
            self._f: IO[bytes] = open(self.path, mode)  # noqa: SIM115 - closed in close()
        except FileExistsError:
            raise RecordingError(
                f"{self.path} exists: choose another name (recordings are never overwritten)"
            ) from None
        except OSError as exc:
            raise RecordingError(f"cannot create {self.path}: {exc.strerror}") from None
        header = {
            "format": FORMAT,
            "schema": SCHEMA_VERSION,
            "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "target": target,
            "rltperf_version": __version__,
            "host": socket.gethostname(),
        }
        body = msgspec.msgpack.encode(header)
        self._enc = FrameEncoder()
        self.records = 0
        self.bytes = 0
        self._write(MAGIC + struct.pack(">I", len(body)) + body)

    def _write(self, data: bytes) -> None:
        try:
            self._f.write(data)
        except OSError as exc:
            raise RecordingError(f"cannot write {self.path}: {exc.strerror}") from None
        self.bytes += len(data)

    def write(self, recs: Iterable[Record]) -> None:
        """Append records (session-local ``SessionEvent``s are skipped)."""
        keep = [r for r in recs if not isinstance(r, SessionEvent)]
        if keep:
            self._write(self._enc.encode_batched(keep))
            self.records += len(keep)

    def flush(self) -> None:
        """Push buffered frames to the OS."""
        try:
            self._f.flush()
        except OSError as exc:
            raise RecordingError(f"cannot write {self.path}: {exc.strerror}") from None

    def close(self) -> None:
        """Flush and close (idempotent; never raises: a write that failed has said so
        already, and a monitor stopping a recording must not fail with it)."""
        if not self._f.closed:
            try:
                self._f.flush()
                os.fsync(self._f.fileno())
            except OSError:
                pass
            try:
                self._f.close()  # flushes what is still buffered once more: a full disk fails again
            except OSError:
                pass

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RecordingReader:
    """Reads a recording: ``header`` then ``records()`` (streamed, bounded memory).

    Damage never stops the read: a frame that cannot be read is skipped and the reader
    resynchronises on the next good frame (``RecoveringFrameReader``), keeping the
    records before and after it.  After the read: ``records_read``, ``damage`` (a list
    of ``Damage(offset, size, reason, recovered)`` with file offsets), ``skipped_bytes``,
    ``recovered_records``, ``truncated_bytes`` (a cut-off last frame) and ``warning``
    (one sentence naming all of it, or None for an intact file).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        try:
            self._f: IO[bytes] = open(self.path, "rb")  # noqa: SIM115 - closed in close()
        except FileNotFoundError:
            raise RecordingError(f"{self.path}: no such file") from None
        except OSError as exc:
            raise RecordingError(f"cannot open {self.path}: {exc.strerror}") from None
        magic = self._f.read(len(MAGIC))
        # One or two damaged bytes in the magic still leave a recording worth reading.
        if len(magic) < len(MAGIC) or sum(a != b for a, b in zip(magic, MAGIC, strict=True)) > 2:
            self._f.close()
            raise RecordingError(f"{self.path} is not an rltperf recording (no RLTREC1 header)")
        self.header_damaged = magic != MAGIC
        """The magic or the header map was damaged (``header`` then holds what was read)."""
        raw = self._f.read(4)
        if len(raw) < 4:
            self._f.close()
            raise RecordingError(f"{self.path}: header cut short")
        (n,) = struct.unpack(">I", raw)
        self.header: dict[str, Any] = {}
        self._start = len(MAGIC) + 4 + n  # file offset of the first frame
        try:
            if n > 1 << 20:
                raise msgspec.DecodeError("header length implausible")
            header = msgspec.msgpack.decode(self._f.read(n))
            if not isinstance(header, dict):
                raise msgspec.DecodeError("header is not a map")
            self.header = header
        except msgspec.DecodeError:
            # Read the frames anyway: the scan starts after the magic and skips the header.
            self.header_damaged = True
            self._start = len(MAGIC)
            self._f.seek(self._start)
        if not self.header_damaged and self.header.get("schema") != SCHEMA_VERSION:
            self._f.close()
            raise RecordingError(
                f"{self.path} has schema {self.header.get('schema')}, this rltperf reads {SCHEMA_VERSION}"
            )
        self._frames = RecoveringFrameReader(offset=self._start)
        self._frames_end = self._start
        self.records_read = 0
        """Records read so far (recovered ones included)."""

    @property
    def damage(self) -> list[Damage]:
        """Skipped runs of bytes, with file offsets (the header's, if damaged, first)."""
        return self._frames.damage

    @property
    def skipped_bytes(self) -> int:
        """Bytes skipped as unreadable (the cut-off tail is ``truncated_bytes``)."""
        return self._frames.skipped_bytes

    @property
    def recovered_records(self) -> int:
        """Records kept from inside damaged frames (a damaged ``Batch``'s whole records)."""
        return self._frames.recovered_records + self._frames.truncated_recovered

    @property
    def truncated_bytes(self) -> int:
        """Bytes of a cut-off last frame (a crash or a full disk while recording)."""
        return self._frames.truncated_bytes

    @property
    def damaged(self) -> bool:
        """Whether anything at all was skipped or cut off."""
        return bool(self.damage or self.truncated_bytes or self.header_damaged)

    @property
    def warning(self) -> str | None:
        """One sentence on what was skipped and where (file byte offsets), or None."""
        parts = []
        if self.header_damaged:
            parts.append("the file header is damaged")
        if self.damage:
            where = ", ".join(f"{d.size} at byte {d.offset}" for d in self.damage[:5])
            if len(self.damage) > 5:
                where += f" and {len(self.damage) - 5} more"
            rec = self._frames.recovered_records
            parts.append(
                f"skipped {self.skipped_bytes} damaged bytes in {len(self.damage)} "
                f"run{'s' if len(self.damage) > 1 else ''} ({where}; first: {self.damage[0].reason})"
                + (f", {rec} record{'s' if rec > 1 else ''} recovered from inside them" if rec else "")
            )
        if self.truncated_bytes:
            rec = self._frames.truncated_recovered
            parts.append(
                f"the last {self.truncated_bytes} bytes (from byte "
                f"{self._frames_end - self.truncated_bytes}) are a cut-off frame"
                + (f", {rec} whole record{'s' if rec > 1 else ''} recovered from it" if rec else "")
            )
        if not parts:
            return None
        return f"{'; '.join(parts)}; read {self.records_read} records"

    @property
    def error(self) -> str | None:
        """Older name of ``warning``."""
        return self.warning

    def chunks(self, chunk_records_hint: int = 4096) -> Iterator[list[Record]]:
        """Yield lists of records as they are read (about 256 KiB of file each)."""
        frames = self._frames
        self._frames_end = self._start
        while True:
            data = self._f.read(1 << 18)
            if not data:
                break
            self._frames_end += len(data)
            recs = frames.feed(data)
            if recs:
                self.records_read += len(recs)
                yield recs
        recs = frames.finish()
        if recs:
            self.records_read += len(recs)
            yield recs

    def records(self) -> Iterator[Record]:
        """Every record in order."""
        for chunk in self.chunks():
            yield from chunk

    def close(self) -> None:
        """Close the file."""
        self._f.close()

    def __enter__(self) -> RecordingReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_all(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[Record]]:
    """Header and all records of a (small) recording."""
    with RecordingReader(path) as r:
        return r.header, list(r.records())


def scan(path: str | os.PathLike[str]) -> RecordingReader:
    """Read a whole recording without keeping its records, for its damage report
    (``warning``, ``damage``, ...) and ``records_read``; raises ``RecordingError`` for a
    file that is not a recording at all."""
    with RecordingReader(path) as r:
        for _ in r.chunks():
            pass
        return r
