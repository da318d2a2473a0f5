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

The window's figures (defined in ``figures.py`` with the other ratios): the power is the
energy the counter gained over the window's included time, divided by the part of that
time its readings cover (``window_energy``: time left out of the window, such as a
capture's profiled and exporting steps, leaves the energy too); joules per output token
and per step are that power divided by the window's own tokens/s and steps/s, so every
exclusion the window makes applies to them unchanged.
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

SHORT = {
    "nvml": "NVML counter · whole GPU",
    "rapl": "RAPL counter · whole CPU package",
}
"""``CAVEATS`` in a few words, for a panel line."""

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


def window_energy(
    readings: Any, w0_ns: float, w1_ns: float, excluded_lo: Any = (), excluded_hi: Any = ()
) -> tuple[float, float] | None:
    """``(joules, seconds)``: what the devices' counters gained over the window
    ``[w0, w1]`` less its excluded spans, and the time that covers (the part of that time
    between each device's first and last reading; devices are read in the same tick, so
    their spans agree: the shortest is used and each device's energy scaled to it).

    ``readings``: one ``(ts_ns, joules)`` pair of arrays per device (cumulative, sorted by
    time).  Excluded spans are clipped to the window and must not overlap.  None when no
    device has two readings.  Power is ``joules / seconds`` (``figures.power_w``).
    """
    lo = np.asarray(excluded_lo, dtype=np.float64)
    hi = np.asarray(excluded_hi, dtype=np.float64)
    lo, hi = np.maximum(lo, w0_ns), np.minimum(hi, w1_ns)
    inside = hi > lo
    lo, hi = lo[inside], hi[inside]
    parts: list[tuple[float, float]] = []
    for ts, joules in readings:
        t = np.asarray(ts, dtype=np.float64)
        if t.size < 2:
            return None
        j = float(energy_between(t, joules, w0_ns, w1_ns)) - float(np.sum(energy_between(t, joules, lo, hi)))
        c = float(covered_ns(t, w0_ns, w1_ns)) - float(np.sum(covered_ns(t, lo, hi)))
        parts.append((max(j, 0.0), max(c, 0.0) / 1e9))
    if not parts:
        return None
    secs = min(c for _, c in parts)
    if secs <= 0:
        return 0.0, 0.0
    return sum(j * secs / c for j, c in parts if c > 0), secs


def span_energy(readings: Any, lo_ns: Any, hi_ns: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """Per span ``[lo, hi]`` (arrays: a recording's steps' owned time): the joules the
    devices' counters gained (summed over devices) and the seconds of it their readings
    cover (the least over devices; they are read in the same tick).  Sums of these over
    any set of spans are ``window_energy``'s over those spans.  None: no device has two
    readings."""
    lo = np.asarray(lo_ns, dtype=np.float64)
    hi = np.asarray(hi_ns, dtype=np.float64)
    joules = np.zeros(lo.shape)
    covered: np.ndarray | None = None
    for ts, j in readings:
        t = np.asarray(ts, dtype=np.float64)
        if t.size < 2:
            return None
        joules += energy_between(t, j, lo, hi)
        c = covered_ns(t, lo, hi) / 1e9
        covered = c if covered is None else np.minimum(covered, c)
    if covered is None:
        return None
    return joules, covered


def energy_kind(kinds: Any) -> str:
    """The device kind whose energy the figures are, among the sampled kinds: ``cuda``
    when the engine has a sampled GPU, else ``cpu`` (a GPU engine's host CPU is not its
    device)."""
    return "cuda" if "cuda" in set(kinds) else "cpu"


def readings_by_device(samples: Any) -> dict[str, list[tuple[int, float]]]:
    """``{"kind:index": [(ts_ns, joules), ...]}`` of the samples that carry a counter
    reading (``DeviceSample`` objects or their dicts), of the energy kind only (``energy_kind``),
    in time order: what a bundle's ``meta.json`` keeps (``energy.readings``)."""
    rows: list[dict[str, Any]] = [
        s if isinstance(s, dict) else {f: getattr(s, f, None) for f in ("ts_ns", "kind", "index", "energy_j")}
        for s in samples
    ]
    rows = [r for r in rows if r.get("energy_j") is not None]
    kind = energy_kind(r.get("kind") for r in rows)
    out: dict[str, list[tuple[int, float]]] = {}
    for r in sorted(rows, key=lambda r: r["ts_ns"]):
        if r.get("kind") == kind:
            out.setdefault(f"{kind}:{r.get('index', 0)}", []).append((int(r["ts_ns"]), float(r["energy_j"])))
    return out
