"""Whole-run figures in bounded memory (``rltperf_tui.live.whole_run``, issue 20 §5).

Fed batch by batch, the exact figures must equal the window's over every step at once
(``TargetStats`` growing without bound, ``window(None)``); the sketched percentiles
must lie within the stated relative accuracy of the samples at their rank; the
persisted form must give the same figures back."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine_adapters.definitions.records import (
    FLAG_EXPORTING,
    FLAG_PROFILED,
    RequestRecord,
    Stats,
    StepRecord,
)
from rltperf_tui.live.aggregator import TargetStats
from rltperf_tui.live.whole_run import RELATIVE_ACCURACY, SERIES_BUCKETS, WholeRun
from tests.rltperf_tui.test_aggregator import MS, _hello

S = 1000 * MS


def _run(seed: int = 0) -> list[list[object]]:
    """Batches of a run: lognormal steps and gaps, busy and bytes, a capture (profiled
    then exporting steps), a quiet stretch, requests, heartbeats."""
    rng = np.random.default_rng(seed)
    t = 2 * S
    batches: list[list[object]] = [[_hello(peak_bw=100.0), Stats(ts_ns=S, in_step_since_ns=0)]]
    sid = 0
    for b in range(60):
        batch: list[object] = []
        for _ in range(int(rng.integers(1, 120))):
            dur = int(rng.lognormal(np.log(8e6), 0.5))
            t += int(rng.lognormal(np.log(5e5), 1.0))
            flags = FLAG_PROFILED if 20 <= b < 21 else FLAG_EXPORTING if 21 <= b < 24 else 0
            batch.append(StepRecord(step_id=sid, start_ns=t, end_ns=t + dur, out_tokens=int(rng.integers(1, 9)),
                                    busy_ns=dur // 2, bytes_read=int(rng.integers(1, 10**9)), flags=flags))  # fmt: skip
            sid += 1 + (b == 40)  # records lost on the way
            t += dur
        if b == 30:  # the load pauses: heartbeats between steps
            t += 3 * S
            batch.append(Stats(ts_ns=t - S, in_step_since_ns=0))
        arr = t - int(rng.integers(1, 3 * S))
        batch.append(RequestRecord(req_id=f"r{b}", arrival_ns=arr, finish_ns=t, first_token_ns=arr + 20 * MS,
                                   output_tokens=int(rng.integers(1, 40)), status="ok" if b % 7 else "failed"))  # fmt: skip
        batches.append(batch)
    batches.append([Stats(ts_ns=t + 2 * S, in_step_since_ns=0)])  # a quiet tail
    return batches


def _fed(batches: list[list[object]]) -> tuple[TargetStats, WholeRun]:
    st, run = TargetStats(capacity=1024, grow=True), WholeRun()
    for b in batches:
        st.add(b)  # type: ignore[arg-type]
        run.add(b, st.clock)
    return st, run


def test_whole_run_exact_figures_are_the_window_over_every_step() -> None:
    st, run = _fed(_run())
    w = st.window(None)
    got = run.figures(peak_bw_gbps=100.0)
    # (seconds are rounded to the microsecond, as summary --json's)
    assert got["wall_s"] == pytest.approx(w.span_s, abs=1e-6)
    assert got["excluded_s"] == pytest.approx(w.excluded_s, abs=1e-6) and w.excluded_s > 0
    assert got["baseline_s"] == pytest.approx(w.baseline_s, abs=1e-6)
    assert got["steps"] == w.steps
    for key in ("tokens_per_s", "idle_fraction", "mbu", "steps_per_s"):
        assert got[key] == pytest.approx(getattr(w, key), rel=1e-9), key
    assert got["requests"] == {"ok": w.requests_ok, "failed": w.requests_failed}
    assert got["excluded"]["requests"] == w.requests_excluded > 0
    assert got["excluded"]["profiled_steps"] == w.profiled_steps > 0
    assert got["excluded"]["exporting_steps"] == w.exporting_steps > 0
    assert got["dropped"] == st.id_gaps > 0  # records lost on the way
    assert got["step_ms_mean"] == pytest.approx(w.step_ms_mean, rel=1e-9)


def test_sketched_percentiles_are_within_their_bound_of_the_samples_at_their_rank() -> None:
    st, run = _fed(_run(1))
    col = st.steps.last
    keep = (col("flags") & (FLAG_PROFILED | FLAG_EXPORTING)) == 0
    exact = np.sort((col("end") - col("start"))[keep] / 1e6)
    ids = col("step_id")
    start, end = col("start"), col("end")
    consec = (np.diff(ids) == 1) & keep[1:] & keep[:-1]
    gaps = np.sort(((start[1:] - end[:-1]) / 1e6)[consec])
    for key, xs in (("step_ms", exact), ("gap_ms", gaps)):
        got = run.percentiles(key)
        n = xs.size
        for q in (50, 95, 99):
            lo = xs[int(np.floor(q / 100 * (n - 1)))]
            assert abs(got[f"p{q}"] - lo) <= RELATIVE_ACCURACY * lo + 1e-12, (key, q, got, lo)
            # and so near the linearly interpolated percentile the window shows
            hi = xs[int(np.ceil(q / 100 * (n - 1)))]
            assert lo * (1 - RELATIVE_ACCURACY) <= got[f"p{q}"] <= hi * (1 + RELATIVE_ACCURACY)


def _same(a: dict[str, object], b: dict[str, object]) -> None:
    """Equal figures; the sketched ones to 1e-9 (the protobuf form stores the mapping's
    gamma, recomputed on reading)."""
    for k, v in a.items():
        if k in ("step_ms", "gap_ms", "ttft_ms", "tpot_ms"):
            assert v == pytest.approx(b[k], rel=1e-9), k
        else:
            assert v == b[k], k


def test_persisted_and_read_back_it_gives_the_same_figures_and_goes_on() -> None:
    batches = _run(2)
    st, run = _fed(batches[:40])
    back = WholeRun.from_json(json.loads(json.dumps(run.to_json())))
    _same(back.figures(100.0), run.figures(100.0))
    for b in batches[40:]:
        st.add(b)  # type: ignore[arg-type]
        run.add(b, st.clock)
        back.add(b, st.clock)
    _same(back.figures(100.0), run.figures(100.0))


def test_the_series_stays_bounded_and_covers_the_run() -> None:
    run = WholeRun()
    st = TargetStats(capacity=256)
    st.add([_hello(), Stats(ts_ns=0, in_step_since_ns=0)])
    t, sid = 0, 0
    for _ in range(30):  # 30 minutes of 1 step per 2 s
        batch = []
        for _ in range(30):
            batch.append(StepRecord(step_id=sid, start_ns=t, end_ns=t + 10 * MS))
            sid, t = sid + 1, t + 2 * S
        st.add(batch)  # type: ignore[arg-type]
        run.add(batch, st.clock)
    x, mean, mx, _ex = run.chart_series()
    assert run.series.shape[0] == SERIES_BUCKETS and x.size <= SERIES_BUCKETS
    assert x[0] == 0 and x[-1] >= 1790 - run.bucket_s  # from the first step to the last
    assert mean == pytest.approx(10.0) and mx == pytest.approx(10.0)
    assert int(run.series[:, 0].sum()) == sid
