"""Device (or engine-thread) busy and idle over a trace window, each idle gap classified
as host wait, kernel wait or other (the definitions: ``analysis.traces``)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from rltperf_tui.analysis.trace_steps import (
    DEFAULT_KERNEL_WAIT_US,
    DEVICE_CATS,
    HOST_OP_CATS,
    LAUNCH_CATS,
    Span,
    StepScan,
    scan_steps,
    spans,
)


@dataclass
class IdleBreakdown:
    """Busy / idle of the device (or the engine thread on a CPU-only trace) over a window."""

    basis: str
    """``device activity`` (GPU kernels, copies, sets) or ``engine-thread operators`` (CPU-only)."""
    window_s: float
    busy_s: float
    idle_s: float
    idle_fraction: float | None
    host_wait_s: float
    kernel_wait_s: float | None
    """None on a CPU-only trace (not defined there), never a made-up zero."""
    other_s: float | None
    within_steps_s: float | None
    """Idle inside engine step ranges (None when the trace has no step ranges)."""
    between_steps_s: float | None
    gaps: int
    longest_gap_ms: float
    kernel_wait_threshold_us: float
    devices: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON form; ``*_fraction`` entries are shares of the window."""
        w = self.window_s or float("nan")

        def frac(v: float | None) -> float | None:
            return None if v is None or not self.window_s else round(v / w, 6)

        return {
            "basis": self.basis,
            "window_s": round(self.window_s, 6),
            "busy_s": round(self.busy_s, 6),
            "idle_s": round(self.idle_s, 6),
            "idle_fraction": None if self.idle_fraction is None else round(self.idle_fraction, 6),
            "host_wait_s": round(self.host_wait_s, 6),
            "kernel_wait_s": None if self.kernel_wait_s is None else round(self.kernel_wait_s, 6),
            "other_s": None if self.other_s is None else round(self.other_s, 6),
            "host_wait_fraction": frac(self.host_wait_s),
            "kernel_wait_fraction": frac(self.kernel_wait_s),
            "other_fraction": frac(self.other_s),
            "within_steps_s": None if self.within_steps_s is None else round(self.within_steps_s, 6),
            "between_steps_s": None if self.between_steps_s is None else round(self.between_steps_s, 6),
            "gaps": self.gaps,
            "longest_gap_ms": round(self.longest_gap_ms, 4),
            "kernel_wait_threshold_us": self.kernel_wait_threshold_us,
            "devices": self.devices,
            "note": self.note,
        }


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def _overlap(a0: float, a1: float, merged: list[tuple[float, float]]) -> float:
    """Length of [a0, a1] covered by a merged, sorted interval list."""
    tot = 0.0
    for s, e in merged:
        if e <= a0:
            continue
        if s >= a1:
            break
        tot += min(e, a1) - max(s, a0)
    return tot


def _classify(
    acts: list[tuple[float, float, float | None]],
    w0: float,
    w1: float,
    threshold_us: float,
) -> tuple[float, float, float, float, list[tuple[float, float]]]:
    """Union of activities (start, end, launch) clipped to [w0, w1]; returns
    (busy, host_wait, kernel_wait, other, idle_intervals) in µs.

    An activity's ``launch`` is when the host queued it (None: unknown).  For CPU
    operators pass the operator's own start: it runs when it is issued.
    """
    acts = sorted((max(s, w0), min(e, w1), la) for s, e, la in acts if e > w0 and s < w1)
    busy = host = kern = other = 0.0
    idle: list[tuple[float, float]] = []
    cur = w0  # end of the union so far (the window start counts as "previous end")
    run_start: float | None = None
    for s, e, launch in acts:
        if s > cur:
            gap = s - cur
            idle.append((cur, s))
            if launch is None:
                other += gap  # no launch record: cannot be attributed
            elif launch > cur:
                host += gap
            elif gap < threshold_us:
                kern += gap
            else:
                other += gap
            if run_start is not None:
                busy += cur - run_start
            run_start = s
        elif run_start is None:
            run_start = s
        if e > cur:
            cur = e
    if run_start is not None:
        busy += cur - run_start
    if w1 > cur:
        idle.append((cur, w1))
        host += w1 - cur  # nothing more was queued: the host did not submit work
    return busy, host, kern, other, idle


@dataclass
class _Busy:
    """Busy time and idle gaps of one basis (devices, or the engine thread), trace µs."""

    busy: float
    host: float
    kernel: float | None
    """Kernel wait; None where not defined (CPU-only)."""
    other: float | None
    idle_iv: list[tuple[float, float]]
    scale: int
    """Devices the figures are a mean over (idle intervals of all of them are pooled)."""
    basis: str
    note: str
    per: list[dict[str, Any]]


def _device_busy(
    events: list[dict[str, Any]],
    dev: list[Span],
    w0: float,
    w1: float,
    win_us: float,
    kernel_wait_threshold_us: float,
) -> _Busy:
    """Device activity: the union of kernel/memcpy/memset intervals per device, gaps
    classified by their launch time (the mean over devices)."""
    launches: dict[Any, float] = {}
    for s in spans(events, LAUNCH_CATS):
        c = s.args.get("correlation")
        if c is not None and c not in launches:
            launches[c] = s.ts
    by_dev: dict[Any, list[tuple[float, float, float | None]]] = defaultdict(list)
    for s in dev:
        d = s.args.get("device", s.pid)
        by_dev[d].append((s.ts, s.end, launches.get(s.args.get("correlation"))))
    per: list[dict[str, Any]] = []
    tot = [0.0, 0.0, 0.0, 0.0]
    idle_all: list[tuple[float, float]] = []
    for d in sorted(by_dev, key=str):
        busy, host, kern, other, idle_d = _classify(by_dev[d], w0, w1, kernel_wait_threshold_us)
        per.append(
            {
                "device": f"cuda:{d}" if isinstance(d, int) else str(d),
                "busy_s": round(busy / 1e6, 6),
                "idle_fraction": round(1 - busy / win_us, 6) if win_us else None,
                "host_wait_s": round(host / 1e6, 6),
                "kernel_wait_s": round(kern / 1e6, 6),
                "other_s": round(other / 1e6, 6),
                "activities": len(by_dev[d]),
            }
        )
        for i, v in enumerate((busy, host, kern, other)):
            tot[i] += v
        idle_all.extend(idle_d)
    n = len(by_dev)
    busy, host, kern, other = (v / n for v in tot)
    basis = "device activity"
    note = (
        "device idle = window minus the union of kernel/memcpy/memset intervals; gaps split as "
        "Holistic Trace Analysis does (host wait: launched after the device went idle; kernel wait: "
        f"queued and gap < {kernel_wait_threshold_us:g} µs; other: queued, longer gap)"
        + (f"; figures are the mean over {n} devices" if n > 1 else "")
    )
    return _Busy(busy, host, kern, other, idle_all, n, basis, note, per)


def _thread_busy(
    events: list[dict[str, Any]], scan: StepScan, w0: float, w1: float, kernel_wait_threshold_us: float
) -> _Busy:
    """CPU-only: the union of operator intervals on the engine thread (every gap host wait)."""
    ops = spans(events, HOST_OP_CATS)
    thread = scan.engine_thread
    if thread is None and ops:
        tot_by: dict[tuple[Any, Any], float] = defaultdict(float)
        for s in ops:
            tot_by[(s.pid, s.tid)] += s.dur
        thread = max(tot_by, key=lambda k: tot_by[k])
    mine: list[tuple[float, float, float | None]] = [
        (s.ts, s.end, s.ts) for s in ops if (s.pid, s.tid) == thread
    ]
    busy, host, _k, _o, idle_iv = _classify(mine, w0, w1, kernel_wait_threshold_us)
    basis = "engine-thread operators"
    note = (
        "CPU-only trace: no device timeline. Busy = the union of operator intervals on the engine "
        "thread; operators run synchronously there, so every gap is host wait by HTA's rule and "
        "kernel wait / other are not defined (None, not zero)"
    )
    return _Busy(busy, host, None, None, idle_iv, 1, basis, note, [])


def idle_breakdown(
    events: list[dict[str, Any]],
    scan: StepScan | None = None,
    window: tuple[float, float] | None = None,
    kernel_wait_threshold_us: float = DEFAULT_KERNEL_WAIT_US,
) -> IdleBreakdown | None:
    """HTA-style idle breakdown over the capture window (see the module docstring).

    ``window`` defaults to the step window of ``scan`` (found when not given); None is
    returned when there is neither a window nor any activity to define one.
    """
    if scan is None:
        scan = scan_steps(events)
    dev = spans(events, DEVICE_CATS)
    w = window or scan.window
    if w is None:
        pool = dev or spans(events, HOST_OP_CATS)
        if not pool:
            return None
        w = (min(s.ts for s in pool), max(s.end for s in pool))
    w0, w1 = w
    win_us = max(0.0, w1 - w0)
    step_iv = _merge([(st.span.ts, st.span.end) for st in scan.steps if st.span is not st.cycle]) or None

    bb = (
        _device_busy(events, dev, w0, w1, win_us, kernel_wait_threshold_us)
        if dev
        else _thread_busy(events, scan, w0, w1, kernel_wait_threshold_us)
    )
    busy, idle_iv = bb.busy, bb.idle_iv
    idle = win_us - busy
    within = between = None
    if step_iv is not None:
        within = sum(_overlap(a, b, step_iv) for a, b in idle_iv) / bb.scale
        between = idle - within
    longest = max((b - a for a, b in idle_iv), default=0.0)
    return IdleBreakdown(
        basis=bb.basis,
        window_s=win_us / 1e6,
        busy_s=busy / 1e6,
        idle_s=idle / 1e6,
        idle_fraction=(idle / win_us) if win_us else None,
        host_wait_s=bb.host / 1e6,
        kernel_wait_s=None if bb.kernel is None else bb.kernel / 1e6,
        other_s=None if bb.other is None else bb.other / 1e6,
        within_steps_s=None if within is None else within / 1e6,
        between_steps_s=None if between is None else between / 1e6,
        gaps=len(idle_iv),
        longest_gap_ms=longest / 1e3,
        kernel_wait_threshold_us=kernel_wait_threshold_us,
        devices=bb.per,
        note=bb.note,
    )
