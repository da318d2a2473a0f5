"""Exact order statistics by numpy's own definitions, without numpy's per-call cost.

``np.percentile`` and ``np.median`` spend ~80 us a call in Python before they sort
anything: most of a 1 000-sample call, and the live screen makes several at every
render tick (the latency percentiles, the idle-gap threshold, each stage's median).
These give the same values to the last bit (the sign of a zero and a NaN's payload
included): the same partition, then numpy's arithmetic step by step.  Anything they
do not cover (other dtypes, NaN where a shortcut would not see it) goes to numpy
itself.  ``engine_adapters.definitions.figures.pct`` is the figure; this is how it
is computed.
"""

from __future__ import annotations

import functools

import numpy as np


@functools.lru_cache(maxsize=256)
def _plan(n: int, qs: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Which sorted positions ``qs`` (0-100) of ``n`` samples interpolate between, with
    what weight, and the positions numpy partitions at: its default ("linear") method."""
    vi = (n - 1) * np.true_divide(qs, 100.0)
    lo = np.floor(vi)
    hi = lo + 1
    top = vi >= n - 1
    lo[top] = -1
    hi[top] = -1
    lo_i, hi_i = lo.astype(np.intp), hi.astype(np.intp)
    gamma = vi - lo_i
    kth = np.unique(np.concatenate(([0, n - 1], lo_i % n, hi_i % n)))
    return lo_i, hi_i, gamma, gamma >= 0.5, kth


def quantiles(values: np.ndarray, qs: tuple[float, ...]) -> np.ndarray:
    """``np.percentile(values, qs)`` (``qs`` in 0-100), as a float64 array."""
    v = np.asarray(values)
    if v.dtype != np.float64 or v.ndim != 1 or v.size == 0:
        return np.asarray(np.percentile(v, qs), dtype=np.float64).reshape(len(qs))
    lo, hi, gamma, upper, kth = _plan(v.size, tuple(qs))
    found = _staged(v, lo, hi) if v.size >= STAGED_MIN else None
    if found is None:
        part = np.partition(v, kth)
        if np.isnan(part[-1]):  # numpy: any NaN makes every percentile that NaN
            return np.full(len(qs), part[-1])
        found = part[lo], part[hi]
    return _lerp(*found, gamma, upper)


def sorted_quantiles(s: np.ndarray, qs: tuple[float, ...]) -> np.ndarray:
    """``quantiles`` of values already sorted ascending (``s``, 1-D, at least one value):
    the same positions and arithmetic, without a partition (the live window keeps its
    samples sorted as it slides: ``rltperf_tui.live.sorted_window``).  The same bits as
    ``np.percentile`` of the unsorted values, as long as no value is NaN and zeros are
    of one sign (which of ``-0.0`` and ``0.0`` sorts first is the partition's choice)."""
    if np.isnan(s[-1]):  # NaN sorts last; numpy makes every percentile that NaN
        return np.full(len(qs), s[-1], dtype=np.float64)
    lo, hi, gamma, upper, _ = _plan(s.size, tuple(qs))
    return _lerp(s[lo].astype(np.float64), s[hi].astype(np.float64), gamma, upper)


def _lerp(a: np.ndarray, b: np.ndarray, gamma: np.ndarray, upper: np.ndarray) -> np.ndarray:
    diff = b - a  # numpy's _lerp, step by step
    out = a + diff * gamma
    np.subtract(b, diff * (1 - gamma), out=out, where=upper)
    return out


STAGED_MIN = 4096
"""From this many samples on, ``quantiles`` finds its order statistics one position at a
time (``_staged``): numpy's partition at several positions at once grows faster than the
sample (10 000 samples, the percentiles' eight positions: 206 us; one at a time: 61 us;
30 000: 664 against 143 us).  Below it the one partition is cheaper."""


def _staged(v: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The values at sorted positions ``lo`` and ``hi`` (-1: the last) of ``v``, each
    found by partitioning only what lies above the one before; None when a
    NaN or a zero could make them differ from numpy's partition in their bits (which of
    two equal zeros, which NaN's payload), left to that."""
    n = v.size
    pos = np.unique(np.concatenate((lo % n, hi % n, [n - 1])))  # the last: NaNs sort there
    work = np.partition(v, int(pos[0]))
    base = int(pos[0]) + 1
    for k in pos[1:].tolist():
        work[base:].partition(k - base)  # a view: in place, in ``work``
        base = k + 1
    got = work[pos]
    if np.isnan(got[-1]) or not got.all():
        return None
    return work[lo], work[hi]


def median(values: np.ndarray) -> float:
    """``float(np.median(values))`` of a 1-D array (at least one value).  The fast path
    takes integers (nanosecond times), and floats with no zero and no NaN (times,
    sizes): among floats, which of two equal middles a partition leaves where decides
    the sign of a zero median."""
    v = np.asarray(values)
    if v.ndim != 1 or v.size == 0:
        return float(np.median(v))
    if v.dtype == np.int64:
        return float(column_medians(v[None, :])[0])
    if v.dtype != np.float64 or not (v != 0).all() or np.isnan(v).any():
        return float(np.median(v))
    k = v.size // 2
    part = np.partition(v, k)
    if v.size % 2:
        return float(part[k])
    return float((part[:k].max() + part[k]) / 2)


def sorted_median(s: np.ndarray) -> float:
    """``median`` of int64 values already sorted ascending (at least one): the upper
    middle, or the mean of both middles as float64, as ``column_medians`` computes it."""
    k = s.size // 2
    upper = float(s[k])
    if s.size % 2:
        return upper
    return (float(s[k - 1]) + upper) / 2


def column_medians(m: np.ndarray, overwrite_input: bool = False) -> np.ndarray:
    """``np.median(m, axis=1)`` of a 2-D array as float64 (the fast path: int64);
    ``overwrite_input``: ``m`` may be reordered (no copy: a copy of a window's stage
    matrix, freshly allocated at every tick, tripled the cost).

    One partition per row at the upper middle (a partition at both middles costs three
    times as much); the lower middle of an even count is then the largest value below
    it.  The mean of the two is numpy's: both as float64, added, halved."""
    rows, n = m.shape
    if m.dtype != np.int64 or n == 0 or rows == 0:
        return np.asarray(np.median(m, axis=1), dtype=np.float64)
    k = n // 2
    part = m if overwrite_input else m.copy()
    part.partition(k, axis=1)
    upper = part[:, k].astype(np.float64)
    if n % 2:
        return upper
    lower = part[:, :k].max(axis=1).astype(np.float64)
    return (lower + upper) / 2
