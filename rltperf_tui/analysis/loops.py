"""Per-loop-depth figures of a looped model for ``rltperf report`` and ``rltperf summary``.

- From a trace: the ``loop[<t>]`` ranges a looped model marks around each pass
  (rltperf's vLLM Ouro model; ``record_function`` names), attributed to the engine step
  that contains them: mean time per depth over the steps, and the passes per step.
- From step records (recordings, ``steps.jsonl``): the exit histogram and the mean time
  and tokens per depth, as the aggregator's window holds them.
"""

from __future__ import annotations

import re
from typing import Any

from rltperf_tui.analysis import traces as T

LOOP_RANGE_RE = re.compile(r"^loop\[(\d+)\]$")
"""The name of one pass's range: ``loop[t]``, t counted from 0."""


def loop_ranges(events: list[dict[str, Any]], scan: T.StepScan | None) -> dict[str, Any] | None:
    """Mean ms per depth of the ``loop[t]`` ranges inside the scan's steps (None when the trace has none)."""
    ranges = [(int(m.group(1)), s) for s in T.spans(events) if (m := LOOP_RANGE_RE.match(s.name))]
    if not ranges:
        return None
    depth = max(t for t, _ in ranges) + 1
    tot = [0.0] * depth
    per_step: list[int] = []
    steps = scan.steps if scan else []
    for st in steps:
        inside = [(t, s) for t, s in ranges if s.ts >= st.span.ts - 0.5 and s.end <= st.span.end + 0.5]
        per_step.append(len(inside))
        for t, s in inside:
            tot[t] += s.dur
    n = len(steps) or 1
    if not steps:  # no step source: every range counts once
        for t, s in ranges:
            tot[t] += s.dur
    return {
        "loop_ms": [round(v / n / 1e3, 6) for v in tot],
        "passes_per_step": per_step,
        "ranges": len(ranges),
    }


def render(loop_ms: list[float] | None, exit_hist: list[int] | None, label: str) -> list[str]:
    """Text lines: per depth, mean time and exits (empty when neither is known)."""
    if not loop_ms and not exit_hist:
        return []
    d = max(len(loop_ms or []), len(exit_hist or []))
    parts = []
    for i in range(d):
        ms = f"{loop_ms[i]:.3f} ms" if loop_ms and i < len(loop_ms) else "n/a ms"
        ex = f"{exit_hist[i]} exits" if exit_hist and i < len(exit_hist) else "exits n/a"
        parts.append(f"depth {i + 1}: {ms}, {ex}")
    return [f"loops       {label}: " + " | ".join(parts)]
