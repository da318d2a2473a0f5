"""Roofline arithmetic (pure functions; DESIGN.md's definitions).

Units: bytes, FLOPs, seconds; bandwidth in GB/s (10^9 B/s) and compute in GFLOP/s
(10^9 FLOP/s).  Peak bandwidth follows the STREAM convention (a copy of S bytes moves
2·S), and a step's bytes are what it reads plus what it writes, so MBU of a kernel that
streams its weights once is at most about 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

HOST_BOUND_IDLE = 0.5
"""Idle fraction above which a window is called host-bound whatever its intensity."""


def achieved_gbps(total_bytes: float, seconds: float) -> float:
    """Achieved bandwidth, GB/s."""
    return total_bytes / seconds / 1e9


def mbu(total_bytes: float, seconds: float, peak_bw_gbps: float) -> float:
    """Model bandwidth utilisation: achieved bytes/s over peak bytes/s."""
    return total_bytes / (seconds * peak_bw_gbps * 1e9)


def arithmetic_intensity(flops: float, nbytes: float) -> float:
    """FLOPs per byte moved."""
    return flops / nbytes


def machine_balance(peak_gflops: float, peak_bw_gbps: float) -> float:
    """Peak FLOP/s over peak bytes/s (FLOP per byte); below it a kernel is memory-bound."""
    return peak_gflops / peak_bw_gbps


def ceiling_time_s(nbytes: Any, flops: Any, peak_bw_gbps: float, peak_gflops: float | None) -> Any:
    """Roofline floor of a step: max(bytes / peak BW, FLOPs / peak FLOP/s), seconds.

    Works on scalars and numpy arrays alike.
    """
    t_mem = np.asarray(nbytes, dtype=np.float64) / (peak_bw_gbps * 1e9)
    if not peak_gflops:
        return t_mem
    t_cmp = np.asarray(flops, dtype=np.float64) / (peak_gflops * 1e9)
    return np.maximum(t_mem, t_cmp)


def verdict(intensity: float | None, balance: float | None, idle_fraction: float | None) -> str:
    """``host-bound`` when idle dominates, else ``memory-bound`` / ``compute-bound``,
    ``unknown`` without the numbers to say."""
    if idle_fraction is not None and idle_fraction > HOST_BOUND_IDLE:
        return "host-bound"
    if intensity is None or balance is None:
        return "unknown"
    return "memory-bound" if intensity < balance else "compute-bound"


@dataclass
class RooflinePoint:
    """Roofline figures of one window."""

    achieved_gbps: float | None
    achieved_gflops: float | None
    mbu: float | None
    intensity: float | None
    balance: float | None
    verdict: str


def window_roofline(
    *,
    total_bytes: float | None,
    total_flops: float | None,
    seconds: float,
    peak_bw_gbps: float | None,
    peak_gflops: float | None,
    idle_fraction: float | None,
) -> RooflinePoint:
    """All roofline figures of a window; None wherever an input is unknown."""
    ok = seconds > 0
    gbps = achieved_gbps(total_bytes, seconds) if ok and total_bytes is not None else None
    gfl = total_flops / seconds / 1e9 if ok and total_flops is not None else None
    m = mbu(total_bytes, seconds, peak_bw_gbps) if ok and total_bytes is not None and peak_bw_gbps else None
    ai = arithmetic_intensity(total_flops, total_bytes) if total_flops is not None and total_bytes else None
    bal = machine_balance(peak_gflops, peak_bw_gbps) if peak_gflops and peak_bw_gbps else None
    return RooflinePoint(gbps, gfl, m, ai, bal, verdict(ai, bal, idle_fraction))
