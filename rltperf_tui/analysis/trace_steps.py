"""Spans of a Chrome trace, the engine steps and stages among them, and operator
statistics (the definitions: ``analysis.traces``)."""

from __future__ import annotations

import json
import re
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
