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

from engine_adapters.definitions.histograms import (
    PERCENTILE_METHOD,
    bounded_percentiles,
    capped_percentiles,
    percentiles,
    pool,
)
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
    lo = None if seconds is None else last.ts_ns - int(seconds * 1e9)
    win = [m for m in samples if lo is None or m.ts_ns > lo]
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
        lat[name] = percentiles(pooled, scale=1e3)
        mean = pooled.mean if pooled is not None else None
        lat_mean[name] = mean * 1e3 if mean is not None else None
        lat_n[name] = int(pooled.count) if pooled is not None else 0
        cap = capped_percentiles(pooled)
        if cap:
            capped[name] = cap
        low = bounded_percentiles(pooled)
        if low:
            bounded[name] = low
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
    mbu_note = next((n for n in notes if "estimator" in n), None)
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
