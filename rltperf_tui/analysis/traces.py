"""Chrome traces (torch.profiler / Kineto JSON) read as evidence: steps, stages, operators, idle.

This module is where the trace-based definitions live (docs/ARCHITECTURE.md, "Where each figure is defined"):

- **Steps**: ``ProfilerStep#k`` spans (one per ``prof.step()``; in rltperf bundles each
  one covers a captured step *and the gap before it*), the probe's ``rltperf.step#<id>
  <kind>`` ranges (the step itself), and vLLM's step annotations
  ``execute_context_<n>(<tok>)_generation_<n>(<tok>)`` (category ``user_annotation``).
- **Stages**: ``stage:<name>`` ``record_function`` ranges, attributed to the step range
  that contains them.
- **Device busy / idle** (Holistic Trace Analysis' definition): the union of the device's
  activity intervals (kernels, memcpy, memset) over the capture window is busy; the rest
  is idle.  Each idle gap is classified by the activity that ends it, as HTA does:
  *host wait* when that activity was launched (its ``cudaLaunchKernel``/driver call,
  matched by ``correlation``) after the device had gone idle, i.e. the host was late;
  otherwise *kernel wait* when the gap is shorter than a threshold (back-to-back launch
  overhead) and *other* when it is longer (waits on events, syncs, unknown).  A gap
  after the last activity of the window is host wait (nothing was queued).
  HTA's threshold is the number 30 in its timestamp unit: Kineto's JSON is in µs (the
  classic HTA compared µs); releases that convert to ns keep 30, i.e. 30 ns.  We default
  to 30 µs and let callers choose.
- **CPU-only traces**: the same union over the operator (``cpu_op``) intervals of the
  engine thread (the thread of the step spans).  Operators run synchronously there, so
  every gap is, by HTA's rule, host wait; kernel wait and other are *not defined* and are
  reported as None, never as zero.

Idle is further split into time inside engine steps and time between them, because a
gap between steps (scheduler, Python, sleep) and a gap inside one (launch overhead,
syncs) call for different fixes.

Nothing here imports torch: reports run anywhere.  Times inside are trace microseconds
(the JSON's unit); results are seconds or milliseconds as their names say.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

PROFILER_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
"""torch.profiler's per-``prof.step()`` span."""
RLTPERF_STEP_RE = re.compile(r"^rltperf\.step#(\d+)(?: (\S+))?$")
"""The probe's range around one engine step: ``rltperf.step#<id> <kind>``."""
VLLM_STEP_RE = re.compile(r"^execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)$")
"""vLLM's per-step annotation: context requests(tokens), generation requests(tokens)."""
STAGE_PREFIX = "stage:"
"""Prefix of stage ranges (``record_function("stage:<name>")``)."""

DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
"""Trace categories of device activity (what HTA counts as a stream's work)."""
LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver"})
"""Host-side launch calls, matched to device activity by ``args.correlation``."""
HOST_OP_CATS = frozenset({"cpu_op", "operator"})
"""Host operator categories (``operator`` in older Kineto)."""
ANNOTATION_CATS = frozenset({"user_annotation"})
"""Host ``record_function`` ranges (not operators)."""

DEFAULT_KERNEL_WAIT_US = 30.0
"""Gap below which an idle gap whose next activity was already queued is kernel wait."""


# --------------------------------------------------------------------------- loading


@dataclass
class TraceFile:
    """A Chrome trace as read from disk, with what was wrong with it."""

    path: str
    events: list[dict[str, Any]]
    """Complete trace events (a damaged file keeps those before the damage)."""
    top: dict[str, Any] = field(default_factory=dict)
    """Top-level keys other than ``traceEvents`` (deviceProperties, baseTimeNanoseconds...)."""
    error: str | None = None
    """What was wrong, as a sentence; None for an intact file."""
    truncated: bool = False
    """The file ends early (cut gzip stream or cut JSON): events after the cut are missing."""
    bytes_on_disk: int = 0
    json_bytes: int = 0


def _gunzip_partial(raw: bytes) -> tuple[bytes, str | None]:
    """Decompress as much of a gzip stream as is intact; (data, problem or None)."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out: list[bytes] = []
    step = 1 << 20
    for i in range(0, len(raw), step):
        try:
            out.append(d.decompress(raw[i : i + step]))
        except zlib.error as exc:
            return b"".join(out), f"the gzip stream is corrupt after {i} compressed bytes ({exc})"
        if d.eof:
            break
    if not d.eof:
        try:
            out.append(d.flush())
        except zlib.error:
            pass
        return b"".join(out), f"the gzip stream is cut short ({len(raw)} compressed bytes, no end marker)"
    return b"".join(out), None


def _salvage_events(text: str) -> tuple[list[dict[str, Any]], dict[str, Any], int]:
    """Complete events of a cut JSON trace: (events, top-level keys read before them, offset reached)."""
    dec = json.JSONDecoder()
    top: dict[str, Any] = {}
    key = text.find('"traceEvents"')
    if key < 0:
        # maybe a bare array of events
        pos = text.find("[")
        if pos < 0:
            return [], top, 0
    else:
        # keys before traceEvents (torch writes schemaVersion, deviceProperties... first)
        head = text[:key].rstrip().rstrip(",")
        try:
            top = json.loads(head + "}") if head.lstrip().startswith("{") else {}
        except ValueError:
            top = {}
        pos = text.find("[", key)
        if pos < 0:
            return [], top, key
    pos += 1
    events: list[dict[str, Any]] = []
    n = len(text)
    while pos < n:
        while pos < n and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= n or text[pos] == "]":
            break
        try:
            obj, end = dec.raw_decode(text, pos)
        except ValueError:
            break
        if isinstance(obj, dict):
            events.append(obj)
        pos = end
    return events, top, pos


def load_trace(path: str | os.PathLike[str]) -> TraceFile:
    """Read a ``.json`` or ``.json.gz`` Chrome trace; a damaged one keeps what is readable.

    Raises ``FileNotFoundError``/``OSError`` only when the file cannot be opened at all.
    """
    p = os.fspath(path)
    with open(p, "rb") as f:
        raw = f.read()
    problem: str | None = None
    truncated = False
    if raw[:2] == b"\x1f\x8b":
        data, problem = _gunzip_partial(raw)
        truncated = problem is not None
    else:
        data = raw
    text = data.decode("utf-8", "replace")
    try:
        obj = json.loads(text)
    except ValueError as exc:
        events, top, reached = _salvage_events(text)
        what = f"the JSON ends or breaks at byte {reached} of {len(data)} ({getattr(exc, 'msg', exc)})"
        problem = f"{problem}; {what}" if problem else what
        truncated = True
        return TraceFile(p, events, top, problem, truncated, len(raw), len(data))
    if isinstance(obj, list):
        events = [e for e in obj if isinstance(e, dict)]
        top = {}
    elif isinstance(obj, dict):
        evs = obj.get("traceEvents")
        if not isinstance(evs, list):
            problem = problem or "the trace has no traceEvents list"
            evs = []
        events = [e for e in evs if isinstance(e, dict)]
        top = {k: v for k, v in obj.items() if k != "traceEvents"}
    else:
        events, top = [], {}
        problem = problem or "the file is JSON but not a Chrome trace"
    return TraceFile(p, events, top, problem, truncated, len(raw), len(data))


def save_trace(
    path: str | os.PathLike[str], events: list[dict[str, Any]], top: dict[str, Any] | None = None
) -> None:
    """Write a (gzipped when the name ends in .gz) Chrome trace; used to make test traces."""
    obj = dict(top or {})
    obj["traceEvents"] = events
    data = json.dumps(obj).encode()
    p = os.fspath(path)
    if p.endswith(".gz"):
        with gzip.open(p, "wb") as f:
            f.write(data)
    else:
        with open(p, "wb") as f:
            f.write(data)


# --------------------------------------------------------------------------- spans


@dataclass
class Span:
    """One complete (``ph: X``) event, times in trace microseconds."""

    name: str
    ts: float
    dur: float
    pid: Any
    tid: Any
    cat: str
    args: dict[str, Any]

    @property
    def end(self) -> float:
        """End time, µs."""
        return self.ts + self.dur


def spans(events: Iterable[dict[str, Any]], cats: frozenset[str] | None = None) -> list[Span]:
    """Complete events (optionally of the given categories) as ``Span``s, by start time."""
    out: list[Span] = []
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = str(e.get("cat", ""))
        if cats is not None and cat.lower() not in cats:
            continue
        ts = e.get("ts")
        dur = e.get("dur")
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            continue
        args = e.get("args")
        out.append(
            Span(
                str(e.get("name", "")),
                float(ts),
                float(dur),
                e.get("pid"),
                e.get("tid"),
                cat,
                args if isinstance(args, dict) else {},
            )
        )
    out.sort(key=lambda s: (s.ts, -s.dur))
    return out


@dataclass
class EngineStep:
    """One engine step found in the trace."""

    index: int
    """Position in the window (0-based)."""
    step_id: int | None
    """Engine step id (rltperf ranges), None when the trace does not say."""
    kind: str | None
    span: Span
    """The step itself (rltperf range or vLLM annotation)."""
    cycle: Span | None = None
    """The enclosing ``ProfilerStep`` span (step plus the gap before it), when present."""
    stages_us: dict[str, float] = field(default_factory=dict)
    """Time per ``stage:<name>`` range inside the step, µs."""
    batch: dict[str, int] | None = None
    """vLLM: context/generation requests and tokens from the annotation."""


@dataclass
class StepScan:
    """Steps of a trace, by every source the trace holds."""

    profiler_steps: list[Span]
    rltperf_steps: list[Span]
    vllm_steps: list[Span]
    source: str
    """``ProfilerStep``, ``vllm execute annotations``, ``rltperf ranges`` or ``none``."""
    steps: list[EngineStep]
    """The engine steps of the window, each with its stages (and cycle span)."""
    window: tuple[float, float] | None
    """Capture window (µs): first step-source span start to last end."""
    engine_thread: tuple[Any, Any] | None
    """(pid, tid) of the thread that ran the steps."""
    stage_names: list[str]

    @property
    def found(self) -> int:
        """Steps found by the primary source."""
        if self.source == "ProfilerStep":
            return len(self.profiler_steps)
        if self.source == "vllm execute annotations":
            return len(self.vllm_steps)
        if self.source == "rltperf ranges":
            return len(self.rltperf_steps)
        return 0


def _inside(inner: Span, outer: Span, slack: float = 0.5) -> bool:
    return inner.ts >= outer.ts - slack and inner.end <= outer.end + slack


def scan_steps(events: list[dict[str, Any]], ann: list[Span] | None = None) -> StepScan:
    """Find the steps, their stages and the capture window."""
    if ann is None:
        ann = spans(events, ANNOTATION_CATS)
    prof = [s for s in ann if PROFILER_STEP_RE.match(s.name)]
    rlt = [s for s in ann if RLTPERF_STEP_RE.match(s.name)]
    vll = [s for s in ann if VLLM_STEP_RE.match(s.name)]
    stage_spans = [s for s in ann if s.name.startswith(STAGE_PREFIX)]
    if vll and not rlt:
        source, primary = "vllm execute annotations", vll
    elif prof:
        source, primary = "ProfilerStep", prof
    elif rlt:
        source, primary = "rltperf ranges", rlt
    else:
        source, primary = "none", []
    window = (min(s.ts for s in primary), max(s.end for s in primary)) if primary else None
    thread = (primary[0].pid, primary[0].tid) if primary else None

    steps: list[EngineStep] = []
    inner = rlt if rlt else vll
    if inner:
        for i, sp in enumerate(inner):
            m = RLTPERF_STEP_RE.match(sp.name)
            sid: int | None = None
            kind: str | None = None
            batch = None
            if m:
                sid = int(m.group(1))
                kind = m.group(2)
            else:
                v = VLLM_STEP_RE.match(sp.name)
                if v:
                    cr, ct, gr, gt = (int(x) for x in v.groups())
                    batch = {
                        "context_requests": cr,
                        "context_tokens": ct,
                        "generation_requests": gr,
                        "generation_tokens": gt,
                    }
                    kind = "prefill" if cr and not gr else ("decode" if gr and not cr else "mixed")
            cyc = next((p for p in prof if _inside(sp, p)), None)
            steps.append(EngineStep(i, sid, kind, sp, cyc, {}, batch))
    elif prof:
        steps = [EngineStep(i, None, None, p, p) for i, p in enumerate(prof)]
    # stages -> the step that holds them (both lists are sorted by start)
    names: list[str] = []
    j = 0
    for st in stage_spans:
        name = st.name[len(STAGE_PREFIX) :]
        if name not in names:
            names.append(name)
        while j < len(steps) and steps[j].span.end < st.ts:
            j += 1
        for k in (j, j - 1):
            if 0 <= k < len(steps) and _inside(st, steps[k].span):
                d = steps[k].stages_us
                d[name] = d.get(name, 0.0) + st.dur
                break
    return StepScan(prof, rlt, vll, source, steps, window, thread, names)


# --------------------------------------------------------------------------- operators


@dataclass
class OpStat:
    """Aggregate of one operator (or kernel) name."""

    name: str
    count: int = 0
    total_us: float = 0.0
    self_us: float = 0.0
    shapes: str | None = None

    def as_dict(self, steps: int | None = None) -> dict[str, Any]:
        """JSON form (ms), with per-step figures when ``steps`` is given."""
        d: dict[str, Any] = {
            "name": self.name,
            "count": self.count,
            "total_ms": round(self.total_us / 1e3, 4),
            "self_ms": round(self.self_us / 1e3, 4),
        }
        if self.shapes is not None:
            d["input_dims"] = self.shapes
        if steps:
            d["self_ms_per_step"] = round(self.self_us / 1e3 / steps, 5)
            d["count_per_step"] = round(self.count / steps, 3)
        return d


def host_op_stats(
    op_spans: list[Span], by_shape: bool = False, window: tuple[float, float] | None = None
) -> list[OpStat]:
    """Per operator name (and input shapes), count, total and *self* time (minus nested ops).

    Nesting is found per thread from the spans' extents (torch writes parents first).
    Operators outside ``window`` are left out.
    """
    by_thread: dict[tuple[Any, Any], list[Span]] = defaultdict(list)
    for s in op_spans:
        if window is not None and (s.end < window[0] or s.ts > window[1]):
            continue
        by_thread[(s.pid, s.tid)].append(s)
    stats: dict[tuple[str, str | None], OpStat] = {}
    for ops in by_thread.values():
        ops.sort(key=lambda s: (s.ts, -s.dur))
        child_sum = [0.0] * len(ops)
        stack: list[int] = []
        for i, s in enumerate(ops):
            while stack and ops[stack[-1]].end <= s.ts:
                stack.pop()
            if stack and _inside(s, ops[stack[-1]], slack=0.0):
                child_sum[stack[-1]] += s.dur
            stack.append(i)
        for i, s in enumerate(ops):
            shp = json.dumps(s.args.get("Input Dims")) if by_shape and "Input Dims" in s.args else None
            key = (s.name, shp)
            st = stats.get(key)
            if st is None:
                st = stats[key] = OpStat(s.name, shapes=shp)
            st.count += 1
            st.total_us += s.dur
            st.self_us += max(0.0, s.dur - child_sum[i])
    return sorted(stats.values(), key=lambda o: o.self_us, reverse=True)


def device_op_stats(dev_spans: list[Span], window: tuple[float, float] | None = None) -> list[OpStat]:
    """Per kernel/memcpy name: count and time (device activities do not nest: self = total)."""
    stats: dict[str, OpStat] = {}
    for s in dev_spans:
        if window is not None and (s.end < window[0] or s.ts > window[1]):
            continue
        st = stats.get(s.name)
        if st is None:
            st = stats[s.name] = OpStat(s.name)
        st.count += 1
        st.total_us += s.dur
        st.self_us += s.dur
    return sorted(stats.values(), key=lambda o: o.self_us, reverse=True)


def memory_peaks(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Allocation peaks per device from ``[memory]`` instant events (full captures).

    Returns ``[{"device": "cpu"|"cuda:0", "peak_allocated_bytes", "peak_reserved_bytes",
    "largest_allocation_bytes", "events"}]``; empty when the trace holds no memory events.
    """
    per: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.get("ph") != "i" or e.get("name") != "[memory]":
            continue
        a = e.get("args") or {}
        dtype = a.get("Device Type", 0)
        did = a.get("Device Id", -1)
        dev = "cpu" if dtype == 0 else f"cuda:{did}" if dtype == 1 else f"type{dtype}:{did}"
        d = per.setdefault(
            dev,
            {
                "device": dev,
                "peak_allocated_bytes": 0,
                "peak_reserved_bytes": 0,
                "largest_allocation_bytes": 0,
                "events": 0,
            },
        )
        d["events"] += 1
        for key, src in (
            ("peak_allocated_bytes", "Total Allocated"),
            ("peak_reserved_bytes", "Total Reserved"),
        ):
            v = a.get(src)
            if isinstance(v, (int, float)) and v > d[key]:
                d[key] = int(v)
        b = a.get("Bytes")
        if isinstance(b, (int, float)) and b > d["largest_allocation_bytes"]:
            d["largest_allocation_bytes"] = int(b)
    return sorted(per.values(), key=lambda d: d["device"])


# --------------------------------------------------------------------------- idle


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

    if dev:
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
        kern_o: float | None = kern
        other_o: float | None = other
        idle_iv = idle_all
        scale = n
    else:
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
        kern_o = None
        other_o = None
        scale = 1
    idle = win_us - busy
    within = between = None
    if step_iv is not None:
        within = sum(_overlap(a, b, step_iv) for a, b in idle_iv) / scale
        between = idle - within
    longest = max((b - a for a, b in idle_iv), default=0.0)
    return IdleBreakdown(
        basis=basis,
        window_s=win_us / 1e6,
        busy_s=busy / 1e6,
        idle_s=idle / 1e6,
        idle_fraction=(idle / win_us) if win_us else None,
        host_wait_s=host / 1e6,
        kernel_wait_s=None if kern_o is None else kern_o / 1e6,
        other_s=None if other_o is None else other_o / 1e6,
        within_steps_s=None if within is None else within / 1e6,
        between_steps_s=None if between is None else between / 1e6,
        gaps=len(idle_iv),
        longest_gap_ms=longest / 1e3,
        kernel_wait_threshold_us=kernel_wait_threshold_us,
        devices=per if dev else [],
        note=note,
    )
