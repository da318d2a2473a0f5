"""What a window query of ``TargetStats`` returns: ``Window`` (every figure of one window,
as the screen, ``summary --json`` and the triggers read it) and ``IdleGap``.

Computed in ``rltperf_tui.live.step_windows``; the definitions are in
``engine_adapters.definitions.figures`` (docs/ARCHITECTURE.md, "Where each figure is defined").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine_adapters.definitions import roofline
from engine_adapters.definitions.energy import CAVEATS
from engine_adapters.definitions.order_stats import median
from rltperf_tui.live.step_rings import MAX_DEPTH


@dataclass
class Window:
    """Statistics of one window; every figure says what it is in the UI."""

    seconds: float
    span_s: float
    """Window wall time (``w1 − w0``), excluded time included."""
    steps: int
    step_ms: dict[str, float | None]
    gap_ms: dict[str, float | None]
    step_ms_mean: float | None
    stage_ms_mean: dict[str, float]
    idle_fraction: float | None
    busy_known_steps: int
    achieved_gbps: float | None
    achieved_gflops: float | None
    mbu: float | None
    mbu_overcount: bool
    intensity: float | None
    balance: float | None
    verdict: str
    ceiling_ms_p50: float | None
    tokens_per_s: float | None
    steps_per_s: float | None
    ttft_ms: dict[str, float | None]
    tpot_ms: dict[str, float | None]
    requests_ok: int
    requests_failed: int
    goodput_rps: float | None
    exit_hist: list[int]
    mean_exit_depth: float | None
    loop_ms_mean: list[float]
    loop_tokens_mean: list[float]
    spec_drafts: int
    spec_drafted: int
    spec_accepted: int
    acceptance_rate: float | None
    mean_acceptance_len: float | None
    profiled_steps: int
    warmup_steps: int
    exporting_steps: int
    baseline_s: float = 0.0
    """The figures' denominator: wall time less ``excluded_s``."""
    excluded_s: float = 0.0
    """Time owned by profiled/exporting/warm-up steps (left out of every figure)."""
    requests_excluded: int = 0
    """Requests in flight during excluded time (left out of TTFT/TPOT and goodput)."""
    quiet_s: float = 0.0
    """Data time since the newest step ended (0 while steps come)."""
    in_step_idle: float | None = None
    """1 − Σ busy / Σ step time over the window's steps (the verdict's input)."""
    ring_cut: bool = False
    """The step ring no longer holds the window's oldest steps (a stream faster than the
    ring holds for the window): the window is ``span_s``, the steps kept, not ``seconds``
    (``StepWindows.bounds``)."""
    blind: bool = False
    """Excluded steps own more than half of this window (``figures.blind``: a capture's
    export longer than the window): its own figures stand on too little."""
    stale_s: float | None = None
    """Set on a live window that was blind (``TargetStats.window``): the figures are those
    of the newest window that was not, this many seconds of data time older; the step
    counts left out (profiled, exporting, warm-up, requests) and ``quiet_s`` are this
    window's.  None: the figures are this window's own."""

    power_w: float | None = None
    """Mean device power over the window's baseline time, from the device's energy counter."""
    joules_per_token: float | None = None
    """Power / tokens/s: joules per output token (``definitions/figures.py``)."""
    joules_per_step: float | None = None
    """Power / steps/s: joules per baseline step."""
    energy_source: str | None = None
    """The counter behind the energy figures: ``nvml`` or ``rapl`` (``definitions.energy.CAVEATS``)."""
    energy_na: str | None = None
    """Why there are no energy figures: no counter (the device's reason), or too few readings yet."""

    def energy_summary(self) -> dict[str, Any]:
        """The ``energy`` object of ``summary --json``: figures, source, caveat, reason."""
        return {
            "power_w": self.power_w,
            "joules_per_token": self.joules_per_token,
            "joules_per_step": self.joules_per_step,
            "source": self.energy_source,
            "caveat": CAVEATS.get(self.energy_source) if self.energy_source else None,
            "reason": self.energy_na,
        }

    def as_summary(self) -> dict[str, Any]:
        """The ``rltperf summary --json`` shape."""
        return {
            "steps": self.steps,
            "wall_s": round(self.span_s, 6),
            "baseline_s": round(self.baseline_s, 6),
            "excluded_s": round(self.excluded_s, 6),
            "step_ms": self.step_ms,
            "gap_ms": self.gap_ms,
            "idle_fraction": self.idle_fraction,
            "mbu": self.mbu,
            "tokens_per_s": self.tokens_per_s,
            "ttft_ms": self.ttft_ms,
            "tpot_ms": self.tpot_ms,
            "requests": {"ok": self.requests_ok, "failed": self.requests_failed},
            "stale_s": None if self.stale_s is None else round(self.stale_s, 3),
        }


@dataclass
class IdleGap:
    """A gap between steps longer than the threshold."""

    at_ns: int
    length_ms: float
    after_step: int
    grown_stage: str | None
    grown_ms: float | None


def loop_figures(
    sums: dict[str, np.ndarray], n_keep: int, max_loops: int | None
) -> tuple[list[int], float | None, list[float], list[float]]:
    """Exit-depth histogram, mean exit depth, mean time and tokens per loop depth over
    the window's matrix sums (``max_loops`` None: the deepest exit seen)."""
    exit_hist = sums["exit"]
    depth = int(np.max(np.nonzero(exit_hist)[0]) + 1) if exit_hist.any() else 0
    max_loops = max_loops or depth
    exit_list = [int(v) for v in exit_hist[: max(depth, max_loops or 0)]]
    tot_exit = exit_hist.sum()
    mean_depth = float((exit_hist * np.arange(1, MAX_DEPTH + 1)).sum() / tot_exit) if tot_exit else None
    nl = max_loops or 0
    loop_ms = [float(v) for v in sums["loop_ns"][:nl] / n_keep / 1e6] if n_keep and nl else []
    loop_tk = [float(v) for v in sums["loop_tokens"][:nl] / n_keep] if n_keep and nl else []
    return exit_list, mean_depth, loop_ms, loop_tk


def ceiling_ms_p50(
    nbytes: np.ndarray, flops: np.ndarray, keep: np.ndarray, peak_bw: float | None, peak_fl: float | None
) -> float | None:
    """Median per-step roofline ceiling time (ms) of the baseline steps with known bytes."""
    bknown = ~np.isnan(nbytes) & keep
    fknown = ~np.isnan(flops)
    if not (bknown.any() and peak_bw):
        return None
    per_step = roofline.ceiling_time_s(nbytes[bknown], np.where(fknown, flops, 0.0)[bknown], peak_bw, peak_fl)
    return median(per_step) * 1e3
