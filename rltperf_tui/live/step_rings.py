"""The numpy column store under the step windows: a ring of step (and request) columns,
filled a batch at a time, and the running sums that keep the render tick cheap.

Used by ``rltperf_tui.live.step_windows`` (``TargetStats``'s windows); no Textual.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import chain
from operator import attrgetter
from typing import Any, Literal

import numpy as np

from engine_adapters.definitions.records import RequestRecord, StepRecord

MAX_STAGES = 24
MAX_DEPTH = 16

KINDS = ("decode", "prefill", "mixed", "draft", "verify", "idle")
KIND_CODE = {k: i for i, k in enumerate(KINDS)}
"""A step's kind as the small integer kept in the ``kind`` column."""

# The fields of a StepRecord pulled in one C call (``step_columns``): integers, optional
# numbers (None: unknown), the per-stage / per-depth lists, and the kind.
STEP_FIELDS = attrgetter(
    "step_id", "start_ns", "end_ns", "batch", "tokens", "prefill_tokens", "out_tokens", "flags",
    "spec_drafts", "spec_drafted", "spec_accepted", "preempted",
    "busy_ns", "flops", "kv_used", "kv_total", "waiting", "running", "bytes_read", "bytes_written",
    "stage_ns", "exit_hist", "loop_ns", "loop_tokens", "kind",
)  # fmt: skip


def opt_column(values: Sequence[float | None]) -> Sequence[float] | np.ndarray:
    """A column of optional numbers with None as NaN (no copy when none is missing; all
    NaN in one call when the engine does not report the field at all)."""
    if None in values:
        if values.count(None) == len(values):
            return np.full(len(values), math.nan)
        return [math.nan if v is None else v for v in values]
    return values  # type: ignore[return-value]


def opt_sum(a: Sequence[float | None], b: Sequence[float | None]) -> list[float] | np.ndarray:
    """a + b per row, None counting as 0, NaN when both are None (bytes read + written).
    In one call when each side is always or never reported (an engine that counts bytes
    read alone, both, or neither)."""
    n = len(a)
    none_a, none_b = a.count(None), b.count(None)
    if none_a == 0 and none_b == 0:
        return np.add(a, b, dtype=np.float64)  # type: ignore[arg-type]  # no None on this path
    if none_a == n and none_b in (0, n):
        return np.asarray(b, dtype=np.float64) if none_b == 0 else np.full(n, math.nan)
    if none_b == n and none_a == 0:
        return np.asarray(a, dtype=np.float64)
    return [math.nan if x is None and y is None else (x or 0) + (y or 0) for x, y in zip(a, b, strict=True)]


def padded_matrix(rows: Sequence[list[int] | None], width: int, dtype: Any) -> np.ndarray:
    """Rows of variable length (or None) as a zero-padded ``len(rows) x width`` array."""
    out = np.zeros((len(rows), width), dtype=dtype)
    if rows[0] is None and rows[-1] is None and None in rows and rows.count(None) == len(rows):
        return out  # the field is not reported at all
    try:
        # The common case, one shape for the whole batch, converts in C; ragged rows or
        # None make numpy refuse, and the loop below handles them.
        a = np.array(rows, dtype=dtype)
    except (ValueError, TypeError):
        a = None
    if a is not None and a.ndim == 2:
        m = min(a.shape[1], width)
        out[:, :m] = a[:, :m]
        return out
    for i, r in enumerate(rows):
        if r:
            m = min(len(r), width)
            out[i, :m] = r[:m]
    return out


def row_width(rows: Sequence[list[int] | None]) -> int | None:
    """The one length of every row (0: every row is None or empty); None when a row is
    None and another is not, or the lengths differ (``padded_matrix`` takes those)."""
    if None in rows:
        return 0 if rows.count(None) == len(rows) else None
    lens = set(map(len, rows))  # type: ignore[arg-type]  # no None on this path
    return lens.pop() if len(lens) == 1 else None


def list_matrices(
    fields: Sequence[Sequence[list[int] | None]], widths: Sequence[int], dtypes: Sequence[Any]
) -> list[np.ndarray]:
    """Each field's rows (one row per step) as a matrix at most ``widths[i]`` wide: when
    every field's rows have one length, all fields convert in one C pass over their
    integers (``np.fromiter``; rows as lists, one field after another, a step at a time)
    and each matrix is a view as wide as its rows (``Ring.append`` pads it with zeros):
    a third of the per-step cost of ingest was four ``padded_matrix`` calls, at 1,000
    steps/s.  Else ``padded_matrix`` per field."""
    ks = [row_width(rows) for rows in fields]
    if None in ks:
        return [padded_matrix(rows, w, dt) for rows, w, dt in zip(fields, widths, dtypes, strict=True)]
    n = len(fields[0])
    total = sum(ks)  # type: ignore[arg-type]  # no None on this path
    flat = np.zeros((n, 0), dtype=np.int64)
    if total:
        rows_of = [rows for rows, k in zip(fields, ks, strict=True) if k]
        ints = chain.from_iterable(chain.from_iterable(zip(*rows_of, strict=True)))
        flat = np.fromiter(ints, np.int64, n * total).reshape(n, total)
    out = []
    a = 0
    for k, w in zip(ks, widths, strict=True):
        assert k is not None
        out.append(flat[:, a : a + min(k, w)])
        a += k
    return out


class Ring:
    """Fixed-capacity column store; ``grow=True`` doubles instead of overwriting."""

    def __init__(self, capacity: int, columns: dict[str, tuple[Any, tuple[int, ...]]], grow: bool) -> None:
        self.cap = capacity
        self.grow = grow
        self.n = 0  # total appended
        self.cols: dict[str, np.ndarray] = {
            name: np.zeros((capacity, *shape), dtype=dt) for name, (dt, shape) in columns.items()
        }

    def __len__(self) -> int:
        return min(self.n, self.cap)

    def _ensure(self, extra: int) -> None:
        if not self.grow or self.n + extra <= self.cap:
            return
        new = self.cap
        while new < self.n + extra:
            new *= 2
        for name, arr in self.cols.items():
            bigger = np.zeros((new, *arr.shape[1:]), dtype=arr.dtype)
            bigger[: self.n] = arr[: self.n]
            self.cols[name] = bigger
        self.cap = new

    def append(self, batch: dict[str, Any], count: int) -> None:
        """Append ``count`` rows given as column -> list/array."""
        if count == 0:
            return
        self._ensure(count)
        cap = self.cap
        if count > cap:  # keep only the newest cap rows
            batch = {k: np.asarray(v)[-cap:] for k, v in batch.items()}
            self.n += count - cap
            count = cap
        start = self.n % cap
        end = start + count
        for name, values in batch.items():
            col = self.cols[name]
            arr = np.asarray(values, dtype=col.dtype)
            if end <= cap:
                _put(col, start, end, arr)
            else:
                k = cap - start
                _put(col, start, cap, arr[:k])
                _put(col, 0, end - cap, arr[k:])
        self.n += count

    def rows(self, name: str, a: int, b: int) -> np.ndarray:
        """Rows ``a`` to ``b`` (absolute append numbers, still kept) of a column."""
        col = self.cols[name]
        if b <= a:
            return col[:0]
        cap = self.cap
        i, j = a % cap, b % cap
        if i < j or j == 0:
            return col[i : j or cap]
        return np.concatenate((col[i:], col[:j]))

    def oldest(self, name: str) -> Any:
        """The oldest kept value of a column (no copy; the ring must not be empty)."""
        return self.cols[name][self.n % self.cap if self.n > self.cap else 0]

    def search(self, name: str, value: int, side: Literal["left", "right"] = "left") -> int:
        """``np.searchsorted`` over the kept rows of a column sorted oldest first (their
        logical order), without joining the ring's two pieces: a copy of the whole ring
        at every render tick, per call."""
        col = self.cols[name]
        if self.n <= self.cap:
            return int(np.searchsorted(col[: self.n], value, side=side))
        i = self.n % self.cap  # the oldest row; col[i:] then col[:i]
        older = col[i:]
        if (value < older[-1]) if side == "right" else (value <= older[-1]):
            return int(np.searchsorted(older, value, side=side))
        return older.size + int(np.searchsorted(col[:i], value, side=side))

    def _newest(self, k: int) -> tuple[int, int]:
        """Where the newest ``k`` rows lie in the arrays: ``col[start:end]``, or, when
        ``start`` < 0 (they wrap), ``col[start:]`` then ``col[:end]``."""
        end = self.n % self.cap
        return end - k, end

    def last(self, name: str, k: int | None = None) -> np.ndarray:
        """The newest ``k`` (default all kept) values of a column, oldest first."""
        size = len(self)
        k = size if k is None else min(k, size)
        if k <= 0:
            col = self.cols[name]
            return col[:0]
        col = self.cols[name]
        start, end = self._newest(k)
        if start >= 0:
            return col[start:end]
        return np.concatenate((col[start:], col[:end]))


def _put(col: np.ndarray, a: int, b: int, arr: np.ndarray) -> None:
    """``col[a:b] = arr``; a matrix narrower than the column fills its first columns and
    the rest are zeroed (``list_matrices``' views)."""
    if arr.ndim == 2 and arr.shape[1] < col.shape[1]:
        w = arr.shape[1]
        col[a:b, :w] = arr
        col[a:b, w:] = 0
    else:
        col[a:b] = arr


STEP_COLS: dict[str, tuple[Any, tuple[int, ...]]] = {
    "step_id": (np.int64, ()),
    "start": (np.int64, ()),
    "end": (np.int64, ()),
    "kind": (np.int8, ()),
    "batch": (np.int32, ()),
    "tokens": (np.int32, ()),
    "prefill": (np.int32, ()),
    "out_tokens": (np.int32, ()),
    "busy": (np.float64, ()),  # NaN = unknown
    "bytes": (np.float64, ()),  # read + written, NaN = unknown
    "flops": (np.float64, ()),
    "flags": (np.int32, ()),
    "kv_used": (np.float64, ()),
    "kv_total": (np.float64, ()),
    "waiting": (np.float64, ()),
    "running": (np.float64, ()),
    "drafts": (np.int32, ()),
    "drafted": (np.int32, ()),
    "accepted": (np.int32, ()),
    "preempted": (np.int32, ()),
    "stages": (np.int64, (MAX_STAGES,)),
    "exit": (np.int32, (MAX_DEPTH,)),
    "loop_ns": (np.int64, (MAX_DEPTH,)),
    "loop_tokens": (np.int32, (MAX_DEPTH,)),
}
REQ_COLS: dict[str, tuple[Any, tuple[int, ...]]] = {
    "arrival": (np.int64, ()),
    "finish": (np.int64, ()),
    "ttft": (np.float64, ()),  # ns, NaN = no first token
    "tpot": (np.float64, ()),  # ns, NaN = fewer than 2 tokens
    "out": (np.int32, ()),
    "prompt": (np.int32, ()),
    "ok": (np.bool_, ()),
}


def slides_forward(lo0: int, hi0: int, lo: int, hi: int, oldest: int) -> bool:
    """Whether a window kept over absolute rows ``lo0`` to ``hi0`` can be moved to ``lo``
    to ``hi`` by adding the rows that came and taking out those that left: it moved
    forward, still overlaps, by no more than its size, and the rows that left are still
    in the ring (from ``oldest`` on).  Otherwise the window is computed afresh
    (``WindowSums``, ``sorted_window.SortedWindow``)."""
    return oldest <= lo0 <= lo <= hi0 <= hi and (lo - lo0) + (hi - hi0) <= hi - lo


class WindowSums:
    """Column sums of the per-step matrices (stages, exits, loop time and tokens) over a
    window of rows, slid forward by adding the rows that entered and subtracting those
    that left (integers: exact).  Summing 10 000 rows x 72 columns afresh at each render
    tick was the largest part of the monitor's window statistics at 1000 steps/s."""

    COLS = ("stages", "exit", "loop_ns", "loop_tokens")

    def __init__(self) -> None:
        self.lo = 0
        self.hi = 0
        self.sums: dict[str, np.ndarray] | None = None

    def get(self, ring: Ring, lo: int, hi: int) -> dict[str, np.ndarray]:
        """Sums over absolute rows ``lo`` to ``hi`` (both still in ``ring``)."""
        sums = self.sums
        if sums is None or not slides_forward(self.lo, self.hi, lo, hi, ring.n - len(ring)):
            sums = {c: ring.rows(c, lo, hi).sum(axis=0, dtype=np.int64) for c in self.COLS}
        else:
            for c in self.COLS:
                if hi > self.hi:
                    sums[c] += ring.rows(c, self.hi, hi).sum(axis=0, dtype=np.int64)
                if lo > self.lo:
                    sums[c] -= ring.rows(c, self.lo, lo).sum(axis=0, dtype=np.int64)
        self.sums, self.lo, self.hi = sums, lo, hi
        return sums


class TimelineSums:
    """Per-bucket sums of steps for the timeline chart, kept up to date from only the
    rows appended since the last call (a render tick at 1000 steps/s adds ~500 rows to a
    30 s window of 30 000; recomputing the whole window each tick was a tenth of the
    monitor's CPU).  Buckets are aligned to absolute time, multiples of ``bucket_ns``, so
    a finished bucket never changes and the chart does not jitter between ticks.

    A bucket's row: ``[steps, sum of step ns, sum of gap ns, gaps, stage ns sums...]``;
    a gap belongs to the bucket of the step after it and is only counted between
    consecutive step ids (a drop is not a gap).  The rows live in a ring of ``keep``
    slots (bucket ``b`` in slot ``b % keep``): memory is fixed however long the monitor
    runs, and a newer bucket takes an older one's slot.
    """

    HEAD = 4
    _NONE = np.iinfo(np.int64).min

    def __init__(self, bucket_ns: int, keep: int) -> None:
        self.bucket_ns = bucket_ns
        self.keep = keep  # buckets kept behind the newest
        self.seen = 0  # steps.n already summed
        self.prev_end: int | None = None
        self.prev_id: int | None = None
        self.mat = np.zeros((keep, self.HEAD + MAX_STAGES), dtype=np.float64)
        self.key = np.full(keep, self._NONE, dtype=np.int64)  # the bucket each slot holds

    def rows(self, first: int, count: int) -> np.ndarray:
        """The rows of buckets ``first`` .. ``first + count - 1`` (zeros: no step, or a
        bucket older than the ring keeps); ``count`` at most ``keep``."""
        want = first + np.arange(count, dtype=np.int64)
        slots = want % self.keep
        return np.where((self.key[slots] == want)[:, None], self.mat[slots], 0.0)

    def update(self, steps: Ring, since_ns: int) -> None:
        new = min(steps.n - self.seen, len(steps))
        self.seen = steps.n
        if new <= 0:
            return
        all_end = steps.last("end", new)
        all_ids = steps.last("step_id", new)
        lo = int(np.searchsorted(all_end, since_ns, side="right"))
        if lo >= new:
            self.prev_end, self.prev_id = int(all_end[-1]), int(all_ids[-1])
            return
        end, ids = all_end[lo:], all_ids[lo:]
        start = steps.last("start", new)[lo:]
        stages = steps.last("stages", new)[lo:]
        n = end.size
        b = end // self.bucket_ns
        # the step before each row (the first: the row before it, or the previous call's last)
        prev_end = np.empty(n, dtype=np.int64)
        prev_id = np.empty(n, dtype=np.int64)
        prev_end[1:], prev_id[1:] = end[:-1], ids[:-1]
        if lo > 0:
            prev_end[0], prev_id[0] = all_end[lo - 1], all_ids[lo - 1]
        elif self.prev_end is not None and self.prev_id is not None:
            prev_end[0], prev_id[0] = self.prev_end, self.prev_id
        else:
            prev_end[0], prev_id[0] = 0, -2  # no step before: no gap
        ok = (ids - prev_id) == 1
        gap = np.where(ok, start - prev_end, 0)
        self.prev_end, self.prev_id = int(end[-1]), int(ids[-1])
        # one row of sums per bucket the new rows fall in (each an exact integer sum)
        first = np.flatnonzero(np.diff(b, prepend=b[0] - 1))
        add = np.empty((first.size, self.HEAD + MAX_STAGES), dtype=np.float64)
        add[:, 0] = np.diff(first, append=n)
        add[:, 1] = np.add.reduceat(end - start, first)
        add[:, 2] = np.add.reduceat(gap, first)
        add[:, 3] = np.add.reduceat(ok.astype(np.int64), first)
        add[:, self.HEAD :] = np.add.reduceat(stages, first, axis=0)
        for key, row in zip(b[first].tolist(), add, strict=True):
            slot = key % self.keep
            if self.key[slot] != key:
                self.key[slot] = key
                self.mat[slot] = row
            else:
                self.mat[slot] += row


def step_columns(
    steps: list[StepRecord], want_reported: bool = True
) -> tuple[dict[str, Any], tuple[bool, bool, bool]]:
    """The columns (``STEP_COLS``) of a batch of steps, and whether any of them reported
    busy time, bytes and FLOPs (only counted when ``want_reported``; else all False)."""
    # Columns come out in C: attrgetter pulls every field of a record in one call and
    # zip(*rows) transposes; Python-level work per record is a handful of calls.  The
    # monitor must keep up with 200k records/s (rltperf bench ingest).
    n = len(steps)
    (ids, start, end, batch, tokens, prefill, out_tok, flags, drafts, drafted, accepted, preempted,
     busy, flops, kv_used, kv_total, waiting, running, b_read, b_written,
     stage_l, exit_l, loop_l, ltok_l, kinds) = zip(*map(STEP_FIELDS, steps), strict=True)  # fmt: skip
    stages, exits, loop_ns, loop_tok = list_matrices(
        (stage_l, exit_l, loop_l, ltok_l),
        (MAX_STAGES, MAX_DEPTH, MAX_DEPTH, MAX_DEPTH),
        (np.int64, np.int32, np.int64, np.int32),
    )
    reported = (False, False, False)
    if want_reported:
        reported = (
            busy.count(None) < n,
            b_read.count(None) < n or b_written.count(None) < n,
            flops.count(None) < n,
        )
    kc = KIND_CODE
    cols: dict[str, Any] = {
        "step_id": ids,
        "start": start,
        "end": end,
        "kind": [kc.get(k, 0) for k in kinds] if kinds.count(kinds[0]) < n else [kc.get(kinds[0], 0)] * n,
        "batch": batch,
        "tokens": tokens,
        "prefill": prefill,
        "out_tokens": out_tok,
        "busy": opt_column(busy),
        "bytes": opt_sum(b_read, b_written),
        "flops": opt_column(flops),
        "flags": flags,
        "kv_used": opt_column(kv_used),
        "kv_total": opt_column(kv_total),
        "waiting": opt_column(waiting),
        "running": opt_column(running),
        "drafts": drafts,
        "drafted": drafted,
        "accepted": accepted,
        "preempted": preempted,
        "stages": stages,
        "exit": exits,
        "loop_ns": loop_ns,
        "loop_tokens": loop_tok,
    }
    return cols, reported


def request_columns(reqs: list[RequestRecord]) -> dict[str, Any]:
    """The columns (``REQ_COLS``) of a batch of finished requests: TTFT = first token −
    arrival, TPOT = (finish − first token) / (output tokens − 1), NaN where undefined."""
    n = len(reqs)
    arrival = [0] * n
    finish = [0] * n
    ttft = [math.nan] * n
    tpot = [math.nan] * n
    out = [0] * n
    prompt = [0] * n
    ok = [False] * n
    for i, r in enumerate(reqs):
        arrival[i] = r.arrival_ns
        finish[i] = r.finish_ns
        if r.first_token_ns is not None:
            ttft[i] = r.first_token_ns - r.arrival_ns
            if r.output_tokens > 1:
                tpot[i] = (r.finish_ns - r.first_token_ns) / (r.output_tokens - 1)
        out[i] = r.output_tokens
        prompt[i] = r.prompt_tokens
        ok[i] = r.status == "ok"
    return {
        "arrival": arrival,
        "finish": finish,
        "ttft": ttft,
        "tpot": tpot,
        "out": out,
        "prompt": prompt,
        "ok": ok,
    }
