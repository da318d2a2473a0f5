"""The aggregator against numbers computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine_adapters.definitions.records import (
    SCHEMA_VERSION,
    Ceiling,
    EngineInfo,
    Hello,
    RequestRecord,
    Stats,
    StepRecord,
)
from rltperf_tui.live.aggregator import TargetStats

MS = 1_000_000


def _hello(peak_bw=None, peak_fl=None, max_loops=4):
    ceiling = (
        Ceiling(device="d", peak_bw_gbps=peak_bw, peak_gflops=peak_fl, source="spec table")
        if peak_bw
        else None
    )
    return Hello(
        schema=SCHEMA_VERSION,
        engine=EngineInfo(name="e", max_loops=max_loops),
        stage_names=["schedule", "forward", "sample"],
        ceiling=ceiling,
    )


def _steps(n, step_ms, gap_ms, busy_ms=None, nbytes=None, flops=None, start_id=0, t0=0):
    out = []
    t = t0
    for i in range(n):
        s, e = t, t + int(step_ms * MS)
        out.append(
            StepRecord(
                step_id=start_id + i,
                start_ns=s,
                end_ns=e,
                stage_ns=[MS, int((step_ms - 1.5) * MS), MS // 2],
                busy_ns=int(busy_ms * MS) if busy_ms is not None else None,
                bytes_read=nbytes,
                flops=flops,
                out_tokens=4,
                exit_hist=[1, 0, 2, 1],
            )
        )
        t = e + int(gap_ms * MS)
    return out


def test_step_gap_idle_mbu_by_hand():
    a = TargetStats()
    # 100 steps of 8 ms with 2 ms gaps; 6 ms busy each; 1.2 GB read per step; peak 200 GB/s.
    a.add(
        [
            _hello(peak_bw=200.0, peak_fl=1000.0),
            *_steps(100, 8, 2, busy_ms=6, nbytes=1200000000, flops=2400000000.0),
        ]
    )
    w = a.window(None)
    assert w.steps == 100
    assert w.step_ms["p50"] == pytest.approx(8.0)
    assert w.gap_ms["p99"] == pytest.approx(2.0)
    span = (99 * 10 + 8) / 1000  # first start to last end, seconds
    assert w.span_s == pytest.approx(span)
    assert w.idle_fraction == pytest.approx(1 - 100 * 0.006 / span)
    assert w.achieved_gbps == pytest.approx(100 * 1.2 / span)
    assert w.mbu == pytest.approx(100 * 1.2e9 / (span * 200e9))
    assert w.intensity == pytest.approx(2.0) and w.balance == pytest.approx(5.0)
    assert w.verdict == "memory-bound"
    assert w.ceiling_ms_p50 == pytest.approx(1.2e9 / 200e9 * 1e3)  # 6 ms: bytes dominate
    assert w.tokens_per_s == pytest.approx(400 / span)
    assert w.stage_ms_mean["schedule"] == pytest.approx(1.0) and w.stage_ms_mean["forward"] == pytest.approx(
        6.5
    )
    assert w.exit_hist == [100, 0, 200, 100] and w.mean_exit_depth == pytest.approx((100 + 600 + 400) / 400)
    assert not w.mbu_overcount


def test_window_uses_data_time_and_excludes_old_steps():
    a = TargetStats()
    a.add([_hello(), *_steps(50, 1, 1), *_steps(10, 50, 0, start_id=50, t0=20000 * MS)])
    w = a.window(1.0)  # the last second of data: only the 50 ms steps
    assert w.steps == 10 and w.step_ms["p50"] == pytest.approx(50.0)
    assert a.window(None).steps == 60


def test_gaps_across_dropped_records_are_not_gaps():
    a = TargetStats()
    steps = _steps(10, 1, 1)
    del steps[5]  # a dropped record leaves a 3 ms hole that is not an idle gap
    a.add([_hello(), *steps])
    w = a.window(None)
    assert w.gap_ms["p99"] == pytest.approx(1.0)
    assert a.id_gaps == 1 and a.dropped == 1


def test_latency_percentiles_and_goodput():
    a = TargetStats()
    reqs = []
    for i in range(100):
        arrival = i * 10 * MS
        ttft = (i + 1) * MS  # 1..100 ms
        out_tokens = 11
        tpot = 2 * MS if i < 90 else 20 * MS
        reqs.append(
            RequestRecord(
                req_id=str(i),
                arrival_ns=arrival,
                first_token_ns=arrival + ttft,
                finish_ns=arrival + ttft + (out_tokens - 1) * tpot,
                output_tokens=out_tokens,
            )
        )
    reqs.append(RequestRecord(req_id="bad", arrival_ns=0, finish_ns=5 * MS, status="failed"))
    a.add([_hello(), *_steps(200, 5, 0), *reqs])
    w = a.window(None, slo_ttft_ms=50, slo_tpot_ms=5)
    assert w.requests_ok == 100 and w.requests_failed == 1
    assert w.ttft_ms["p50"] == pytest.approx(np.percentile(np.arange(1, 101), 50))
    assert w.ttft_ms["p99"] == pytest.approx(np.percentile(np.arange(1, 101), 99))
    assert w.tpot_ms["p50"] == pytest.approx(2.0) and w.tpot_ms["p99"] == pytest.approx(20.0)
    assert w.goodput_rps == pytest.approx(50 / w.span_s)  # ttft <= 50 ms: i < 50, all with tpot 2 ms


def test_mbu_over_one_is_flagged_and_unknowns_stay_none():
    a = TargetStats()
    a.add([_hello(peak_bw=1.0), *_steps(10, 1, 0, nbytes=10**9)])
    assert a.window(None).mbu_overcount
    b = TargetStats()
    b.add([_hello(), *_steps(10, 1, 0)])
    w = b.window(None)
    assert w.idle_fraction is None and w.mbu is None and w.achieved_gbps is None and w.verdict == "unknown"
    assert w.ttft_ms["p50"] is None


def test_stats_drop_counts_and_ring_wraps():
    a = TargetStats(capacity=64)
    a.add([_hello(), *_steps(1000, 1, 0)])
    a.add([Stats(ts_ns=2_000 * MS, ring_dropped=3, sub_dropped=4)])
    assert len(a.steps) == 64 and a.window(None).steps == 64
    ids = a.steps.last("step_id")
    assert list(ids) == list(range(936, 1000))
    assert a.dropped == 7


def test_timeline_buckets_and_idle_gaps():
    a = TargetStats()
    steps = _steps(300, 4, 1)
    # one long gap after step 200, whose forward stage grew by 30 ms
    s = steps[200]
    steps[200] = StepRecord(
        step_id=s.step_id,
        start_ns=s.start_ns,
        end_ns=s.end_ns + 30 * MS,
        stage_ns=[MS, int(2.5 * MS) + 30 * MS, MS // 2],
    )
    for i in range(201, 300):
        r = steps[i]
        steps[i] = StepRecord(
            step_id=r.step_id, start_ns=r.start_ns + 80 * MS, end_ns=r.end_ns + 80 * MS, stage_ns=r.stage_ns
        )
    a.add([_hello(), *steps])
    gaps = a.idle_gaps(seconds=60)
    assert len(gaps) == 1
    g = gaps[0]
    assert g.after_step == 200 and g.length_ms == pytest.approx(51.0)
    assert g.grown_stage == "forward" and g.grown_ms == pytest.approx(30.0)
    tl = a.timeline(seconds=2.0, buckets=4)
    ends = a.steps.last("end")
    assert tl["bucket_s"] == 0.5 and tl["t0_ns"] % (500 * MS) == 0  # aligned to absolute time
    assert a.now_ns - 2000 * MS < tl["t0_ns"] <= a.now_ns - 1500 * MS
    assert sum(tl["steps"]) == int((ends >= tl["t0_ns"]).sum())
    assert all(math.isnan(v) or 3.9 < v < 40 for v in tl["step_ms"])
    assert set(tl["stage_ms"]) == {"schedule", "forward", "sample"}


def test_idle_gaps_name_the_grown_stage_against_medians_of_a_wrapped_ring():
    """The stage that grew most before each listed gap, by each stage's median over the
    kept steps, computed from the records by numpy; on a ring that wrapped, so its
    stage rows come from both pieces."""
    rng = np.random.default_rng(11)
    recs, t = [], 0
    for i in range(700):
        st = [int(x) for x in rng.integers(MS // 10, 2 * MS, 3)]
        if i == 679:  # the step before the newest gap: its forward stage far over its usual
            st[1] = 9 * MS
        gap = 40 * MS if i % 97 == 0 else MS // 10
        recs.append(StepRecord(step_id=i, start_ns=t, end_ns=t + sum(st), stage_ns=st))
        t += sum(st) + gap
    a = TargetStats(capacity=256)
    a.add([_hello()])
    for i in range(0, len(recs), 50):
        a.add(recs[i : i + 50])
    kept = recs[-256:]
    gaps = a.idle_gaps(seconds=1e6, threshold_ms=20.0, limit=8)
    stages = np.array([r.stage_ns for r in kept])
    med, p99 = np.median(stages, axis=0), np.percentile(stages, 99, axis=0)
    want = []
    for j in range(len(kept) - 2, -1, -1):
        if kept[j + 1].start_ns - kept[j].end_ns > 20 * MS:
            over = stages[j] - med
            delta = np.where(over > 2 * (p99 - med), over, -np.inf)  # beyond its usual spread
            best = int(np.argmax(delta))
            named = ("schedule", "forward", "sample")[best] if delta[best] > 0 else None
            want.append((kept[j].step_id, named, delta[best] / 1e6 if named else None))
    assert len(want) == 3 and a.steps.n == 700  # the ring wrapped: kept rows in two pieces
    assert sum(w[1] is not None for w in want) == 1  # (one gap's step has a stage far over its usual)
    got = [(g.after_step, g.grown_stage, g.grown_ms) for g in gaps]
    assert [w[:2] for w in want] == [g[:2] for g in got]
    assert [w[2] for w in want] == pytest.approx([g[2] for g in got])


def _in_pieces(stats, recs, rng, most):
    """Add ``recs`` in uneven batches of 1 to ``most`` - 1; yield how many are in after each."""
    i = 0
    while i < len(recs):
        k = int(rng.integers(1, most))
        stats.add(recs[i : i + k])
        i += k
        yield min(i, len(recs))


def _timeline_from_scratch(recs, now_ns, seconds, buckets):
    bns = int(seconds * 1e9 / buckets)
    first = now_ns // bns - buckets + 1
    start, end, ids = (np.array([getattr(r, f) for r in recs]) for f in ("start_ns", "end_ns", "step_id"))
    fwd = np.array([r.stage_ns[1] for r in recs])
    b = end // bns - first
    out = {"t0_ns": first * bns, "steps": [], "step_ms": [], "forward": [], "gap_ms": []}
    for j in range(buckets):
        sel = b == j
        out["steps"].append(int(sel.sum()))
        gsel = sel[1:] & (np.diff(ids) == 1)
        gaps = (start[1:] - end[:-1])[gsel]
        out["gap_ms"].append(float(gaps.mean()) / 1e6 if gaps.size else math.nan)
        out["step_ms"].append(float((end - start)[sel].mean()) / 1e6 if sel.any() else math.nan)
        out["forward"].append(float(fwd[sel].mean()) / 1e6 if sel.any() else math.nan)
    return out


def _same(a, b):
    return all((math.isnan(x) and math.isnan(y)) or x == pytest.approx(y) for x, y in zip(a, b, strict=True))


def test_timeline_fed_in_pieces_equals_one_pass_over_the_window():
    """The timeline keeps per-bucket sums and adds only new rows at each call; fed in
    uneven batches (with calls between them, records dropped, stalls) or all at once, it
    must equal a computation from scratch."""
    rng = np.random.default_rng(7)
    recs = []
    t = 0
    sid = 0
    for _ in range(3000):
        d = int(rng.uniform(1, 6) * MS)
        stages = [int(d * 0.2), int(d * 0.7), int(d * 0.1)]
        recs.append(StepRecord(step_id=sid, start_ns=t, end_ns=t + d, stage_ns=stages))
        t += d + int(rng.choice([0.2, 0.2, 0.2, 30.0]) * MS)
        sid += 2 if rng.random() < 0.02 else 1  # a drop now and then: no gap across it
    seconds, buckets = 3.0, 37
    pieces = TargetStats()
    pieces.add([_hello()])
    for _ in _in_pieces(pieces, recs, rng, 400):
        pieces.timeline(seconds, buckets)
    at_once = TargetStats()
    at_once.add([_hello(), *recs])
    for a in (pieces, at_once):
        for bk in (buckets, 10):  # a different bucket size starts afresh
            got = a.timeline(seconds, bk)
            want = _timeline_from_scratch(recs, a.now_ns, seconds, bk)
            assert got["t0_ns"] == want["t0_ns"] and got["steps"] == want["steps"]
            assert sum(want["steps"]) > 100 and not all(math.isnan(g) for g in want["gap_ms"])
            assert _same(got["step_ms"], want["step_ms"])
            assert _same(got["stage_ms"]["forward"], want["forward"])
            assert _same(got["gap_ms"], want["gap_ms"])


def test_timeline_memory_stays_fixed_over_a_long_run():
    """The timeline's per-bucket sums live in a ring of a fixed number of buckets.  They
    were a dict that nothing pruned (lost when the aggregator was split): a monitor left
    open grew by one entry every bucket (0.2 s on a 160-column screen), ~100 MB a day.
    Over 4 000 buckets, memory after the first 1 000 and at the end must agree, and the
    chart still equal a computation from scratch."""
    import tracemalloc

    seconds, buckets = 3.0, 30  # 0.1-s buckets; the sums keep 60
    a = TargetStats(capacity=2048)
    a.add([_hello()])
    tracemalloc.start()
    try:
        sid, t = 0, 0
        at_1000 = 0
        for batch in range(400):  # 1 s of 10-ms steps a batch
            recs = _steps(100, 4, 6, start_id=sid, t0=t)
            sid, t = sid + 100, t + 100 * 10 * MS
            a.add(recs)
            a.timeline(seconds, buckets)
            if batch == 99:
                at_1000 = tracemalloc.get_traced_memory()[0]
        grown = tracemalloc.get_traced_memory()[0] - at_1000
    finally:
        tracemalloc.stop()
    assert grown < 100_000, f"timeline memory grew by {grown} bytes over 3 000 buckets"
    kept = _steps(sid, 4, 6)[-int(seconds * 100) - 10 :]
    got = a.timeline(seconds, buckets)
    want = _timeline_from_scratch(kept, a.now_ns, seconds, buckets)
    assert got["t0_ns"] == want["t0_ns"] and got["steps"] == want["steps"] and sum(got["steps"]) >= 290
    assert _same(got["step_ms"], want["step_ms"]) and _same(got["gap_ms"], want["gap_ms"])


def test_timeline_after_a_quiet_spell_longer_than_its_ring():
    """The engine goes quiet for 100 s, far more than the buckets the timeline's ring
    keeps (60 of 0.1 s, all filled before), then steps for 1.5 s of the chart's 3: the
    chart's empty buckets sit in slots still holding old buckets, and must read empty;
    the filled ones must hold only the new steps (a computation from scratch)."""
    before = _steps(600, 4, 6)
    after = _steps(150, 4, 6, start_id=600, t0=before[-1].end_ns + 100_000 * MS)
    a = TargetStats()
    a.add([_hello()])
    a.add(before)
    a.timeline(3.0, 30)
    a.add(after[:70])
    a.timeline(3.0, 30)
    a.add(after[70:])
    got = a.timeline(3.0, 30)
    want = _timeline_from_scratch([before[-1], *after], a.now_ns, 3.0, 30)  # the 100 s gap: step 600's
    assert got["t0_ns"] == want["t0_ns"] and got["steps"] == want["steps"]
    assert sum(got["steps"]) == 150 and got["steps"].count(0) >= 12
    assert _same(got["step_ms"], want["step_ms"]) and _same(got["gap_ms"], want["gap_ms"])


def test_window_sums_slid_forward_equal_a_fresh_window():
    """window() slides its matrix sums (stages, exits, loop time/tokens) forward between
    calls; after uneven batches, a ring that wrapped and window sizes that alternate,
    every figure equals that of a fresh aggregator over the same rows."""
    rng = np.random.default_rng(3)
    recs = []
    t = 0
    for i in range(6000):
        d = int(rng.uniform(0.5, 3) * MS)
        exits = [int(x) for x in rng.integers(0, 5, 4)]
        loop = [int(x) for x in rng.integers(1, MS, 4)]
        recs.append(
            StepRecord(step_id=i, start_ns=t, end_ns=t + d, stage_ns=[d // 5, d // 2, d // 4],
                       exit_hist=exits, loop_ns=loop, loop_tokens=[8, 6, 4, 2], out_tokens=3)
        )  # fmt: skip
        t += d + int(rng.uniform(0, 2) * MS)
    slid = TargetStats(capacity=2048)  # wraps: 6000 steps through 2048 slots
    slid.add([_hello()])
    for i in _in_pieces(slid, recs, rng, 300):
        for sec in (1.0, 2.5):
            slid.window(sec)
        if i > 3000:
            fresh = TargetStats(capacity=2048)
            fresh.add([_hello(), *recs[:i]])
            for sec in (1.0, 2.5):
                a, b = slid.window(sec), fresh.window(sec)
                assert a.steps == b.steps > 0
                assert a.exit_hist == b.exit_hist and a.mean_exit_depth == b.mean_exit_depth
                assert a.loop_ms_mean == pytest.approx(b.loop_ms_mean)
                assert a.loop_tokens_mean == pytest.approx(b.loop_tokens_mean)
                assert a.stage_ms_mean == pytest.approx(b.stage_ms_mean)
    # and against numbers computed from the records themselves
    w = slid.window(2.5)
    inside = recs[-w.steps :]
    assert w.exit_hist == [sum(r.exit_hist[d] for r in inside) for d in range(4)]
    assert w.loop_ms_mean[0] == pytest.approx(sum(r.loop_ns[0] for r in inside) / len(inside) / MS)


def _idle_gaps_by_hand(recs, w0_ns, threshold_ms, names, limit, first_seen=None):
    """The idle-gap list written out plainly with numpy (np.nanmedian, np.median).
    ``first_seen``: step id -> grown stage of the gaps listed at earlier calls (a gap's
    grown stage is the one against the window's medians when it was first listed)."""
    first_seen = {} if first_seen is None else first_seen
    win = [r for r in recs if r.end_ns > w0_ns]
    start, end, ids = (np.array([getattr(r, f) for r in win]) for f in ("start_ns", "end_ns", "step_id"))
    g = (start[1:] - end[:-1]).astype(np.float64)
    g[np.diff(ids) != 1] = np.nan
    if threshold_ms is None:
        threshold_ms = max(1.0, 5 * float(np.nanmedian(g)) / 1e6)
    stages = np.array([r.stage_ns for r in win], dtype=np.int64)
    med, p99 = np.median(stages, axis=0), np.percentile(stages, 99, axis=0)
    out = []
    for i in np.nonzero(g / 1e6 > threshold_ms)[0][::-1][:limit]:
        if int(ids[i]) not in first_seen:
            over = stages[i] - med
            delta = np.where(over > 2 * (p99 - med), over, -np.inf)  # beyond its usual spread
            j = int(np.argmax(delta))
            first_seen[int(ids[i])] = names[j] if delta[j] > 0 else None
        out.append((int(end[i]), float(g[i] / 1e6), int(ids[i]), first_seen[int(ids[i])]))
    return threshold_ms, out


def test_idle_gaps_and_threshold_match_numpy_by_hand_as_the_window_moves():
    # random step lengths, stage times, long gaps and dropped records; each check after
    # a batch, and again after a heartbeat that moves the window with no new step
    rng = np.random.default_rng(11)
    names = ["schedule", "forward", "sample"]
    recs, t, sid = [], 0, 0
    for _ in range(3000):
        sid += 1 + int(rng.random() < 0.02)  # a dropped record now and then
        d = int(rng.integers(1, 4) * MS)
        stage = [int(x) for x in rng.integers(0, d // 3, 3)]
        recs.append(StepRecord(step_id=sid, start_ns=t, end_ns=t + d, stage_ns=stage))
        t += d + int(rng.choice([MS // 5, MS // 4, 30 * MS], p=[0.5, 0.49, 0.01]))
    a = TargetStats()
    a.add([_hello()])
    seen = 0
    first_seen: dict[int, str | None] = {}
    for k in (700, 1500, 2999):
        a.add(recs[seen:k])
        seen = k
        for moved_ms in (0, 900):
            if moved_ms:
                a.add([Stats(ts_ns=recs[k - 1].end_ns + moved_ms * MS, in_step_since_ns=0)])
            w0, _ = a.window_bounds(2.0)
            thr, want = _idle_gaps_by_hand(recs[:k], w0, None, names, 8, first_seen)
            assert a.idle_gap_threshold_ms(2.0) == thr
            got = a.idle_gaps(2.0, limit=8)
            assert want and [(x.at_ns, x.length_ms, x.after_step, x.grown_stage) for x in got] == want
            assert a.idle_gaps(2.0, threshold_ms=thr, limit=8) == got


def test_a_sleep_between_steps_whose_stages_ran_as_usual_names_no_stage() -> None:
    """An engine that sleeps 20 ms every 200 steps outside every stage (the loop engine's
    ``--stall-ms``): the steps before the gaps ran their stages as every other step did,
    within their usual spread, so no stage grew.  The screen once named whichever stage
    happened to be a few tens of microseconds over its median (``forward +0.021``)."""
    rng = np.random.default_rng(3)
    recs, t = [], 0
    for i in range(2000):
        st = [int(x) for x in rng.normal([45_000, 223_000, 22_000], [3_000, 15_000, 2_000])]
        recs.append(StepRecord(step_id=i, start_ns=t, end_ns=t + sum(st), stage_ns=st))
        t += sum(st) + (20 * MS if i % 200 == 199 else 3 * MS)
    a = TargetStats()
    a.add([_hello()])
    for i in range(0, len(recs), 100):
        a.add(recs[i : i + 100])
    gaps = a.idle_gaps(seconds=30.0)
    assert [g.after_step for g in gaps] == [1799, 1599, 1399, 1199, 999, 799, 599, 399]
    assert [g.grown_stage for g in gaps] == [None] * 8
