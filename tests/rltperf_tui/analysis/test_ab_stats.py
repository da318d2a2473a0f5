"""The A/B statistics against hand-computed numbers and known-answer synthetic series."""

from __future__ import annotations

import numpy as np
import pytest

from rltperf_tui.analysis import stats as S


def test_holm_matches_hand_computation() -> None:
    # sorted p: 0.01 (x4 = 0.04), 0.02 (x3 = 0.06), 0.03 (x2 = 0.06), 0.5 (x1 = 0.5)
    assert S.holm([0.03, 0.5, 0.01, 0.02]) == pytest.approx([0.06, 0.5, 0.04, 0.06])
    assert S.holm([0.9, 0.9]) == [1.0, 1.0]


def test_block_indices_are_contiguous_blocks() -> None:
    rng = np.random.default_rng(1)
    idx = S.block_indices(100, 10, 50, rng)
    assert idx.shape == (50, 100)
    assert idx.min() >= 0 and idx.max() <= 99
    blocks = idx.reshape(50, 10, 10)
    assert (np.diff(blocks, axis=2) == 1).all()  # each block is a run of consecutive samples


def test_min_samples_and_block_length() -> None:
    assert S.min_samples(99) == 500 and S.min_samples(95) == 100 and S.min_samples(50) == 10
    assert S.block_length(1000) == 10
    iid = np.random.default_rng(0).normal(size=3000)
    assert S.auto_block_length(iid) == S.block_length(3000)
    # a slow wave: strongly autocorrelated, needs long blocks
    wave = np.sin(np.arange(3000) / 100.0) + 0.1 * np.random.default_rng(0).normal(size=3000)
    assert S.auto_block_length(wave) > 100


def test_known_shift_is_significant_and_same_distribution_is_not() -> None:
    rng = np.random.default_rng(42)
    a = rng.gamma(4.0, 0.25, size=4000)  # ms
    b_same = rng.gamma(4.0, 0.25, size=4000)
    b_tail = np.where(np.arange(4000) % 10 == 0, a + 20.0, a) + rng.normal(0, 0.01, 4000)
    diffs = [
        S.compare_stat("gap P99", "ms", a, b_tail, 99, rng, 400),
        S.compare_stat("gap P50", "ms", a, b_same, 50, rng, 400),
        S.compare_stat("gap P99 same", "ms", a, b_same, 99, rng, 400),
    ]
    S.decide(diffs)
    assert diffs[0].significant and diffs[0].diff is not None and diffs[0].diff > 15
    assert diffs[0].ci_low is not None and diffs[0].ci_low > 10
    assert not diffs[1].significant and "holm" in diffs[1].failed
    assert diffs[1].verdict.startswith("not significant")
    assert "not significant after Holm: p=" in diffs[1].reason
    assert not diffs[2].significant


def test_small_effect_below_smallest_effect_of_interest() -> None:
    rng = np.random.default_rng(3)
    a = rng.normal(10.0, 0.05, 4000)
    b = a + 0.2  # a real 2 % shift with a tiny CI
    d = S.compare_stat("step P50", "ms", a, b, 50, rng, 300)
    S.decide([d], min_effect=0.05)
    assert d.verdict == "below min effect" and d.failed == ["min_effect"]
    assert d.reason.startswith("below the smallest effect of interest (5% of A: ")
    d2 = S.compare_stat("step P50", "ms", a, b, 50, rng, 300)
    S.decide([d2], min_effect=0.01)
    assert d2.significant


def test_too_few_samples_for_a_tail_percentile() -> None:
    rng = np.random.default_rng(0)
    d = S.compare_stat("TPOT P99", "ms", rng.normal(size=200), rng.normal(size=200), 99, rng)
    assert d.verdict == "too few samples" and "needs at least 500" in d.reason and d.p is None


def test_ratio_metric_blocks_add_up_to_the_whole() -> None:
    start = np.arange(10, dtype=np.int64) * 1_000_000  # a step every 1 ms
    end = start + 400_000  # 0.4 ms each
    busy = np.full(10, 300_000.0)
    bs = S.block_sums(start, end, np.full(10, 2.0), busy, np.full(10, 1e6), 3)
    assert bs.span_s.sum() == pytest.approx((end[-1] - start[0]) / 1e9)
    f = S.ratio_metric(bs, "idle_fraction")
    idle = f(np.arange(bs.span_s.size)[None, :])[0]
    assert idle == pytest.approx(1 - 10 * 0.3 / 9.4)  # 1 - busy / (last end - first start)
    tok = S.ratio_metric(bs, "tokens_per_s")(np.arange(bs.span_s.size)[None, :])[0]
    assert tok == pytest.approx(20 / 9.4e-3)
    mbu = S.ratio_metric(bs, "mbu", peak_bw_gbps=10.0)(np.arange(bs.span_s.size)[None, :])[0]
    assert mbu == pytest.approx(1e7 / (9.4e-3 * 10e9))


def test_segment_values() -> None:
    x = np.concatenate([np.full(250, 1.0), np.full(250, 3.0)])
    assert S.segment_values(x, 50, k=2) == [1.0, 3.0]
    assert S.spread(S.segment_values(x, 50, k=4)) == 2.0
    assert S.segment_values(np.ones(150), 99) is None  # a P99 segment needs 100 samples


@pytest.mark.slow
def test_bench_capture_figures() -> None:
    """``rltperf bench capture`` on the loop engine: every figure present and sane."""
    import argparse

    from rltperf_tui.bench import capture

    r = capture.run(argparse.Namespace(target=None, steps=4, repeats=1, modes="ops,full", token=None))
    assert r["ok"], r
    ops, full = r["modes"]["ops"], r["modes"]["full"]
    for m in (ops, full):
        assert m["captures"] == 1 and m["to_first_step_steps"] >= 1 and m["to_first_step_ms"] > 0
        assert m["slowdown"] > 0 and m["export_s"] > 0 and m["trace_bytes_per_step"] > 0
    # full records shapes, memory and stacks: more events per step than ops
    assert full["events_per_step"] > ops["events_per_step"]


def test_reasons_name_each_failed_condition_with_its_numbers() -> None:
    """Hand-set figures: a Holm-failed difference whose uncorrected interval excludes 0
    says so (it once read "CI [1.873, 5.246] includes 0 or p=0.144"), and a difference
    failing both conditions names both."""
    d = S.Diff("TPOT P95", "ms", 10.0, 13.5, diff=3.5, rel=0.35, ci_low=1.873, ci_high=5.246, p=0.012)
    others = [
        S.Diff(f"m{i}", "ms", 10.0, 10.0, diff=0.0, rel=0.0, ci_low=-1, ci_high=1, p=0.9) for i in range(11)
    ]
    S.decide([d, *others])
    assert d.p_holm == pytest.approx(0.144)  # 12 metrics x 0.012
    assert d.failed == ["holm"] and d.verdict == "not significant after Holm"
    assert d.reason == (
        "not significant after Holm: p=0.144 ≥ 0.05 over 12 metrics (uncorrected p=0.012); the 95% CI "
        "[1.873, 5.246] ms excludes 0 but is not corrected for comparing 12 metrics at once"
    )
    e = S.Diff(
        "gap P50", "ms", 0.6085, 0.615, diff=0.0065, rel=0.0065 / 0.6085, ci_low=-0.005, ci_high=0.02, p=0.4
    )
    S.decide([e], min_effect=0.05)
    assert e.failed == ["holm", "min_effect"] and e.verdict == "not significant, below min effect"
    assert "includes 0" in e.reason
    assert (
        "below the smallest effect of interest (5% of A: 0.03043 ms): |B-A| is 0.0065 ms (+1.1% of A)"
        in e.reason
    )
