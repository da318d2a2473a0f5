"""Where each window figure is defined: the one implementation every consumer calls.

The live screen (``rltperf_tui.live.aggregator``), ``rltperf summary``, the probe's
Prometheus gauges and ``rltperf compare`` all compute idle, MBU, tokens/s, steps/s
and goodput here, so a figure means the same thing wherever it is shown.

The window is wall time, not the span of the steps
---------------------------------------------------
A window runs from ``w0`` to ``w1`` on the probe's clock:

- ``w1`` is the newest moment the data vouches for: the end of the newest step, or
  the probe's newest heartbeat (``Stats``) when it says no step was running then (a
  heartbeat taken inside a step vouches only up to that step's start).  So when a
  load test pauses, the window keeps moving and idle rises to 100 %; when the engine
  stops answering altogether (hung), ``w1`` stops too and the monitor shows the
  figures as stale, never as current.
- ``w0`` is ``w1 − seconds`` (live), or the recording's first timestamp (summary),
  but never before the stream's first timestamp, nor before the oldest step a live
  monitor's ring still keeps (a stream faster than the ring holds for the window:
  ``StepWindows.bounds``; the window is then shorter, and says so).

Each step owns the time from the previous step's end to its own end (its gap and
itself): those intervals tile the stream.  Steps that do not measure the engine as it
normally runs (``EXCLUDED_FLAGS``: profiled, exporting, warm-up) leave the window
whole: their owned time leaves the denominator and their busy time, bytes, FLOPs and
tokens leave the numerators, and requests in flight during that time leave the latency
percentiles and goodput.

- idle fraction = 1 − Σ busy / T;  MBU = Σ bytes / (T × peak bandwidth);
  tokens/s = Σ output tokens / T;  steps/s = steps / T;  goodput = requests meeting
  both SLOs / T; where T is the window's wall time less the excluded time, and a step
  that straddles ``w0`` or ``w1`` counts by the part of it inside the window.

Each ratio is one function (``idle_fraction``, ``per_second``, ``mbu``) that takes
scalars (one window) or numpy arrays (many windows at once: ``compare``'s quarters of
a recording, its bootstrap resamples), and ``RATIO_FIGURES`` names them by the key
``summary --json`` and ``compare`` use, so that a figure ``compare`` resamples is the
figure the window shows.  Energy is two more sums: the joules the device's own counter
gained over T and the part of T its readings cover (``energy.window_energy``); power =
joules / covered time; joules per output token = power / tokens/s (``power_w``,
``joules_per_token``).

Exporting steps stay out, measured (``rltperf bench exporting``): on a loaded 2-core
host the engine made 0.2-0.6 x its steps/s and tokens/s while a bundle exported (the
forked export child takes a CPU), its step P50 x0.9-1.8: the capture's cost, not the
engine as it runs.  So an export longer than the window leaves a live window with
(nearly) no baseline: such a window is *blind* (``blind``: excluded steps own more than
``BLIND_SHARE`` of it).  A live consumer (the screen, ``attach --jsonl``, the probe's
Prometheus gauges) then shows the figures of the newest window that was not blind,
marked stale with their age (``HeldFigures``), never n/a; a whole recording
(``summary``, ``compare``) has nothing older to show and leaves the excluded steps out
as above.

Latency figures (step time, gap, TTFT, TPOT) are percentiles of the pooled samples in
the window, by linear interpolation (``pct``, ``percentile``): never means of per-run
percentiles.  The monitor's windows, ``summary``, ``report`` and ``compare`` all call
these two.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from engine_adapters.definitions.energy import MIN_SPAN_S as MIN_ENERGY_SPAN_S
from engine_adapters.definitions.energy import window_energy
from engine_adapters.definitions.order_stats import quantiles, sorted_quantiles
from engine_adapters.definitions.records import FLAG_EXPORTING, FLAG_PROFILED, FLAG_WARMUP

EXCLUDED_FLAGS = FLAG_PROFILED | FLAG_EXPORTING | FLAG_WARMUP
"""Steps flagged with any of these are not baseline: they leave every window figure."""

PERCENTILES = (50, 95, 99)
"""The percentiles a latency figure shows (``pct``)."""

QUIET_AFTER_S = 2.0
"""A target whose data time has run this long past its newest step is "quiet" (no steps)."""

BLIND_SHARE = 0.5
"""A window whose excluded time is more than this share of its wall time is blind: its
figures would stand on less than half of it (``blind``)."""

Num = TypeVar("Num", float, np.ndarray)
"""A figure's input and output: a float (one window) or an array (one value per window)."""


def _float_if_scalar(x: Any) -> Any:
    # one window's figure comes back a Python float, so it prints and serialises as before
    return x if np.ndim(x) else float(x)


def quotient(num: Any, den: Any) -> Any:
    """``num / den`` on scalars or arrays alike: a zero denominator gives inf or NaN, never
    an exception (callers that show one window say None instead); a scalar result is a
    float."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return _float_if_scalar(np.divide(num, den))


def per_second(count: Num, seconds: Num) -> Num:
    """``count`` / T: tokens/s, steps/s, goodput (requests meeting both SLOs per second).
    Scalars or arrays."""
    return quotient(count, seconds)


def idle_fraction(busy_s: Num, seconds: Num) -> Num:
    """1 − Σ busy / T, the busy share clipped to [0, 1] (busy time measured a little
    past the window's edge never reads as negative idle).  Scalars or arrays."""
    busy = np.minimum(1.0, np.maximum(0.0, quotient(busy_s, seconds)))
    return _float_if_scalar(1.0 - busy)


def mbu(nbytes: Num, seconds: Num, peak_bw_gbps: float) -> Num:
    """Model bandwidth utilisation, Σ bytes / (T × peak bandwidth): achieved bytes/s over
    the peak's (GB/s, 10^9 B/s).  Never clipped: above 1 means the byte count or the peak
    is wrong, and the screen says so.  Scalars or arrays."""
    return quotient(nbytes, np.multiply(seconds, peak_bw_gbps) * 1e9)


def power_w(joules: Num, energy_s: Num) -> Num:
    """Mean power, W: the joules the device's energy counter gained / the time its
    readings cover (``energy.window_energy``).  Scalars or arrays."""
    return quotient(joules, energy_s)


def joules_per_token(joules: Num, energy_s: Num, tokens: Num, seconds: Num) -> Num:
    """Joules per output token: the window's power / its tokens/s (so the window's
    exclusions apply to both).  Scalars or arrays; inf or NaN without tokens."""
    return quotient(power_w(joules, energy_s), per_second(tokens, seconds))


@dataclass(frozen=True)
class RatioSums:
    """What the window's ratio figures are made of: their sums and T.  Floats for one
    window, or equal-length arrays for many at once (a recording's quarters, bootstrap
    resamples of time blocks)."""

    seconds: Any
    """T: wall time less excluded time, seconds."""
    tokens: Any
    """Σ output tokens."""
    busy_s: Any
    """Σ device busy time, seconds."""
    nbytes: Any
    """Σ bytes read + written."""
    joules: Any = None
    """Joules the device's energy counter gained over T (None: no counter)."""
    energy_s: Any = None
    """The part of T the counter's readings cover, seconds (None: no counter)."""


def _energy_figure(f: Callable[[RatioSums], Any]) -> Callable[[RatioSums, float | None], Any]:
    return lambda s, _peak: None if s.joules is None or s.energy_s is None else f(s)


RATIO_FIGURES: dict[str, Callable[[RatioSums, float | None], Any]] = {
    "tokens_per_s": lambda s, _peak: per_second(s.tokens, s.seconds),
    "idle_fraction": lambda s, _peak: idle_fraction(s.busy_s, s.seconds),
    "mbu": lambda s, peak: mbu(s.nbytes, s.seconds, peak) if peak else None,
    "power_w": _energy_figure(lambda s: power_w(s.joules, s.energy_s)),
    "joules_per_token": _energy_figure(lambda s: joules_per_token(s.joules, s.energy_s, s.tokens, s.seconds)),
}
"""The window's ratio figures by their ``summary --json`` / ``compare`` key: each a
function of the sums (and the peak bandwidth, for MBU: None without one)."""


def ratio_figure(key: str, sums: RatioSums, peak_bw_gbps: float | None = None) -> Any:
    """The ratio figure ``key`` (``RATIO_FIGURES``) of ``sums``: a float, or an array when
    the sums are arrays."""
    try:
        f = RATIO_FIGURES[key]
    except KeyError:
        raise ValueError(f"{key!r} is not a ratio figure (one of {', '.join(RATIO_FIGURES)})") from None
    return f(sums, peak_bw_gbps)


@dataclass(frozen=True)
class WindowFigures:
    """The rate figures of one window (see the module docstring for the definitions)."""

    w0_ns: int
    """Window start, probe clock."""
    w1_ns: int
    """Window end, probe clock."""
    excluded_s: float
    """Time inside the window owned by excluded (profiled/exporting/warm-up) steps."""
    seconds: float
    """The denominator T: window wall time less the excluded time."""
    steps: float
    """Baseline steps inside the window (a straddling step counts by its inside part)."""
    busy_s: float | None
    """Σ device busy of baseline steps (None: no step reported busy time)."""
    nbytes: float | None
    """Σ analytic bytes read + written (None: not reported)."""
    flops: float | None
    """Σ analytic FLOPs (None: not reported)."""
    tokens: float
    """Σ output tokens."""
    joules: float | None = None
    """Joules the device's energy counter gained over T (None: no counter readings)."""
    energy_s: float | None = None
    """The part of T the counter's readings cover, seconds."""

    @property
    def wall_s(self) -> float:
        """Window wall time, excluded time included."""
        return (self.w1_ns - self.w0_ns) / 1e9

    @property
    def idle_fraction(self) -> float | None:
        """1 − Σ busy / T."""
        if self.busy_s is None or self.seconds <= 0:
            return None
        return idle_fraction(self.busy_s, self.seconds)

    @property
    def tokens_per_s(self) -> float | None:
        """Σ output tokens / T."""
        return per_second(self.tokens, self.seconds) if self.seconds > 0 else None

    @property
    def steps_per_s(self) -> float | None:
        """Baseline steps / T."""
        return per_second(self.steps, self.seconds) if self.seconds > 0 else None

    def mbu(self, peak_bw_gbps: float | None) -> float | None:
        """Σ bytes / (T × peak bandwidth); None without bytes or a peak."""
        if self.nbytes is None or not peak_bw_gbps or self.seconds <= 0:
            return None
        return mbu(self.nbytes, self.seconds, peak_bw_gbps)

    @property
    def power_w(self) -> float | None:
        """Mean device power over T, W; None without a counter or with less than
        ``energy.MIN_SPAN_S`` of readings."""
        if self.joules is None or self.energy_s is None or self.energy_s < MIN_ENERGY_SPAN_S:
            return None
        return power_w(self.joules, self.energy_s)

    @property
    def joules_per_token(self) -> float | None:
        """Power / tokens/s: joules per output token (None: no power or no tokens)."""
        p, r = self.power_w, self.tokens_per_s
        return quotient(p, r) if p is not None and r else None

    @property
    def joules_per_step(self) -> float | None:
        """Power / steps/s: joules per baseline step (None: no power or no steps)."""
        p, r = self.power_w, self.steps_per_s
        return quotient(p, r) if p is not None and r else None

    def per_second(self, count: float) -> float | None:
        """``count`` / T (goodput: requests meeting both SLOs)."""
        return per_second(count, self.seconds) if self.seconds > 0 else None


def blind(fig: WindowFigures) -> bool:
    """True when excluded steps (a capture's export, warm-up) own more than
    ``BLIND_SHARE`` of the window: a live consumer shows the last figures that were not
    blind instead, marked stale (``HeldFigures``).  A quiet engine is never blind: its
    time is idle time, not excluded."""
    return fig.excluded_s > BLIND_SHARE * fig.wall_s


Held = TypeVar("Held")
"""What a live consumer shows of one window (a ``Window``, the Prometheus gauges)."""


class HeldFigures(Generic[Held]):
    """A live consumer's figures across blind windows: each window's own while it is not
    ``blind``, else the newest ones that were not, with their age (data time from that
    window's end to this one's).  One per live window a consumer shows."""

    def __init__(self) -> None:
        self._held: Held | None = None
        self._w1_ns = 0

    def show(self, value: Held, is_blind: bool, w1_ns: int) -> tuple[Held, float | None]:
        """(what to show, its age in seconds, or None when it is ``value`` itself) for the
        window ending at ``w1_ns`` whose figures are ``value``; ``is_blind``: that window's
        ``blind()``.  ``value`` itself when it is not blind or nothing earlier was."""
        if not is_blind:
            self._held, self._w1_ns = value, w1_ns
            return value, None
        if self._held is None:
            return value, None
        return self._held, max(0.0, (w1_ns - self._w1_ns) / 1e9)


def pct(values: np.ndarray) -> dict[str, float | None]:
    """P50/P95/P99 of pooled samples (linear interpolation); None for no samples."""
    if values.size == 0:
        return {f"p{p}": None for p in PERCENTILES}
    q = quantiles(values, PERCENTILES)
    return {f"p{p}": float(v) for p, v in zip(PERCENTILES, q, strict=True)}


def pct_sorted(values: np.ndarray) -> dict[str, float | None]:
    """``pct`` of samples already sorted ascending (the live window keeps its samples
    sorted: ``rltperf_tui.live.sorted_window``); the same figures, to the bit."""
    if values.size == 0:
        return {f"p{p}": None for p in PERCENTILES}
    q = sorted_quantiles(values, PERCENTILES)
    return {f"p{p}": float(v) for p, v in zip(PERCENTILES, q, strict=True)}


def percentile(values: np.ndarray, q: float) -> float:
    """One percentile ``q`` (0-100) of pooled samples, by the same definition as ``pct``
    (``values`` must hold at least one sample)."""
    return float(quantiles(values, (q,))[0])


def owned_from(start: np.ndarray, end: np.ndarray, t0_ns: int) -> np.ndarray:
    """Where each step's owned time begins: the previous step's end (the first step:
    ``t0_ns``), never after the step's own start or before ``t0_ns``."""
    prev = np.empty_like(end)
    if end.size:
        prev[0] = t0_ns
        prev[1:] = end[:-1]
    return np.minimum(np.maximum(prev, t0_ns), start)


def _overlap(lo: np.ndarray, hi: np.ndarray, w0: int, w1: int) -> np.ndarray:
    return np.clip(np.minimum(hi, w1) - np.maximum(lo, w0), 0, None)


def window_figures(
    *,
    start: np.ndarray,
    end: np.ndarray,
    flags: np.ndarray,
    busy: np.ndarray,
    nbytes: np.ndarray,
    flops: np.ndarray,
    tokens: np.ndarray,
    w0_ns: int,
    w1_ns: int,
    owned_lo: np.ndarray | None = None,
    reported: tuple[bool, bool, bool] = (False, False, False),
    energy: Any = (),
) -> WindowFigures:
    """The figures of window ``[w0_ns, w1_ns]`` over the given steps (in stream order;
    steps wholly outside the window add nothing).  ``busy``/``nbytes``/``flops`` are
    float arrays with NaN where unknown.  ``owned_lo`` is each step's owned-time start
    (``owned_from``); by default the previous step's end, the first step owning from its
    own start.  ``reported`` says whether the engine reports busy, bytes and FLOPs at
    all: then a window without such steps sums to 0 (idle 1, MBU 0), not unknown.
    ``energy``: one ``(ts_ns, joules)`` pair of arrays per device, the cumulative energy
    counter readings (``energy.window_energy``; empty: no counter)."""
    w0, w1 = int(w0_ns), int(max(w0_ns, w1_ns))
    start = np.asarray(start, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    if owned_lo is None:
        owned_lo = owned_from(start, end, int(start[0]) if start.size else w0)
    excl = (np.asarray(flags) & EXCLUDED_FLAGS) != 0
    any_excl = bool(excl.any())
    excluded_ns = float(_overlap(owned_lo[excl], end[excl], w0, w1).sum()) if any_excl else 0.0
    seconds = max(0.0, (w1 - w0 - excluded_ns) / 1e9)
    keep = ~excl
    span = end - start
    inside = _overlap(start, end, w0, w1)
    # a zero-length step inside the window counts whole
    if span.size and span.min() > 0:  # (the usual case: the same fractions, fewer passes)
        frac = inside / span
    else:
        frac = np.where(
            span > 0, inside / np.maximum(span, 1), ((start >= w0) & (end <= w1)).astype(np.float64)
        )
    if any_excl:
        frac = np.where(keep, frac, 0.0)

    def opt_sum(v: np.ndarray, seen: bool) -> float | None:
        v = np.asarray(v, dtype=np.float64)
        known = ~np.isnan(v)
        if any_excl:
            known &= keep
        if not known.any():
            return 0.0 if seen else None
        if known.all():  # every step known and kept: the same products, not gathered
            return float((v * frac).sum())
        return float((v[known] * frac[known]).sum())

    busy_s = opt_sum(busy, reported[0])
    en = window_energy(energy, w0, w1, owned_lo[excl], end[excl]) if len(energy) else None
    return WindowFigures(
        w0_ns=w0,
        w1_ns=w1,
        excluded_s=excluded_ns / 1e9,
        seconds=seconds,
        steps=float(frac.sum()),
        busy_s=busy_s / 1e9 if busy_s is not None else None,
        nbytes=opt_sum(nbytes, reported[1]),
        flops=opt_sum(flops, reported[2]),
        tokens=float((np.asarray(tokens, dtype=np.float64) * frac).sum()),
        joules=en[0] if en is not None else None,
        energy_s=en[1] if en is not None else None,
    )


def excluded_spans(
    start: np.ndarray, end: np.ndarray, flags: np.ndarray, owned_lo: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The owned intervals ``(lo, hi)`` of excluded steps, sorted by end."""
    start = np.asarray(start, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    if owned_lo is None:
        owned_lo = owned_from(start, end, int(start[0]) if start.size else 0)
    excl = (np.asarray(flags) & EXCLUDED_FLAGS) != 0
    return owned_lo[excl], end[excl]


def requests_clear_of(
    arrival: np.ndarray, finish: np.ndarray, spans: tuple[np.ndarray, np.ndarray]
) -> np.ndarray:
    """True for each request whose life ``[arrival, finish]`` touches no excluded span."""
    lo, hi = spans
    arrival = np.asarray(arrival, dtype=np.int64)
    finish = np.asarray(finish, dtype=np.int64)
    clear = np.ones(arrival.size, dtype=bool)
    if not lo.size or not arrival.size:
        return clear
    # the first excluded span ending after the arrival: the request overlaps it when it
    # began before the request finished (spans are disjoint and ordered)
    j = np.searchsorted(hi, arrival, side="right")
    inb = j < hi.size
    clear[inb] = ~(lo[j[inb]] < finish[inb])
    return clear
