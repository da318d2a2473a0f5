"""Every consumer computes the window figures with the same code (engine_adapters.definitions.figures).

A real recording of the reference engine that spans an ops capture (profiled steps and
an export) must give the same idle, MBU and tokens/s in ``summary`` and ``compare``;
``compare`` used to keep the capture's wall time in its blocks (a B with one capture read
tokens/s 89 vs 99 for identical speed).

Each formula takes one window's floats or many windows' arrays, and compare's quarters
(drift check) and bootstrap resamples are checked against values worked out by hand
on a recording made by hand.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_rltperf
from tests.rltperf_tui.hand_recording import (
    hand_recording,
)
from tests.rltperf_tui.tui._uihelpers import RECORDING


def test_summary_and_compare_agree_on_a_recording_with_a_capture(tmp_path: Path) -> None:
    # B: the same recording with its last frame cut off (a copy would be refused as the
    # same input): another file, nearly the same figures; only A's are checked exactly
    a, b = tmp_path / "a.rltrec", tmp_path / "b.rltrec"
    shutil.copy(RECORDING, a)
    data = RECORDING.read_bytes()
    b.write_bytes(data[: len(data) - 200])
    summ = json.loads(run_rltperf("summary", str(a), "--json").stdout)
    assert summ["excluded"]["profiled_steps"] > 0 and summ["excluded"]["seconds"] > 1.0
    assert summ["baseline_s"] == pytest.approx(summ["wall_s"] - summ["excluded"]["seconds"], abs=1e-5)
    out = run_rltperf("compare", str(a), str(b), "--json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    got = {m["key"]: m for m in res["metrics"]}
    for key in ("tokens_per_s", "idle_fraction", "mbu"):
        assert got[key]["a"] == pytest.approx(summ[key], rel=1e-5), (key, got[key], summ[key])
        summ_b = json.loads(run_rltperf("summary", str(b), "--json").stdout)
        assert got[key]["b"] == pytest.approx(summ_b[key], rel=1e-5)


def test_each_formula_takes_scalars_and_arrays() -> None:
    """Each ratio and roofline formula gives, on arrays, element by element what it gives
    on one window's floats (a float, so one window prints as before), by hand."""
    import numpy as np

    from engine_adapters.definitions import figures as F
    from engine_adapters.definitions import roofline as RL

    busy = np.array([0.25, 0.5, 1.5, 0.0])  # s: the third is busy past its window
    secs = np.array([1.0, 2.0, 1.0, 0.5])
    assert F.idle_fraction(busy, secs) == pytest.approx([0.75, 0.75, 0.0, 1.0])
    assert F.per_second(np.array([10.0, 30.0]), np.array([2.0, 3.0])) == pytest.approx([5.0, 10.0])
    # 6e9 B in 2 s against 4 GB/s: 0.75; 3e9 B in 0.5 s: 1.5, never clipped
    assert F.mbu(np.array([6e9, 3e9]), np.array([2.0, 0.5]), 4.0) == pytest.approx([0.75, 1.5])
    assert RL.achieved_gbps(np.array([6e9, 3e9]), np.array([2.0, 0.5])) == pytest.approx([3.0, 6.0])
    assert RL.achieved_gflops(np.array([8e9]), np.array([4.0])) == pytest.approx([2.0])
    assert RL.arithmetic_intensity(np.array([8.0, 1.0]), np.array([2.0, 4.0])) == pytest.approx([4.0, 0.25])
    # the roof: 10 GB/s x intensity, capped at 50 GFLOP/s (the balance, 5 FLOP/B, is the knee)
    assert RL.machine_balance(50.0, 10.0) == 5.0
    assert RL.attainable_gflops(np.array([1.0, 5.0, 20.0]), 10.0, 50.0) == pytest.approx([10.0, 50.0, 50.0])
    assert RL.attainable_gflops(np.array([20.0]), 10.0, None) == pytest.approx([200.0])
    for i in range(busy.size):
        one = F.idle_fraction(float(busy[i]), float(secs[i]))
        assert type(one) is float and one == F.idle_fraction(busy, secs)[i]
    one_mbu = F.mbu(6e9, 2.0, 4.0)
    assert type(one_mbu) is float and one_mbu == 0.75
    for f in (RL.achieved_gbps, RL.achieved_gflops, RL.arithmetic_intensity, F.per_second):
        assert type(f(6.0, 2.0)) is float
    assert type(RL.attainable_gflops(2.0, 10.0, 50.0)) is float
    # the ratio table names the same functions by the keys compare and summary use
    sums = F.RatioSums(seconds=secs, tokens=np.array([4.0, 8.0, 2.0, 1.0]), busy_s=busy, nbytes=secs * 4e9)
    assert F.ratio_figure("idle_fraction", sums) == pytest.approx([0.75, 0.75, 0.0, 1.0])
    assert F.ratio_figure("tokens_per_s", sums) == pytest.approx([4.0, 4.0, 2.0, 2.0])
    assert F.ratio_figure("mbu", sums, 8.0) == pytest.approx([0.5] * 4)
    assert F.ratio_figure("mbu", sums, None) is None
    with pytest.raises(ValueError, match="not a ratio figure"):
        F.ratio_figure("step_ms", sums)


# --------------------------------------------------------------------------- quarters and bootstrap
#
# A recording made by hand: 80 steps of 10 ms, each after a 2 ms gap, so every step owns
# 12 ms and the recording is 0.96 s of baseline.  The quarters (20 steps, 0.24 s each)
# differ by design: output tokens 2, 3, 4, 5 per step; device busy 2, 4, 6, 8 ms per
# step; bytes 1.2, 2.4, 3.6, 4.8 MB per step.  Against a peak of 1 GB/s, by hand:
#
#   quarter        tokens/s              idle                      MBU
#   Q1   20*2/0.24 = 166.667   1 - 20*0.002/0.24 = 0.8333   20*1.2e6/(0.24*1e9) = 0.1
#   Q2   20*3/0.24 = 250       1 - 20*0.004/0.24 = 0.6667                         0.2
#   Q3   20*4/0.24 = 333.333   1 - 20*0.006/0.24 = 0.5                            0.3
#   Q4   20*5/0.24 = 416.667   1 - 20*0.008/0.24 = 0.3333                         0.4
#   all  280/0.96  = 291.667   1 - 0.4/0.96      = 0.5833    (24+48+72+96)e6/0.96e9 = 0.25
#
# The bootstrap's blocks are 10 steps (0.12 s; --block-s 0.115 asks for ≥ 9.6 steps), two
# per quarter: block b lies in quarter b // 2.

PEAK = 1.0  # GB/s
BY_HAND = {
    "tokens_per_s": [40 / 0.24, 60 / 0.24, 80 / 0.24, 100 / 0.24],
    "idle_fraction": [1 - 0.04 / 0.24, 1 - 0.08 / 0.24, 1 - 0.12 / 0.24, 1 - 0.16 / 0.24],
    "mbu": [0.1, 0.2, 0.3, 0.4],
}
WHOLE = {"tokens_per_s": 280 / 0.96, "idle_fraction": 1 - 0.4 / 0.96, "mbu": 0.25}


def test_quarters_and_bootstrap_resamples_are_the_window_figures_by_hand(tmp_path: Path) -> None:
    """compare's quarter values (drift check) and bootstrap resamples compute idle, MBU and
    tokens/s as the window does: each quarter and each resample is checked against the
    figures worked out by hand above, and the whole against ``summary``."""
    import numpy as np

    from rltperf_tui.analysis import compare as C
    from rltperf_tui.analysis import stats as S

    a = tmp_path / "a.rltrec"
    hand_recording(a)
    side = C.load_side("A", [str(a)], PEAK, block_s=0.115)
    (part,) = side.parts
    assert part["steps"] == 80 and part["span_s"] == pytest.approx(0.96)
    for key, want in BY_HAND.items():
        got = C._segment_values(part, key, PEAK)
        assert got == pytest.approx(want, rel=1e-12), key
    # no peak: no MBU quarters (never a ratio against a made-up peak)
    assert C._segment_values(part, "mbu", None) is None

    # the bootstrap: blocks of 10 steps; a resample is a row of block indices
    assert part["block_steps"] == 10
    bs = side.blocks()
    assert bs.span_s == pytest.approx([0.12] * 8)
    rows = np.array(
        [
            [0, 0, 0, 0, 0, 0, 0, 0],  # Q1 eight times
            [7, 7, 7, 7, 7, 7, 7, 7],  # Q4 eight times
            [0, 1, 2, 3, 4, 5, 6, 7],  # the recording itself
            [0, 7, 0, 7, 0, 7, 0, 7],  # Q1 and Q4 alike
            [2, 2, 4, 4, 4, 4, 6, 6],  # Q2 twice, Q3 four times, Q4 twice
        ]
    )
    q = BY_HAND
    want_rows = {
        # a row's value: Σ of its blocks' sums over Σ of their 0.12 s, by hand
        "tokens_per_s": [q["tokens_per_s"][0], q["tokens_per_s"][3], WHOLE["tokens_per_s"],
                         (10 * 2 + 10 * 5) / 0.24, (2 * 30 + 4 * 40 + 2 * 50) / 0.96],
        "idle_fraction": [q["idle_fraction"][0], q["idle_fraction"][3], WHOLE["idle_fraction"],
                          1 - (0.02 + 0.08) / 0.24, 1 - (2 * 0.04 + 4 * 0.06 + 2 * 0.08) / 0.96],
        "mbu": [0.1, 0.4, 0.25, (12e6 + 48e6) / 0.24e9, (2 * 24e6 + 4 * 36e6 + 2 * 48e6) / 0.96e9],
    }  # fmt: skip
    for key, want in want_rows.items():
        got = S.ratio_metric(bs, key, PEAK)(rows)
        assert got == pytest.approx(want, rel=1e-12), key

    # the whole recording, as compare states it, is summary's figure
    summ = json.loads(run_rltperf("summary", str(a), "--json", "--peak-gbps", str(PEAK)).stdout)
    for key, want in WHOLE.items():
        assert summ[key] == pytest.approx(want, rel=1e-12), key


def test_compare_reports_the_quarters_by_hand(tmp_path: Path) -> None:
    """End to end: B is faster, busier and moves more bytes than A, by far; compare finds
    tokens/s, idle and MBU past Holm and the smallest effect, states A and B as worked
    out by hand, and its drift check prints each side's quarters as worked out by hand."""
    a, b = tmp_path / "a.rltrec", tmp_path / "b.rltrec"
    hand_recording(a)
    # B by hand: tokens 8..11 per step; busy 9.5 ms and 6 MB in every step
    hand_recording(b, tokens=(8, 9, 10, 11), busy_ms=(9.5,) * 4, nbytes=(6_000_000,) * 4)
    b_quarters = {
        "tokens_per_s": [160 / 0.24, 180 / 0.24, 200 / 0.24, 220 / 0.24],
        "idle_fraction": [1 - 0.19 / 0.24] * 4,
        "mbu": [20 * 6e6 / 0.24e9] * 4,
    }
    b_whole = {"tokens_per_s": 760 / 0.96, "idle_fraction": 1 - 0.76 / 0.96, "mbu": 80 * 6e6 / 0.96e9}
    out = run_rltperf("compare", str(a), str(b), "--json", "--peak-gbps", str(PEAK), "--block-s", "0.115")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    got = {m["key"]: m for m in res["metrics"]}
    for key in ("tokens_per_s", "idle_fraction", "mbu"):
        # past Holm and the smallest effect, so the quarters were computed; A's own quarters
        # differ by design, which the drift check may hold against the difference
        assert got[key]["verdict"] in ("significant", "not established (drift)"), got[key]
        # the JSON rounds to 6 significant digits (figures) and 6 decimals (quarters)
        assert got[key]["a"] == pytest.approx(WHOLE[key], rel=1e-5), key
        assert got[key]["b"] == pytest.approx(b_whole[key], rel=1e-5), key
        segs = res["drift"]["segments"][key]
        assert segs["A1"] == pytest.approx(BY_HAND[key], abs=1e-6), (key, segs)
        assert segs["B1"] == pytest.approx(b_quarters[key], abs=1e-6), (key, segs)


def test_a_recording_ending_in_excluded_steps_keeps_its_quiet_tail(tmp_path: Path) -> None:
    """The quiet time after the last step is baseline (idle) time in the window, whether
    or not that step was excluded.  compare dropped it with an excluded last step (a
    recording that ends on a capture's export, then quiet), reading this one's tokens/s
    333.3 and idle 0.5 where summary reads 217.4 and 0.674.

    By hand: steps 75-79 exporting leave with their 5 x 12 ms; the 75 kept steps own
    0.90 s, the quiet tail adds 0.48 s: T = 1.38 s; tokens 75 x 4 = 300 -> 217.39 tok/s;
    busy 75 x 6 ms = 0.45 s -> idle 1 - 0.45 / 1.38 = 0.6739; bytes 75 x 1 MB -> MBU
    75e6 / (1.38 x 1e9) = 0.05435 against 1 GB/s."""
    a, b = tmp_path / "a.rltrec", tmp_path / "b.rltrec"
    flat = {"tokens": (4,) * 4, "busy_ms": (6,) * 4, "nbytes": (1_000_000,) * 4}
    hand_recording(a, **flat, excluded_from=75, quiet_ms=480)
    hand_recording(b, **flat, quiet_ms=480)
    want = {"tokens_per_s": 300 / 1.38, "idle_fraction": 1 - 0.45 / 1.38, "mbu": 75e6 / 1.38e9}
    summ = json.loads(run_rltperf("summary", str(a), "--json", "--peak-gbps", str(PEAK)).stdout)
    assert summ["baseline_s"] == pytest.approx(1.38)
    out = run_rltperf("compare", str(a), str(b), "--json", "--peak-gbps", str(PEAK))
    assert out.returncode == 0, out.stderr
    got = {m["key"]: m for m in json.loads(out.stdout)["metrics"]}
    for key, v in want.items():
        assert summ[key] == pytest.approx(v, rel=1e-9), key
        assert got[key]["a"] == pytest.approx(v, rel=1e-5), (key, got[key]["a"], v)
    # the quarters too: the last holds the tail (19 kept steps, 0.228 s + 0.48 s)
    from rltperf_tui.analysis import compare as C

    (part,) = C.load_side("A", [str(a)], PEAK).parts
    assert part["span_s"] == pytest.approx(1.38)
    q = C._segment_values(part, "tokens_per_s", PEAK)
    assert q == pytest.approx([19 * 4 / 0.228, 19 * 4 / 0.228, 19 * 4 / 0.228, 18 * 4 / (0.216 + 0.48)])
