"""A window over a metrics endpoint's scrapes (vLLM's ``/metrics``): rates, gauges and
latency estimates from ``MetricsSample`` records.

Rates are counter gains over the summed scrape intervals of the window (each sample
carries what its counters gained since the previous scrape, so any window pools
exactly); gauges are the newest scrape's; latency percentiles are histogram estimates
(``histograms.py``: interpolated inside the server's buckets, lowered to the bound the
exact mean allows).  The monitor's aggregator (screen, ``summary``) calls
``metrics_window``; nothing here imports numpy or Textual.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from engine_adapters.definitions.histograms import PERCENTILE_METHOD, estimates, pool
from engine_adapters.definitions.looped_cost import MFU_CAVEAT
from engine_adapters.definitions.records import Ceiling, MetricsSample

METRIC_LATENCIES = ("ttft", "itl", "tpot", "e2e", "queue", "prefill", "decode")
"""Latency histograms a ``MetricsSample`` may carry (see ``MetricsWindow.latency_ms``)."""


@dataclass
class MetricsWindow:
    """Engine-wide figures from ``MetricsSample`` records (a metrics endpoint such as vLLM's
    ``/metrics``) over a window.  Rates are gains over the summed scrape intervals; latency
    percentiles are histogram estimates (``percentile_method`` says so on screen)."""

    seconds: float
    span_s: float
    samples: int
    source: str
    tokens_per_s: float | None
    prompt_tokens_per_s: float | None
    requests_per_s: float | None
    steps_per_s: float | None
    tokens_per_step: float | None
    finished: dict[str, float]
    preemptions: float
    prefix_hit_rate: float | None
    running: float | None
    waiting: float | None
    kv_usage: float | None
    latency_ms: dict[str, dict[str, float | None]]
    latency_mean_ms: dict[str, float | None]
    latency_samples: dict[str, int]
    latency_capped: dict[str, list[str]]
    achieved_gbps: float | None
    achieved_gflops: float | None
    mbu: float | None
    mbu_overcount: bool
    mbu_note: str | None
    notes: list[str]
    percentile_method: str = PERCENTILE_METHOD
    latency_bounded: dict[str, list[str]] = field(default_factory=dict)
    """Percentiles lowered to the bound the exact mean allows (a wide first bucket made
    the interpolation overshoot): upper limits, shown as such."""


def metrics_window(
    samples: Sequence[MetricsSample], seconds: float | None = 10.0, ceiling: Ceiling | None = None
) -> MetricsWindow | None:
    """Figures from the samples of the last ``seconds`` of data time (None: all given);
    None without samples.  ``ceiling`` (peak bandwidth) turns the server's byte estimate
    into MBU."""
    if not samples:
        return None
    last = samples[-1]
    win = recent_scrapes(samples, seconds)
    span = sum(m.interval_s for m in win)

    def rate(v: float) -> float | None:
        return v / span if span > 0 else None

    gen = sum(m.generation_tokens for m in win)
    steps = sum(m.steps for m in win)
    finished: dict[str, float] = {}
    for m in win:
        for k, v in m.requests_finished.items():
            finished[k] = finished.get(k, 0.0) + v
    queries = sum(m.prefix_queries for m in win)
    lat: dict[str, dict[str, float | None]] = {}
    lat_mean: dict[str, float | None] = {}
    lat_n: dict[str, int] = {}
    capped: dict[str, list[str]] = {}
    bounded: dict[str, list[str]] = {}
    for name in METRIC_LATENCIES:
        pooled = pool(m.hist[name] for m in win if name in m.hist)
        pct = estimates(pooled, scale=1e3)
        lat[name] = pct.values
        mean = pooled.mean if pooled is not None else None
        lat_mean[name] = mean * 1e3 if mean is not None else None
        lat_n[name] = int(pooled.count) if pooled is not None else 0
        if pct.capped:
            capped[name] = pct.capped
        if pct.bounded:
            bounded[name] = pct.bounded
    est = [m for m in win if m.read_bytes is not None]
    gbps = gflops = mbu = None
    if est and span > 0:
        est_span = sum(m.interval_s for m in est)
        nbytes = sum((m.read_bytes or 0.0) + (m.write_bytes or 0.0) for m in est)
        gbps = nbytes / est_span / 1e9 if est_span > 0 else None
        fl = [m.flops for m in est if m.flops is not None]
        gflops = sum(fl) / est_span / 1e9 if fl and est_span > 0 else None
        if gbps is not None and ceiling is not None and ceiling.peak_bw_gbps:
            mbu = gbps / ceiling.peak_bw_gbps
    notes: list[str] = []
    for m in win:
        for n in m.notes:
            if n not in notes:
                notes.append(n)
    # the warning beside MBU: the note about vLLM's byte/FLOP estimate of a looped model
    # (corrected, or left uncorrected for want of its loop count); any other note (a plain
    # model's "not looped") is an ordinary note
    mbu_note = next((n for n in notes if MFU_CAVEAT in n), None)
    return MetricsWindow(
        seconds=float(seconds) if seconds is not None else span,
        span_s=span,
        samples=len(win),
        source=last.source,
        tokens_per_s=rate(gen),
        prompt_tokens_per_s=rate(sum(m.prompt_tokens for m in win)),
        requests_per_s=rate(sum(finished.values())),
        steps_per_s=rate(steps),
        tokens_per_step=sum(m.step_tokens for m in win) / steps if steps > 0 else None,
        finished=finished,
        preemptions=sum(m.preemptions for m in win),
        prefix_hit_rate=sum(m.prefix_hits for m in win) / queries if queries > 0 else None,
        running=last.running,
        waiting=last.waiting,
        kv_usage=last.kv_usage,
        latency_ms=lat,
        latency_mean_ms=lat_mean,
        latency_samples=lat_n,
        latency_capped=capped,
        achieved_gbps=gbps,
        achieved_gflops=gflops,
        mbu=mbu,
        mbu_overcount=mbu is not None and mbu > 1.0,
        mbu_note=mbu_note,
        notes=notes,
        latency_bounded=bounded,
    )


IMBALANCE_RATIO = 1.5
"""Replicas are flagged unbalanced when a figure's largest replica exceeds its smallest by
more than this factor (and the difference is not idle noise, ``IMBALANCE_FLOOR``)."""
IMBALANCE_FLOOR = {"running": 1.0, "tokens_per_s": 1.0}
"""Smallest difference (max − min) that may be flagged: one request running, one token a
second (0 against 0.4 running is an idle pair, not an imbalance)."""
REPLICA_LATENCIES = ("ttft", "tpot", "queue")


@dataclass
class ReplicaTotals:
    """Several metrics endpoints (data-parallel replicas, prefill and decode instances)
    over one window, each over its own newest ``seconds``: sums of rates and gauges,
    latencies pooled across replicas (the same bounded histogram estimate), and how
    unbalanced they are."""

    windows: list[MetricsWindow | None]
    """Each replica's window, in the order given (None: nothing scraped yet)."""
    mean_running: list[float | None]
    """Each replica's mean running requests over its window (the imbalance's input)."""
    running: float | None
    waiting: float | None
    kv_usage_max: float | None
    tokens_per_s: float | None
    prompt_tokens_per_s: float | None
    requests_per_s: float | None
    latency_p95_ms: dict[str, float | None]
    latency_bounded: list[str]
    """Latencies whose pooled P95 was lowered to the mean's bound (upper limits)."""
    imbalance: dict[str, float | None]
    """Largest over smallest replica (inf when the smallest is 0) of mean running and of
    tokens/s; None with fewer than two replicas reporting."""
    flagged: list[str]
    """Figures whose imbalance exceeds ``IMBALANCE_RATIO`` beyond ``IMBALANCE_FLOOR``."""


def recent_scrapes(samples: Sequence[MetricsSample], seconds: float | None) -> list[MetricsSample]:
    """The samples of the last ``seconds`` (None: all), oldest first.  Scrapes are kept in
    time order: the walk back stops at the window's start instead of reading the whole
    history (an hour of scrapes at each render tick)."""
    if not samples:
        return []
    if seconds is None:
        return list(samples)
    lo = samples[-1].ts_ns - int(seconds * 1e9)
    win: list[MetricsSample] = []
    for m in reversed(samples):
        if m.ts_ns <= lo:
            break
        win.append(m)
    win.reverse()
    return win


def _sum(vals: Sequence[float | None]) -> float | None:
    got = [v for v in vals if v is not None]
    return sum(got) if got else None


def imbalance(values: Sequence[float | None]) -> float | None:
    """Largest over smallest of the values given (inf when the smallest is 0 and the
    largest is not; 1 when all are 0); None with fewer than two values."""
    got = [v for v in values if v is not None]
    if len(got) < 2:
        return None
    hi, lo = max(got), min(got)
    if hi <= 0:
        return 1.0
    return hi / lo if lo > 0 else float("inf")


def replica_totals(
    replicas: Sequence[Sequence[MetricsSample]], seconds: float | None = 10.0
) -> ReplicaTotals:
    """Totals and imbalance of several replicas (see ``ReplicaTotals``)."""
    windows = [metrics_window(s, seconds) for s in replicas]
    recent = [recent_scrapes(s, seconds) for s in replicas]
    mean_running: list[float | None] = []
    for win in recent:
        vals = [m.running for m in win if m.running is not None]
        mean_running.append(sum(vals) / len(vals) if vals else None)
    lat: dict[str, float | None] = {}
    low: list[str] = []
    for name in REPLICA_LATENCIES:
        pooled = pool(m.hist[name] for win in recent for m in win if name in m.hist)
        pct = estimates(pooled, (95,), scale=1e3)
        lat[name] = pct.values["p95"]
        if pct.bounded:
            low.append(name)
    tps: list[float | None] = [w.tokens_per_s if w is not None else None for w in windows]
    ratios = {"running": imbalance(mean_running), "tokens_per_s": imbalance(tps)}
    flagged = []
    for key, series in (("running", mean_running), ("tokens_per_s", tps)):
        got: list[float] = [v for v in series if v is not None]
        r = ratios[key]
        if r is not None and r > IMBALANCE_RATIO and max(got) - min(got) >= IMBALANCE_FLOOR[key]:
            flagged.append(key)
    kvs = [w.kv_usage for w in windows if w is not None and w.kv_usage is not None]
    return ReplicaTotals(
        windows=windows,
        mean_running=mean_running,
        running=_sum([w.running if w is not None else None for w in windows]),
        waiting=_sum([w.waiting if w is not None else None for w in windows]),
        kv_usage_max=max(kvs) if kvs else None,
        tokens_per_s=_sum(tps),
        prompt_tokens_per_s=_sum([w.prompt_tokens_per_s if w is not None else None for w in windows]),
        requests_per_s=_sum([w.requests_per_s if w is not None else None for w in windows]),
        latency_p95_ms=lat,
        latency_bounded=low,
        imbalance=ratios,
        flagged=flagged,
    )
