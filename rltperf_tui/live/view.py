"""What one render tick knows about a target, as plain values: ``StatsView``.

The screen's panels are functions of their input: the render tick builds one
``StatsView`` per target from its ``TargetStats`` (``stats_view``) and hands it down;
no panel calls back into the live model while drawing, so a panel never sees a
half-updated model and can be tested by calling it on a view.  Everything a panel
draws that is computed (the timeline's buckets, idle gaps, the metrics window and
trends, the totals since attach) is computed here, once per tick, at the sizes the
panels ask for (``ViewSize``).  The replica table gets its own value (``ReplicaView``).
No Textual here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from engine_adapters.definitions.ranks import RankFigures
from engine_adapters.definitions.records import Ceiling, DeviceSample, EngineInfo, Hello, StepRecord
from engine_adapters.definitions.server_history import LIFETIME_LATENCIES, ServerLifetime, ServerTrends
from engine_adapters.definitions.server_window import MetricsWindow, ReplicaTotals, replica_totals
from rltperf_tui.live.aggregator import TargetStats
from rltperf_tui.live.stream_state import CaptureView
from rltperf_tui.live.window_stats import IdleGap


@dataclass(frozen=True)
class ViewSize:
    """The sizes the panels draw at, so the tick computes what fits (defaults before the
    first layout)."""

    timeline_cols: int = 60
    """Buckets of the step timeline (one a column)."""
    idle_gap_rows: int = 8
    """Idle gaps the device panel can list (it takes the newest that fit)."""
    trend_cols: int = 60
    """Columns of the server trend lines."""


@dataclass(frozen=True)
class TimelineView:
    """The step timeline over the last ``timeline_s`` seconds, one value per bucket
    (``TargetStats.timeline``; empty buckets hold NaN)."""

    t0_ns: int
    """Start of the first bucket, probe clock."""
    bucket_s: float
    step_ms: np.ndarray
    """Mean step time per bucket."""
    gap_ms: np.ndarray
    """Mean gap before a step per bucket."""
    stage_ms: Mapping[str, np.ndarray]
    """Mean time per step of each stage that ran, per bucket."""
    steps: tuple[int, ...]
    """Steps per bucket."""
    flagged: np.ndarray
    """1 where a bucket holds a profiled, exporting or warm-up step (``flagged_buckets``)."""


@dataclass(frozen=True)
class LifetimeView:
    """A metrics endpoint's counters, latencies and peaks since attach
    (``ServerLifetime`` at this tick)."""

    samples: int = 0
    elapsed_s: float = 0.0
    span_s: float = 0.0
    requests: float = 0.0
    finished: Mapping[str, float] = field(default_factory=dict)
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    preemptions: float = 0.0
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    peak_running: float | None = None
    peak_waiting: float | None = None
    peak_kv: float | None = None
    """KV usage 0..1."""
    peak_gen_tps: float | None = None
    peak_prompt_tps: float | None = None
    p95_ms: Mapping[str, tuple[float | None, bool]] = field(default_factory=dict)
    """P95 since attach per latency, and whether it is an upper limit."""
    means_ms: Mapping[str, float | None] = field(default_factory=dict)
    """Exact mean since attach per latency."""

    def latency_ms(self, name: str) -> tuple[float | None, bool]:
        """P95 of ``name`` since attach (ms) and whether it is an upper limit."""
        return self.p95_ms.get(name, (None, False))

    def mean_ms(self, name: str) -> float | None:
        """Mean of ``name`` since attach (ms)."""
        return self.means_ms.get(name)


def lifetime_view(lt: ServerLifetime) -> LifetimeView:
    """``lt``'s figures now, as values."""
    return LifetimeView(
        samples=lt.samples,
        elapsed_s=lt.elapsed_s,
        span_s=lt.span_s,
        requests=lt.requests,
        finished=dict(lt.finished),
        prompt_tokens=lt.prompt_tokens,
        generation_tokens=lt.generation_tokens,
        preemptions=lt.preemptions,
        prefix_queries=lt.prefix_queries,
        prefix_hits=lt.prefix_hits,
        peak_running=lt.peak_running.value,
        peak_waiting=lt.peak_waiting.value,
        peak_kv=lt.peak_kv.value,
        peak_gen_tps=lt.peak_gen_tps.value,
        peak_prompt_tps=lt.peak_prompt_tps.value,
        p95_ms={n: lt.latency_ms(n) for n in LIFETIME_LATENCIES},
        means_ms={n: lt.mean_ms(n) for n in LIFETIME_LATENCIES},
    )


@dataclass(frozen=True)
class StatsView:
    """One target's ``TargetStats`` at one render tick, as plain values (the attribute
    names are ``TargetStats``'s where it has them)."""

    state: str = "connecting"
    """connecting, connected, reconnecting, ended, error."""
    state_detail: str = ""
    hello: Hello | None = None
    info: EngineInfo | None = None
    stage_names: tuple[str, ...] = ()
    records: int = 0
    """Records ingested."""
    dropped: int = 0
    """Records known lost."""
    quiet_s: float = 0.0
    """Data time since the newest step while the engine was between steps."""
    now_ns: int = 0
    """The newest timestamp of any record, probe clock."""
    ceiling: Ceiling | None = None
    """Peak figures in use."""
    devices: Mapping[tuple[str, int], DeviceSample] = field(default_factory=dict)
    device_notes: tuple[str, ...] = ()
    gpu_util_mean: float | None = None
    """Mean NVML utilisation over the window; None without a GPU."""
    last_step: StepRecord | None = None
    kv: Mapping[str, Any] = field(default_factory=dict)
    """Newest queue and KV figures (``TargetStats.latest_kv``)."""
    captures: Mapping[str, CaptureView] = field(default_factory=dict)
    """Captures by id, oldest first (copies)."""
    metrics_only: bool = False
    """A metrics endpoint (scrapes, no step records): the server panels show, not the step ones."""
    scrapes_only: bool = False
    """The target can only ever send scrapes (its ``Hello`` says ``metrics``: a vLLM server
    over HTTP), never steps: step figures do not exist for it, not even as n/a."""
    timeline: TimelineView | None = None
    """The step timeline (None for a metrics endpoint)."""
    idle_gap_threshold_ms: float = 1.0
    idle_gaps: tuple[IdleGap, ...] = ()
    """Gaps over the threshold in the window, newest first, as many as ``ViewSize`` allows."""
    metrics: MetricsWindow | None = None
    """The metrics-endpoint window (None: not a metrics endpoint, or nothing scraped)."""
    trends: ServerTrends | None = None
    """The metrics-endpoint trend lines over the timeline."""
    lifetime: LifetimeView = field(default_factory=LifetimeView)
    """The metrics endpoint since attach."""
    ranks: RankFigures | None = None
    """Per-rank figures over the window (the slowest rank, the skew); None: one rank."""


def stats_view(
    st: TargetStats, window_s: float, timeline_s: float, size: ViewSize | None = None
) -> StatsView:
    """``st`` now, with what the panels shown for it draw (step panels, or a metrics
    endpoint's server panels) computed at ``size``."""
    size = size or ViewSize()
    metrics_only = bool(st.metrics) and len(st.steps) == 0
    base = StatsView(
        state=st.state,
        state_detail=st.state_detail,
        hello=st.hello,
        info=st.info,
        stage_names=tuple(st.stage_names),
        records=st.records,
        dropped=st.dropped,
        quiet_s=st.quiet_s,
        now_ns=st.now_ns,
        ceiling=st.ceiling,
        devices=dict(st.devices),
        device_notes=tuple(st.device_notes),
        last_step=st.last_step,
        kv=st.latest_kv(),
        captures={k: replace(c) for k, c in st.captures.items()},
        metrics_only=metrics_only,
        scrapes_only=metrics_only or (st.hello is not None and "metrics" in st.hello.capabilities),
    )
    if metrics_only:
        return replace(
            base,
            metrics=st.metrics_window(window_s),
            trends=st.server_trends(timeline_s, size.trend_cols),
            lifetime=lifetime_view(st.lifetime),
        )
    tl = st.timeline(timeline_s, size.timeline_cols)
    timeline = TimelineView(
        t0_ns=int(tl["t0_ns"]),
        bucket_s=float(tl["bucket_s"]),
        step_ms=tl["step_ms"],
        gap_ms=tl["gap_ms"],
        stage_ms=dict(tl["stage_ms"]),
        steps=tuple(tl["steps"]),
        flagged=st.flagged_buckets(tl["t0_ns"], tl["bucket_s"], size.timeline_cols),
    )
    thr = st.idle_gap_threshold_ms(window_s)
    return replace(
        base,
        gpu_util_mean=st.gpu_util_mean(window_s),
        timeline=timeline,
        idle_gap_threshold_ms=thr,
        idle_gaps=tuple(st.idle_gaps(window_s, threshold_ms=thr, limit=size.idle_gap_rows)),
        ranks=st.rank_window(window_s),
    )


@dataclass(frozen=True)
class ReplicaView:
    """What one render tick knows about the replicas (two or more metrics endpoints)."""

    names: tuple[str, ...]
    totals: ReplicaTotals
    window_s: float


def replica_view(names: Sequence[str], stats: Sequence[TargetStats], window_s: float) -> ReplicaView:
    """The replica table's values: each target's window, their totals and imbalance
    (``engine_adapters.definitions.server_window.replica_totals``)."""
    return ReplicaView(tuple(names), replica_totals([s.metrics for s in stats], window_s), window_s)
