"""Percentiles from Prometheus histograms: pooling interval deltas and bucket interpolation.

A Prometheus histogram only keeps cumulative counts at fixed bucket bounds, so a
percentile taken from it is an *estimate*: the rank is located in its bucket and the
value interpolated linearly between the bucket's bounds (the ``histogram_quantile``
rule; the first bucket starts at 0).  A rank that falls in the ``+Inf`` bucket cannot be
interpolated: the estimate is then the largest finite bound and ``capped`` says so.

Pure Python, no numpy, no prometheus_client: the monitor's aggregator uses it too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from engine_adapters.definitions.records import HistogramDelta

PERCENTILE_METHOD = "histogram estimate (linear interpolation inside Prometheus buckets)"
"""Label for every percentile computed here; the screen shows it beside the figures."""


@dataclass
class Pooled:
    """Observations of one histogram pooled over a window."""

    bounds: list[float]
    counts: list[float]
    count: float
    sum: float

    @property
    def mean(self) -> float | None:
        """Mean of the observations (exact: from the histogram's sum), None when empty."""
        return self.sum / self.count if self.count > 0 else None


def pool(deltas: Iterable[HistogramDelta]) -> Pooled | None:
    """Sum interval deltas with identical bounds (a bounds change starts a new pool).

    Each bucket's counts are added in the order given (``sum`` of the bucket's column:
    the same float additions as adding the deltas one by one, a C loop per bucket rather
    than a Python one per bucket and delta)."""
    group: list[HistogramDelta] = []
    for d in deltas:
        if group and group[0].bounds != d.bounds:
            group = []
        group.append(d)
    if not group:
        return None
    first = group[0]
    if len(group) == 1:
        return Pooled(list(first.bounds), list(first.counts), first.count, first.sum)
    return Pooled(
        list(first.bounds),
        list(map(sum, zip(*(d.counts for d in group), strict=True))),
        sum(d.count for d in group),
        sum(d.sum for d in group),
    )


def quantile(
    bounds: list[float], cumulative: list[float], total: float, q: float
) -> tuple[float | None, bool]:
    """Estimate the ``q`` quantile (0..1) from cumulative bucket counts.

    Returns ``(value, capped)``; value is None without observations; ``capped`` is True
    when the rank lies beyond the largest finite bound (value = that bound, a lower limit).
    """
    if total <= 0 or not bounds:
        return None, False
    rank = q * total
    prev_bound = 0.0
    prev_count = 0.0
    for bound, cum in zip(bounds, cumulative, strict=True):
        if cum >= rank and cum > prev_count:
            frac = (rank - prev_count) / (cum - prev_count)
            return prev_bound + (bound - prev_bound) * max(0.0, min(1.0, frac)), False
        prev_bound = bound
        prev_count = cum
    return bounds[-1], True


@dataclass(frozen=True)
class Estimates:
    """Percentile estimates of one pooled histogram, from one interpolation per percentile."""

    values: dict[str, float | None]
    """``{"p50": v, ...}`` (times the scale asked for); None when empty.  A value beyond
    the mean's bound is lowered to it (``markov_bound``); one capped at the largest finite
    bound is still given (a lower limit)."""
    capped: list[str]
    """Names of the percentiles whose rank lies in the ``+Inf`` bucket (lower limits)."""
    bounded: list[str]
    """Names of the percentiles lowered to the mean's bound (upper limits)."""


def estimates(pooled: Pooled | None, qs: Iterable[float] = (50, 95, 99), scale: float = 1.0) -> Estimates:
    """The ``qs`` percentiles of ``pooled`` and which of them are capped or bounded (every
    figure below is this one's: a render tick asks for all three)."""
    values: dict[str, float | None] = {}
    capped: list[str] = []
    bounded: list[str] = []
    for q in qs:
        name = f"p{q:g}"
        if pooled is None:
            values[name] = None
            continue
        v, cap = quantile(pooled.bounds, pooled.counts, pooled.count, q / 100.0)
        if cap:
            capped.append(name)
        bound = markov_bound(pooled, q)
        if v is not None and bound is not None and v > bound:
            v = bound
            bounded.append(name)
        values[name] = None if v is None else v * scale
    return Estimates(values, capped, bounded)


def percentiles(
    pooled: Pooled | None, qs: Iterable[float] = (50, 95, 99), scale: float = 1.0
) -> dict[str, float | None]:
    """``{"p50": v, ...}`` estimates (times ``scale``, e.g. 1000 for ms); None when empty
    (``estimates``).  A value capped at the largest finite bound is still given (a lower
    limit); use ``capped_percentiles`` to know which."""
    return estimates(pooled, qs, scale).values


def markov_bound(pooled: Pooled | None, q: float) -> float | None:
    """Upper bound of the ``q``-th percentile from the exact mean (non-negative values):
    P(X >= mean / (1 - q)) <= 1 - q.  Interpolation inside a wide first bucket can put
    an estimate above it (seen: vLLM queue times of ~0.02 ms, P50 "150 ms" from a
    0-300 ms bucket); such estimates are lowered to the bound (see ``bounded_percentiles``)."""
    if pooled is None or pooled.mean is None or q >= 100:
        return None
    return pooled.mean / (1.0 - q / 100.0)


def bounded_percentiles(pooled: Pooled | None, qs: Iterable[float] = (50, 95, 99)) -> list[str]:
    """Names of the percentiles lowered to the mean's bound (upper limits only)."""
    return estimates(pooled, qs).bounded


def capped_percentiles(pooled: Pooled | None, qs: Iterable[float] = (50, 95, 99)) -> list[str]:
    """Names of the percentiles whose rank lies in the ``+Inf`` bucket (lower limits only)."""
    return estimates(pooled, qs).capped
