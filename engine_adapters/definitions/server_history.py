"""History of a metrics endpoint (vLLM's ``/metrics``): trend lines over the timeline,
counters and peaks since attach.

Trends.  The scrapes of the timeline (``--timeline`` seconds of data time up to the
newest scrape) are drawn in at most ``columns`` columns of the same number of
consecutive scrapes (one each while they fit: the line then has a column per scrape, as
a scraper's late answers stretch a scrape without leaving a hole).  Per column:

- a gauge (running, waiting, KV usage) is the highest reading in the column (a peak
  never falls between two columns);
- a rate (prompt and generation tokens/s) is the counter gains over the summed scrape
  intervals of the column (``server_window``'s definition on a shorter window);
- a percentile (TTFT, TPOT, queue time P95) is the histogram estimate over the column's
  pooled histogram deltas, lowered to the bound its exact mean allows like every
  histogram percentile (``histograms.percentiles``): a 0-300 ms bucket holding
  0.012 ms queue times reads ≤ 0.24 ms, not 285 ms.  A column in which no request
  finished has no value (a gap, never zero).

Min, max and now are those of the columns drawn (now: the newest value among the last
``NOW_COLUMNS`` columns), so the numbers beside a line describe that line.

Since attach.  ``ServerLifetime`` adds every scrape as it arrives (not bounded by the
samples kept): counter totals (tokens, finished requests by reason, preemptions, prefix
cache), the latency histograms pooled since attach, and peaks: the highest gauge reading
and the highest tokens/s over any ``PEAK_SPAN_S`` of consecutive scrapes (one scrape's
rate over half a second is noise, not a peak).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from engine_adapters.definitions.histograms import Pooled, estimates, pool
from engine_adapters.definitions.records import HistogramDelta, MetricsSample
from engine_adapters.definitions.server_window import recent_scrapes

TREND_FIGURES: tuple[tuple[str, str, str], ...] = (
    ("running", "running", "gauge"),
    ("waiting", "waiting", "gauge"),
    ("kv", "KV cache %", "gauge"),
    ("prompt_tps", "prompt tok/s", "rate"),
    ("gen_tps", "gen tok/s", "rate"),
    ("ttft_p95", "TTFT p95 ms", "p95"),
    ("tpot_p95", "TPOT p95 ms", "p95"),
    ("queue_p95", "queue p95 ms", "p95"),
)
"""(key, label, kind) of every trend line, in screen order."""

_HIST = {"ttft_p95": "ttft", "tpot_p95": "tpot", "queue_p95": "queue"}
PEAK_SPAN_S = 1.0
"""Peak tokens/s are rates over at least this many seconds of consecutive scrapes."""
NOW_COLUMNS = 3
"""``now`` looks this many columns back for a value (a scrape in which no request
finished has no P95; three without one and the figure is not current any more)."""
LIFETIME_LATENCIES = ("ttft", "tpot", "itl", "e2e", "queue")
"""Histograms pooled since attach."""


@dataclass
class Trend:
    """One figure over the timeline, a value per column (None: nothing to say there)."""

    key: str
    label: str
    kind: str
    """``gauge``, ``rate`` or ``p95`` (see the module docstring)."""
    values: list[float | None]
    bounded: list[bool]
    """Per column: the percentile was lowered to the mean's bound (an upper limit)."""

    @property
    def present(self) -> list[float]:
        """The values that exist."""
        return [v for v in self.values if v is not None]

    @property
    def lo(self) -> float | None:
        """Smallest value drawn."""
        p = self.present
        return min(p) if p else None

    @property
    def hi(self) -> float | None:
        """Largest value drawn."""
        p = self.present
        return max(p) if p else None

    @property
    def now(self) -> float | None:
        """The newest value among the last ``NOW_COLUMNS`` columns (None when they have none:
        an idle server has no current TTFT)."""
        return next((v for v in reversed(self.values[-NOW_COLUMNS:]) if v is not None), None)

    @property
    def now_bounded(self) -> bool:
        """Whether ``now`` is an upper limit (lowered to the mean's bound)."""
        recent = zip(reversed(self.values[-NOW_COLUMNS:]), reversed(self.bounded[-NOW_COLUMNS:]), strict=True)
        return next((b for v, b in recent if v is not None), False)


@dataclass
class ServerTrends:
    """Every trend line of a target over the timeline."""

    seconds: float
    """The timeline asked for."""
    per_column: int
    """Consecutive scrapes per column."""
    samples: int
    """Scrapes inside the timeline."""
    span_s: float
    """Summed scrape intervals the columns hold (less than ``seconds`` just after attach)."""
    lines: dict[str, Trend] = field(default_factory=dict)


ColumnCache = dict[tuple[int, int, int], tuple[tuple[float | None, bool], ...]]
"""Column values already computed, by (first and last scrape's time, scrapes): each
``TREND_FIGURES`` figure's (value, bounded) in that order."""


def server_trends(
    samples: Sequence[MetricsSample], seconds: float, columns: int, cache: ColumnCache | None = None
) -> ServerTrends | None:
    """Trend lines over the last ``seconds`` of data time in at most ``columns`` columns
    (see the module docstring); None without samples.

    ``cache`` (kept by the caller between calls) holds the values of columns computed
    before: a column's value depends only on its scrapes, and from one call to the next
    all but the newest column hold the same ones (a render tick then computes one column,
    not the whole line: three histogram P95s).  It is left holding this call's columns
    only."""
    if not samples or columns < 1 or seconds <= 0:
        return None
    win = recent_scrapes(samples, seconds)
    per = max(1, math.ceil(len(win) / columns))
    # whole columns counted from the newest scrape: the oldest column may hold fewer
    cut = len(win) % per
    bins = ([win[:cut]] if cut else []) + [win[i : i + per] for i in range(cut, len(win), per)]
    span = sum(m.interval_s for m in win)
    tr = ServerTrends(seconds=seconds, per_column=per, samples=len(win), span_s=span)
    used: ColumnCache = {}
    cols = []
    for b in bins:
        ck = (b[0].ts_ns, b[-1].ts_ns, len(b))
        got = cache.get(ck) if cache is not None else None
        if got is None:
            got = tuple(_column_value(key, b) for key, _, _ in TREND_FIGURES)
        used[ck] = got
        cols.append(got)
    for i, (key, label, kind) in enumerate(TREND_FIGURES):
        tr.lines[key] = Trend(key, label, kind, [c[i][0] for c in cols], [c[i][1] for c in cols])
    if cache is not None:
        cache.clear()
        cache.update(used)
    return tr


def _column_value(key: str, col: list[MetricsSample]) -> tuple[float | None, bool]:
    if not col:
        return None, False
    if key in ("running", "waiting", "kv"):
        attr = "kv_usage" if key == "kv" else key
        vals = [getattr(m, attr) for m in col if getattr(m, attr) is not None]
        if not vals:
            return None, False
        return (max(vals) * (100.0 if key == "kv" else 1.0)), False
    if key in ("prompt_tps", "gen_tps"):
        span = sum(m.interval_s for m in col)
        attr = "prompt_tokens" if key == "prompt_tps" else "generation_tokens"
        return (sum(getattr(m, attr) for m in col) / span if span > 0 else None), False
    name = _HIST[key]
    pooled = pool(m.hist[name] for m in col if name in m.hist)
    if pooled is None or pooled.count <= 0:
        return None, False
    est = estimates(pooled, (95,), scale=1e3)
    return est.values["p95"], bool(est.bounded)


@dataclass
class Peak:
    """The highest value seen since attach and when (data time, ns)."""

    value: float | None = None
    at_ns: int = 0

    def offer(self, v: float | None, at_ns: int) -> None:
        """Keep ``v`` if it is the highest so far."""
        if v is not None and (self.value is None or v > self.value):
            self.value = v
            self.at_ns = at_ns


@dataclass
class ServerLifetime:
    """Counters, pooled latencies and peaks since attach (``add`` each scrape in order)."""

    first_ns: int | None = None
    """Data time of the first scrape after attach."""
    last_ns: int = 0
    samples: int = 0
    span_s: float = 0.0
    """Summed scrape intervals: the time the counters below cover."""
    generation_tokens: float = 0.0
    prompt_tokens: float = 0.0
    finished: dict[str, float] = field(default_factory=dict)
    preemptions: float = 0.0
    steps: float = 0.0
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    peak_running: Peak = field(default_factory=Peak)
    peak_waiting: Peak = field(default_factory=Peak)
    peak_kv: Peak = field(default_factory=Peak)
    """KV usage 0..1."""
    peak_gen_tps: Peak = field(default_factory=Peak)
    peak_prompt_tps: Peak = field(default_factory=Peak)
    pooled: dict[str, Pooled] = field(default_factory=dict)
    """Latency histograms pooled since attach (a change of bucket bounds starts over)."""
    _acc: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    """Gains (generation, prompt) and seconds of the open peak span."""

    def add(self, m: MetricsSample) -> None:
        """Count one scrape."""
        if self.first_ns is None:
            self.first_ns = m.ts_ns - int(m.interval_s * 1e9)
        self.last_ns = max(self.last_ns, m.ts_ns)
        self.samples += 1
        self.span_s += m.interval_s
        self.generation_tokens += m.generation_tokens
        self.prompt_tokens += m.prompt_tokens
        for k, v in m.requests_finished.items():
            self.finished[k] = self.finished.get(k, 0.0) + v
        self.preemptions += m.preemptions
        self.steps += m.steps
        self.prefix_queries += m.prefix_queries
        self.prefix_hits += m.prefix_hits
        self.peak_running.offer(m.running, m.ts_ns)
        self.peak_waiting.offer(m.waiting, m.ts_ns)
        self.peak_kv.offer(m.kv_usage, m.ts_ns)
        acc = self._acc
        acc[0] += m.generation_tokens
        acc[1] += m.prompt_tokens
        acc[2] += m.interval_s
        if acc[2] >= PEAK_SPAN_S:
            self.peak_gen_tps.offer(acc[0] / acc[2], m.ts_ns)
            self.peak_prompt_tps.offer(acc[1] / acc[2], m.ts_ns)
            self._acc = [0.0, 0.0, 0.0]
        for name in LIFETIME_LATENCIES:
            d = m.hist.get(name)
            if d is not None:
                self._pool(name, d)

    def _pool(self, name: str, d: HistogramDelta) -> None:
        cur = self.pooled.get(name)
        if cur is None or cur.bounds != d.bounds:
            self.pooled[name] = pool([d]) or Pooled(list(d.bounds), list(d.counts), d.count, d.sum)
            return
        cur.counts = [a + b for a, b in zip(cur.counts, d.counts, strict=True)]
        cur.count += d.count
        cur.sum += d.sum

    @property
    def requests(self) -> float:
        """Requests finished since attach, every reason."""
        return sum(self.finished.values())

    @property
    def elapsed_s(self) -> float:
        """Data time from the first scrape's interval start to the newest scrape."""
        return (self.last_ns - self.first_ns) / 1e9 if self.first_ns is not None else 0.0

    def latency_ms(self, name: str, q: float = 95) -> tuple[float | None, bool]:
        """The ``q`` percentile since attach (ms) and whether it is an upper limit."""
        p = self.pooled.get(name)
        if p is None or p.count <= 0:
            return None, False
        est = estimates(p, (q,), scale=1e3)
        return est.values[f"p{q:g}"], bool(est.bounded)

    def mean_ms(self, name: str) -> float | None:
        """Exact mean since attach (ms), from the histograms' sums."""
        p = self.pooled.get(name)
        m = p.mean if p is not None else None
        return m * 1e3 if m is not None else None
