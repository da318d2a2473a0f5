"""A column's samples over a sliding window of ring rows, kept sorted as the window
slides: the live window's percentiles and medians without a partition at every tick.

At a render tick the 10 s window of a 1,000 steps/s stream has moved by ~500 of its
10,000 rows.  Partitioning the whole window again for its step and gap percentiles and
the idle-gap threshold was the largest numpy cost of the tick; here the rows that left
are taken out of the sorted samples and the rows that came are put in (each a sort of a
few hundred values and one pass over the window).  The order statistics read from the
sorted samples are the same values, to the bit, as numpy's partition of the window's
samples finds (``order_stats.sorted_quantiles``).  No Textual.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from engine_adapters.definitions.figures import EXCLUDED_FLAGS
from engine_adapters.definitions.order_stats import sorted_median, sorted_quantiles
from rltperf_tui.live.step_rings import Ring, WindowSums, slides_forward


class SortedWindow:
    """The samples ``values_of(a, b)`` gives for absolute ring rows ``a`` to ``b``, over
    the window of rows ``lo`` to ``hi``, sorted ascending.  ``values_of`` must give the
    same samples for the same rows (a function of the rows' columns); it may read
    ``reach`` rows before ``a`` (a gap's samples need the step before).  Each row gives
    zero or more samples; the window is the multiset of its rows' samples."""

    def __init__(self, values_of: Callable[[int, int], np.ndarray], reach: int = 0) -> None:
        self.values_of = values_of
        self.reach = reach
        self.lo = 0
        self.hi = 0
        self.vals: np.ndarray | None = None
        self.rebuilds = 0
        """How many times the window was sorted afresh (tests read it)."""

    def get(self, oldest: int, lo: int, hi: int) -> np.ndarray:
        """The sorted samples of rows ``lo`` to ``hi``; ``oldest``: the oldest row the
        ring still holds (rows that left the window must still be readable to be taken
        out; otherwise, or when the window jumped, it is sorted afresh).  The caller
        must not write to the array returned."""
        vals = self.vals
        if vals is None or not slides_forward(self.lo, self.hi, lo, hi, oldest + self.reach):
            vals = None
        else:
            if lo > self.lo:
                vals = remove_sorted(vals, self.values_of(self.lo, lo))
            if vals is not None and hi > self.hi:
                vals = insert_sorted(vals, self.values_of(self.hi, hi))
        if vals is None:
            self.rebuilds += 1
            vals = np.sort(self.values_of(lo, hi)) if hi > lo else np.zeros(0)
        self.vals, self.lo, self.hi = vals, lo, hi
        return vals


def insert_sorted(s: np.ndarray, new: np.ndarray) -> np.ndarray:
    """``s`` (sorted) with the values of ``new`` put in their places."""
    if new.size == 0:
        return s
    a = np.sort(new)
    return np.insert(s, np.searchsorted(s, a, side="left"), a)


def remove_sorted(s: np.ndarray, gone: np.ndarray) -> np.ndarray | None:
    """``s`` (sorted) less one occurrence of each value of ``gone`` (a multiset); None
    when ``s`` does not hold them all (or a NaN, which no search finds): the caller
    sorts afresh."""
    if gone.size == 0:
        return s
    d = np.sort(gone)
    pos = np.searchsorted(s, d, side="left")
    # the k-th of several equal values leaving takes the k-th equal place
    pos += np.arange(d.size) - np.searchsorted(d, d, side="left")
    if pos[-1] >= s.size or not np.array_equal(s[pos], d):
        return None
    return np.delete(s, pos)


class WindowSlide:
    """What a window of one length keeps from one tick to the next: its per-step matrix
    sums (``WindowSums``) and its sorted samples, each over the step ring ``steps``.

    - ``step_ms``: the step times (ms) of the steps the window keeps (not profiled,
      exporting or warm-up), for the step percentiles;
    - ``gap_ms``: the gaps (ms) between consecutive step ids both kept, for the gap
      percentiles (a row's gap is the one before it: the window's first row has none);
    - ``gap_ns``: the gaps (ns) between consecutive step ids, kept or not, for the
      idle-gap threshold;
    - ``stage_ns``: each stage column (ns) of every row, for the stage medians an idle
      gap's step is held against, and their P99s (``stage_median_p99``)."""

    def __init__(self, steps: Ring) -> None:
        self.steps = steps
        self.sums = WindowSums()
        self.step_ms = SortedWindow(self._step_ms)
        self.gap_ms = SortedWindow(self._gap_ms, reach=1)
        self.gap_ns = SortedWindow(self._gap_ns, reach=1)
        self.stage_ns: list[SortedWindow] = []

    def _rows(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        r = self.steps.rows
        return r("start", a, b), r("end", a, b), r("step_id", a, b), r("flags", a, b)

    def _step_ms(self, a: int, b: int) -> np.ndarray:
        start, end, _, flags = self._rows(a, b)
        keep = (flags & EXCLUDED_FLAGS) == 0
        return (end - start).astype(np.float64)[keep] / 1e6

    def _gap_ms(self, a: int, b: int) -> np.ndarray:
        start, end, ids, flags = self._rows(a - 1, b)
        keep = (flags & EXCLUDED_FLAGS) == 0
        consec = (np.diff(ids) == 1) & keep[1:] & keep[:-1]
        return (start[1:] - end[:-1]).astype(np.float64)[consec] / 1e6

    def _gap_ns(self, a: int, b: int) -> np.ndarray:
        start, end, ids, _ = self._rows(a - 1, b)
        return (start[1:] - end[:-1])[np.diff(ids) == 1]

    def _stage_ns(self, i: int, a: int, b: int) -> np.ndarray:
        return self.steps.rows("stages", a, b)[:, i]

    def oldest(self) -> int:
        """The oldest row the ring still holds."""
        return self.steps.n - len(self.steps)

    def sorted_step_ms(self, n: int) -> np.ndarray:
        """The kept step times of the newest ``n`` rows, sorted."""
        hi = self.steps.n
        return self.step_ms.get(self.oldest(), hi - n, hi)

    def sorted_gap_ms(self, n: int) -> np.ndarray:
        """The gaps between consecutive kept steps within the newest ``n`` rows, sorted."""
        hi = self.steps.n
        return self.gap_ms.get(self.oldest(), min(hi, hi - n + 1), hi)

    def sorted_gap_ns(self, n: int) -> np.ndarray:
        """The gaps between consecutive steps within the newest ``n`` rows, sorted."""
        hi = self.steps.n
        return self.gap_ns.get(self.oldest(), min(hi, hi - n + 1), hi)

    def stage_median_p99(self, n: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        """The median and the P99 (ns, float64) of each of the first ``width`` stage
        columns over the newest ``n`` rows, every row: ``np.median`` and ``np.percentile``
        of the window's stage matrix, to the bit, read off the same sorted columns.  At
        1,000 steps/s a new idle gap was listed at almost every tick, and a partition of
        the window's stage matrix each time was the largest numpy cost of the render tick
        (cProfile of the screen: 178 partitions in 60 ticks)."""
        while len(self.stage_ns) < width:
            i = len(self.stage_ns)
            self.stage_ns.append(SortedWindow(partial(self._stage_ns, i)))
        hi, oldest = self.steps.n, self.oldest()
        vals = [w.get(oldest, hi - n, hi) for w in self.stage_ns[:width]]
        med = np.array([sorted_median(v) if v.size else np.nan for v in vals], dtype=np.float64)
        p99 = np.array(
            [sorted_quantiles(v, (99.0,))[0] if v.size else np.nan for v in vals], dtype=np.float64
        )
        return med, p99
