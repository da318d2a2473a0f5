"""The aggregator: records in, windowed statistics out.  No Textual; numpy only.

The same code serves ``rltperf summary``, the live screen, ``compare`` and
``bench ingest``.  Metric definitions (docs/ARCHITECTURE.md):

- step time = end − start; gap = start of step k+1 − end of step k (only between
  consecutive step ids, so a hole left by dropped records is not read as a gap);
- device idle fraction over a window W = 1 − Σ busy / W (busy clipped to the window);
- MBU over W = Σ (bytes read + written) / (W × peak bandwidth);
- roofline: arithmetic intensity = FLOPs / bytes against machine balance;
- TTFT = first token − arrival; TPOT = (finish − first token) / (output tokens − 1);
  percentiles are of the pooled samples in the window; failed requests are counted;
- goodput = completed requests per second meeting both SLOs (DistServe).

The window figures (idle, MBU, tokens/s, steps/s, goodput) are defined once, in
``engine_adapters.definitions.figures``: a window is wall time on the probe's clock, up to the
newest moment the data vouches for (a step's end, or a heartbeat between steps), so
a quiet engine reads idle, and a hung one stops the clock (the screen says so).
Profiled, exporting and warm-up steps leave every figure.  Time is data time, not the
monitor's wall clock, so a replay gives the same numbers as the live stream did.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import numpy as np

from engine_adapters.definitions import figures as F
from engine_adapters.definitions.records import (
    FLAG_EXPORTING,
    FLAG_PROFILED,
    FLAG_WARMUP,
    Bye,
    CaptureDone,
    CaptureExporting,
    CaptureFailed,
    CaptureProgress,
    CaptureStarted,
    Ceiling,
    DeviceSample,
    EngineInfo,
    Hello,
    MetricsSample,
    Record,
    Refused,
    RequestRecord,
    SessionEvent,
    StageTable,
    Stats,
    StepRecord,
)
from engine_adapters.definitions.server_history import ServerLifetime, ServerTrends, server_trends
from engine_adapters.definitions.server_window import MetricsWindow, metrics_window
from rltperf_tui import roofline

MAX_STAGES = 24
MAX_DEPTH = 16
PERCENTILES = (50, 95, 99)

_KINDS = ("decode", "prefill", "mixed", "draft", "verify", "idle")
_KIND_CODE = {k: i for i, k in enumerate(_KINDS)}


def pct(values: np.ndarray) -> dict[str, float | None]:
    """P50/P95/P99 of pooled samples (linear interpolation); None for no samples."""
    if values.size == 0:
        return {f"p{p}": None for p in PERCENTILES}
    q = np.percentile(values, PERCENTILES)
    return {f"p{p}": float(v) for p, v in zip(PERCENTILES, q, strict=True)}


_STEP_INTS = attrgetter(
    "step_id", "start_ns", "end_ns", "batch", "tokens", "prefill_tokens", "out_tokens", "flags",
    "spec_drafts", "spec_drafted", "spec_accepted", "preempted",
)  # fmt: skip
_STEP_OPTS = attrgetter(
    "busy_ns", "flops", "kv_used", "kv_total", "waiting", "running", "bytes_read", "bytes_written"
)
_STEP_LISTS = attrgetter("stage_ns", "exit_hist", "loop_ns", "loop_tokens")


def _opt(values: Sequence[float | None]) -> Sequence[float]:
    """A column of optional numbers with None as NaN (no copy when none is missing)."""
    if None in values:
        return [math.nan if v is None else v for v in values]
    return values  # type: ignore[return-value]


def _opt_sum(a: Sequence[float | None], b: Sequence[float | None]) -> list[float]:
    """a + b per row, None counting as 0, NaN when both are None (bytes read + written)."""
    return [math.nan if x is None and y is None else (x or 0) + (y or 0) for x, y in zip(a, b, strict=True)]


def _matrix(rows: Sequence[list[int] | None], width: int, dtype: Any) -> np.ndarray:
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


class _Ring:
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
                col[start:end] = arr
            else:
                k = cap - start
                col[start:] = arr[:k]
                col[: end - cap] = arr[k:]
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

    def last(self, name: str, k: int | None = None) -> np.ndarray:
        """The newest ``k`` (default all kept) values of a column, oldest first."""
        size = len(self)
        k = size if k is None else min(k, size)
        if k <= 0:
            col = self.cols[name]
            return col[:0]
        col = self.cols[name]
        end = self.n % self.cap if self.n >= self.cap else self.n
        start = end - k
        if start >= 0:
            return col[start:end]
        return np.concatenate((col[start:], col[:end]))


_STEP_COLS: dict[str, tuple[Any, tuple[int, ...]]] = {
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
_REQ_COLS: dict[str, tuple[Any, tuple[int, ...]]] = {
    "arrival": (np.int64, ()),
    "finish": (np.int64, ()),
    "ttft": (np.float64, ()),  # ns, NaN = no first token
    "tpot": (np.float64, ()),  # ns, NaN = fewer than 2 tokens
    "out": (np.int32, ()),
    "prompt": (np.int32, ()),
    "ok": (np.bool_, ()),
}


class _WindowSums:
    """Column sums of the per-step matrices (stages, exits, loop time and tokens) over a
    window of rows, slid forward by adding the rows that entered and subtracting those
    that left (integers: exact).  Summing 10 000 rows x 72 columns afresh at each render
    tick was the largest part of the monitor's window statistics at 1000 steps/s."""

    COLS = ("stages", "exit", "loop_ns", "loop_tokens")

    def __init__(self) -> None:
        self.lo = 0
        self.hi = 0
        self.sums: dict[str, np.ndarray] | None = None

    def get(self, ring: _Ring, lo: int, hi: int) -> dict[str, np.ndarray]:
        """Sums over absolute rows ``lo`` to ``hi`` (both still in ``ring``)."""
        oldest = ring.n - len(ring)
        sums = self.sums
        moved = (lo - self.lo) + (hi - self.hi)
        if (
            sums is None
            or lo < self.lo
            or hi < self.hi
            or self.lo < oldest
            or lo > self.hi
            or moved > hi - lo
        ):
            sums = {c: ring.rows(c, lo, hi).sum(axis=0, dtype=np.int64) for c in self.COLS}
        else:
            for c in self.COLS:
                if hi > self.hi:
                    sums[c] += ring.rows(c, self.hi, hi).sum(axis=0, dtype=np.int64)
                if lo > self.lo:
                    sums[c] -= ring.rows(c, self.lo, lo).sum(axis=0, dtype=np.int64)
        self.sums, self.lo, self.hi = sums, lo, hi
        return sums


class _TimelineSums:
    """Per-bucket sums of steps for the timeline chart, kept up to date from only the
    rows appended since the last call (a render tick at 1000 steps/s adds ~500 rows to a
    30 s window of 30 000; recomputing the whole window each tick was a tenth of the
    monitor's CPU).  Buckets are aligned to absolute time, multiples of ``bucket_ns``, so
    a finished bucket never changes and the chart does not jitter between ticks.

    A bucket's row: ``[steps, sum of step ns, sum of gap ns, gaps, stage ns sums...]``;
    a gap belongs to the bucket of the step after it and is only counted between
    consecutive step ids (a drop is not a gap).
    """

    HEAD = 4

    def __init__(self, bucket_ns: int, keep: int) -> None:
        self.bucket_ns = bucket_ns
        self.keep = keep  # buckets kept behind the newest
        self.seen = 0  # steps.n already summed
        self.prev_end: int | None = None
        self.prev_id: int | None = None
        self.sums: dict[int, np.ndarray] = {}

    def update(self, steps: _Ring, since_ns: int) -> None:
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
        cuts = np.flatnonzero(np.diff(b)) + 1
        for seg in np.split(np.arange(n), cuts):
            key = int(b[seg[0]])
            row = self.sums.get(key)
            if row is None:
                row = self.sums[key] = np.zeros(self.HEAD + MAX_STAGES, dtype=np.float64)
            row[0] += seg.size
            row[1] += float((end[seg] - start[seg]).sum())
            row[2] += float(gap[seg].sum())
            row[3] += float(ok[seg].sum())
            row[self.HEAD :] += stages[seg].sum(axis=0)
        newest = int(b[-1])
        for key in [k for k in self.sums if k < newest - self.keep]:
            del self.sums[key]


@dataclass
class CaptureView:
    """What the monitor knows of one capture."""

    capture_id: str
    mode: str
    steps: int
    state: str = "requested"  # requested, armed, capturing, exporting, saved, failed, refused
    steps_done: int = 0
    first_step: int | None = None
    bundle: str | None = None
    trace_bytes: int | None = None
    events: int | None = None
    export_s: float | None = None
    error: str | None = None
    cold: bool = False
    exporting_since_ns: int | None = None
    requested_ns: int = 0
    note: str | None = None
    """From ``CaptureDone.note``: e.g. the engine could not honour the requested mode."""
    trigger: str | None = None
    """The trigger rule (and value) that asked for this capture; None: a key press."""


@dataclass
class Window:
    """Statistics of one window; every figure says what it is in the UI."""

    seconds: float
    span_s: float
    """Window wall time (``w1 − w0``), excluded time included."""
    steps: int
    step_ms: dict[str, float | None]
    gap_ms: dict[str, float | None]
    step_ms_mean: float | None
    stage_ms_mean: dict[str, float]
    idle_fraction: float | None
    busy_known_steps: int
    achieved_gbps: float | None
    achieved_gflops: float | None
    mbu: float | None
    mbu_overcount: bool
    intensity: float | None
    balance: float | None
    verdict: str
    ceiling_ms_p50: float | None
    tokens_per_s: float | None
    steps_per_s: float | None
    ttft_ms: dict[str, float | None]
    tpot_ms: dict[str, float | None]
    requests_ok: int
    requests_failed: int
    goodput_rps: float | None
    exit_hist: list[int]
    mean_exit_depth: float | None
    loop_ms_mean: list[float]
    loop_tokens_mean: list[float]
    spec_drafts: int
    spec_drafted: int
    spec_accepted: int
    acceptance_rate: float | None
    mean_acceptance_len: float | None
    profiled_steps: int
    warmup_steps: int
    exporting_steps: int
    baseline_s: float = 0.0
    """The figures' denominator: wall time less ``excluded_s``."""
    excluded_s: float = 0.0
    """Time owned by profiled/exporting/warm-up steps (left out of every figure)."""
    requests_excluded: int = 0
    """Requests in flight during excluded time (left out of TTFT/TPOT and goodput)."""
    quiet_s: float = 0.0
    """Data time since the newest step ended (0 while steps come)."""
    in_step_idle: float | None = None
    """1 − Σ busy / Σ step time over the window's steps (the verdict's input)."""

    def as_summary(self) -> dict[str, Any]:
        """The ``rltperf summary --json`` shape."""
        return {
            "steps": self.steps,
            "wall_s": round(self.span_s, 6),
            "baseline_s": round(self.baseline_s, 6),
            "excluded_s": round(self.excluded_s, 6),
            "step_ms": self.step_ms,
            "gap_ms": self.gap_ms,
            "idle_fraction": self.idle_fraction,
            "mbu": self.mbu,
            "tokens_per_s": self.tokens_per_s,
            "ttft_ms": self.ttft_ms,
            "tpot_ms": self.tpot_ms,
            "requests": {"ok": self.requests_ok, "failed": self.requests_failed},
        }


@dataclass
class IdleGap:
    """A gap between steps longer than the threshold."""

    at_ns: int
    length_ms: float
    after_step: int
    grown_stage: str | None
    grown_ms: float | None


@dataclass
class TargetStats:
    """Everything known about one target's stream."""

    capacity: int = 32768
    grow: bool = False
    peak_override: Ceiling | None = None
    info: EngineInfo | None = None
    hello: Hello | None = None
    stage_names: list[str] = field(default_factory=list)
    state: str = "connecting"
    state_detail: str = ""
    dropped_ring: int = 0
    dropped_sub: int = 0
    id_gaps: int = 0
    steps_total: int | None = None
    records: int = 0
    last_step_id: int | None = None
    last_end_ns: int | None = None
    last_step: StepRecord | None = None
    devices: dict[tuple[str, int], DeviceSample] = field(default_factory=dict)
    device_notes: list[str] = field(default_factory=list)
    captures: dict[str, CaptureView] = field(default_factory=dict)
    messages: deque[str] = field(default_factory=lambda: deque(maxlen=20))
    now_ns: int = 0
    first_ns: int | None = None
    """The stream's first timestamp (a heartbeat or a step start), probe clock."""
    vouched_ns: int = 0
    """The newest moment the data vouches for (``engine_adapters.definitions.figures``)."""
    in_step_since_ns: int = 0
    """The newest heartbeat found the engine inside a step begun then (0: between steps)."""
    ended: bool = False
    """The probe said goodbye."""
    reported: tuple[bool, bool, bool] = (False, False, False)
    """Whether any step so far reported busy time, bytes, FLOPs (a window without such
    steps then reads 0, not unknown)."""

    def __post_init__(self) -> None:
        self.steps = _Ring(self.capacity, _STEP_COLS, self.grow)
        self._timeline: _TimelineSums | None = None
        self._wsums: dict[float | None, _WindowSums] = {}
        self.reqs = _Ring(max(1024, self.capacity // 4), _REQ_COLS, self.grow)
        self.gpu_util: deque[tuple[int, float]] = deque(maxlen=600)
        self.dram_util: deque[tuple[int, float]] = deque(maxlen=600)
        self.metrics: deque[MetricsSample] = deque(maxlen=3600)
        self.lifetime = ServerLifetime()
        """Counters, latencies and peaks of the metrics scrapes since attach."""

    # -- ingest ------------------------------------------------------------------------------

    @property
    def ceiling(self) -> Ceiling | None:
        """Peak figures in use: an override (flag or calibration), else the engine's."""
        if self.peak_override is not None:
            return self.peak_override
        return self.hello.ceiling if self.hello is not None else None

    def add(self, recs: list[Record]) -> None:
        """Ingest a batch of records (any mix, in stream order)."""
        steps: list[StepRecord] = []
        reqs: list[RequestRecord] = []
        for r in recs:
            if isinstance(r, StepRecord):
                steps.append(r)
            elif isinstance(r, RequestRecord):
                reqs.append(r)
            else:
                if steps:
                    self._add_steps(steps)
                    steps = []
                self._add_other(r)
        if steps:
            self._add_steps(steps)
        if reqs:
            self._add_requests(reqs)
        self.records += len(recs)

    def _seen(self, t_ns: int) -> None:
        if self.first_ns is None or t_ns < self.first_ns:
            self.first_ns = t_ns

    def _add_other(self, r: Record) -> None:
        if isinstance(r, Stats):
            self.dropped_ring = r.ring_dropped
            self.dropped_sub = r.sub_dropped
            self.steps_total = r.steps_total
            self.now_ns = max(self.now_ns, r.ts_ns)
            self._seen(r.ts_ns)
            since = r.in_step_since_ns
            if since > 0 and (self.last_end_ns is None or since >= self.last_end_ns):
                # inside a step: the heartbeat vouches for the time up to its start only
                self.in_step_since_ns = since
                self.vouched_ns = max(self.vouched_ns, min(since, r.ts_ns))
            else:  # between steps (or an older probe that does not say)
                self.in_step_since_ns = 0
                self.vouched_ns = max(self.vouched_ns, r.ts_ns)
        elif isinstance(r, DeviceSample):
            self.devices[(r.kind, r.index)] = r
            if r.note and r.note not in self.device_notes:
                self.device_notes.append(r.note)
            if r.gpu_util is not None:
                self.gpu_util.append((r.ts_ns, r.gpu_util))
            if r.dram_bw_util is not None:
                self.dram_util.append((r.ts_ns, r.dram_bw_util))
        elif isinstance(r, MetricsSample):
            self.metrics.append(r)
            self.lifetime.add(r)
            self.now_ns = max(self.now_ns, r.ts_ns)
        elif isinstance(r, Hello):
            self.hello = r
            self.info = r.engine
            self.stage_names = list(r.stage_names)
        elif isinstance(r, StageTable):
            self.stage_names = list(r.stage_names)
        elif isinstance(r, SessionEvent):
            self.state = r.state
            self.state_detail = r.detail
            if r.detail:
                self.messages.append(r.detail)
        elif isinstance(r, Bye):
            self.messages.append(f"engine: {r.reason}")
            self.ended = True
            if r.ts_ns > 0:
                self.vouched_ns = max(self.vouched_ns, r.ts_ns)
                self.now_ns = max(self.now_ns, r.ts_ns)
        elif isinstance(r, (CaptureStarted, CaptureProgress, CaptureExporting, CaptureDone, CaptureFailed)):
            self._capture_event(r)
        elif isinstance(r, Refused):
            if r.capture_id and r.capture_id in self.captures:
                c = self.captures[r.capture_id]
                c.state = "refused"
                c.error = r.reason
            self.messages.append(f"refused: {r.reason}")

    def note_capture_request(self, capture_id: str, mode: str, steps: int, now_ns: int = 0) -> CaptureView:
        """The monitor asked for a capture (before the engine answers)."""
        c = CaptureView(capture_id=capture_id, mode=mode, steps=steps, state="armed", requested_ns=now_ns)
        self.captures[capture_id] = c
        return c

    def _capture_event(self, r: Any) -> None:
        c = self.captures.get(r.capture_id)
        if c is None:  # requested by another client: still show it
            steps = getattr(r, "steps", getattr(r, "steps_requested", 0))
            c = self.captures[r.capture_id] = CaptureView(
                capture_id=r.capture_id, mode=getattr(r, "mode", "?"), steps=steps
            )
        if isinstance(r, CaptureStarted):
            c.state, c.first_step, c.cold, c.mode, c.steps = (
                "capturing",
                r.first_step,
                r.cold,
                r.mode,
                r.steps,
            )
        elif isinstance(r, CaptureProgress):
            # 0 of N before the window started: the engine's acknowledgement (armed)
            armed = r.steps_done == 0 and c.first_step is None
            c.state, c.steps_done = ("armed" if armed else "capturing"), r.steps_done
        elif isinstance(r, CaptureExporting):
            c.state, c.exporting_since_ns, c.steps_done = "exporting", r.since_ns, c.steps
        elif isinstance(r, CaptureDone):
            c.state = "saved"
            c.bundle, c.trace_bytes, c.events, c.export_s = r.bundle, r.trace_bytes, r.events, r.export_s
            c.steps_done = r.steps_captured
            c.note = r.note
        elif isinstance(r, CaptureFailed):
            c.state, c.error, c.bundle = "failed", r.reason, r.bundle

    def _add_steps(self, steps: list[StepRecord]) -> None:
        # Columns come out in C: attrgetter pulls many fields of a record in one call and
        # zip(*rows) transposes; Python-level work per record is a handful of calls.  The
        # monitor must keep up with 200k records/s (rltperf bench ingest).
        n = len(steps)
        (ids, start, end, batch, tokens, prefill, out_tok, flags, drafts, drafted, accepted, preempted) = zip(
            *map(_STEP_INTS, steps), strict=True
        )
        (busy, flops, kv_used, kv_total, waiting, running, b_read, b_written) = zip(
            *map(_STEP_OPTS, steps), strict=True
        )
        stage_l, exit_l, loop_l, ltok_l = zip(*map(_STEP_LISTS, steps), strict=True)
        kc = _KIND_CODE
        prev = self.last_step_id
        gaps = 0
        if prev is not None and ids[0] > prev + 1:
            gaps += ids[0] - prev - 1
        if ids[-1] - ids[0] != n - 1:  # holes inside the batch (dropped records)
            for i in range(1, n):
                d = ids[i] - ids[i - 1]
                if d > 1:
                    gaps += d - 1
        self.id_gaps += gaps
        self.last_step_id = ids[-1]
        self.last_step = steps[-1]
        self.last_end_ns = end[-1]
        if end[-1] > self.now_ns:
            self.now_ns = end[-1]
        if end[-1] > self.vouched_ns:
            self.vouched_ns = end[-1]
        if self.first_ns is None or start[0] < self.first_ns:
            self._seen(start[0])
        if self.in_step_since_ns and end[-1] >= self.in_step_since_ns:
            self.in_step_since_ns = 0
        rep = self.reported
        if not (rep[0] and rep[1] and rep[2]):
            self.reported = (
                rep[0] or busy.count(None) < n,
                rep[1] or b_read.count(None) < n or b_written.count(None) < n,
                rep[2] or flops.count(None) < n,
            )
        nbytes: Any
        if None in b_read or None in b_written:
            nbytes = _opt_sum(b_read, b_written)
        else:
            nbytes = np.add(b_read, b_written, dtype=np.float64)
        batch_cols: dict[str, Any] = {
            "step_id": ids,
            "start": start,
            "end": end,
            "kind": [kc.get(s.kind, 0) for s in steps],
            "batch": batch,
            "tokens": tokens,
            "prefill": prefill,
            "out_tokens": out_tok,
            "busy": _opt(busy),
            "bytes": nbytes,
            "flops": _opt(flops),
            "flags": flags,
            "kv_used": _opt(kv_used),
            "kv_total": _opt(kv_total),
            "waiting": _opt(waiting),
            "running": _opt(running),
            "drafts": drafts,
            "drafted": drafted,
            "accepted": accepted,
            "preempted": preempted,
            "stages": _matrix(stage_l, MAX_STAGES, np.int64),
            "exit": _matrix(exit_l, MAX_DEPTH, np.int32),
            "loop_ns": _matrix(loop_l, MAX_DEPTH, np.int64),
            "loop_tokens": _matrix(ltok_l, MAX_DEPTH, np.int32),
        }
        self.steps.append(batch_cols, n)

    def _add_requests(self, reqs: list[RequestRecord]) -> None:
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
        self.now_ns = max(self.now_ns, max(finish))
        self.reqs.append(
            {
                "arrival": arrival,
                "finish": finish,
                "ttft": ttft,
                "tpot": tpot,
                "out": out,
                "prompt": prompt,
                "ok": ok,
            },
            n,
        )

    # -- queries -----------------------------------------------------------------------------

    @property
    def dropped(self) -> int:
        """Records known lost: probe ring + this subscriber's queue (+ id holes seen)."""
        return max(self.dropped_ring + self.dropped_sub, self.id_gaps)

    def window_bounds(self, seconds: float | None) -> tuple[int, int]:
        """``(w0, w1)`` of the window over the last ``seconds`` (None: the whole stream),
        probe clock: ``w1`` is the newest moment the data vouches for, ``w0`` never before
        the stream's first timestamp (``engine_adapters.definitions.figures``)."""
        w1 = self.vouched_ns
        first = self.first_ns if self.first_ns is not None else w1
        w0 = first if seconds is None else max(first, w1 - int(seconds * 1e9))
        return min(w0, w1), w1

    def kept_seconds(self) -> float | None:
        """The window that holds exactly what the step ring still keeps: None (the whole
        stream) until the ring has overwritten old steps, then from the oldest kept
        step's start to now.  Whole-stream figures of a bounded ring use it."""
        if self.steps.n <= len(self.steps) or not len(self.steps):
            return None
        oldest = int(self.steps.last("start", len(self.steps))[0])
        return max(0.0, (self.vouched_ns - oldest) / 1e9)

    @property
    def quiet_s(self) -> float:
        """Data time since the newest step ended while the engine was between steps
        (0 while steps come, or while a step is running)."""
        if self.last_end_ns is None or self.in_step_since_ns:
            return 0.0
        return max(0.0, (self.vouched_ns - self.last_end_ns) / 1e9)

    def _window_rows(self, seconds: float | None) -> int:
        """How many of the newest kept steps end inside the window of the last ``seconds``
        (None: all kept)."""
        rows = len(self.steps)
        if rows and seconds is not None:
            w0, _ = self.window_bounds(seconds)
            rows -= int(np.searchsorted(self.steps.last("end"), w0, side="right"))
        return rows

    def _window_cols(self, seconds: float | None, rows: int | None = None) -> Any:
        """``col(name)``: the rows of a step column that end inside the window of the last
        ``seconds`` (None: all kept), copying only those rows (a whole-ring copy of the
        stage matrix is megabytes, at every render tick); ``rows``: ``_window_rows``
        when the caller has it."""
        if rows is None:
            rows = self._window_rows(seconds)
        last = self.steps.last

        def col(name: str) -> np.ndarray:
            return last(name, rows)

        return col

    def window(
        self, seconds: float | None = 10.0, slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None
    ) -> Window:
        """Statistics over the window of the last ``seconds`` of data time (None: the whole
        stream); rates are ``engine_adapters.definitions.figures``'s, percentiles leave excluded steps
        (profiled, exporting, warm-up) and the requests in flight during them out."""
        w0, w1 = self.window_bounds(seconds)
        n = self._window_rows(seconds)
        col = self._window_cols(seconds, n)
        start_x = self.steps.last("start", n + 1)  # and the step before the window, when kept
        end_x = self.steps.last("end", n + 1)
        k = start_x.size - n  # 1 when the step before the window is kept
        start = start_x[k:]
        end = end_x[k:]
        ids = col("step_id")
        flags = col("flags")
        names = self.stage_names
        ceiling = self.ceiling
        peak_bw = ceiling.peak_bw_gbps if ceiling else None
        peak_fl = ceiling.peak_gflops if ceiling else None
        # each step owns the time from the previous step's end (figures.owned_from)
        t0 = int(end_x[0]) if k else (self.first_ns if self.first_ns is not None else w0)
        owned_lo = F.owned_from(start, end, t0)
        busy = col("busy")
        nbytes = col("bytes")
        flops = col("flops")
        out_tok = col("out_tokens")
        fig = F.window_figures(
            start=start,
            end=end,
            flags=flags,
            busy=busy,
            nbytes=nbytes,
            flops=flops,
            tokens=out_tok,
            w0_ns=w0,
            w1_ns=w1,
            owned_lo=owned_lo,
            reported=self.reported,
        )
        keep = (flags & F.EXCLUDED_FLAGS) == 0
        n_keep = int(keep.sum())
        dur = (end - start).astype(np.float64)
        dur_k = dur[keep]
        consec = (np.diff(ids) == 1) & keep[1:] & keep[:-1]
        gaps = (start[1:] - end[:-1]).astype(np.float64)[consec] if n > 1 else np.zeros(0)
        ws = self._wsums.get(seconds)
        if ws is None:
            if len(self._wsums) >= 4:
                self._wsums.pop(next(iter(self._wsums)))
            ws = self._wsums[seconds] = _WindowSums()
        sums = ws.get(self.steps, self.steps.n - n, self.steps.n)
        if n_keep < n:  # take the few excluded rows back out of the sliding sums
            sums = {c: v - col(c)[~keep].sum(axis=0, dtype=np.int64) for c, v in sums.items()}
        stage_mean = {}
        if n_keep:
            means = sums["stages"][: len(names)] / n_keep / 1e6 if names else np.zeros(0)
            stage_mean = {nm: float(v) for nm, v in zip(names, means, strict=False) if v > 0}
        known = ~np.isnan(busy) & keep
        in_step_idle = None
        if known.any() and dur[known].sum() > 0:
            in_step_idle = float(1.0 - min(1.0, busy[known].sum() / dur[known].sum()))
        rf = roofline.window_roofline(
            total_bytes=fig.nbytes,
            total_flops=fig.flops,
            seconds=fig.seconds,
            peak_bw_gbps=peak_bw,
            peak_gflops=peak_fl,
            in_step_idle=in_step_idle,
        )
        bknown = ~np.isnan(nbytes) & keep
        fknown = ~np.isnan(flops)
        ceil_ms = None
        if bknown.any() and peak_bw:
            per_step = roofline.ceiling_time_s(
                nbytes[bknown], np.where(fknown, flops, 0.0)[bknown], peak_bw, peak_fl
            )
            ceil_ms = float(np.median(per_step) * 1e3)
        # requests finishing in the window; those in flight during excluded time leave
        R = self.reqs
        rfin = R.last("finish")
        rsl = slice(int(np.searchsorted(rfin, w0, side="right")), rfin.size)
        ok = R.last("ok")[rsl]
        ttft = R.last("ttft")[rsl]
        tpot = R.last("tpot")[rsl]
        all_flags = self.steps.last("flags")
        clear = np.ones(ok.size, dtype=bool)
        if ok.size and (all_flags & F.EXCLUDED_FLAGS).any():
            a_start = self.steps.last("start")
            a_end = self.steps.last("end")
            spans = F.excluded_spans(a_start, a_end, all_flags)
            clear = F.requests_clear_of(R.last("arrival")[rsl], rfin[rsl], spans)
        ok_c = ok & clear
        ttft_ok = ttft[ok_c & ~np.isnan(ttft)] / 1e6
        tpot_ok = tpot[ok_c & ~np.isnan(tpot)] / 1e6
        goodput = None
        if slo_ttft_ms is not None or slo_tpot_ms is not None:
            good = ok_c.copy()
            if slo_ttft_ms is not None:
                good &= ~np.isnan(ttft) & (ttft / 1e6 <= slo_ttft_ms)
            if slo_tpot_ms is not None:
                # a one-token request has no TPOT: it meets the TPOT SLO trivially
                good &= np.isnan(tpot) | (tpot / 1e6 <= slo_tpot_ms)
            goodput = fig.per_second(float(good.sum()))
        exit_hist = sums["exit"]
        depth = int(np.max(np.nonzero(exit_hist)[0]) + 1) if exit_hist.any() else 0
        max_loops = (self.info.max_loops if self.info else None) or depth
        exit_list = [int(v) for v in exit_hist[: max(depth, max_loops or 0)]]
        tot_exit = exit_hist.sum()
        mean_depth = float((exit_hist * np.arange(1, MAX_DEPTH + 1)).sum() / tot_exit) if tot_exit else None
        nl = max_loops or 0
        loop_ms = [float(v) for v in sums["loop_ns"][:nl] / n_keep / 1e6] if n_keep and nl else []
        loop_tk = [float(v) for v in sums["loop_tokens"][:nl] / n_keep] if n_keep and nl else []
        drafts = int(col("drafts")[keep].sum())
        drafted = int(col("drafted")[keep].sum())
        accepted = int(col("accepted")[keep].sum())
        return Window(
            seconds=float(seconds) if seconds is not None else fig.wall_s,
            span_s=fig.wall_s,
            steps=n_keep,
            step_ms=pct(dur_k / 1e6),
            gap_ms=pct(gaps / 1e6),
            step_ms_mean=float(dur_k.mean() / 1e6) if n_keep else None,
            stage_ms_mean=stage_mean,
            idle_fraction=fig.idle_fraction,
            busy_known_steps=int(known.sum()),
            achieved_gbps=rf.achieved_gbps,
            achieved_gflops=rf.achieved_gflops,
            mbu=rf.mbu,
            mbu_overcount=rf.mbu is not None and rf.mbu > 1.0,
            intensity=rf.intensity,
            balance=rf.balance,
            verdict=rf.verdict,
            ceiling_ms_p50=ceil_ms,
            tokens_per_s=fig.tokens_per_s if n or fig.seconds > 0 else None,
            steps_per_s=fig.steps_per_s,
            ttft_ms=pct(ttft_ok),
            tpot_ms=pct(tpot_ok),
            requests_ok=int(ok_c.sum()),
            requests_failed=int((~ok & clear).sum()),
            goodput_rps=goodput,
            exit_hist=exit_list,
            mean_exit_depth=mean_depth,
            loop_ms_mean=loop_ms,
            loop_tokens_mean=loop_tk,
            spec_drafts=drafts,
            spec_drafted=drafted,
            spec_accepted=accepted,
            acceptance_rate=accepted / drafted if drafted else None,
            mean_acceptance_len=1.0 + accepted / drafts if drafts else None,
            profiled_steps=int(((flags & FLAG_PROFILED) != 0).sum()),
            warmup_steps=int(((flags & FLAG_WARMUP) != 0).sum()),
            exporting_steps=int(((flags & FLAG_EXPORTING) != 0).sum()),
            baseline_s=fig.seconds,
            excluded_s=fig.excluded_s,
            requests_excluded=int((~clear).sum()),
            quiet_s=self.quiet_s,
            in_step_idle=in_step_idle,
        )

    def timeline(self, seconds: float = 30.0, buckets: int = 60) -> dict[str, Any]:
        """Per-bucket mean step time by stage and mean gap over the last ``seconds``.

        Buckets are ``seconds / buckets`` long and aligned to absolute time; the newest
        one holds "now" and is still filling.  Returns ``{"t0_ns", "bucket_s", "stage_ms":
        {name: array}, "gap_ms": array, "step_ms": array, "steps": [int]}`` (float arrays,
        one value a bucket); a step counts in the bucket its end falls in; empty buckets
        hold NaN.
        """
        bucket_ns = max(1, int(seconds * 1e9 / buckets))
        acc = self._timeline
        if acc is None or acc.bucket_ns != bucket_ns or acc.keep < buckets:
            acc = self._timeline = _TimelineSums(bucket_ns, 2 * buckets)
            acc.seen = max(0, self.steps.n - len(self.steps))
        last_b = self.now_ns // bucket_ns
        first_b = last_b - buckets + 1
        acc.update(self.steps, first_b * bucket_ns - 1)
        m = np.zeros((buckets, _TimelineSums.HEAD + MAX_STAGES))
        for i in range(buckets):
            r = acc.sums.get(first_b + i)
            if r is not None:
                m[i] = r
        cnt = m[:, 0]
        with np.errstate(invalid="ignore", divide="ignore"):
            per_step = m / cnt[:, None] / 1e6  # NaN where a bucket has no steps
            gap = m[:, 2] / m[:, 3] / 1e6
        out: dict[str, Any] = {
            "t0_ns": first_b * bucket_ns,
            "bucket_s": bucket_ns / 1e9,
            "stage_ms": {},
            "gap_ms": gap,
            "step_ms": per_step[:, 1],
            "steps": [int(c) for c in cnt],
        }
        h = _TimelineSums.HEAD
        for i, nm in enumerate(self.stage_names[:MAX_STAGES]):
            if m[:, h + i].any():
                out["stage_ms"][nm] = per_step[:, h + i]
        return out

    def flagged_buckets(self, t0_ns: int, bucket_s: float, buckets: int) -> np.ndarray:
        """Per timeline bucket (``timeline()``'s ``t0_ns`` and ``bucket_s``): 1 where a
        step ending in it was profiled, exporting or warm-up (not baseline), else 0."""
        out = np.zeros(buckets, dtype=np.int8)
        n = len(self.steps)
        if not n:
            return out
        end = self.steps.last("end")
        lo = int(np.searchsorted(end, t0_ns, side="left"))
        flags = self.steps.last("flags")[lo:]
        hit = (flags & F.EXCLUDED_FLAGS) != 0
        if hit.any():
            cols = ((end[lo:][hit] - t0_ns) // int(bucket_s * 1e9)).astype(np.int64)
            cols = cols[(cols >= 0) & (cols < buckets)]
            out[cols] = 1
        return out

    def idle_gaps(
        self, seconds: float = 30.0, threshold_ms: float | None = None, limit: int = 8
    ) -> list[IdleGap]:
        """Gaps between consecutive steps over the threshold, newest first, each with the
        stage that grew most in the step before it (vs that stage's median in the window).

        Default threshold: max(1 ms, 5 × the median gap).
        """
        col = self._window_cols(seconds)
        start = col("start")
        end = col("end")
        ids = col("step_id")
        if end.size < 2:
            return []
        g = (start[1:] - end[:-1]).astype(np.float64)
        g[np.diff(ids) != 1] = np.nan
        if threshold_ms is None:
            med = float(np.nanmedian(g)) / 1e6 if np.any(~np.isnan(g)) else 0.0
            threshold_ms = max(1.0, 5 * med)
        idx = np.nonzero(g / 1e6 > threshold_ms)[0]
        if idx.size == 0:
            return []
        stages = col("stages")
        names = self.stage_names
        med_st = np.median(stages[:, : len(names)], axis=0) if names else np.zeros(0)
        out: list[IdleGap] = []
        for i in idx[::-1][:limit]:
            grown = None
            grown_ms = None
            if names:
                delta = stages[i, : len(names)] - med_st
                j = int(np.argmax(delta))
                if delta[j] > 0:
                    grown, grown_ms = names[j], float(delta[j] / 1e6)
            out.append(
                IdleGap(
                    at_ns=int(end[i]),
                    length_ms=float(g[i] / 1e6),
                    after_step=int(ids[i]),
                    grown_stage=grown,
                    grown_ms=grown_ms,
                )
            )
        return out

    def idle_gap_threshold_ms(self, seconds: float = 30.0) -> float:
        """The default threshold ``idle_gaps`` uses over the window: max(1 ms, 5 x median gap)
        (so the screen can say which threshold it lists gaps over)."""
        col = self._window_cols(seconds)
        start = col("start")
        end = col("end")
        ids = col("step_id")
        if end.size < 2:
            return 1.0
        g = (start[1:] - end[:-1]).astype(np.float64)
        g = g[np.diff(ids) == 1]
        med = float(np.median(g)) / 1e6 if g.size else 0.0
        return max(1.0, 5 * med)

    def latest_kv(self) -> dict[str, Any]:
        """Newest queue and KV figures (None when the engine does not report them)."""
        s = self.last_step
        if s is None:
            return {}
        return {
            "waiting": s.waiting,
            "running": s.running,
            "kv_used": s.kv_used,
            "kv_total": s.kv_total,
            "kv_per_depth": s.kv_per_depth,
        }

    def gpu_util_mean(self, seconds: float = 10.0) -> float | None:
        """Mean NVML utilisation over the window (coarse cross-check), None without a GPU."""
        lo = self.now_ns - int(seconds * 1e9)
        vals = [v for t, v in self.gpu_util if t >= lo]
        return sum(vals) / len(vals) if vals else None

    def latest_metrics(self) -> MetricsSample | None:
        """The newest ``MetricsSample`` (vLLM over HTTP), or None."""
        return self.metrics[-1] if self.metrics else None

    def metrics_window(self, seconds: float | None = 10.0) -> MetricsWindow | None:
        """Figures from the ``MetricsSample`` records of the last ``seconds`` of data time
        (None: all kept); None when the target sends no such records
        (``engine_adapters.definitions.server_window``)."""
        return metrics_window(self.metrics, seconds, self.ceiling)

    def server_trends(self, seconds: float, columns: int) -> ServerTrends | None:
        """Trend lines of the metrics scrapes over the last ``seconds`` in at most ``columns``
        columns (``engine_adapters.definitions.server_history``); None without scrapes."""
        return server_trends(self.metrics, seconds, columns)
