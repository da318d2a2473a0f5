"""Recording files (``.rltrec``): a header, then the same frames as the wire.

Layout: the 8 magic bytes ``RLTREC1\\n``, one length-prefixed msgpack map (the header:
``format``, ``schema``, ``created_utc``, ``target``, ``rltperf_version``, ``host``), then
frames of records exactly as the probe sends them (the stream's ``Hello`` first).  A file
cut short (a crash, a full disk) reads up to its last whole frame.
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
from engine_adapters.records import SCHEMA_VERSION, Record, SessionEvent
from engine_adapters.wire import FrameEncoder, FrameError, FrameReader

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
        """Flush and close (idempotent)."""
        if not self._f.closed:
            try:
                self._f.flush()
                os.fsync(self._f.fileno())
            except OSError:
                pass
            self._f.close()

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RecordingReader:
    """Reads a recording: ``header`` then ``records()`` (streamed, bounded memory)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        try:
            self._f: IO[bytes] = open(self.path, "rb")  # noqa: SIM115 - closed in close()
        except FileNotFoundError:
            raise RecordingError(f"{self.path}: no such file") from None
        except OSError as exc:
            raise RecordingError(f"cannot open {self.path}: {exc.strerror}") from None
        magic = self._f.read(len(MAGIC))
        if magic != MAGIC:
            self._f.close()
            raise RecordingError(f"{self.path} is not an rltperf recording (no RLTREC1 header)")
        raw = self._f.read(4)
        if len(raw) < 4:
            self._f.close()
            raise RecordingError(f"{self.path}: header cut short")
        (n,) = struct.unpack(">I", raw)
        body = self._f.read(n)
        try:
            self.header: dict[str, Any] = msgspec.msgpack.decode(body)
        except msgspec.DecodeError:
            self._f.close()
            raise RecordingError(f"{self.path}: header unreadable") from None
        if self.header.get("schema") != SCHEMA_VERSION:
            self._f.close()
            raise RecordingError(
                f"{self.path} has schema {self.header.get('schema')}, this rltperf reads {SCHEMA_VERSION}"
            )
        self.truncated_bytes = 0
        self.error: str | None = None

    def chunks(self, chunk_records_hint: int = 4096) -> Iterator[list[Record]]:
        """Yield lists of records as they are read (about 256 KiB of file each)."""
        reader = FrameReader()
        while True:
            data = self._f.read(1 << 18)
            if not data:
                break
            try:
                recs = reader.feed(data)
            except FrameError as exc:
                self.error = f"{self.path}: {exc}; read stops there"
                break
            if recs:
                yield recs
        self.truncated_bytes = reader.pending

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
