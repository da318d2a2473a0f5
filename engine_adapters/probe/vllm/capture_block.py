"""The capture control block: one small shared file per vLLM worker, from the engine
core's probe to the worker's capture controller and back.

vLLM runs the model in worker processes the engine core's probe cannot profile, so a
capture there is the worker's own ``torch.profiler`` (``worker_capture.py``), driven
from the engine core (``core_capture.py``) through this block.  It is a 4 KiB file under
``/dev/shm`` named like the loop rings (``<base>-dp<D>-pp<P>-tp<T>.cap``; the base is
``RLTPERF_CAPTURE_CTL``, set by ``plugin.register`` in the first vLLM process and
inherited by the engine cores and their workers), created by the worker and allocated
in full (``os.posix_fallocate``: a full ``/dev/shm`` is an ``OSError`` at creation, not
a SIGBUS at a later store), mapped by both sides.  No system call, lock or copy on
either step path: the worker reads one integer per forward (``command_gen``).

Layout: ``WORDS`` little-endian int64 words, then text fields.  Inside a window the
engine core also notes each dispatched step's id (``note_step``, a ring of eight), so the
worker names its ``rltperf.step#<id>`` range after the engine core's step, as the
probe does.  The engine core writes
a command's fields, then its generation last (``CMD_GEN``); the worker writes its
status fields, then ``ST_STATE`` last, and ``ST_GEN`` (the command it answers) before
them.  x86 and ARM both keep a single writer's stores to one mapping in program order
as seen by a reader that checks the last-written word first (the reader re-reads a
status whose generation changed underneath it).

Standard library only.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
from dataclasses import dataclass, field

ENV_CTL = "RLTPERF_CAPTURE_CTL"
"""Base path of the workers' control blocks (``block_path`` adds the ranks)."""
MAGIC = 0x524C5450_43415054  # "RLTPCAPT"
VERSION = 1
SIZE = 4096
WORDS = 48

# words: header, the command (engine core -> worker), the status (worker -> engine core)
_MAGIC, _VERSION, _PID = 0, 1, 2
CMD_GEN, CMD_OP, CMD_START_SEQ, CMD_STEPS, CMD_FULL = 3, 4, 5, 6, 7
ST_GEN, ST_STATE, ST_STEPS_DONE, ST_FIRST_SEQ, ST_LAST_SEQ = 8, 9, 10, 11, 12
ST_WINDOW_START, ST_WINDOW_END, ST_EXPORT_START, ST_EXPORT_END = 13, 14, 15, 16
ST_TRACE_BYTES, ST_EVENTS, ST_STEPS_FOUND, ST_EXPORT_IN, ST_SEEN_SEQ = 17, 18, 19, 20, 21
ST_COSTS = 24  # COST_NAMES, in microseconds, -1 when not measured
STEP_RING, STEP_SLOTS = 32, 8  # (dispatch seq, engine step id) of the window's steps
COST_NAMES = (
    "profiler_start_ms", "profiler_start_cpu_ms", "profiler_stop_ms", "profiler_stop_cpu_ms",
    "save_ms", "save_cpu_ms", "release_ms", "release_cpu_ms",
)  # fmt: skip

# text fields: (offset, length) in bytes
_ID = (WORDS * 8, 64)
_DIR = (_ID[0] + _ID[1], 1024)
_ERROR = (_DIR[0] + _DIR[1], 1024)

OP_START, OP_CANCEL = 1, 2
"""Commands: start a window at ``CMD_START_SEQ``; cancel the running one (its trace is discarded)."""
IDLE, ARMED, WARMUP, CAPTURING, EXPORTING, DONE, FAILED, CANCELLED = range(8)
STATE_NAMES = ("idle", "armed", "warmup", "capturing", "exporting", "done", "failed", "cancelled")
FINAL = (DONE, FAILED, CANCELLED)
"""States in which the worker is finished with a command."""
EXPORT_IN = (None, "child", "thread")


def default_base() -> str:
    """Where the blocks of this process tree go: ``/dev/shm`` when present."""
    d = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    return os.path.join(d, f"rltperf-capture-{os.getpid()}")


def block_path(base: str, dp: int, pp: int, tp: int) -> str:
    """The block of one worker: ``base`` with its ranks in the name."""
    return f"{base}-dp{dp}-pp{pp}-tp{tp}.cap"


@dataclass
class Command:
    """What the engine core asks of a worker."""

    gen: int
    op: int
    start_seq: int
    steps: int
    full: bool
    capture_id: str
    out_dir: str


@dataclass
class Status:
    """What a worker says about the command ``gen``."""

    gen: int
    state: int
    steps_done: int = 0
    first_seq: int = -1
    last_seq: int = -1
    window_start_ns: int = 0
    window_end_ns: int = 0
    export_start_ns: int = 0
    export_end_ns: int = 0
    trace_bytes: int = 0
    events: int = 0
    steps_found: int = 0
    export_in: str | None = None
    seen_seq: int = -1
    costs: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    @property
    def state_name(self) -> str:
        """The state in words."""
        return STATE_NAMES[self.state] if 0 <= self.state < len(STATE_NAMES) else f"state {self.state}"


class ControlBlock:
    """A mapped control block (either side).  ``create`` is the worker's (it makes the
    file), ``open`` the engine core's; both raise ``OSError`` when they cannot."""

    def __init__(self, path: str, mm: mmap.mmap) -> None:
        self.path = path
        self._mm = mm
        self.w = memoryview(mm).cast("q")  # int64 words; w[i] is one load or store

    @classmethod
    def create(cls, path: str) -> ControlBlock:
        """Create (truncate) and map the block; every page backed now."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            os.posix_fallocate(fd, 0, SIZE)
            mm = mmap.mmap(fd, SIZE)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        finally:
            os.close(fd)
        b = cls(path, mm)
        b.w[_VERSION] = VERSION
        b.w[_PID] = os.getpid()
        b.w[_MAGIC] = MAGIC
        return b

    @classmethod
    def open(cls, path: str) -> ControlBlock:
        """Map a block a worker created (``OSError`` when missing or not a block)."""
        fd = os.open(path, os.O_RDWR)
        try:
            if os.fstat(fd).st_size < SIZE:
                raise OSError(f"{path} is not a capture control block (too small)")
            mm = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        b = cls(path, mm)
        if b.w[_MAGIC] != MAGIC or b.w[_VERSION] != VERSION:
            raise OSError(f"{path} is not a capture control block of this rltperf (magic/version)")
        return b

    @property
    def pid(self) -> int:
        """The worker that created the block."""
        return int(self.w[_PID])

    # -- text ----------------------------------------------------------------------------

    def _put(self, where: tuple[int, int], text: str) -> None:
        off, n = where
        raw = text.encode("utf-8", "replace")[: n - 1]
        self._mm[off : off + n] = raw + b"\0" * (n - len(raw))

    def _get(self, where: tuple[int, int]) -> str:
        off, n = where
        return self._mm[off : off + n].split(b"\0", 1)[0].decode("utf-8", "replace")

    # -- engine core side -------------------------------------------------------------------

    def command(self, op: int, start_seq: int, steps: int, full: bool, capture_id: str, out_dir: str) -> int:
        """Write a command; returns its generation (written last)."""
        w = self.w
        gen = int(w[CMD_GEN]) + 1
        w[CMD_OP], w[CMD_START_SEQ], w[CMD_STEPS], w[CMD_FULL] = op, start_seq, steps, int(full)
        self._put(_ID, capture_id)
        self._put(_DIR, out_dir)
        w[CMD_GEN] = gen
        return gen

    def status(self) -> Status:
        """The worker's status now (of the command ``Status.gen``)."""
        w = self.w
        for _ in range(3):  # a status rewritten while read: read it again
            gen, state = int(w[ST_GEN]), int(w[ST_STATE])
            costs = {n: w[ST_COSTS + i] / 1e3 for i, n in enumerate(COST_NAMES) if w[ST_COSTS + i] >= 0}
            ein = int(w[ST_EXPORT_IN])
            st = Status(
                gen=gen, state=state, steps_done=int(w[ST_STEPS_DONE]), first_seq=int(w[ST_FIRST_SEQ]),
                last_seq=int(w[ST_LAST_SEQ]), window_start_ns=int(w[ST_WINDOW_START]),
                window_end_ns=int(w[ST_WINDOW_END]), export_start_ns=int(w[ST_EXPORT_START]),
                export_end_ns=int(w[ST_EXPORT_END]), trace_bytes=int(w[ST_TRACE_BYTES]), events=int(w[ST_EVENTS]),
                steps_found=int(w[ST_STEPS_FOUND]), export_in=EXPORT_IN[ein] if 0 <= ein < len(EXPORT_IN) else None,
                seen_seq=int(w[ST_SEEN_SEQ]), costs=costs, error=self._get(_ERROR) or None,
            )  # fmt: skip
            if int(w[ST_GEN]) == gen and int(w[ST_STATE]) == state:
                return st
        return st

    def note_step(self, seq: int, step_id: int) -> None:
        """The engine core's step id of the step it dispatches as ``seq`` (inside a window:
        the worker names its range after it, as the probe does)."""
        i = STEP_RING + 2 * (seq % STEP_SLOTS)
        self.w[i + 1] = step_id
        self.w[i] = seq

    # -- worker side ----------------------------------------------------------------------

    def step_id(self, seq: int) -> int | None:
        """The engine core's step id of dispatch ``seq``, if it is still in the ring."""
        i = STEP_RING + 2 * (seq % STEP_SLOTS)
        sid = int(self.w[i + 1])
        return sid if int(self.w[i]) == seq and sid >= 0 else None

    def command_gen(self) -> int:
        """The latest command's generation: the worker's one read per forward."""
        return int(self.w[CMD_GEN])

    def read_command(self) -> Command:
        """The latest command (after ``command_gen`` changed)."""
        w = self.w
        return Command(
            gen=int(w[CMD_GEN]), op=int(w[CMD_OP]), start_seq=int(w[CMD_START_SEQ]), steps=int(w[CMD_STEPS]),
            full=bool(w[CMD_FULL]), capture_id=self._get(_ID), out_dir=self._get(_DIR),
        )  # fmt: skip

    def begin_status(self, gen: int, seen_seq: int) -> None:
        """A new command is being answered: reset the status fields (state ``ARMED``)."""
        w = self.w
        w[ST_STATE] = ARMED
        w[ST_GEN] = gen
        for i in range(ST_STEPS_DONE, ST_COSTS + len(COST_NAMES)):
            w[i] = -1 if i >= ST_COSTS or i in (ST_FIRST_SEQ, ST_LAST_SEQ) else 0
        w[ST_SEEN_SEQ] = seen_seq
        self._put(_ERROR, "")

    def put(self, **fields: int) -> None:
        """Store status words by name (``steps_done=3``; ``costs`` by ``set_cost``)."""
        w = self.w
        for k, v in fields.items():
            w[_FIELDS[k]] = int(v)

    def set_cost(self, name: str, ms: float) -> None:
        """Store one cost (``COST_NAMES``) in ms."""
        self.w[ST_COSTS + COST_NAMES.index(name)] = int(ms * 1e3)

    def set_state(self, state: int, error: str | None = None) -> None:
        """Store the state (last: the engine core reads it first)."""
        if error is not None:
            self._put(_ERROR, error)
        self.w[ST_STATE] = state

    def close(self, unlink: bool = False) -> None:
        """Drop the mapping (and the file's name)."""
        if unlink:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        with contextlib.suppress(Exception):
            self.w.release()
            self._mm.close()


_FIELDS = {
    "steps_done": ST_STEPS_DONE, "first_seq": ST_FIRST_SEQ, "last_seq": ST_LAST_SEQ,
    "window_start_ns": ST_WINDOW_START, "window_end_ns": ST_WINDOW_END, "export_start_ns": ST_EXPORT_START,
    "export_end_ns": ST_EXPORT_END, "trace_bytes": ST_TRACE_BYTES, "events": ST_EVENTS,
    "steps_found": ST_STEPS_FOUND, "export_in": ST_EXPORT_IN,
}  # fmt: skip
