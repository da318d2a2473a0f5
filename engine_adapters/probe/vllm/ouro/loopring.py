"""Per-forward loop records, from the model (vLLM's worker) to the plugin's tap (engine core).

On vLLM's CPU platform the model runs in a worker process spawned by the engine core
(the ``mp`` executor), so the tap cannot read the model's Python objects.  The model
writes one fixed-size record per forward into a small ring in a file under
``/dev/shm`` (an ``int64`` memory map: a header and ``SLOTS`` slots); the tap reads the
records that started inside the step it is closing.  A write is a few numpy stores, a
read a few loads: no system call, no lock, no copy of tensors.

**One ring per worker.**  With tensor or pipeline parallelism an engine core drives
several workers, and with data parallelism a server runs several engine cores: each
worker writes its own ring, ``<base>-dp<D>-pp<P>-tp<T>.ring`` (``rank_path``), and each
engine core reads the rings of its own workers.  The file is allocated in full when it
is created (``os.posix_fallocate``): a full ``/dev/shm`` is then an ``OSError`` at
creation (the model records nothing and says why) rather than a SIGBUS at the first
store into a page the filesystem cannot back.

File: ``HEADER`` int64 words (magic, version, sequence of the last complete record,
slots, slot words, max depth), then ``SLOTS`` slots.  Slot words: sequence, start ns,
end ns (host monotonic, same clock in every process), tokens, output rows, passes run,
logits ns (the LM head, added by ``compute_logits``), collective wait ns (time inside
tensor-parallel all-reduces, -1 when not measured), then ``MAX_DEPTH`` each of pass
time ns, tokens per pass and exits per depth.  The writer fills a slot, then stores its
sequence number in the slot and last in the header; the reader checks the slot's
sequence before and after copying it (a torn read is dropped).

The base path is ``RLTPERF_LOOP_RING`` (set by ``plugin.register`` in the first vLLM
process, inherited by the engine cores and their workers).  ``RLTPERF_LOOP_TIMING=0`` turns the
writer off (the model then records nothing; used to measure its cost).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np

ENV_RING = "RLTPERF_LOOP_RING"
"""Path of the ring file, shared by the model's writer and the tap's reader."""
ENV_TIMING = "RLTPERF_LOOP_TIMING"
"""``0`` turns the model's per-loop timing off (default on when the probe is enabled)."""
MAGIC = 0x524C5450_4C4F4F50  # "RLTPLOOP"
VERSION = 2
HEADER = 8
SLOTS = 256
MAX_DEPTH = 64
_FIXED = 8
SLOT_WORDS = _FIXED + 3 * MAX_DEPTH
_SEQ, _T0, _T1, _TOK, _ROWS, _PASSES, _LOGITS, _WAIT = range(_FIXED)


def default_path() -> str:
    """Where a ring for this process tree goes: ``/dev/shm`` when present."""
    base = (
        "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    )
    return os.path.join(base, f"rltperf-loops-{os.getpid()}.ring")


def rank_path(base: str, dp: int, pp: int, tp: int) -> str:
    """The ring of one worker: ``base`` (``RLTPERF_LOOP_RING``) with its ranks in the name."""
    stem = base[: -len(".ring")] if base.endswith(".ring") else base
    return f"{stem}-dp{dp}-pp{pp}-tp{tp}.ring"


def _words() -> int:
    return HEADER + SLOTS * SLOT_WORDS


@dataclass
class LoopRecord:
    """One model forward: its time span, tokens and per-pass figures."""

    start_ns: int
    end_ns: int
    tokens: int
    rows: int
    passes: int
    logits_ns: int
    wait_ns: int | None
    loop_ns: list[int]
    loop_tokens: list[int]
    exit_hist: list[int]


class RingWriter:
    """The model's side: creates (truncates) the ring file and appends records.

    Raises ``OSError`` when the file cannot be created or fully allocated (a full
    ``/dev/shm``); nothing is left behind then."""

    def __init__(self, path: str) -> None:
        self.path = path
        size = _words() * 8
        with open(path, "w+b") as f:
            try:
                f.truncate(size)
                # every page backed now: a store into the mapping can never SIGBUS later
                os.posix_fallocate(f.fileno(), 0, size)
                self._map = mmap.mmap(f.fileno(), size)
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(path)
                raise
        # a plain ndarray over the mapping (np.memmap's per-slice objects cost µs per store)
        self.mm: Any = np.frombuffer(self._map, dtype=np.int64)
        self.mm[1:6] = (VERSION, 0, SLOTS, SLOT_WORDS, MAX_DEPTH)
        self.mm[0] = MAGIC
        self.buf = np.zeros(SLOT_WORDS, dtype=np.int64)
        self.seq = 0

    def write(
        self, start_ns: int, end_ns: int, tokens: int, rows: int, loop_ns: Any, loop_tokens: Any, exit_hist: Any,
        wait_ns: int = -1,
    ) -> None:  # fmt: skip
        """Append one forward's record (the per-depth arguments: sequences of ints or int
        arrays; ``wait_ns`` -1: collective wait not measured)."""
        seq = self.seq + 1
        off = HEADER + (seq % SLOTS) * SLOT_WORDS
        b = self.buf
        n = min(len(loop_ns), MAX_DEPTH)
        b[_SEQ] = seq
        b[_T0], b[_T1], b[_TOK], b[_ROWS], b[_PASSES], b[_LOGITS] = start_ns, end_ns, tokens, rows, n, 0
        b[_WAIT] = wait_ns
        f = _FIXED
        b[f : f + n] = loop_ns[:n]
        b[f + MAX_DEPTH : f + MAX_DEPTH + n] = loop_tokens[:n]
        b[f + 2 * MAX_DEPTH : f + 2 * MAX_DEPTH + n] = exit_hist[:n]
        mm = self.mm
        mm[off + _SEQ] = 0  # invalid while being written
        mm[off + 1 : off + SLOT_WORDS] = b[1:]
        mm[off + _SEQ] = seq
        mm[2] = seq
        self.seq = seq

    def add_logits(self, ns: int) -> None:
        """Add the LM head's time to the last record (``compute_logits`` runs after ``forward``)."""
        if self.seq:
            self.mm[HEADER + (self.seq % SLOTS) * SLOT_WORDS + _LOGITS] += ns

    def close(self) -> None:
        """Drop the mapping (the reader removes the file)."""
        self.mm = None


class RingReader:
    """The tap's side: opens the ring when the model has created it; reads new records."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.mm: Any = None
        self.last = 0
        self.tried = False

    def open(self) -> bool:
        """Map the ring if the model has created it; then remove its name (the mappings stay
        valid in both processes, and nothing is left behind however the engine stops)."""
        if self.mm is not None:
            return True
        first, self.tried = not self.tried, True
        try:
            if os.path.getsize(self.path) < _words() * 8:
                return False
            mm = np.memmap(self.path, dtype=np.int64, mode="r", shape=(_words(),))
        except (OSError, ValueError):
            return False
        if int(mm[0]) != MAGIC or int(mm[1]) != VERSION:
            return False
        self.mm = mm
        # records written before the first attempt (warm-up) are not steps; a ring created
        # after it holds only forwards the tap has seen begin
        self.last = int(mm[2]) if first else 0
        try:
            os.unlink(self.path)
        except OSError:
            pass
        return True

    def read_new(self) -> list[LoopRecord]:
        """Records completed since the last call (oldest first; a lapped ring loses the oldest)."""
        if not self.open():
            return []
        mm = self.mm
        cur = int(mm[2])
        if cur < self.last:  # the writer restarted (a new worker): follow it
            self.last = 0
        first = max(self.last + 1, cur - SLOTS + 1)
        out: list[LoopRecord] = []
        b = _FIXED
        for seq in range(first, cur + 1):
            off = HEADER + (seq % SLOTS) * SLOT_WORDS
            s = np.array(mm[off : off + SLOT_WORDS])
            if int(s[_SEQ]) != seq or int(mm[off + _SEQ]) != seq:
                continue
            n = int(s[_PASSES])
            out.append(
                LoopRecord(
                    start_ns=int(s[_T0]),
                    end_ns=int(s[_T1]),
                    tokens=int(s[_TOK]),
                    rows=int(s[_ROWS]),
                    passes=n,
                    logits_ns=int(s[_LOGITS]),
                    wait_ns=int(s[_WAIT]) if int(s[_WAIT]) >= 0 else None,
                    loop_ns=[int(v) for v in s[b : b + n]],
                    loop_tokens=[int(v) for v in s[b + MAX_DEPTH : b + MAX_DEPTH + n]],
                    exit_hist=[int(v) for v in s[b + 2 * MAX_DEPTH : b + 2 * MAX_DEPTH + n]],
                )
            )
        self.last = cur
        return out

    def close(self) -> None:
        """Drop the mapping (and the file, if it was never opened)."""
        self.mm = None
        try:
            os.unlink(self.path)
        except OSError:
            pass
