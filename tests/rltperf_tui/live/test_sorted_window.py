"""The live window's sorted samples (percentiles, idle-gap threshold, stage medians),
slid forward between ticks, against numpy on a fresh copy of the window's rows (issue 21
§1: partitioning the whole window again for its percentiles at every tick was the
largest numpy cost of the render tick)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_adapters.definitions import figures as F
from engine_adapters.definitions.order_stats import sorted_median, sorted_quantiles
from engine_adapters.definitions.records import (
    FLAG_EXPORTING,
    FLAG_PROFILED,
    EngineInfo,
    Hello,
    Stats,
    StepRecord,
)
from rltperf_tui.live.aggregator import TargetStats
from rltperf_tui.live.sorted_window import SortedWindow, insert_sorted, remove_sorted

MS = 1_000_000


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.integers(0, 6), min_size=1, max_size=60),
    moves=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 12)), min_size=1, max_size=12),
    oldest_step=st.integers(0, 3),
)
def test_slid_windows_hold_the_sorted_rows_of_a_fresh_copy(
    values: list[int], moves: list[tuple[int, int]], oldest_step: int
) -> None:
    col = np.asarray(values, dtype=np.int64)  # few distinct values: many repeats
    calls: list[tuple[int, int]] = []

    def values_of(a: int, b: int) -> np.ndarray:
        calls.append((a, b))
        return col[a:b]

    w = SortedWindow(values_of)
    lo = hi = oldest = 0
    for grow_lo, grow_hi in moves:
        hi = min(len(values), hi + grow_hi)
        lo = min(hi, lo + grow_lo)
        oldest = min(lo, oldest + oldest_step)  # the ring forgot rows before this one
        got = w.get(oldest, lo, hi)
        assert np.array_equal(got, np.sort(col[lo:hi]))
        assert all(a >= oldest for a, _ in calls)  # never read a row the ring forgot
        calls.clear()


def test_a_slide_reads_only_the_rows_that_moved() -> None:
    col = np.arange(1000, dtype=np.int64)[::-1].copy()
    calls: list[tuple[int, int]] = []
    w = SortedWindow(lambda a, b: calls.append((a, b)) or col[a:b])
    w.get(0, 0, 500)
    calls.clear()
    got = w.get(0, 30, 540)
    assert calls == [(0, 30), (500, 540)] and w.rebuilds == 1
    assert np.array_equal(got, np.sort(col[30:540]))
    w.get(0, 900, 1000)  # jumped past the old window: sorted afresh
    assert w.rebuilds == 2


def test_removing_a_value_not_held_asks_for_a_fresh_sort() -> None:
    s = np.array([1, 2, 2, 5])
    assert np.array_equal(remove_sorted(s, np.array([2, 2, 5])), [1])
    assert remove_sorted(s, np.array([2, 2, 2])) is None  # one 2 too many
    assert remove_sorted(s, np.array([3])) is None
    assert remove_sorted(np.array([1.0, np.nan]), np.array([np.nan])) is None
    assert np.array_equal(insert_sorted(s, np.array([5, 0, 2])), [0, 1, 2, 2, 2, 5, 5])


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.integers(0, 10**7), min_size=1, max_size=50))
def test_order_statistics_of_sorted_samples_are_numpys_to_the_bit(values: list[int]) -> None:
    ms = np.asarray(values, dtype=np.float64) / 1e6
    want = np.percentile(ms, F.PERCENTILES)
    got = sorted_quantiles(np.sort(ms), F.PERCENTILES)
    assert got.tobytes() == np.asarray(want, dtype=np.float64).tobytes()
    ns = np.asarray(values, dtype=np.int64)
    assert sorted_median(np.sort(ns)) == float(np.median(ns))


def _hello() -> Hello:
    return Hello(schema=1, engine=EngineInfo(name="t"), stage_names=["a", "b"])


def test_window_percentiles_and_threshold_slid_equal_numpy_on_the_windows_rows() -> None:
    """Uneven batches through a ring that wraps, profiled and exporting steps (left out of
    the percentiles), dropped ids (no gap across a drop), steps of equal length, windows
    of two sizes in turn, and heartbeats that move the window with no new step."""
    rng = np.random.default_rng(5)
    recs: list[StepRecord] = []
    t, sid = 0, 0
    st_ = TargetStats(capacity=2048)  # 5000 steps through 2048 slots
    st_.add([_hello()])
    checked = 0
    while len(recs) < 5000:
        batch = []
        for _ in range(int(rng.integers(1, 400))):
            i = len(recs) + len(batch)
            sid += 1 + int(rng.random() < 0.03)
            d = int(rng.choice([MS, 2 * MS, int(rng.uniform(0.3, 4) * MS)]))  # many equal
            flags = FLAG_PROFILED if 1200 <= i < 1230 else FLAG_EXPORTING if 3000 <= i < 3100 else 0
            batch.append(
                StepRecord(step_id=sid, start_ns=t, end_ns=t + d, flags=flags, stage_ns=[d // 3, d // 2])
            )
            t += d + int(rng.choice([0, MS // 4, 8 * MS], p=[0.2, 0.78, 0.02]))
        recs += batch
        st_.add(batch)
        i = len(recs)
        if rng.random() < 0.3:  # the engine pauses: only a heartbeat moves the window
            t += int(rng.integers(0, 900)) * MS
            st_.add([Stats(ts_ns=t, in_step_since_ns=0)])
            t += MS
        for sec in (1.0, 2.5, 30.0):  # 30 s: more than the ring holds (its oldest row moves)
            w = st_.window(sec)
            w0, _ = st_.window_bounds(sec)
            kept = recs[max(0, i - 2048) : i]
            win = [r for r in kept if r.end_ns > w0] if w0 else kept
            start, end, ids, flags = (np.array([getattr(r, f) for r in win], dtype=np.int64)
                                      for f in ("start_ns", "end_ns", "step_id", "flags"))  # fmt: skip
            keep = (flags & F.EXCLUDED_FLAGS) == 0
            dur = ((end - start).astype(np.float64) / 1e6)[keep]
            consec = np.diff(ids) == 1
            gaps_ns = start[1:] - end[:-1]
            gaps = (gaps_ns.astype(np.float64) / 1e6)[consec & keep[1:] & keep[:-1]]
            for got, vals in ((w.step_ms, dur), (w.gap_ms, gaps)):
                want = np.percentile(vals, F.PERCENTILES) if vals.size else [None] * 3
                assert list(got.values()) == [None if v is None else float(v) for v in want]
            thr = max(1.0, 5 * float(np.median(gaps_ns[consec])) / 1e6) if consec.any() else 1.0
            assert st_.idle_gap_threshold_ms(sec) == thr
            # the stage medians an idle gap's step is held against: every row, kept or not
            stages = np.array([r.stage_ns for r in win], dtype=np.int64).reshape(len(win), 2)
            got_med, got_p99 = st_.windows._slide(sec).stage_median_p99(len(win), 2)
            assert got_med.tobytes() == np.median(stages, axis=0).astype(np.float64).tobytes()
            assert got_p99.tobytes() == np.percentile(stages, 99, axis=0).astype(np.float64).tobytes()
            checked += 1
    assert checked > 20


@pytest.mark.parametrize("rows", [0, 1, 2])
def test_windows_of_no_step_one_step_and_two(rows: int) -> None:
    st_ = TargetStats()
    st_.add(
        [_hello(), *[StepRecord(step_id=i, start_ns=i * 3 * MS, end_ns=i * 3 * MS + MS) for i in range(rows)]]
    )
    w = st_.window(10.0)
    assert w.step_ms["p50"] == (1.0 if rows else None)
    assert w.gap_ms["p50"] == (2.0 if rows == 2 else None)
