"""Reading and writing Chrome trace files (torch.profiler / Kineto JSON, gzipped or not),
salvaging the complete events of a cut or damaged file.  What the events mean is in
``analysis.traces``."""

from __future__ import annotations

import gzip
import json
import os
import zlib
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TraceFile:
    """A Chrome trace as read from disk, with what was wrong with it."""

    path: str
    events: list[dict[str, Any]]
    """Complete trace events (a damaged file keeps those before the damage)."""
    top: dict[str, Any] = field(default_factory=dict)
    """Top-level keys other than ``traceEvents`` (deviceProperties, baseTimeNanoseconds...)."""
    error: str | None = None
    """What was wrong, as a sentence; None for an intact file."""
    truncated: bool = False
    """The file ends early (cut gzip stream or cut JSON): events after the cut are missing."""
    bytes_on_disk: int = 0
    json_bytes: int = 0


def _gunzip_partial(raw: bytes) -> tuple[bytes, str | None]:
    """Decompress as much of a gzip stream as is intact; (data, problem or None)."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out: list[bytes] = []
    step = 1 << 20
    for i in range(0, len(raw), step):
        try:
            out.append(d.decompress(raw[i : i + step]))
        except zlib.error as exc:
            return b"".join(out), f"the gzip stream is corrupt after {i} compressed bytes ({exc})"
        if d.eof:
            break
    if not d.eof:
        try:
            out.append(d.flush())
        except zlib.error:
            pass
        return b"".join(out), f"the gzip stream is cut short ({len(raw)} compressed bytes, no end marker)"
    return b"".join(out), None


def _salvage_events(text: str) -> tuple[list[dict[str, Any]], dict[str, Any], int]:
    """Complete events of a cut JSON trace: (events, top-level keys read before them, offset reached)."""
    dec = json.JSONDecoder()
    top: dict[str, Any] = {}
    key = text.find('"traceEvents"')
    if key < 0:
        # maybe a bare array of events
        pos = text.find("[")
        if pos < 0:
            return [], top, 0
    else:
        # keys before traceEvents (torch writes schemaVersion, deviceProperties... first)
        head = text[:key].rstrip().rstrip(",")
        try:
            top = json.loads(head + "}") if head.lstrip().startswith("{") else {}
        except ValueError:
            top = {}
        pos = text.find("[", key)
        if pos < 0:
            return [], top, key
    pos += 1
    events: list[dict[str, Any]] = []
    n = len(text)
    while pos < n:
        while pos < n and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= n or text[pos] == "]":
            break
        try:
            obj, end = dec.raw_decode(text, pos)
        except ValueError:
            break
        if isinstance(obj, dict):
            events.append(obj)
        pos = end
    return events, top, pos


def load_trace(path: str | os.PathLike[str]) -> TraceFile:
    """Read a ``.json`` or ``.json.gz`` Chrome trace; a damaged one keeps what is readable.

    Raises ``FileNotFoundError``/``OSError`` only when the file cannot be opened at all.
    """
    p = os.fspath(path)
    with open(p, "rb") as f:
        raw = f.read()
    problem: str | None = None
    truncated = False
    if raw[:2] == b"\x1f\x8b":
        data, problem = _gunzip_partial(raw)
        truncated = problem is not None
    else:
        data = raw
    text = data.decode("utf-8", "replace")
    try:
        obj = json.loads(text)
    except ValueError as exc:
        events, top, reached = _salvage_events(text)
        what = f"the JSON ends or breaks at byte {reached} of {len(data)} ({getattr(exc, 'msg', exc)})"
        problem = f"{problem}; {what}" if problem else what
        truncated = True
        return TraceFile(p, events, top, problem, truncated, len(raw), len(data))
    if isinstance(obj, list):
        events = [e for e in obj if isinstance(e, dict)]
        top = {}
    elif isinstance(obj, dict):
        evs = obj.get("traceEvents")
        if not isinstance(evs, list):
            problem = problem or "the trace has no traceEvents list"
            evs = []
        events = [e for e in evs if isinstance(e, dict)]
        top = {k: v for k, v in obj.items() if k != "traceEvents"}
    else:
        events, top = [], {}
        problem = problem or "the file is JSON but not a Chrome trace"
    return TraceFile(p, events, top, problem, truncated, len(raw), len(data))


def save_trace(
    path: str | os.PathLike[str], events: list[dict[str, Any]], top: dict[str, Any] | None = None
) -> None:
    """Write a (gzipped when the name ends in .gz) Chrome trace; used to make test traces."""
    obj = dict(top or {})
    obj["traceEvents"] = events
    data = json.dumps(obj).encode()
    p = os.fspath(path)
    if p.endswith(".gz"):
        with gzip.open(p, "wb") as f:
            f.write(data)
    else:
        with open(p, "wb") as f:
            f.write(data)
