"""Energy: the device's own energy counter, read and turned into figures (one definition).

Sources (never an estimate from a nominal TDP):

- ``nvml``: ``nvmlDeviceGetTotalEnergyConsumption``, millijoules since the driver loaded
  (Volta and newer).  The driver refreshes it every ~20-100 ms, so a difference over less
  than about a second is coarse; the sampler reads it once a second.
- ``rapl``: ``/sys/class/powercap/intel-rapl:N/energy_uj`` of each CPU package (the
  kernel's RAPL interface, AMD included), microjoules that wrap at
  ``max_energy_range_uj``; readable by root only on kernels patched for CVE-2020-8694.

Both are whole-device counters: other processes on the same GPU or CPU package are
included.  ``CAVEATS`` says so wherever a figure is shown.

A ``DeviceSample`` carries ``energy_j``, a cumulative reading in joules (only differences
mean anything; RAPL's wraps are already undone by ``Unwrapper``), ``energy_source`` and,
when there is no counter, ``energy_na`` with the reason.

The window's figures: ``mean_power_w`` is the energy between the counter's readings that
fall inside the window's included time, divided by that time (time left out of the
window, such as a capture's profiled and exporting steps, leaves the energy too).
Joules per step and per output token are that power divided by the window's own steps/s
and tokens/s (``figures.Figures``), so every exclusion the window makes applies to them
unchanged.  Functions take numpy arrays (a window, a bootstrap's resamples) or scalars.
"""

from __future__ import annotations

from typing import Any

import numpy as np

SOURCES = ("nvml", "rapl")
"""Energy counter sources a ``DeviceSample.energy_source`` may name."""

CAVEATS = {
    "nvml": "NVML energy counter (driver-updated every ~20-100 ms); whole-GPU energy: other processes on the GPU are included",
    "rapl": "RAPL package energy counter; whole-CPU-package energy: every process on the CPU is included",
}
"""What each source's figures mean and do not mean, shown beside them."""

MIN_SPAN_S = 2.0
"""Shortest counter span (seconds between the first and last reading used) a power figure
is given for: NVML's counter moves in 20-100 ms steps, so shorter spans are mostly its
quantisation."""


class Unwrapper:
    """Turns a counter that wraps at ``max_range`` into a cumulative one (RAPL's ``energy_uj``).

    ``add(raw)`` returns the running total since the first reading.  A reading below the
    previous one is one wrap (the counter is read far more often than it can wrap: a
    package at 500 W wraps a 2^32 µJ range in ~8 s, a 2^38 one in hours).
    """

    def __init__(self, max_range: int) -> None:
        self.max_range = int(max_range)
        self.last: int | None = None
        self.total = 0

    def add(self, raw: int) -> int:
        """Fold in one reading; the cumulative count since the first reading."""
        raw = int(raw)
        if self.last is not None:
            d = raw - self.last
            if d < 0:
                d += self.max_range
            self.total += d
        self.last = raw
        return self.total


def energy_between(ts_ns: Any, joules: Any, lo_ns: Any, hi_ns: Any) -> Any:
    """Joules the counter gained between ``lo_ns`` and ``hi_ns`` (arrays or scalars),
    by linear interpolation of the cumulative readings ``(ts_ns, joules)`` (sorted by time).

    Spans reaching outside the readings are clipped to them: the caller measures the time
    covered with ``covered_ns`` and divides by that, never by the span asked.  No
    readings: NaN.
    """
    t = np.asarray(ts_ns, dtype=np.float64)
    lo = np.asarray(lo_ns, dtype=np.float64)
    hi = np.asarray(hi_ns, dtype=np.float64)
    if not t.size:
        return np.full(np.broadcast(lo, hi).shape, np.nan)
    e = np.asarray(joules, dtype=np.float64)
    lo, hi = np.clip(lo, t[0], t[-1]), np.clip(hi, t[0], t[-1])
    return np.maximum(np.interp(hi, t, e) - np.interp(lo, t, e), 0.0)


def covered_ns(ts_ns: Any, lo_ns: Any, hi_ns: Any) -> Any:
    """Nanoseconds of ``[lo, hi]`` (arrays or scalars) between the first and last reading."""
    t = np.asarray(ts_ns, dtype=np.float64)
    lo = np.asarray(lo_ns, dtype=np.float64)
    hi = np.asarray(hi_ns, dtype=np.float64)
    if not t.size:
        return np.zeros(np.broadcast(lo, hi).shape)
    return np.maximum(np.clip(hi, t[0], t[-1]) - np.clip(lo, t[0], t[-1]), 0.0)


def mean_power_w(
    ts_ns: Any, joules: Any, w0_ns: float, w1_ns: float, excluded_lo: Any = (), excluded_hi: Any = ()
) -> float | None:
    """Mean power (W) over the window ``[w0, w1]`` less its excluded spans, from the
    counter readings inside it; None when the readings cover less than ``MIN_SPAN_S``.

    Excluded spans must lie inside the window and not overlap (the window's owned spans).
    """
    t = np.asarray(ts_ns, dtype=np.float64)
    if t.size < 2:
        return None
    xlo = np.asarray(excluded_lo, dtype=np.float64)
    xhi = np.asarray(excluded_hi, dtype=np.float64)
    joules_in = float(energy_between(t, joules, w0_ns, w1_ns)) - float(
        np.sum(energy_between(t, joules, xlo, xhi))
    )
    time_in = float(covered_ns(t, w0_ns, w1_ns)) - float(np.sum(covered_ns(t, xlo, xhi)))
    if time_in < MIN_SPAN_S * 1e9:
        return None
    return max(joules_in, 0.0) / (time_in / 1e9)


def joules_per(power_w: Any, rate_per_s: Any) -> Any:
    """Joules per unit (step, output token) at ``power_w`` and ``rate_per_s`` units per
    second (arrays or scalars); NaN where the rate is not positive."""
    p = np.asarray(power_w, dtype=np.float64)
    r = np.asarray(rate_per_s, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(r > 0, p / np.where(r > 0, r, 1.0), np.nan)
    return out if out.ndim else float(out)
