"""One definition of the latency percentiles (``engine_adapters.definitions.figures.pct``),
called by every consumer: the monitor's window, ``report`` and ``compare``; and the
aggregator's parts (connection state, step windows) read as one ``TargetStats``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_adapters.definitions import figures as F
from engine_adapters.definitions import order_stats
from engine_adapters.definitions.records import EngineInfo, Hello, SessionEvent, Stats, StepRecord
from rltperf_tui.analysis import stats as S
from rltperf_tui.analysis.compare import _metric_values
from rltperf_tui.analysis.report_steps import summary_ms
from rltperf_tui.live.aggregator import TargetStats

MS = 1_000_000


def test_pct_by_hand() -> None:
    # 1..101: linear interpolation puts P50 at 51, P95 at 96, P99 at 100
    v = np.arange(1, 102, dtype=np.float64)
    assert F.pct(v) == {"p50": 51.0, "p95": 96.0, "p99": 100.0}
    # four samples: P95 lies 0.85 of the way from 3 to 4 (rank 0.95 x 3 = 2.85)
    assert F.pct(np.array([1.0, 2.0, 3.0, 4.0]))["p95"] == pytest.approx(3.85)
    assert F.pct(np.zeros(0)) == {"p50": None, "p95": None, "p99": None}
    assert F.percentile(np.array([1.0, 2.0, 3.0, 4.0]), 95) == pytest.approx(3.85)


def _steps(durations_ms: list[float]) -> list[StepRecord]:
    out, t = [], 10**9
    for i, d in enumerate(durations_ms):
        out.append(
            StepRecord(step_id=i, start_ns=t, end_ns=t + int(d * MS), kind="decode", tokens=1, out_tokens=1)
        )
        t += int(d * MS) + MS  # 1 ms gap
    return out


def test_window_report_and_compare_give_the_same_percentiles() -> None:
    durs = [1.0, 2.0, 2.5, 3.0, 10.0, 4.0, 1.5, 2.0, 7.0, 3.3] * 5
    st = TargetStats()
    st.add([Hello(schema=1, engine=EngineInfo(name="t"), stage_names=[]), *_steps(durs)])
    w = st.window(None)
    want = F.pct(np.array(durs))
    assert w.step_ms == pytest.approx(want)
    rep = summary_ms(durs)
    assert {k: rep[k] for k in want} == {k: round(v, 4) for k, v in want.items() if v is not None}
    part = {"step_ms": np.array(durs)}
    assert _metric_values(part, "step_ms", 95) == pytest.approx(want["p95"])
    # compare's statistic on too few samples reports the figure itself, by the same definition
    d = S.compare_stat("step P99", "ms", np.array(durs), np.array(durs[:3]), 99, np.random.default_rng(0))
    assert d.a == pytest.approx(want["p99"])


def test_target_stats_reads_and_writes_through_its_parts() -> None:
    st = TargetStats()
    st.state = "error"
    assert st.stream.state == "error"
    st.add([SessionEvent(state="connected", detail="hi")])
    assert st.state == "connected" and list(st.messages) == ["hi"]
    # a heartbeat between steps (stream state) moves the window end the step windows use
    st.add(_steps([2.0, 2.0]))
    end = st.last_end_ns
    assert end is not None and st.window_bounds(None)[1] == end
    st.add([Stats(ts_ns=end + 500 * MS, in_step_since_ns=0)])
    assert st.clock is st.windows.clock is st.stream.clock
    assert st.window_bounds(None)[1] == end + 500 * MS
    assert st.quiet_s == pytest.approx(0.5)
    assert st.window(None).span_s == pytest.approx((end + 500 * MS - 10**9) / 1e9)


_SAMPLE = st.floats(allow_nan=True, allow_infinity=True, width=64) | st.sampled_from([0.0, -0.0, 1.0, 1e6])


@settings(max_examples=400, deadline=None)
@given(
    values=st.lists(_SAMPLE, min_size=1, max_size=300),
    q=st.floats(min_value=0.0, max_value=100.0),
)
def test_pct_is_numpys_percentile_to_the_last_bit(values: list[float], q: float) -> None:
    # pct and percentile skip np.percentile's per-call overhead (the screen asks for
    # four sets at every tick) but must give its values exactly, NaN, infinities and
    # the sign of a zero included
    v = np.array(values, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        want = np.percentile(v, F.PERCENTILES)
        got = F.pct(v)
        one = F.percentile(v, q)
        want_one = np.percentile(v, q)
    assert np.array([got[f"p{p}"] for p in F.PERCENTILES]).tobytes() == want.tobytes()
    assert np.float64(one).tobytes() == np.float64(want_one).tobytes()
    assert v.tobytes() == np.array(values, dtype=np.float64).tobytes()  # the input is left alone


@settings(max_examples=400, deadline=None)
@given(
    values=st.lists(_SAMPLE, min_size=1, max_size=300),
    q=st.floats(min_value=0.0, max_value=100.0),
)
def test_staged_order_statistics_are_numpys_percentile_to_the_last_bit(values: list[float], q: float) -> None:
    # the path a window of 4 096 samples or more takes (one position at a time), on
    # small samples: the same values, zeros' signs, NaNs and infinities included
    old = order_stats.STAGED_MIN
    order_stats.STAGED_MIN = 1
    try:
        test_pct_is_numpys_percentile_to_the_last_bit.hypothesis.inner_test(values, q)  # type: ignore[attr-defined]
    finally:
        order_stats.STAGED_MIN = old


def test_staged_path_on_window_sized_samples_with_zeros_nans_and_ties() -> None:
    rng = np.random.default_rng(11)
    big = rng.lognormal(0, 1, 12_000)
    big[rng.choice(big.size, 3_000, replace=False)] = 0.0
    big[rng.choice(big.size, 3_000, replace=False)] = -0.0  # zeros of both signs at P50
    ties = np.round(rng.lognormal(0, 1, 9_000), 1)  # many equal values
    nan = big.copy()
    nan[5] = np.nan
    for v in (big, ties, nan, -ties, np.abs(big)):
        with np.errstate(invalid="ignore"):
            want = np.percentile(v, F.PERCENTILES)
        got = order_stats.quantiles(v, F.PERCENTILES)
        assert got.tobytes() == want.tobytes()


def test_pct_of_integers_and_of_a_window_sized_sample_match_numpy() -> None:
    rng = np.random.default_rng(7)
    ints = rng.integers(0, 10**9, 1001)
    assert F.pct(ints) == {
        f"p{p}": float(x) for p, x in zip(F.PERCENTILES, np.percentile(ints, F.PERCENTILES), strict=True)
    }
    big = rng.lognormal(0, 1, 10_000)
    assert np.array(list(F.pct(big).values())).tobytes() == np.percentile(big, F.PERCENTILES).tobytes()


@settings(max_examples=300, deadline=None)
@given(
    rows=st.integers(min_value=1, max_value=6),
    values=st.lists(st.integers(min_value=-(2**40), max_value=2**40), min_size=1, max_size=200),
)
def test_medians_of_integers_are_numpys_to_the_last_bit(rows: int, values: list[int]) -> None:
    # the idle-gap threshold (median gap) and each stage's median in the window
    m = np.array([values[i:] + values[:i] for i in range(rows)], dtype=np.int64)
    want = np.median(m, axis=1)
    assert order_stats.column_medians(m).tobytes() == want.tobytes()
    kept = m.copy()
    assert order_stats.column_medians(kept, overwrite_input=True).tobytes() == want.tobytes()
    assert np.float64(order_stats.median(m[0])).tobytes() == np.float64(np.median(m[0])).tobytes()
    # the same value as the median of the floats the gaps used to be
    assert order_stats.median(m[0]) == np.median(m[0].astype(np.float64))
    floats = m[0] / 7.0
    assert np.float64(order_stats.median(floats)).tobytes() == np.float64(np.median(floats)).tobytes()
