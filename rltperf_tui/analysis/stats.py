"""Statistics for A/B evidence: bootstrap confidence intervals, multiple testing, drift.

Step series are autocorrelated (a slow step is often followed by another: batch
composition, cache state, a noisy neighbour taking the CPU for a second), so resampling
single steps would make intervals far too narrow.  Step series use the *moving-block
bootstrap* (Künsch 1989): resample contiguous blocks of ``L`` steps so the dependence
survives inside each block.  ``L`` is the longer of (a) the lag where the
autocorrelation dies out (Politis & White's rule, at least n^(1/3)) and (b) the steps
in ``block_s`` seconds of the recording (default 0.5 s): on a shared machine the step
time wanders on a scale of seconds, and that wander is exactly what a repeated run
would see, so it belongs in the interval.  Requests are resampled the same way in
finish order.  Ratio metrics (tokens/s, idle fraction, MBU) resample the same time
blocks of steps and take the ratio of the sums, as their definitions do.

A difference is *significant* only when (1) its bootstrap two-sided p-value survives the
Holm correction over every metric compared in the same run (so comparing a dozen
metrics does not manufacture a finding), and (2) its size reaches the smallest effect of
interest (default 5 % of A, and for times at least 1 % of A's median step time):
a real but negligible difference is reported as below the smallest effect of interest.
Every verdict carries its reason, naming the condition that failed and its numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from engine_adapters.definitions import figures as F
from rltperf_tui.analysis.verdicts import (
    DEFAULT_ALPHA,
    DEFAULT_MIN_EFFECT,
    FAIL_DRIFT,
    FAIL_HOLM,
    FAIL_MIN_EFFECT,
    FAIL_ROUNDS,
    NA,
    Diff,
    decide,
    explain,
    fmt,
    fmt_ci,
    fmt_p,
    fmt_rel,
    holm,
    round_sig,
    verdict_of,
)

__all__ = [  # the verdict names are re-exported: callers know this module as ``S``
    "DEFAULT_ALPHA",
    "DEFAULT_BLOCK_S",
    "DEFAULT_MIN_EFFECT",
    "DEFAULT_RESAMPLES",
    "FAIL_DRIFT",
    "FAIL_HOLM",
    "FAIL_MIN_EFFECT",
    "FAIL_ROUNDS",
    "NA",
    "PCTS",
    "BlockSums",
    "Diff",
    "acf",
    "auto_block_length",
    "block_indices",
    "block_length",
    "block_sums",
    "compare_ratio",
    "compare_stat",
    "decide",
    "explain",
    "fmt",
    "fmt_ci",
    "fmt_p",
    "fmt_rel",
    "holm",
    "min_samples",
    "percentile_stat",
    "ratio_metric",
    "round_sig",
    "segment_values",
    "spread",
    "verdict_of",
]

DEFAULT_RESAMPLES = 1000
DEFAULT_BLOCK_S = 0.5
PCTS = (50, 95, 99)


def block_length(n: int) -> int:
    """Smallest block length for a series of ``n`` samples: ⌈n^(1/3)⌉, at most n/4."""
    if n <= 4:
        return 1
    return max(1, min(math.ceil(n ** (1 / 3)), n // 4))


def acf(x: np.ndarray, max_lag: int) -> np.ndarray:
    """Sample autocorrelation at lags 0..max_lag (FFT)."""
    x = np.asarray(x, dtype=np.float64)
    x = x - x.mean()
    n = x.size
    f = np.fft.rfft(x, 2 * n)
    r = np.fft.irfft(f * np.conj(f))[: max_lag + 1]
    return r / r[0] if r[0] > 0 else np.zeros(max_lag + 1)


def auto_block_length(x: np.ndarray) -> int:
    """Block length covering the series' dependence.

    The lag ``m`` after which the autocorrelation stays insignificant for ``K``
    consecutive lags (|rho| < 2·sqrt(log10(n)/n), K = max(5, sqrt(log10 n)): the rule of
    Politis & White 2004); the block is ``2m``, at least ⌈n^(1/3)⌉ and at most n/3.
    Slow drifts (a noisy neighbour for seconds) give long blocks and so honestly wide
    intervals.
    """
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    n = x.size
    lo = block_length(n)
    if n < 16 or float(np.std(x)) == 0.0:
        return lo
    hi = max(lo, n // 3)
    r = acf(x, hi)
    thr = 2.0 * math.sqrt(math.log10(n) / n)
    k = max(5, int(math.sqrt(math.log10(n))))
    small = np.abs(r) < thr
    m = hi
    run = 0
    for lag in range(1, hi + 1):
        run = run + 1 if small[lag] else 0
        if run >= k:
            m = lag - k
            break
    return int(min(hi, max(lo, 2 * m)))


def block_indices(n: int, block: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Moving-block bootstrap indices, shape (resamples, n)."""
    block = max(1, min(block, n))
    k = math.ceil(n / block)
    starts = rng.integers(0, n - block + 1, size=(resamples, k))
    idx = (starts[:, :, None] + np.arange(block)[None, None, :]).reshape(resamples, k * block)
    return idx[:, :n]


def _boot_stat(
    x: np.ndarray,
    stat: Callable[[np.ndarray], np.ndarray],
    block: int,
    resamples: int,
    rng: np.random.Generator,
    chunk_elems: int = 4_000_000,
) -> np.ndarray:
    """``stat`` (applied along axis 1) of ``resamples`` block-bootstrap resamples of ``x``."""
    n = x.size
    out = np.empty(resamples)
    per = max(1, chunk_elems // max(n, 1))
    done = 0
    while done < resamples:
        m = min(per, resamples - done)
        idx = block_indices(n, block, m, rng)
        out[done : done + m] = stat(x[idx])
        done += m
    return out


def min_samples(q: float | None) -> int:
    """Samples needed before a percentile is compared: 5 expected beyond it (P99: 500)."""
    if q is None or q <= 50:
        return 10
    return math.ceil(5 / (1 - q / 100) - 1e-9)


def percentile_stat(q: float) -> Callable[[np.ndarray], np.ndarray]:
    """A vectorised ``q``-th percentile along axis 1: ``figures.percentile`` of each
    resample (row) at once, for the bootstrap."""

    def f(m: np.ndarray) -> np.ndarray:
        return np.percentile(m, q, axis=1)

    f.__name__ = f"p{q:g}"
    return f


def _p_two_sided(boot_diffs: np.ndarray, observed: float) -> float:
    """Bootstrap p-value of "no difference": twice the share of resampled differences on
    the far side of zero from the observed one (+1 smoothing), at most 1."""
    n = boot_diffs.size
    if observed >= 0:
        k = int(np.count_nonzero(boot_diffs <= 0))
    else:
        k = int(np.count_nonzero(boot_diffs >= 0))
    return min(1.0, 2 * (k + 1) / (n + 1))


def compare_stat(
    metric: str,
    unit: str,
    a: np.ndarray,
    b: np.ndarray,
    q: float | None,
    rng: np.random.Generator,
    resamples: int = DEFAULT_RESAMPLES,
    block: bool = True,
    min_block_a: int = 1,
    min_block_b: int = 1,
) -> Diff:
    """Percentile ``q`` (or the mean when None) of ``a`` vs ``b`` with a bootstrap CI.

    Block lengths come from ``auto_block_length`` but are at least ``min_block_a/b``
    (the caller's time-based floor) and at most a third of the series.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    a = a[np.isfinite(a)]
    b = b[np.isfinite(b)]
    need = min_samples(q)
    if a.size < need or b.size < need:
        d = Diff(
            metric,
            unit,
            (F.percentile(a, q) if q is not None else float(a.mean())) if a.size else None,
            (F.percentile(b, q) if q is not None else float(b.mean())) if b.size else None,
            n_a=int(a.size),
            n_b=int(b.size),
        )
        d.verdict = "no data" if not (a.size and b.size) else "too few samples"
        d.reason = (
            f"{a.size} samples in A, {b.size} in B; "
            f"{'P' + format(q, 'g') if q is not None else 'the mean'} needs at least {need}"
        )
        if d.a is not None and d.b is not None:
            d.diff = d.b - d.a
            d.rel = d.diff / abs(d.a) if d.a else None
        return d
    stat = percentile_stat(q) if q is not None else (lambda m: m.mean(axis=1))
    va = F.percentile(a, q) if q is not None else float(a.mean())
    vb = F.percentile(b, q) if q is not None else float(b.mean())
    la = min(max(auto_block_length(a), min_block_a), max(1, a.size // 3)) if block else 1
    lb = min(max(auto_block_length(b), min_block_b), max(1, b.size // 3)) if block else 1
    ba = _boot_stat(a, stat, la, resamples, rng)
    bb = _boot_stat(b, stat, lb, resamples, rng)
    bd = bb - ba
    obs = vb - va
    lo, hi = (float(v) for v in np.percentile(bd, [2.5, 97.5]))
    return Diff(
        metric,
        unit,
        va,
        vb,
        n_a=int(a.size),
        n_b=int(b.size),
        diff=obs,
        rel=(obs / abs(va)) if va else None,
        ci_low=lo,
        ci_high=hi,
        p=_p_two_sided(bd, obs),
        block=max(la, lb),
    )


@dataclass
class BlockSums:
    """Per-block sums of a step series, for ratio metrics (see module docstring)."""

    span_s: np.ndarray
    tokens: np.ndarray
    busy_s: np.ndarray
    busy_known: np.ndarray
    nbytes: np.ndarray
    bytes_known: np.ndarray
    joules: np.ndarray | None = None
    """Joules the device's energy counter gained in each block (None: no counter)."""
    energy_s: np.ndarray | None = None
    """Seconds of each block the counter's readings cover."""


def block_sums(
    start_ns: np.ndarray,
    end_ns: np.ndarray,
    tokens: np.ndarray,
    busy_ns: np.ndarray,
    nbytes: np.ndarray,
    block: int,
) -> BlockSums:
    """Cut a step series into contiguous blocks of ``block`` steps; each block's span runs
    from its first step's start to the next block's first start (the last: to its end),
    so the spans add up to the whole series' wall time."""
    n = start_ns.size
    cuts = list(range(0, n, block))
    spans, tok, busy, bk, byt, byk = [], [], [], [], [], []
    for i, c in enumerate(cuts):
        e = cuts[i + 1] if i + 1 < len(cuts) else n
        t1 = start_ns[e] if e < n else end_ns[n - 1]
        spans.append((t1 - start_ns[c]) / 1e9)
        tok.append(tokens[c:e].sum())
        bsl = busy_ns[c:e]
        kn = ~np.isnan(bsl)
        busy.append(bsl[kn].sum() / 1e9)
        bk.append(kn.any())
        ysl = nbytes[c:e]
        yk = ~np.isnan(ysl)
        byt.append(ysl[yk].sum())
        byk.append(yk.any())
    return BlockSums(
        np.array(spans),
        np.array(tok, dtype=np.float64),
        np.array(busy),
        np.array(bk),
        np.array(byt, dtype=np.float64),
        np.array(byk),
    )


def ratio_metric(
    bs: BlockSums, which: str, peak_bw_gbps: float | None = None
) -> Callable[[np.ndarray], np.ndarray]:
    """A function of block indices (resamples x blocks) → the ratio metric ``which`` (a
    key of ``figures.RATIO_FIGURES``) per resample."""

    if which not in F.RATIO_FIGURES:
        raise ValueError(which)
    if which == "mbu":
        assert peak_bw_gbps

    def f(idx: np.ndarray) -> np.ndarray:
        # each resample (row) is a window of its own: the sums of its blocks, then the
        # window's own formula on all rows at once
        sums = F.RatioSums(
            seconds=bs.span_s[idx].sum(axis=1),
            tokens=bs.tokens[idx].sum(axis=1),
            busy_s=bs.busy_s[idx].sum(axis=1),
            nbytes=bs.nbytes[idx].sum(axis=1),
            joules=bs.joules[idx].sum(axis=1) if bs.joules is not None else None,
            energy_s=bs.energy_s[idx].sum(axis=1) if bs.energy_s is not None else None,
        )
        return np.asarray(F.ratio_figure(which, sums, peak_bw_gbps))

    return f


def compare_ratio(
    metric: str,
    unit: str,
    a: BlockSums,
    b: BlockSums,
    which: str,
    rng: np.random.Generator,
    resamples: int = DEFAULT_RESAMPLES,
    peak_bw_gbps: float | None = None,
) -> Diff:
    """A ratio metric of A vs B, bootstrapping the (time-sized) blocks of steps."""
    fa = ratio_metric(a, which, peak_bw_gbps)
    fb = ratio_metric(b, which, peak_bw_gbps)
    na, nb = a.span_s.size, b.span_s.size
    if na < 2 or nb < 2:
        return Diff(
            metric,
            unit,
            None,
            None,
            n_a=na,
            n_b=nb,
            verdict="too few samples",
            reason=f"{na} blocks in A, {nb} in B",
        )
    va = float(fa(np.arange(na)[None, :])[0])
    vb = float(fb(np.arange(nb)[None, :])[0])
    ia = rng.integers(0, na, size=(resamples, na))
    ib = rng.integers(0, nb, size=(resamples, nb))
    bd = fb(ib) - fa(ia)
    bd = bd[np.isfinite(bd)]
    obs = vb - va
    lo, hi = (float(v) for v in np.percentile(bd, [2.5, 97.5]))
    return Diff(
        metric,
        unit,
        va,
        vb,
        n_a=na,
        n_b=nb,
        diff=obs,
        rel=(obs / abs(va)) if va else None,
        ci_low=lo,
        ci_high=hi,
        p=_p_two_sided(bd, obs),
    )


def segment_values(x: np.ndarray, q: float | None, k: int = 4) -> list[float] | None:
    """The statistic over ``k`` consecutive segments of a series (fewer when a segment
    would not hold one expected sample beyond the percentile); None when not even 2 fit.
    Small segments make noisy segment values and so a wider spread: the check errs on
    the side of "not established"."""
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    per = 10 if q is None or q <= 50 else math.ceil(1 / (1 - q / 100) - 1e-9)
    k = min(k, x.size // per)
    if k < 2:
        return None
    f = (lambda v: F.percentile(v, q)) if q is not None else (lambda v: float(v.mean()))
    return [f(c) for c in np.array_split(x, k)]


def spread(values: list[float] | None) -> float | None:
    """max - min of segment values (None passes through)."""
    return None if not values else max(values) - min(values)
