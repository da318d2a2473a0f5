"""Roofline functions against numbers computed by hand.

The reference shape is Ouro-1.4B (hidden 2048, MLP 5632, 24 layers, 16 heads of 128,
vocabulary 49152, all 24 layers looped 4 times, bf16) on an H200 (4.8 TB/s, 989.5
TFLOP/s dense bf16).  By hand:

    per layer  attention 4 x 2048^2 = 16,777,216; MLP 3 x 2048 x 5632 = 34,603,008;
               four RMSNorms 4 x 2048 = 8,192                     -> 51,388,416
    24 layers  1,233,321,984 parameters, read once per loop pass    x 4 loops
    LM head    49152 x 2048 = 100,663,296, read once per step
    bytes      (1,233,321,984 x 4 + 100,663,296) x 2 = 10,067,902,464 B  ~ 10.07 GB
    ceiling    10,067,902,464 / 4.8e12 = 2.0975 ms per decode step at batch 1
    FLOPs      2 per parameter used per token = 10,067,902,464 at batch 1
"""

from __future__ import annotations

import numpy as np
import pytest

from engine_adapters.definitions import figures as F
from engine_adapters.definitions import roofline
from engine_adapters.definitions.records import SCHEMA_VERSION, Ceiling, EngineInfo, Hello, StepRecord
from rltperf_tui.live.aggregator import TargetStats

LAYER = 4 * 2048 * 2048 + 3 * 2048 * 5632 + 4 * 2048
BLOCK = 24 * LAYER
HEAD = 49152 * 2048
OURO_BYTES = 10_067_902_464  # by hand, above
H200_BW = 4800.0  # GB/s
H200_BF16 = 989_500.0  # GFLOP/s


def test_ouro_decode_step_bytes_by_hand() -> None:
    assert LAYER == 51_388_416 and BLOCK == 1_233_321_984
    b = roofline.looped_step_bytes(block_params=BLOCK, loops=4, once_params=HEAD, dtype_bytes=2)
    assert b == OURO_BYTES
    assert b / 1e9 == pytest.approx(10.07, abs=0.005)
    # KV is added as read + written
    assert (
        roofline.looped_step_bytes(block_params=BLOCK, loops=4, once_params=HEAD, kv_read=1000, kv_written=24)
        == OURO_BYTES + 1024
    )


def test_ouro_on_h200_ceiling_is_2_1_ms_at_batch_1() -> None:
    flops = float(OURO_BYTES)  # 2 FLOPs per bf16 parameter (2 bytes): 1 FLOP per byte
    t = float(roofline.ceiling_time_s(OURO_BYTES, flops, H200_BW, H200_BF16))
    assert t == pytest.approx(2.0975e-3, rel=1e-4)
    assert round(t * 1e3, 1) == 2.1
    # intensity 1 FLOP/B against a balance of 206 FLOP/B: memory-bound
    assert roofline.arithmetic_intensity(flops, OURO_BYTES) == 1.0
    assert roofline.machine_balance(H200_BF16, H200_BW) == pytest.approx(206.15, abs=0.01)
    assert roofline.verdict(1.0, 206.15, 0.1) == "memory-bound"


def test_large_batch_crosses_into_compute_bound() -> None:
    # batch 256 shares the weight reads: bytes stay ~10.07 GB, FLOPs x 256
    flops = 256.0 * OURO_BYTES
    t = float(roofline.ceiling_time_s(OURO_BYTES, flops, H200_BW, H200_BF16))
    assert t == pytest.approx(256 * OURO_BYTES / 989.5e12, rel=1e-9)  # 2.605 ms > 2.0975 ms
    assert t == pytest.approx(2.6047e-3, rel=1e-4)
    assert roofline.verdict(256.0, 206.15, 0.0) == "compute-bound"
    # without a FLOP/s peak, the memory term alone
    assert float(roofline.ceiling_time_s(OURO_BYTES, flops, H200_BW, None)) == pytest.approx(
        2.0975e-3, rel=1e-4
    )


def test_window_roofline_by_hand() -> None:
    # 100 Ouro decode steps in a 0.5 s window, the device idle for 60 % of the steps themselves
    rp = roofline.window_roofline(total_bytes=100 * OURO_BYTES, total_flops=100.0 * OURO_BYTES, seconds=0.5,
                                  peak_bw_gbps=H200_BW, peak_gflops=H200_BF16, in_step_idle=0.6)  # fmt: skip
    assert rp.achieved_gbps == pytest.approx(2013.58, abs=0.01)  # 1.0068e12 B / 0.5 s
    assert rp.mbu == pytest.approx(2013.58 / 4800, rel=1e-5)  # 0.4195
    assert rp.achieved_gflops == pytest.approx(2013.58, abs=0.01)
    assert rp.mfu == pytest.approx(2013.58 / 989_500, rel=1e-5)
    assert rp.intensity == 1.0 and rp.balance == pytest.approx(206.15, abs=0.01)
    assert rp.verdict == "host-bound"  # in-step idle dominates whatever the intensity
    busy = roofline.window_roofline(total_bytes=100 * OURO_BYTES, total_flops=100.0 * OURO_BYTES, seconds=0.5,
                                    peak_bw_gbps=H200_BW, peak_gflops=H200_BF16, in_step_idle=0.05)  # fmt: skip
    assert busy.verdict == "memory-bound"


def test_window_roofline_unknowns_are_none_not_zero() -> None:
    rp = roofline.window_roofline(total_bytes=None, total_flops=None, seconds=1.0, peak_bw_gbps=None,
                                  peak_gflops=None, in_step_idle=None)  # fmt: skip
    assert (rp.achieved_gbps, rp.mbu, rp.intensity, rp.balance, rp.mfu, rp.verdict) == (
        None, None, None, None, None, "unknown",
    )  # fmt: skip
    rp = roofline.window_roofline(total_bytes=1e9, total_flops=None, seconds=1.0, peak_bw_gbps=None,
                                  peak_gflops=None, in_step_idle=0.1)  # fmt: skip
    assert rp.achieved_gbps == 1.0 and rp.mbu is None  # no ceiling: MBU unknown
    rp = roofline.window_roofline(total_bytes=1e9, total_flops=1e9, seconds=0.0, peak_bw_gbps=10.0,
                                  peak_gflops=10.0, in_step_idle=None)  # fmt: skip
    assert rp.achieved_gbps is None and rp.mbu is None  # empty window


def test_mbu_over_one_is_reported_as_is() -> None:
    # a wrong byte count gives MBU > 1: the function must not clip it (the UI flags it)
    assert F.mbu(3e9, 0.5, 4.0) == pytest.approx(1.5)


def test_step_roofline_by_hand() -> None:
    b = [OURO_BYTES, OURO_BYTES, np.nan]
    f = [float(OURO_BYTES), float(OURO_BYTES), np.nan]
    dur = [2.5e-3, 4.2e-3, 3.0e-3]
    busy = [2.4e-3, 1.0e-3, np.nan]
    s = roofline.step_roofline(b, f, dur, H200_BW, H200_BF16, busy)
    assert s.achieved_gbps[0] == pytest.approx(OURO_BYTES / 2.5e-3 / 1e9)  # 4027.2 GB/s
    assert s.mbu[0] == pytest.approx(4027.16 / 4800, rel=1e-5)  # 0.839
    assert s.ceiling_s[0] == pytest.approx(2.0975e-3, rel=1e-4)
    assert s.efficiency[0] == pytest.approx(2.0975 / 2.5, rel=1e-4)
    assert s.efficiency[1] == pytest.approx(2.0975 / 4.2, rel=1e-4)
    assert s.busy_fraction[0] == pytest.approx(0.96) and s.busy_fraction[1] == pytest.approx(1.0 / 4.2)
    assert s.verdict == ["memory-bound", "host-bound", "unknown"]
    assert np.isnan(s.mbu[2]) and np.isnan(s.intensity[2]) and np.isnan(s.ceiling_s[2])
    no_peak = roofline.step_roofline(b, f, dur, None, None)
    assert np.isnan(no_peak.mbu).all() and np.isnan(no_peak.ceiling_s).all()
    assert no_peak.achieved_gbps[0] == pytest.approx(4027.16, rel=1e-5)


def test_aggregator_uses_the_roofline_and_the_hello_ceiling() -> None:
    """Ten Ouro decode steps of 2.5 ms back to back, 2.4 ms busy each, on an H200."""
    st = TargetStats()
    ceiling = Ceiling(device="NVIDIA H200", peak_bw_gbps=H200_BW, peak_gflops=H200_BF16, dtype="bfloat16",
                      source="spec table")  # fmt: skip
    hello = Hello(
        schema=SCHEMA_VERSION, engine=EngineInfo(name="t"), stage_names=["forward"], ceiling=ceiling
    )
    t0 = 1_000_000_000
    steps = [
        StepRecord(step_id=i, start_ns=t0 + i * 2_500_000, end_ns=t0 + (i + 1) * 2_500_000, batch=1, tokens=1,
                   busy_ns=2_400_000, bytes_read=OURO_BYTES - 1000, bytes_written=1000, flops=float(OURO_BYTES),
                   out_tokens=1)
        for i in range(10)
    ]  # fmt: skip
    st.add([hello, *steps])
    w = st.window(None)
    assert w.span_s == pytest.approx(0.025)
    assert w.mbu == pytest.approx(10 * OURO_BYTES / (0.025 * 4.8e12), rel=1e-6)  # 0.839
    assert w.ceiling_ms_p50 == pytest.approx(2.0975, rel=1e-4)
    assert w.idle_fraction == pytest.approx(0.04, abs=1e-6)
    assert w.verdict == "memory-bound"
    assert not w.mbu_overcount
