"""Roofline arithmetic (pure functions; docs/ARCHITECTURE.md, "Where each figure is defined").

Units: bytes, FLOPs, seconds; bandwidth in GB/s (10^9 B/s) and compute in GFLOP/s
(10^9 FLOP/s).  Peak bandwidth follows the STREAM convention (a copy of S bytes moves
2·S), and a step's bytes are what it reads plus what it writes, so MBU of a kernel that
streams its weights once is at most about 1.

Each formula is written once and takes scalars (a window) or numpy arrays (one value
per step); MBU is the window's (``figures.mbu``).  The monitor's window, ``report``'s
roofline points, ``compare``'s roofline series and the charts all call these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine_adapters.definitions.figures import Num, mbu, quotient

HOST_BOUND_IDLE = 0.5
"""Device idle *inside the steps* above which a step (or a window's steps) is called
host-bound whatever its intensity.  The gaps between steps never count here: they
follow the load, not the step, and are shown as idle beside the verdict."""


def achieved_gbps(total_bytes: Num, seconds: Num) -> Num:
    """Achieved bandwidth, GB/s: bytes / seconds / 10^9."""
    return quotient(quotient(total_bytes, seconds), 1e9)


def achieved_gflops(total_flops: Num, seconds: Num) -> Num:
    """Achieved compute, GFLOP/s: FLOPs / seconds / 10^9."""
    return quotient(quotient(total_flops, seconds), 1e9)


def arithmetic_intensity(flops: Num, nbytes: Num) -> Num:
    """FLOPs per byte moved."""
    return quotient(flops, nbytes)


def machine_balance(peak_gflops: float, peak_bw_gbps: float) -> float:
    """Peak FLOP/s over peak bytes/s (FLOP per byte); below it a kernel is memory-bound."""
    return float(quotient(peak_gflops, peak_bw_gbps))


def attainable_gflops(intensity: Num, peak_bw_gbps: float, peak_gflops: float | None) -> Num:
    """The roof at arithmetic ``intensity``: min(peak bandwidth × intensity, peak FLOP/s),
    GFLOP/s (the bandwidth slope alone without a FLOP/s peak)."""
    roof: Any = np.multiply(peak_bw_gbps, intensity)
    if peak_gflops:
        roof = np.minimum(roof, peak_gflops)
    out: Any = roof if np.ndim(roof) else float(roof)  # one point: a float
    return out


def ceiling_time_s(nbytes: Any, flops: Any, peak_bw_gbps: float, peak_gflops: float | None) -> Any:
    """Roofline floor of a step: max(bytes / peak BW, FLOPs / peak FLOP/s), seconds.

    Works on scalars and numpy arrays alike.
    """
    t_mem = np.asarray(nbytes, dtype=np.float64) / (peak_bw_gbps * 1e9)
    if not peak_gflops:
        return t_mem
    t_cmp = np.asarray(flops, dtype=np.float64) / (peak_gflops * 1e9)
    return np.maximum(t_mem, t_cmp)


def verdict(intensity: float | None, balance: float | None, in_step_idle: float | None) -> str:
    """The verdict on the step itself: ``host-bound`` when the device was idle for more
    than half of the step's own time (``in_step_idle`` = 1 − busy / step time, gaps
    between steps excluded), else ``memory-bound`` / ``compute-bound`` by arithmetic
    intensity against machine balance; ``unknown`` without the numbers to say."""
    if in_step_idle is not None and in_step_idle > HOST_BOUND_IDLE:
        return "host-bound"
    if intensity is None or balance is None:
        return "unknown"
    return "memory-bound" if intensity < balance else "compute-bound"


def mfu(total_flops: Num, seconds: Num, peak_gflops: float) -> Num:
    """Model FLOP/s utilisation: achieved FLOP/s over peak FLOP/s."""
    return quotient(total_flops, np.multiply(seconds, peak_gflops) * 1e9)


def looped_step_bytes(
    *,
    block_params: float,
    loops: int,
    once_params: float = 0.0,
    dtype_bytes: float = 2.0,
    kv_read: float = 0.0,
    kv_written: float = 0.0,
) -> float:
    """Bytes a decode step of a looped transformer moves (docs/ARCHITECTURE.md, "Units and conventions").

    The shared block's weights are read once per loop pass (``loops`` times), weights
    used once per step (``once_params``: e.g. the LM head) once; plus the KV cache read
    and written.  Embedding rows and norms are negligible and left to the caller.
    """
    return (block_params * loops + once_params) * dtype_bytes + kv_read + kv_written


@dataclass
class RooflinePoint:
    """Roofline figures of one window."""

    achieved_gbps: float | None
    """Achieved bandwidth over the window, GB/s."""
    achieved_gflops: float | None
    """Achieved FLOP/s over the window, GFLOP/s."""
    mbu: float | None
    """Model bandwidth utilisation (bytes / (seconds x peak bandwidth))."""
    intensity: float | None
    """Arithmetic intensity, FLOP per byte."""
    balance: float | None
    """Machine balance, FLOP per byte (peak FLOP/s / peak bandwidth)."""
    verdict: str
    """``memory-bound``, ``compute-bound``, ``host-bound`` or ``unknown``."""
    mfu: float | None = None
    """Model FLOP/s utilisation (FLOPs / (seconds x peak FLOP/s))."""


def window_roofline(
    *,
    total_bytes: float | None,
    total_flops: float | None,
    seconds: float,
    peak_bw_gbps: float | None,
    peak_gflops: float | None,
    in_step_idle: float | None,
) -> RooflinePoint:
    """All roofline figures of a window; None wherever an input is unknown.  The verdict
    uses ``in_step_idle`` (device idle inside the window's steps, not between them)."""
    ok = seconds > 0
    gbps = achieved_gbps(total_bytes, seconds) if ok and total_bytes is not None else None
    gfl = achieved_gflops(total_flops, seconds) if ok and total_flops is not None else None
    m = mbu(total_bytes, seconds, peak_bw_gbps) if ok and total_bytes is not None and peak_bw_gbps else None
    mf = mfu(total_flops, seconds, peak_gflops) if ok and total_flops is not None and peak_gflops else None
    ai = arithmetic_intensity(total_flops, total_bytes) if total_flops is not None and total_bytes else None
    bal = machine_balance(peak_gflops, peak_bw_gbps) if peak_gflops and peak_bw_gbps else None
    return RooflinePoint(gbps, gfl, m, ai, bal, verdict(ai, bal, in_step_idle), mf)


@dataclass
class StepRoofline:
    """Roofline figures per step (numpy arrays, one entry per step; NaN where unknown)."""

    achieved_gbps: np.ndarray
    """Bytes of the step over its duration, GB/s."""
    mbu: np.ndarray
    """The step's bytes over (its duration x peak bandwidth)."""
    intensity: np.ndarray
    """FLOP per byte of the step."""
    ceiling_s: np.ndarray
    """Roofline floor of the step, seconds (``ceiling_time_s``)."""
    efficiency: np.ndarray
    """Ceiling time over the step's duration (1 = at the roofline)."""
    busy_fraction: np.ndarray
    """Device busy time over the step's duration."""
    verdict: list[str]
    """Per step: ``host-bound`` when the device was busy less than half the step, else
    ``memory-bound``/``compute-bound`` by intensity against balance, else ``unknown``."""


def step_roofline(
    nbytes: Any,
    flops: Any,
    seconds: Any,
    peak_bw_gbps: float | None,
    peak_gflops: float | None,
    busy_s: Any = None,
) -> StepRoofline:
    """Roofline figures of each step from per-step bytes, FLOPs, durations (and busy time).

    Inputs are equal-length sequences; NaN (or None) marks an unknown value and gives
    NaN in the outputs that depend on it.
    """
    b = np.asarray(nbytes, dtype=np.float64)
    f = np.asarray(flops, dtype=np.float64)
    s = np.asarray(seconds, dtype=np.float64)
    busy = np.full_like(s, np.nan) if busy_s is None else np.asarray(busy_s, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        s_ok = np.where(s > 0, s, np.nan)
        gbps = achieved_gbps(b, s_ok)
        m = mbu(b, s_ok, peak_bw_gbps) if peak_bw_gbps else np.full_like(s, np.nan)
        ai = np.where(b > 0, arithmetic_intensity(f, b), np.nan)
        if peak_bw_gbps:
            ceil = np.asarray(ceiling_time_s(b, np.where(np.isnan(f), 0.0, f), peak_bw_gbps, peak_gflops))
        else:
            ceil = np.full_like(s, np.nan)
        eff = ceil / s_ok
        busy_frac = busy / s_ok
    bal = machine_balance(peak_gflops, peak_bw_gbps) if peak_gflops and peak_bw_gbps else None
    verdicts = [
        verdict(
            None if np.isnan(a) else float(a),
            bal,
            None if np.isnan(bf) else 1.0 - float(bf),
        )
        for a, bf in zip(ai, busy_frac, strict=True)
    ]
    return StepRoofline(gbps, m, ai, ceil, eff, busy_frac, verdicts)
