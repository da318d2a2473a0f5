"""One histogram family of a ``/metrics`` page, summed over its series (``metrics.parse_scrape``).

A family filled from a page template (``exposition``: ``Family.shape``) is summed by a
plan worked out once per shape (which samples are which series' buckets, in bound order,
and which are counts and sums); others are worked out sample by sample.  Both give the
same figures (``tests/engine_adapters/vllm/test_exposition.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine_adapters.monitor.vllm.exposition import Family, ScrapeError


@dataclass
class Histogram:
    """A cumulative histogram summed over label sets (finite bounds only)."""

    bounds: list[float]
    counts: list[float]
    count: float = 0.0
    sum: float = 0.0


_BucketKey = tuple[tuple[str, str], ...]
_BUCKETS_SEEN: dict[int, tuple[dict[str, str], _BucketKey, float]] = {}
"""A bucket's labels (by identity) -> (those labels, its series' key, its bound).  The reader
hands out one labels object per label text (``exposition._LABELS_SEEN``), so a server's
buckets come back as the same objects scrape after scrape; the entry holds its labels, so
an id is never reused while its entry stands.  Working the key and bound out again for
each of a vLLM page's ~280 buckets was a third of ``parse_scrape`` (``rltperf bench
ingest``'s stored page: 0.79 of 2.4 ms)."""


def _bucket_seen(labels: dict[str, str], le: str, family: str) -> tuple[dict[str, str], _BucketKey, float]:
    """A bucket's ``_BUCKETS_SEEN`` entry: its series (its labels but ``le``, sorted) and bound."""
    items = sorted(labels.items())
    items.remove(("le", le))
    try:
        bound = float(le)
    except ValueError:
        raise ScrapeError(f"{family}: invalid bucket bound le={le!r}") from None
    if len(_BUCKETS_SEEN) > 20_000:  # a server whose labels keep changing: start afresh
        _BUCKETS_SEEN.clear()
    seen = _BUCKETS_SEEN[id(labels)] = (labels, tuple(items), bound)
    return seen


@dataclass(frozen=True)
class _HistogramPlan:
    """Where a histogram family's figures sit among its samples, for every page of one
    shape (``Family.shape``): what ``read_histogram`` works out of names and labels."""

    bounds: list[float]
    """The merged histogram's finite bounds (its first series')."""
    series: list[list[int]]
    """Per series merged (same bounds as the first), its finite buckets' sample indices
    in bound order."""
    counts: list[tuple[int, str]]
    """``_count`` samples: index, and its ``engine`` label for ``iteration_tokens``."""
    sums: list[int]
    """``_sum`` samples' indices."""


_PLANS: dict[int, tuple[object, _HistogramPlan | None]] = {}
"""``Family.shape`` (by identity) -> (that shape, its plan; None when the bucket order
depends on the values: a bound given twice in a series).  The entry holds the shape, so
an id is never reused while its entry stands."""


def _plan(fam: Family) -> _HistogramPlan | None:
    series: dict[_BucketKey, list[tuple[float, int]]] = {}
    counts: list[tuple[int, str]] = []
    sums: list[int] = []
    for i, (sname, labels, _, _) in enumerate(fam.samples):
        if sname.endswith("_bucket"):
            le = labels.get("le")
            if le is None:
                continue
            _, key, bound = _bucket_seen(labels, le, fam.name)
            series.setdefault(key, []).append((bound, i))
        elif sname.endswith("_count"):
            counts.append((i, labels.get("engine", "")))
        elif sname.endswith("_sum"):
            sums.append(i)
    merged: list[list[int]] = []
    first: list[float] | None = None
    for buckets in series.values():
        buckets.sort()
        if len({b for b, _ in buckets}) != len(buckets):
            return None
        bounds = [b for b, _ in buckets if b != float("inf")]
        idx = [i for b, i in buckets if b != float("inf")]
        if first is None:
            first = bounds
        elif bounds != first:
            continue
        merged.append(idx)
    return _HistogramPlan(first or [], merged, counts, sums)


def _read_planned(fam: Family, plan: _HistogramPlan, per_engine: dict[str, float] | None) -> Histogram:
    s = fam.samples
    counts: list[float] = []
    for n, idx in enumerate(plan.series):
        if n == 0:
            counts = [s[i][2] for i in idx]
        else:
            counts = [a + s[i][2] for a, i in zip(counts, idx, strict=True)]
    count = 0.0
    for i, eng in plan.counts:
        value = s[i][2]
        count += value
        if per_engine is not None:
            per_engine[eng] = per_engine.get(eng, 0.0) + value
    total = 0.0
    for i in plan.sums:
        total += s[i][2]
    return Histogram(list(plan.bounds), counts, count, total)


def read_histogram(fam: Family, per_engine: dict[str, float] | None = None) -> Histogram:
    """The family summed over its series (buckets merged where the bounds are the first
    series'; ``_count`` and ``_sum`` summed); with ``per_engine``, each ``_count`` is also
    added there under its ``engine`` label (``""``: none)."""
    if fam.shape is not None:
        got = _PLANS.get(id(fam.shape))
        if got is None or got[0] is not fam.shape:
            if len(_PLANS) > 1000:  # shapes that keep changing: start afresh
                _PLANS.clear()
            got = _PLANS[id(fam.shape)] = (fam.shape, _plan(fam))
        if got[1] is not None:
            return _read_planned(fam, got[1], per_engine)
    buckets: dict[_BucketKey, list[tuple[float, float]]] = {}
    count = 0.0
    total = 0.0
    buckets_seen = _BUCKETS_SEEN
    for sname, labels, value, _ in fam.samples:
        if sname.endswith("_bucket"):
            seen = buckets_seen.get(id(labels))
            if seen is None or seen[0] is not labels:
                le = labels.get("le")
                if le is None:
                    continue
                seen = _bucket_seen(labels, le, fam.name)
            buckets.setdefault(seen[1], []).append((seen[2], value))
        elif sname.endswith("_count"):
            count += value
            if per_engine is not None:
                eng = labels.get("engine", "")
                per_engine[eng] = per_engine.get(eng, 0.0) + value
        elif sname.endswith("_sum"):
            total += value
    merged: Histogram | None = None
    for series in buckets.values():
        series.sort()
        bounds = [b for b, _ in series if b != float("inf")]
        counts = [c for b, c in series if b != float("inf")]
        if merged is None:
            merged = Histogram(bounds, counts)
        elif merged.bounds == bounds:
            merged.counts = [a + b for a, b in zip(merged.counts, counts, strict=True)]
        # series with other bounds (should not happen within one family) are left out
    if merged is None:
        merged = Histogram([], [])
    merged.count = count
    merged.sum = total
    return merged
