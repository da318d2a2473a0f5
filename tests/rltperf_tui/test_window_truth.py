"""The window figures against their independent truth: the wall clock.

Issue: idle, MBU and tokens/s were divided by the span of the steps (first start →
last end), so a load test that paused read "busy" for as long as it stayed quiet, a
recording's summary left out its quiet time, and a capture's export freeze stayed in
every rate.  The window is wall time (``engine_adapters.definitions.figures``).
"""

from __future__ import annotations

import numpy as np
import pytest

from engine_adapters.definitions.figures import EXCLUDED_FLAGS, owned_from, window_figures
from engine_adapters.definitions.records import FLAG_EXPORTING, FLAG_PROFILED, Bye, RequestRecord, Stats
from rltperf_tui.live.aggregator import TargetStats
from tests.rltperf_tui.test_aggregator import MS, _hello, _steps

S = 1000 * MS


def _beats(t0_ns: int, t1_ns: int, every_ns: int = S, since: int = 0) -> list[Stats]:
    return [Stats(ts_ns=t, in_step_since_ns=since) for t in range(t0_ns, t1_ns + 1, every_ns)]


def test_one_busy_second_then_nine_quiet_seconds_reads_ninety_percent_idle() -> None:
    a = TargetStats()
    # 1 s of back-to-back 10 ms steps, fully busy, 1.2 GB each against 200 GB/s (MBU 0.6),
    # then the load stops: only the probe's heartbeats (between steps) for 9 s.
    steps = _steps(100, 10, 0, busy_ms=10, nbytes=1_200_000_000, t0=5 * S)
    a.add([_hello(peak_bw=200.0), Stats(ts_ns=5 * S), *steps])
    busy = a.window(10.0)
    assert busy.idle_fraction == pytest.approx(0.0, abs=1e-9)
    assert busy.mbu == pytest.approx(0.6)
    assert busy.tokens_per_s == pytest.approx(400.0)
    a.add(_beats(6 * S, 15 * S))
    w = a.window(10.0)
    assert w.span_s == pytest.approx(10.0)
    assert w.idle_fraction == pytest.approx(0.9)
    assert w.mbu == pytest.approx(0.06)
    assert w.tokens_per_s == pytest.approx(40.0)
    assert a.quiet_s == pytest.approx(9.0)
    # 20 s later the busy second has left the window: idle 100 %, no tokens
    a.add(_beats(16 * S, 35 * S))
    w = a.window(10.0)
    assert w.idle_fraction == pytest.approx(1.0) and w.tokens_per_s == 0.0 and w.steps == 0
    assert w.mbu == pytest.approx(0.0)


def test_a_heartbeat_inside_a_long_step_does_not_read_as_idle() -> None:
    a = TargetStats()
    steps = _steps(10, 100, 0, busy_ms=100, t0=S)  # 1 s busy, ends at 2 s
    a.add([_hello(), Stats(ts_ns=S), *steps])
    # a 3 s step begins at 2 s: heartbeats at 3 s and 4 s find the engine inside it
    a.add(_beats(3 * S, 4 * S, since=2 * S))
    w = a.window(10.0)
    assert w.span_s == pytest.approx(1.0)  # vouched up to the running step's start only
    assert w.idle_fraction == pytest.approx(0.0, abs=1e-9)
    assert a.quiet_s == 0.0 and a.in_step_since_ns == 2 * S


def test_a_hung_engine_stops_the_clock_instead_of_inventing_figures() -> None:
    a = TargetStats()
    a.add([_hello(), Stats(ts_ns=S), *_steps(100, 10, 0, busy_ms=10, t0=S)])
    before = a.window(10.0)
    # SIGSTOP: nothing more arrives; the figures stay those of the vouched window (the
    # monitor marks them stale by its own clock, see tests/rltperf_tui/tui)
    after = a.window(10.0)
    assert before.as_summary() == after.as_summary()
    assert a.vouched_ns == 2 * S


def test_excluded_steps_leave_numerator_and_denominator() -> None:
    base = _steps(200, 10, 0, busy_ms=5, t0=S)  # 2 s, 5 ms busy of 10 ms: idle 0.5
    a = TargetStats()
    a.add([_hello(), Stats(ts_ns=S), *base])
    # B: the same, then 8 profiled steps and a 3 s exporting step, then the same again
    b = TargetStats()
    prof = _steps(8, 10, 0, busy_ms=5, t0=3 * S, start_id=200)
    prof = [
        p.__class__(**{**{f: getattr(p, f) for f in p.__struct_fields__}, "flags": FLAG_PROFILED})
        for p in prof
    ]
    frz = _steps(1, 3000, 0, busy_ms=5, t0=3 * S + 80 * MS, start_id=208)[0]
    frz = frz.__class__(**{**{f: getattr(frz, f) for f in frz.__struct_fields__}, "flags": FLAG_EXPORTING})
    tail = _steps(200, 10, 0, busy_ms=5, t0=frz.end_ns, start_id=209)
    b.add([_hello(), Stats(ts_ns=S), *base, *prof, frz, *tail])
    wa, wb = a.window(None), b.window(None)
    assert wb.excluded_s == pytest.approx(3.08)
    assert wb.baseline_s == pytest.approx(4.0)
    assert wb.tokens_per_s == pytest.approx(wa.tokens_per_s)
    assert wb.idle_fraction == pytest.approx(0.5) and wa.idle_fraction == pytest.approx(0.5)
    assert wb.step_ms["p99"] == pytest.approx(10.0)  # the 3 s freeze is not a baseline step
    assert wb.steps == 400 and wb.profiled_steps == 8 and wb.exporting_steps == 1


def test_requests_in_flight_during_excluded_time_leave_the_latencies() -> None:
    a = TargetStats()
    steps = _steps(100, 10, 0, t0=S)
    frz = _steps(1, 2000, 0, t0=2 * S, start_id=100)[0]
    frz = frz.__class__(**{**{f: getattr(frz, f) for f in frz.__struct_fields__}, "flags": FLAG_EXPORTING})
    a.add([_hello(), Stats(ts_ns=S), *steps, frz])
    a.add(
        [
            RequestRecord(req_id="clean", arrival_ns=S, finish_ns=S + 500 * MS, first_token_ns=S + 20 * MS,
                          output_tokens=10),
            RequestRecord(req_id="frozen", arrival_ns=2 * S - 100 * MS, finish_ns=4 * S,
                          first_token_ns=3 * S, output_tokens=10),
        ]
    )  # fmt: skip
    w = a.window(None)
    assert w.requests_ok == 1 and w.requests_excluded == 1
    assert w.ttft_ms["p99"] == pytest.approx(20.0)


def test_a_request_inside_the_gap_an_excluded_step_owns_leaves_the_latencies() -> None:
    # each step owns the time from the previous step's end: a request that lives wholly
    # in the 5 ms gap before an exporting step lived in excluded time (the monitor reads
    # only the steps that can overlap a window's requests, and the one before them)
    steps = _steps(100, 10, 5, t0=S)  # step k: [S + 15k ms, S + 15k + 10 ms]
    k = 50
    steps[k] = steps[k].__class__(
        **{**{f: getattr(steps[k], f) for f in steps[k].__struct_fields__}, "flags": FLAG_EXPORTING}
    )
    gap0 = S + (15 * k - 5) * MS
    a = TargetStats()
    a.add([_hello(), Stats(ts_ns=S), *steps])
    a.add([RequestRecord(req_id="in-gap", arrival_ns=gap0 + MS, finish_ns=gap0 + 4 * MS,
                         first_token_ns=gap0 + 2 * MS, output_tokens=2)])  # fmt: skip
    for seconds in (None, 10.0):
        w = a.window(seconds)
        assert (w.requests_ok, w.requests_excluded) == (0, 1)
    # and one that lived before it, with no excluded time, stays
    a.add([RequestRecord(req_id="clean", arrival_ns=S + 100 * MS, finish_ns=S + 300 * MS,
                         first_token_ns=S + 110 * MS, output_tokens=2)])  # fmt: skip
    w = a.window(None)
    assert (w.requests_ok, w.requests_excluded) == (1, 1)
    assert w.ttft_ms["p50"] == pytest.approx(10.0)


def test_the_bye_closes_the_recording_window() -> None:
    a = TargetStats()
    a.add([_hello(), Stats(ts_ns=S), *_steps(100, 10, 0, busy_ms=10, t0=S), Bye(reason="x", ts_ns=4 * S)])
    w = a.window(None)
    assert w.span_s == pytest.approx(3.0) and w.idle_fraction == pytest.approx(2 / 3)


def test_figures_by_hand_straddling_steps_count_by_their_inside_part() -> None:
    import numpy as np

    start = np.array([0, 100, 200]) * MS
    end = np.array([100, 200, 300]) * MS
    flags = np.array([0, 0, 0])
    busy = np.array([100.0, 100.0, 100.0]) * MS
    fig = window_figures(start=start, end=end, flags=flags, busy=busy, nbytes=busy, flops=busy * np.nan,
                         tokens=np.array([10, 10, 10]), w0_ns=50 * MS, w1_ns=400 * MS)  # fmt: skip
    # window 350 ms: half of step 0 (50 ms), steps 1 and 2 whole: busy 250 ms
    assert fig.seconds == pytest.approx(0.35)
    assert fig.busy_s == pytest.approx(0.25)
    assert fig.tokens == pytest.approx(25.0) and fig.steps == pytest.approx(2.5)
    assert fig.idle_fraction == pytest.approx(1 - 0.25 / 0.35)
    assert fig.flops is None
    lo = owned_from(start + 10 * MS, end, -5)
    assert list(lo) == [-5, 100 * MS, 200 * MS]  # the first from t0, then the previous end
    assert EXCLUDED_FLAGS & FLAG_EXPORTING


def test_a_stream_faster_than_the_ring_holds_reads_its_true_rate_and_idle() -> None:
    # 10,000 steps/s (50 us steps, 50 us gaps, busy the whole step: idle 50 %) for 0.5 s
    # into a ring of 1,024 steps (~0.1 s): the 10 s window may only span what is kept.
    # Before, it counted 0.5 s of time against 0.1 s of steps: 2,048 steps/s, idle 90 %.
    from engine_adapters.definitions.records import EngineInfo, Hello, Stats, StepRecord
    from rltperf_tui.live.aggregator import TargetStats

    us = 1000
    st = TargetStats(capacity=1024)
    st.add([Hello(schema=1, engine=EngineInfo(name="fast"), stage_names=[])])
    steps = [
        StepRecord(step_id=i, start_ns=10**9 + i * 100 * us, end_ns=10**9 + i * 100 * us + 50 * us,
                   busy_ns=50 * us, out_tokens=2)
        for i in range(5000)
    ]  # fmt: skip
    for i in range(0, 5000, 250):
        st.add(steps[i : i + 250])
    assert st.steps.n == 5000 and len(st.steps) == 1024
    w = st.window(10.0)
    oldest = steps[5000 - 1024]
    assert st.window_bounds(10.0) == (oldest.start_ns, steps[-1].end_ns)
    assert w.span_s == pytest.approx((steps[-1].end_ns - oldest.start_ns) / 1e9)
    assert w.steps == 1024 and w.ring_cut
    assert w.steps_per_s == pytest.approx(10_000, rel=1e-3)
    assert w.tokens_per_s == pytest.approx(20_000, rel=1e-3)
    assert w.idle_fraction == pytest.approx(0.5, abs=1e-3)
    # the engine goes quiet for 0.3 s (a heartbeat between steps): the window runs on from
    # the oldest kept step to the heartbeat, the same busy time over a longer wall time
    quiet_to = steps[-1].end_ns + 300_000 * us
    st.add([Stats(ts_ns=quiet_to, in_step_since_ns=0)])
    q = st.window(10.0)
    assert q.ring_cut and q.steps == 1024
    assert q.idle_fraction == pytest.approx(1 - 1024 * 50 * us / (quiet_to - oldest.start_ns), abs=1e-6)
    # a stream the ring holds whole is unchanged: its window starts at the first step
    slow = TargetStats(capacity=8192)
    slow.add([Hello(schema=1, engine=EngineInfo(name="fast"), stage_names=[]), *steps])
    assert slow.window_bounds(10.0)[0] == steps[0].start_ns
    ws = slow.window(10.0)
    assert ws.steps_per_s == pytest.approx(10_000, rel=1e-3) and not ws.ring_cut


@pytest.mark.parametrize("case", ["all-known", "unknown-busy", "excluded", "zero-length"])
def test_window_sums_are_the_same_bits_whether_or_not_a_step_is_left_out(case: str) -> None:
    """``window_figures`` skips the gathers when every step is kept and known, and the
    per-step case split when no step has zero length; the sums must be the bits of
    Σ value × inside fraction over the known kept steps, by hand (numpy's own sum of the
    gathered products), on windows that cut a step at either end and on ring views."""
    rng = np.random.default_rng(7)
    for trial in range(40):
        n = int(rng.integers(50, 3000))
        dur = rng.integers(200_000, 3_000_000, n)
        gap = rng.integers(0, 500_000, n)
        if case == "zero-length":
            dur[rng.random(n) < 0.1] = 0
        start = np.cumsum(dur + gap) - dur
        end = start + dur
        busy = dur * rng.uniform(0.3, 1.0, n)
        nbytes = rng.uniform(1e6, 3e9, n)
        flops = rng.uniform(1e9, 5e13, n)
        tokens = rng.integers(1, 64, n)
        flags = np.zeros(n, dtype=np.int32)
        if case == "unknown-busy":
            busy[rng.random(n) < 0.2] = np.nan
        if case == "excluded":
            flags[rng.random(n) < 0.05] = FLAG_PROFILED
        # a view at an odd offset, as the ring hands out (not a fresh, aligned array)
        pad = int(rng.integers(1, 7))
        busy = np.concatenate((np.zeros(pad), busy))[pad:]
        w0 = int(start[0] + (end[0] - start[0]) // 2) if trial % 2 else int(start[0])
        w1 = int(end[-1] - (end[-1] - start[-1]) // 3) if trial % 3 else int(end[-1])
        fig = window_figures(start=start, end=end, flags=flags, busy=busy, nbytes=nbytes, flops=flops,
                             tokens=tokens, w0_ns=w0, w1_ns=w1, reported=(True, True, True))  # fmt: skip
        keep = (flags & EXCLUDED_FLAGS) == 0
        inside = np.clip(np.minimum(end, w1) - np.maximum(start, w0), 0, None)
        whole = ((start >= w0) & (end <= w1)).astype(np.float64)
        frac = np.where(end > start, inside / np.maximum(end - start, 1), whole)
        frac = np.where(keep, frac, 0.0)
        for got, v in ((fig.busy_s, busy), (fig.nbytes, nbytes), (fig.flops, flops)):
            known = ~np.isnan(v) & keep
            want = float((v[known] * frac[known]).sum())
            assert got == (want / 1e9 if v is busy else want), (trial, case)
        assert fig.steps == float(frac.sum())
        assert fig.tokens == float((tokens.astype(np.float64) * frac).sum())
