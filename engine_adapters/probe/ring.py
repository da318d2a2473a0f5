"""The step ring: preallocated slots the engine thread fills, and the API that reads them.

The step path does nothing but read clocks and store into a slot of a bounded ring
(``Probe.step`` → ``StepSlot.mark`` / ``stage`` / ``set`` → ``__exit__``); durations,
encoding and sockets are the reader's work, in the publisher thread
(``engine_adapters.probe.reader``).  Measured on the 2-core CI machine (``rltperf bench
probe``): about 1.3 µs per four-stage step with ``step.mark()`` and about 2.7 µs with the
nested ``with step.stage()`` form — one ``perf_counter_ns()`` costs ~100 ns there.

A slot is reused every ``size`` steps.  A reader copies a finished slot and checks its
sequence number afterwards (``StepRing.read_since``); a slot overwritten meanwhile (the
reader fell a whole ring behind) counts as lost, never as a corrupted record.

A step observer (a capture window) is the ring's ``observer``: while one is set,
``Probe.step`` hands the step to it, and it returns an ``ObservedStep`` that fills the
same ring slot and tells the observer at each boundary.  No slot changes class and the
step path without an observer is the same code as with none ever set.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from time import perf_counter_ns as _clk
from typing import Any, Protocol, TypeVar

__all__ = ["MAX_MARKS", "ObservedStep", "StageNames", "StepObserver", "StepRing", "StepSlot"]

MAX_MARKS = 64
"""Stage boundaries stored per step; more are ignored (and counted)."""

T = TypeVar("T")

# A boundary stores the clock and the stage *name* (None = "between stages", the
# with-form's exit); the reader maps names to indices, so the step path does no
# dictionary work.


class _StageCM:
    """Context manager for ``with step.stage(name):`` (one cached per slot and stage)."""

    __slots__ = ("name", "slot")

    def __init__(self, slot: StepSlot, name: str) -> None:
        self.slot = slot
        self.name = name

    def __enter__(self) -> _StageCM:
        sl = self.slot
        k = sl.k
        try:
            sl.t[k] = _clk()
            sl.ix[k] = self.name
        except IndexError:
            sl.overflow += 1
            return self
        sl.k = k + 1
        return self

    def __exit__(self, *exc: object) -> None:
        sl = self.slot
        k = sl.k
        try:
            sl.t[k] = _clk()
            sl.ix[k] = None
        except IndexError:
            sl.overflow += 1
            return
        sl.k = k + 1


class StepSlot:
    """One engine step being timed; returned by ``Probe.step()``.

    Use it as a context manager.  Inside, either nest ``with step.stage(name):`` blocks
    or call ``step.mark(name)`` at each stage boundary (a stage then lasts until the
    next mark or the end of the step; cheaper: one clock read per boundary).
    ``step.set(...)`` attaches analytic and scheduler facts (see ``StepRecord``).
    ``kind``, ``batch`` and ``tokens`` may be assigned until the step ends.
    """

    __slots__ = (
        "_cms",
        "batch",
        "end",
        "extras",
        "flags",
        "ix",
        "k",
        "kind",
        "overflow",
        "ring",
        "seq",
        "start",
        "step_id",
        "t",
        "tokens",
    )

    def __init__(self, ring: StepRing) -> None:
        self.ring = ring
        self.t = [0] * MAX_MARKS
        self.ix: list[str | None] = [None] * MAX_MARKS
        self.k = 0
        self.seq = -1
        self.step_id = -1
        self.start = 0
        self.end = 0
        self.kind = "decode"
        self.batch = 0
        self.tokens = 0
        self.extras: dict[str, Any] | None = None
        self.flags = 0
        self.overflow = 0
        self._cms: dict[str, _StageCM] = {}

    # -- engine-facing API -------------------------------------------------------------

    def mark(self, name: str) -> None:
        """Start stage ``name`` now (ending the previous one)."""
        k = self.k
        try:
            self.t[k] = _clk()
            self.ix[k] = name
        except IndexError:
            self.overflow += 1
            return
        self.k = k + 1

    def stage(self, name: str) -> Any:
        """``with step.stage("forward"): ...`` times the block as stage ``name``."""
        try:
            return self._cms[name]
        except KeyError:
            cm = self._cms[name] = _StageCM(self, name)
            return cm

    def set(self, **facts: Any) -> None:
        """Attach facts to the step: any ``StepRecord`` field, e.g. ``bytes_read=...``.

        Also ``busy_events=[(start_event, end_event), ...]`` (CUDA events recorded
        around the step's device regions): the reader reads their elapsed time once they
        complete, never synchronising the engine.
        """
        if self.extras is None:
            self.extras = facts
        else:
            self.extras.update(facts)

    def __enter__(self) -> StepSlot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.end = _clk()
        sid = self.step_id
        self.seq = sid
        self.ring.w = sid + 1

    def finish(self) -> None:
        """End the step (for code that cannot use ``with``)."""
        self.__exit__(None, None, None)


class StepObserver(Protocol):
    """Watches steps while it is the ring's ``observer`` (a capture window).

    ``begin_step`` runs instead of the plain step start and returns the step the engine
    fills (``StepRing.begin_observed``, or ``StepRing.begin`` to let a step pass); an
    ``ObservedStep`` then calls the other three on the engine thread.
    """

    def begin_step(self, kind: str, batch: int, tokens: int) -> StepSlot: ...

    def stage_begins(self, name: str) -> None: ...

    def stage_ends(self) -> None: ...

    def step_ended(self, step: StepSlot) -> None: ...


class _ObservedStageCM:
    __slots__ = ("inner", "name", "observer")

    def __init__(self, step: ObservedStep, name: str) -> None:
        self.name = name
        self.observer = step.observer
        self.inner = StepSlot.stage(step, name)

    def __enter__(self) -> _ObservedStageCM:
        self.inner.__enter__()
        self.observer.stage_begins(self.name)
        return self

    def __exit__(self, *exc: object) -> None:
        self.observer.stage_ends()
        self.inner.__exit__()


class ObservedStep(StepSlot):
    """A step seen by a ``StepObserver``: its marks go into the ring slot it is bound to
    (the two share their boundary lists), and the observer hears each boundary and the
    end.  Its scalar fields are copied into the slot when the step ends, before the
    slot is published; one object serves a whole window, rebound at each step."""

    __slots__ = ("observer", "target")

    def __init__(self, ring: StepRing, observer: StepObserver) -> None:
        super().__init__(ring)
        self.observer = observer
        self.target: StepSlot | None = None

    def mark(self, name: str) -> None:
        StepSlot.mark(self, name)
        self.observer.stage_begins(name)

    def stage(self, name: str) -> Any:
        return _ObservedStageCM(self, name)

    def __exit__(self, *exc: object) -> None:
        obs = self.observer
        obs.stage_ends()
        tg = self.target
        end = _clk()
        if tg is not None:
            tg.kind = self.kind
            tg.batch = self.batch
            tg.tokens = self.tokens
            tg.extras = self.extras
            tg.flags = self.flags
            tg.k = self.k
            tg.overflow += self.overflow
            tg.end = end
            tg.seq = self.step_id
        self.overflow = 0
        self.end = end
        sid = self.step_id
        self.seq = sid
        self.ring.w = sid + 1
        obs.step_ended(self)


class StageNames:
    """Stage names by index (as in ``StepRecord.stage_ns``); new names are added on
    first use, from any thread."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self._names: list[str] = []
        self._index: dict[str, int] = {}
        self._lock = threading.Lock()
        for s in names:
            self.register(s)

    def register(self, name: str) -> int:
        """The index of ``name``, registering it; ``ValueError`` for a bad name."""
        with self._lock:
            idx = self._index.get(name)
            if idx is None:
                if not isinstance(name, str) or not name:
                    raise ValueError(f"stage name must be a non-empty string, not {name!r}")
                idx = len(self._names)
                self._names.append(name)
                self._index[name] = idx
            return idx

    def get(self, name: Any) -> int | None:
        """The index of a known name, else None (no lock: reads of a dict are atomic)."""
        return self._index.get(name)

    def __len__(self) -> int:
        return len(self._names)

    @property
    def names(self) -> list[str]:
        """A copy of the names by index."""
        return list(self._names)


class StepRing:
    """``size`` preallocated ``StepSlot``s (a power of two >= 16) and the write cursor.

    Written by the engine thread only (``w``: steps finished; a slot's ``__exit__``
    advances it); read from any thread through ``read_since`` and ``in_step_since``.
    """

    __slots__ = ("mask", "observer", "slots", "w")

    def __init__(self, size: int) -> None:
        if size < 16 or size & (size - 1):
            raise ValueError(f"ring_size must be a power of two >= 16, not {size}")
        self.mask = size - 1
        self.slots = [StepSlot(self) for _ in range(size)]
        self.w = 0
        self.observer: StepObserver | None = None
        """Set while a capture watches the steps (``Probe.step`` then hands them to it)."""

    @property
    def size(self) -> int:
        """Slots in the ring."""
        return self.mask + 1

    # -- engine thread ---------------------------------------------------------------------

    def step(self, kind: str = "decode", batch: int = 0, tokens: int = 0) -> StepSlot:
        """``Probe.step`` (each probe binds it as its own ``step``): start step ``w`` in its
        slot, or let the observer take it while one is set."""
        obs = self.observer
        if obs is not None:
            return obs.begin_step(kind, batch, tokens)
        # begin(), inlined: this is the step path (one call frame less per step)
        w = self.w
        sl = self.slots[w & self.mask]
        sl.seq = -1
        sl.step_id = w
        sl.kind = kind
        sl.batch = batch
        sl.tokens = tokens
        sl.extras = None
        sl.flags = 0
        sl.k = 0
        sl.start = _clk()
        return sl

    def begin(self, kind: str, batch: int, tokens: int, flags: int = 0) -> StepSlot:
        """Start step ``w`` in its slot, whatever the observer (the observer's own path)."""
        w = self.w
        sl = self.slots[w & self.mask]
        sl.seq = -1
        sl.step_id = w
        sl.kind = kind
        sl.batch = batch
        sl.tokens = tokens
        sl.extras = None
        sl.flags = flags
        sl.k = 0
        sl.start = _clk()
        return sl

    def begin_observed(
        self, step: ObservedStep, kind: str, batch: int, tokens: int, flags: int
    ) -> ObservedStep:
        """Start step ``w`` in its slot, filled through ``step`` (rebound to it)."""
        tg = self.begin(kind, batch, tokens, flags)
        step.target = tg
        step.t = tg.t
        step.ix = tg.ix
        step.seq = -1
        step.step_id = tg.step_id
        step.kind = kind
        step.batch = batch
        step.tokens = tokens
        step.extras = None
        step.flags = flags
        step.k = 0
        step.overflow = 0
        step.start = tg.start
        return step

    # -- readers (any thread) --------------------------------------------------------------

    def read_since(self, cursor: int, convert: Callable[[StepSlot, int], T]) -> tuple[list[T], int, int]:
        """Steps ``cursor`` … ``w - 1``: ``convert(slot, step_id)`` of each that was still
        intact after the conversion, the next cursor, and how many were lost (the ring
        went round past them)."""
        w = self.w
        mask = self.mask
        lost = 0
        if w - cursor > mask:
            lost = w - cursor - mask
            cursor += lost
        slots = self.slots
        out: list[T] = []
        while cursor < w:
            sl = slots[cursor & mask]
            item = convert(sl, cursor)
            if sl.seq != cursor:
                lost += 1
            else:
                out.append(item)
                # The step's facts now live in ``item``: the slot lets go of them (else
                # every slot held its last step's until reused, ~11 MB in the reference
                # engine).  Only while the engine is half a ring away from this slot: it
                # cannot reach it and set a new step's facts before the store.
                if self.w - cursor <= mask >> 1:
                    sl.extras = None
            cursor += 1
        return out, cursor, lost

    def in_step_since(self) -> int:
        """Start of the step running now (probe clock), or 0 between steps: read from
        the slot the engine is filling, without touching the step path (a step is open
        when the slot of step ``w`` has begun and not ended)."""
        w = self.w
        sl = self.slots[w & self.mask]
        start = sl.start
        if sl.step_id == w and sl.seq == -1 and start > 0:
            return int(start)
        return 0
