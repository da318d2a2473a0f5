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

``TargetStats`` composes two parts sharing one ``StreamClock``: the connection and
capture state (``rltperf_tui.live.stream_state``: hello, heartbeats, devices, captures) and
the numpy step windows (``rltperf_tui.live.step_windows`` over ``rltperf_tui.live.step_rings``:
``window()``, ``timeline()``, ``idle_gaps()``...).  Its attributes read and write
through to the part that keeps them, so callers see one object.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar, overload

import numpy as np

from engine_adapters.definitions.figures import EXCLUDED_FLAGS, PERCENTILES, HeldFigures, pct
from engine_adapters.definitions.ranks import RankFigures, rank_figures
from engine_adapters.definitions.records import (
    Ceiling,
    DeviceSample,
    EngineInfo,
    Hello,
    MetricsSample,
    Record,
    RequestRecord,
    StepRecord,
)
from engine_adapters.definitions.server_history import (
    ColumnCache,
    ServerLifetime,
    ServerTrends,
    server_trends,
)
from engine_adapters.definitions.server_window import METRIC_LATENCIES, MetricsWindow, metrics_window
from rltperf_tui.live.step_rings import KIND_CODE as _KIND_CODE  # noqa: F401  (tests import it from here)
from rltperf_tui.live.step_rings import MAX_DEPTH, MAX_STAGES, Ring
from rltperf_tui.live.step_windows import IdleGap, StepWindows, Window
from rltperf_tui.live.stream_state import CaptureView, StreamClock, StreamState

__all__ = [
    "MAX_DEPTH",
    "MAX_STAGES",
    "METRIC_LATENCIES",
    "PERCENTILES",
    "CaptureView",
    "IdleGap",
    "MetricsWindow",
    "TargetStats",
    "Window",
    "pct",
]


T = TypeVar("T")


class _Part(Generic[T]):
    """An attribute of ``TargetStats`` kept on one of its parts (``stream``, ``clock`` or
    ``windows``): reading and writing it on the target reads and writes it there."""

    def __init__(self, part: str, doc: str = "") -> None:
        self.part = part
        self.name = ""
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> _Part[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(getattr(obj, self.part), self.name)

    def __set__(self, obj: object, value: T) -> None:
        setattr(getattr(obj, self.part), self.name, value)


@dataclass
class TargetStats:
    """Everything known about one target's stream: its connection and capture state
    (``stream``) and its step windows (``windows``), on one data clock (``clock``)."""

    capacity: int = 32768
    grow: bool = False
    peak_override: Ceiling | None = None
    records: int = 0
    """Records ingested."""

    # connection and capture state (rltperf_tui.live.stream_state)
    info = _Part[EngineInfo | None]("stream")
    hello = _Part[Hello | None]("stream")
    stage_names = _Part[list[str]]("stream")
    state = _Part[str]("stream", "connecting, connected, ... (the adapter's ``SessionEvent``).")
    state_detail = _Part[str]("stream")
    dropped_ring = _Part[int]("stream")
    dropped_sub = _Part[int]("stream")
    steps_total = _Part[int | None]("stream")
    devices = _Part[dict[tuple[str, int], DeviceSample]]("stream")
    device_notes = _Part[list[str]]("stream")
    captures = _Part[dict[str, CaptureView]]("stream")
    messages = _Part[deque[str]]("stream")
    ended = _Part[bool]("stream", "The probe said goodbye.")
    gpu_util = _Part[deque[tuple[int, float]]]("stream")
    dram_util = _Part[deque[tuple[int, float]]]("stream")
    # the data clock (shared by both parts)
    now_ns = _Part[int]("clock", "The newest timestamp of any record, probe clock.")
    first_ns = _Part[int | None]("clock", "The stream's first timestamp (a heartbeat or a step start).")
    vouched_ns = _Part[int]("clock", "The newest moment the data vouches for (the window end).")
    in_step_since_ns = _Part[int]("clock", "The newest heartbeat found a step begun then (0: between steps).")
    last_end_ns = _Part[int | None]("clock", "End of the newest step.")
    # the step windows (rltperf_tui.live.step_windows)
    steps = _Part[Ring]("windows", "The step columns (``step_rings.Ring``).")
    reqs = _Part[Ring]("windows", "The request columns (``step_rings.Ring``).")
    id_gaps = _Part[int]("windows")
    last_step_id = _Part[int | None]("windows")
    last_step = _Part[StepRecord | None]("windows")
    reported = _Part[tuple[bool, bool, bool]]("windows", "Whether any step reported busy, bytes, FLOPs.")

    def __post_init__(self) -> None:
        self.clock = StreamClock()
        self.stream = StreamState(self.clock)
        self.windows = StepWindows(self.clock, self.capacity, self.grow)
        self.metrics: deque[MetricsSample] = deque(maxlen=3600)
        self.lifetime = ServerLifetime()
        """Counters, latencies and peaks of the metrics scrapes since attach."""
        self._trend_columns: ColumnCache = {}
        """Trend columns computed at the last ``server_trends`` (reused at the next)."""
        self.rank_steps: deque[StepRecord] = deque(maxlen=None if self.grow else self.capacity)
        """Steps that carry per-rank figures (a multi-rank engine), for ``rank_window``."""
        self._held: dict[tuple[float | None, float | None, float | None], HeldFigures[Window]] = {}
        """Per live window asked for: the figures shown across its blind stretches."""

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
        self.clock.seen(t_ns)

    def _add_other(self, r: Record) -> None:
        if self.stream.add(r):
            return
        if isinstance(r, MetricsSample):
            self.metrics.append(r)
            self.lifetime.add(r)
            self.now_ns = max(self.now_ns, r.ts_ns)

    def note_capture_request(self, capture_id: str, mode: str, steps: int, now_ns: int = 0) -> CaptureView:
        """The monitor asked for a capture (before the engine answers)."""
        return self.stream.note_capture_request(capture_id, mode, steps, now_ns)

    def _capture_event(self, r: Any) -> None:
        self.stream.capture_event(r)

    def _add_steps(self, steps: list[StepRecord]) -> None:
        self.windows.add_steps(steps)
        self.rank_steps.extend(s for s in steps if s.rank_busy_ns is not None)

    def _add_requests(self, reqs: list[RequestRecord]) -> None:
        self.windows.add_requests(reqs)

    # -- queries -----------------------------------------------------------------------------

    @property
    def dropped(self) -> int:
        """Records known lost: probe ring + this subscriber's queue (+ id holes seen)."""
        return max(self.dropped_ring + self.dropped_sub, self.id_gaps)

    def window_bounds(self, seconds: float | None) -> tuple[int, int]:
        """``(w0, w1)`` of the window over the last ``seconds`` (None: the whole stream),
        probe clock, within the steps still kept (``StepWindows.bounds``)."""
        return self.windows.bounds(seconds)

    def kept_seconds(self) -> float | None:
        """The window that holds exactly what the step ring still keeps
        (``StepWindows.kept_seconds``)."""
        return self.windows.kept_seconds()

    @property
    def step_free(self) -> bool:
        """No step and no request has come (a metrics endpoint so far): every step window
        is empty, whatever the time."""
        return self.windows.steps.n == 0 and self.windows.reqs.n == 0

    @property
    def quiet_s(self) -> float:
        """Data time since the newest step ended while the engine was between steps
        (0 while steps come, or while a step is running)."""
        return self.clock.quiet_s

    def window(
        self,
        seconds: float | None = 10.0,
        slo_ttft_ms: float | None = None,
        slo_tpot_ms: float | None = None,
        *,
        hold: bool | None = None,
    ) -> Window:
        """Statistics over the window of the last ``seconds`` of data time (None: the whole
        stream), against this target's ceiling and stage names (``StepWindows.window``).

        A live window (``hold``; default: when ``seconds`` is given) that is blind (a
        capture's export owns most of it: ``figures.blind``) gives the figures of the
        newest such window that was not, with ``stale_s`` set (``figures.HeldFigures``)."""
        info = self.info
        since = self.window_bounds(seconds)[0] if seconds is not None else None
        w = self.windows.window(
            seconds,
            slo_ttft_ms,
            slo_tpot_ms,
            ceiling=self.ceiling,
            stage_names=self.stage_names,
            max_loops=info.max_loops if info else None,
            energy=self.stream.energy_readings(since),
            energy_source=self.stream.energy_source.get(self.stream.energy_device()),
            energy_why=self.stream.energy_why(),
        )
        if not (seconds is not None if hold is None else hold):
            return w
        key = (seconds, slo_ttft_ms, slo_tpot_ms)
        held = self._held.get(key)
        if held is None:
            held = self._held[key] = HeldFigures()
        shown, age = held.show(w, w.blind, self.window_bounds(seconds)[1])
        if age is None:
            return w
        return replace(
            shown,
            stale_s=age,
            blind=True,
            profiled_steps=w.profiled_steps,
            exporting_steps=w.exporting_steps,
            warmup_steps=w.warmup_steps,
            requests_excluded=w.requests_excluded,
            quiet_s=w.quiet_s,
        )

    def rank_window(self, seconds: float | None = 10.0) -> RankFigures | None:
        """Per-rank figures (busy, wait, compute per step; the slowest rank and the skew)
        over the window's steps, profiled/exporting/warm-up ones left out
        (``engine_adapters.definitions.ranks``); None for a single-rank engine."""
        if not self.rank_steps:
            return None
        w0, w1 = self.window_bounds(seconds)
        sel = [s for s in self.rank_steps if w0 < s.end_ns <= w1 and not s.flags & EXCLUDED_FLAGS]
        n = len(self.rank_steps[-1].rank_busy_ns or [])
        info = self.info
        names = (
            list(info.ranks)
            if info is not None and info.ranks and len(info.ranks) == n
            else [f"rank{k}" for k in range(n)]
        )
        return rank_figures(
            names,
            [s.rank_busy_ns or [] for s in sel],
            [s.rank_wait_ns for s in sel],
            [s.rank_loop_ns for s in sel],
        )

    def timeline(self, seconds: float = 30.0, buckets: int = 60) -> dict[str, Any]:
        """Per-bucket mean step time by stage and mean gap (``StepWindows.timeline``)."""
        return self.windows.timeline(seconds, buckets, self.stage_names)

    def flagged_buckets(self, t0_ns: int, bucket_s: float, buckets: int) -> np.ndarray:
        """Timeline buckets holding a profiled, exporting or warm-up step
        (``StepWindows.flagged_buckets``)."""
        return self.windows.flagged_buckets(t0_ns, bucket_s, buckets)

    def idle_gaps(
        self, seconds: float = 30.0, threshold_ms: float | None = None, limit: int = 8
    ) -> list[IdleGap]:
        """Gaps between consecutive steps over the threshold, newest first
        (``StepWindows.idle_gaps``)."""
        return self.windows.idle_gaps(seconds, threshold_ms, limit, self.stage_names)

    def idle_gap_threshold_ms(self, seconds: float = 30.0) -> float:
        """The default threshold ``idle_gaps`` uses over the window: max(1 ms, 5 x median gap)."""
        return self.windows.idle_gap_threshold_ms(seconds)

    def latest_kv(self) -> dict[str, Any]:
        """Newest queue and KV figures (None when the engine does not report them)."""
        return self.windows.latest_kv()

    def gpu_util_mean(self, seconds: float = 10.0) -> float | None:
        """Mean NVML utilisation over the window (coarse cross-check), None without a GPU."""
        return self.stream.gpu_util_mean(seconds)

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
        return server_trends(self.metrics, seconds, columns, self._trend_columns)
