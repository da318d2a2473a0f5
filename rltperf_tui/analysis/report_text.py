"""``rltperf report`` as text: the report dict of ``analysis.report.analyze_bundle``, a
section at a time, for a terminal."""

from __future__ import annotations

import math
from typing import Any

from rltperf_tui.elide import elide


def _f(v: Any, fmt: str = "{:.3f}") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return fmt.format(v)


def render_text(rep: dict[str, Any], max_steps: int = 24) -> str:
    """The report as text for a terminal."""
    L: list[str] = []
    L += _header_lines(rep)
    L += _step_lines(rep, max_steps)
    L += _idle_lines(rep)
    L += _op_lines(rep)
    L += _capture_lines(rep)
    L.append("")
    L.append("Reminder: profiled timings, not a baseline.")
    return "\n".join(L)


def _header_lines(rep: dict[str, Any]) -> list[str]:
    """Bundle, trigger, engine, the profiled note, completeness, problems and notes."""
    L: list[str] = []
    L.append(f"bundle   {rep['bundle']}")
    trig = rep.get("trigger")
    if trig:
        where = f" at step {trig['step_id']}" if trig.get("step_id") is not None else " over the window"
        delay = []
        if trig.get("delay_steps") is not None:
            delay.append(f"{trig['delay_steps']} steps")
        if trig.get("delay_ms") is not None:
            delay.append(f"{trig['delay_ms']:.0f} ms")
        L.append(
            f"TRIGGERED by {trig.get('rule')}: {trig.get('figure')} = {_f(trig.get('value'), '{:.4g}')}{where}"
            + (f"; the window began {' / '.join(delay)} later" if delay else "")
            + ("; that step is in steps.jsonl (trigger_step), with those before it (before_trigger)"
               if trig.get("step_id") is not None else "")
        )  # fmt: skip
    rw = "  [random weights: performance study only]" if rep.get("random_weights") else ""
    L.append(f"engine   {rep.get('engine') or 'unknown'}   mode {rep.get('mode') or 'unknown'}{rw}")
    L.append("PROFILED: " + rep["note"])
    if rep.get("partial"):
        L.append(f"PARTIAL: {rep['partial']}")
    L.append("")
    status = "COMPLETE" if rep["complete"] else "INCOMPLETE"
    L.append(
        f"{status}: steps requested {_f(rep['steps_requested'], '{}')}, recorded in meta.json "
        f"{_f(rep['steps_recorded'], '{}')}, found in the trace {_f(rep['steps_found'], '{}')} "
        f"({rep.get('step_source') or 'no trace'})"
    )
    rk = rep.get("ranks")
    if rk and rk.get("text"):
        L.append(
            f"RANKS: {rk['text']}"
            + (f" ({', '.join(rk.get('held') or {})})" if not rk.get("missing") else "")
        )
    for p in rep["problems"]:
        L.append(f"  problem: {p}")
    for n in rep["notes"]:
        L.append(f"  note:    {n}")
    return L


def _step_lines(rep: dict[str, Any], max_steps: int) -> list[str]:
    """Per-step table, step-time percentiles and the per-stage summary."""
    L: list[str] = []
    steps = rep["steps"]
    if steps:
        L.append("")
        names = list(rep["stage_ms"].keys())
        names = [n for n in names if n != "(outside stages)"]
        hdr = f"{'step':>8} {'kind':>8} {'step ms':>9} {'cycle ms':>9}" + "".join(
            f" {elide(n, 10):>10}" for n in names
        )
        L.append("per step (from the trace; cycle = step + the gap before it, one ProfilerStep)")
        L.append(hdr)
        for d in steps[:max_steps]:
            sid = d["step_id"] if d["step_id"] is not None else f"#{d['index']}"
            L.append(
                f"{sid!s:>8} {(d['kind'] or '-'):>8} {_f(d['step_ms']):>9} {_f(d['cycle_ms']):>9}"
                + "".join(f" {_f(d['stage_ms'].get(n)):>10}" for n in names)
            )
        if len(steps) > max_steps:
            L.append(f"   … {len(steps) - max_steps} more steps (--json has all)")
        sm = rep["step_ms"]
        L.append(
            f"step ms  p50 {_f(sm['p50'])}  p95 {_f(sm['p95'])}  p99 {_f(sm['p99'])}  max {_f(sm['max'])}  "
            f"(profiled, {len(steps)} steps)"
        )
    if rep["stage_ms"]:
        L.append("")
        L.append("stages    p50 ms    max ms   share of step time")
        for n, s in rep["stage_ms"].items():
            L.append(
                f"  {elide(n, 18):<18} {_f(s['p50']):>8} {_f(s['max']):>8}   {_f(s['share_of_step'], '{:.1%}')}"
            )
    return L


def _idle_lines(rep: dict[str, Any]) -> list[str]:
    """The trace's idle breakdown."""
    L: list[str] = []
    ib = rep["idle_breakdown"]
    if ib:
        L.append("")
        L.append(
            f"idle ({ib['basis']}) over the {ib['window_s'] * 1e3:.2f} ms window: "
            f"{_f(ib['idle_fraction'], '{:.1%}')} idle, busy {ib['busy_s'] * 1e3:.2f} ms"
        )
        L.append(
            f"  host wait {_f(ib['host_wait_fraction'], '{:.1%}')}   kernel wait "
            f"{_f(ib['kernel_wait_fraction'], '{:.1%}')}   other {_f(ib['other_fraction'], '{:.1%}')}"
            f"   (kernel-wait threshold {ib['kernel_wait_threshold_us']:g} µs)"
        )
        if ib["within_steps_s"] is not None:
            L.append(
                f"  idle inside steps {ib['within_steps_s'] * 1e3:.2f} ms, between steps "
                f"{ib['between_steps_s'] * 1e3:.2f} ms; longest gap {ib['longest_gap_ms']:.2f} ms"
            )
        L.append(f"  {ib['note']}")
    return L


def _op_lines(rep: dict[str, Any]) -> list[str]:
    """Top host operators, device activities, shapes, memory and stacks (full mode)."""
    L: list[str] = []
    to = rep["top_ops"]
    if to["host"]:
        L.append("")
        L.append("top host operators by self time          count   self ms   self ms/step")
        for o in to["host"]:
            L.append(
                f"  {elide(o['name'], 40):<40} {o['count']:>5} {o['self_ms']:>9.3f} {_f(o.get('self_ms_per_step'), '{:.4f}'):>13}"
            )
    L.append("")
    if to["device"]:
        L.append("top device activities by time             count   time ms   ms/step")
        for o in to["device"]:
            L.append(
                f"  {elide(o['name'], 40):<40} {o['count']:>5} {o['self_ms']:>9.3f} {_f(o.get('self_ms_per_step'), '{:.4f}'):>9}"
            )
    elif to["device_note"]:
        L.append(f"device activities: none — {to['device_note']}")
    if rep.get("shapes"):
        L.append("")
        # the shapes go last on the line, whole: a cut shape list is a wrong shape
        L.append("by input shape (full capture)  count   self ms   input shapes")
        for o in rep["shapes"][:10]:
            L.append(
                f"  {elide(o['name'], 28):<28} {o['count']:>5} {o['self_ms']:>9.3f}   {o.get('input_dims')}"
            )
    if rep.get("memory"):
        for m in rep["memory"]:
            L.append(
                f"memory {m['device']}: peak allocated {m['peak_allocated_bytes'] / 2**20:.2f} MiB, "
                f"largest allocation {m['largest_allocation_bytes'] / 2**20:.2f} MiB ({m['events']} events)"
            )
    if rep.get("stacks") is not None:
        L.append(f"stacks: {rep['stacks']['python_function_events']} Python function events")
    return L


def _capture_lines(rep: dict[str, Any]) -> list[str]:
    """Probe step times around the window, the capture's export, the contract, plots."""
    L: list[str] = []
    ctx = rep.get("unprofiled_context")
    if ctx and ctx["steps_before"]:
        L.append("")
        L.append(
            f"probe step times: unprofiled before the window p50 {_f(ctx['unprofiled_before_ms']['p50'])} ms "
            f"({ctx['steps_before']} steps); captured p50 {_f(ctx['captured_probe_ms']['p50'])} ms "
            f"→ profiler slow-down x{_f(ctx['profiler_slowdown_p50'], '{:.2f}')}"
        )
    if rep.get("loop_ms") or rep.get("exit_hist"):
        from rltperf_tui.analysis.loops import render

        L.append("")
        L += render(rep.get("loop_ms"), rep.get("exit_hist"), "loop[t] ranges per step, steps.jsonl exits")
        L.append(
            f"loop[t] ranges per step: {rep.get('loop_passes_per_step')} (loop[0] … loop[{len(rep.get('loop_ms') or [0]) - 1}])"
        )
    cap = rep["capture"]
    L.append("")
    L.append(
        f"capture: export {_f(cap.get('export_s'), '{:.3f}')} s, trace {_f(cap.get('trace_bytes'), '{:,}')} bytes, "
        f"{_f(cap.get('events'), '{:,}')} events"
        + (", COLD profiler (first-use cost in the window)" if cap.get("cold") else "")
    )
    if rep["contract"] is not None:
        unk = rep["unknown_contract_fields"]
        L.append(
            f"contract: {len(rep['contract'])} fields, {len(unk)} unknown"
            + (": " + ", ".join(unk) if unk else "")
        )
    else:
        L.append("contract: missing")
    if rep.get("pngs"):
        L.append("")
        for p in rep["pngs"]:
            L.append(f"wrote {p}")
    for s in rep.get("png_skipped", []):
        L.append(f"not drawn: {s}")
    return L
