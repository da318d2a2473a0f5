"""``rltperf report``: what a capture bundle holds, whether it is complete, and what it shows.

The seeds' rules drive every line: missing trace events, an incomplete window or an
export error are stated plainly and never read as zero cost; a CPU-only capture is not
called a complete device capture; the timings are profiled and are not a baseline.

A bundle (see ``engine_adapters.probe.bundle``) is a folder with ``trace.json.gz``,
``meta.json``, ``ops.txt`` and ``steps.jsonl``.  vLLM bundles use the same layout; their
steps are vLLM's ``execute_context_…_generation_…`` annotations.  A bare trace file is
accepted too (then nothing is known of what was requested).
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from typing import Any

from engine_adapters.definitions import roofline as RL
from engine_adapters.definitions.bundle import missing_meta_fields, read_meta
from engine_adapters.definitions.figures import EXCLUDED_FLAGS
from engine_adapters.definitions.ranks import ranks_text
from rltperf_tui.analysis import traces as T
from rltperf_tui.analysis.report_steps import (
    Operators,
    ceiling_of,
    check_steps,
    check_written_files,
    contract_of,
    full_mode_artifacts,
    operators,
    per_step_table,
    probe_context,
    read_trace,
    summary_ms,
)
from rltperf_tui.analysis.report_text import render_text

__all__ = [
    "BundleAnalysis",
    "ReportError",
    "analyze_bundle",
    "exit_histogram",
    "render_text",
    "roofline_points",
]

PROFILED_NOTE = (
    "These timings were taken with the profiler on: they are NOT a baseline. Use them to find "
    "where time goes; claim speed-ups only from unprofiled recordings (rltperf record / compare)."
)


class ReportError(Exception):
    """The path is not something a report can be made of; the message says why."""


def find_trace(folder: str) -> tuple[str | None, list[str]]:
    """The bundle's trace file and any other trace files beside it (other ranks/processes)."""
    for name in ("trace.json.gz", "trace.json"):
        p = os.path.join(folder, name)
        if os.path.exists(p):
            others = [q for q in glob.glob(os.path.join(folder, "*.trace.json*")) if q != p]
            return p, sorted(others)
    cands = sorted(
        glob.glob(os.path.join(folder, "*.trace.json.gz")) + glob.glob(os.path.join(folder, "*.trace.json"))
    )
    if not cands:
        return None, []
    # vLLM writes the worker's trace as <prefix>rank<k>.<ns>.pt.trace.json.gz: prefer rank 0
    ranked = [c for c in cands if ".rank0." in os.path.basename(c) or "rank0." in os.path.basename(c)]
    main = ranked[0] if ranked else max(cands, key=os.path.getsize)
    return main, [c for c in cands if c != main]


@dataclass
class BundleAnalysis:
    """Everything read and derived from one bundle (the report is ``report``)."""

    path: str
    meta: dict[str, Any] | None
    trace: T.TraceFile | None
    scan: T.StepScan | None
    host_ops: list[T.OpStat] = field(default_factory=list)
    device_ops: list[T.OpStat] = field(default_factory=list)
    idle: T.IdleBreakdown | None = None
    step_records: list[dict[str, Any]] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)


def analyze_bundle(
    path: str,
    top: int = 15,
    kernel_wait_us: float = T.DEFAULT_KERNEL_WAIT_US,
    peak_gbps: float | None = None,
    peak_gflops: float | None = None,
) -> BundleAnalysis:
    """Read a bundle folder (or a bare trace file) and build its report dict.

    Raises ``ReportError`` only when ``path`` is neither a folder nor a trace file.
    """
    path = os.path.abspath(path)
    problems: list[str] = []
    notes: list[str] = []
    meta: dict[str, Any] | None = None
    bare_trace = False
    if os.path.isdir(path):
        folder = path
        trace_path, other_traces = find_trace(folder)
        if trace_path is None and not os.path.exists(os.path.join(folder, "meta.json")):
            inner = sorted(glob.glob(os.path.join(folder, "*", "meta.json")))
            if inner:
                newest = os.path.dirname(max(inner, key=os.path.getmtime))
                raise ReportError(
                    f"{path} holds {len(inner)} bundles, not one: pass a bundle folder, e.g. the newest: {newest}"
                )
            if not os.path.exists(os.path.join(folder, "steps.jsonl")):
                raise ReportError(
                    f"{path} is not a capture bundle (no meta.json, trace.json.gz or steps.jsonl): "
                    "pass the folder `rltperf capture` or the monitor's c / f printed"
                )
        got = read_meta(folder)
        meta = got.raw
        if got.problem:
            problems.append(got.problem)
        if trace_path is None:
            problems.append(
                "no trace file (trace.json.gz) in the bundle: the operators and timeline are missing"
            )
        if other_traces:
            notes.append(
                "other trace files beside the main one (other ranks or processes), not analysed: "
                + ", ".join(os.path.basename(p) for p in other_traces)
            )
    elif os.path.isfile(path) and (path.endswith(".json") or path.endswith(".json.gz")):
        folder = os.path.dirname(path)
        trace_path = path
        bare_trace = True
        notes.append("a bare trace file, not a bundle: steps requested and the test contract are unknown")
    elif not os.path.exists(path):
        raise ReportError(f"{path} does not exist")
    else:
        raise ReportError(f"{path} is neither a bundle folder nor a Chrome trace (.json / .json.gz)")

    # ---- meta fields
    missing_fields: list[str] = []
    if meta is not None:
        missing_fields, absent_fields = missing_meta_fields(meta)
        problems.extend(f"meta.json has no '{name}'" for name in missing_fields)
        notes.extend(f"meta.json has no '{name}' (optional)" for name in absent_fields)
    cap: dict[str, Any] = (meta or {}).get("capture") or {}
    if not isinstance(cap, dict):
        cap = {}
    steps_requested = cap.get("steps_requested") if isinstance(cap.get("steps_requested"), int) else None
    steps_recorded = cap.get("steps_captured") if isinstance(cap.get("steps_captured"), int) else None
    mode = cap.get("mode") if isinstance(cap.get("mode"), str) else None
    meta_ids = [int(i) for i in cap.get("step_ids") or [] if isinstance(i, int)]
    export_error = cap.get("error")
    if export_error:
        problems.append(f"the capture recorded an error: {export_error}")

    check_written_files(meta, folder, problems)
    trace, events = read_trace(trace_path, cap, problems)
    ann = T.spans(events, T.ANNOTATION_CATS)
    scan = T.scan_steps(events, ann) if trace is not None else None
    step_ids = check_steps(
        scan, events, trace is not None, meta_ids, steps_requested, steps_recorded, problems, notes
    )
    per_step, stage_summary, step_ms_list = per_step_table(scan)
    window = scan.window if scan else None
    nsteps = (scan.found if scan is not None else None) or None
    ops = operators(events, window, cap, trace is not None, problems, notes)
    shapes, memory, stacks = full_mode_artifacts(
        events, ops.host_spans, mode, trace is not None, window, nsteps, top, problems
    )
    idle = T.idle_breakdown(events, scan, kernel_wait_threshold_us=kernel_wait_us) if events else None
    step_records, context = probe_context(folder, bare_trace, meta_ids, problems, notes)
    contract, unknown = contract_of(meta)
    rep = _report_dict(
        path=path,
        meta=meta,
        cap=cap,
        mode=mode,
        steps_requested=steps_requested,
        steps_recorded=steps_recorded,
        scan=scan,
        trace=trace,
        events=events,
        problems=problems,
        notes=notes,
        missing_fields=missing_fields,
        step_ids=step_ids,
        per_step=per_step,
        stage_summary=stage_summary,
        step_ms_list=step_ms_list,
        idle=idle,
        ops=ops,
        top=top,
        nsteps=nsteps,
        extras={"shapes": shapes, "memory": memory, "stacks": stacks, "unprofiled_context": context},
        contract=contract,
        unknown=unknown,
        ceiling=ceiling_of(meta, peak_gbps, peak_gflops),
    )
    from rltperf_tui.analysis.loops import loop_ranges

    lr = loop_ranges(events, scan) if trace else None
    rep["loop_ms"] = lr["loop_ms"] if lr else None
    rep["loop_passes_per_step"] = lr["passes_per_step"] if lr else None
    rep["exit_hist"] = exit_histogram(step_records) or None
    rk = cap.get("ranks")  # vLLM captures of a multi-rank server: held and missing ranks
    rep["ranks"] = dict(rk, text=ranks_text(rk)) if isinstance(rk, dict) else None
    if rep["ranks"] and rep["ranks"].get("missing"):
        rep["problems"].append(f"ranks missing from the capture: {rep['ranks']['text']}")
    return BundleAnalysis(path, meta, trace, scan, ops.host_ops, ops.device_ops, idle, step_records, rep)


def _report_dict(
    *,
    path: str,
    meta: dict[str, Any] | None,
    cap: dict[str, Any],
    mode: str | None,
    steps_requested: int | None,
    steps_recorded: int | None,
    scan: T.StepScan | None,
    trace: T.TraceFile | None,
    events: list[dict[str, Any]],
    problems: list[str],
    notes: list[str],
    missing_fields: list[str],
    step_ids: dict[str, list[int]],
    per_step: list[dict[str, Any]],
    stage_summary: dict[str, Any],
    step_ms_list: list[float],
    idle: T.IdleBreakdown | None,
    ops: Operators,
    top: int,
    nsteps: int | None,
    extras: dict[str, Any],
    contract: dict[str, Any] | None,
    unknown: list[str],
    ceiling: dict[str, Any] | None,
) -> dict[str, Any]:
    """The report dict (``rltperf report --json``) from the steps' findings."""
    engine = (meta or {}).get("engine") or {}
    complete = not problems and trace is not None and meta is not None
    return {
        "bundle": path,
        "engine": engine.get("name") if isinstance(engine, dict) else None,
        "random_weights": engine.get("random_weights") if isinstance(engine, dict) else None,
        "mode": mode,
        "profiled": True,
        "note": PROFILED_NOTE,
        "steps_requested": steps_requested,
        "steps_recorded": steps_recorded,
        "steps_found": scan.found if scan is not None else None,
        "step_source": scan.source if scan else None,
        "complete": complete,
        "partial": cap.get("partial_reason"),
        "trigger": (meta or {}).get("trigger") if isinstance((meta or {}).get("trigger"), dict) else None,
        "problems": problems,
        "notes": notes,
        "missing_meta_fields": missing_fields,
        "step_ids": step_ids,
        "steps": per_step,
        "step_ms": summary_ms(step_ms_list),
        "cycle_ms": summary_ms([d["cycle_ms"] for d in per_step if d["cycle_ms"] is not None]),
        "stage_ms": stage_summary,
        "idle_fraction": idle.idle_fraction if idle else None,
        "idle_breakdown": idle.as_dict() if idle else None,
        "top_ops": {
            "host": [o.as_dict(nsteps) for o in ops.host_ops[:top]],
            "device": [o.as_dict(nsteps) for o in ops.device_ops[:top]] if ops.dev_spans else None,
            "device_note": ops.device_note,
            "sorted_by": "self time",
        },
        **extras,
        "capture": {
            k: cap.get(k)
            for k in (
                "capture_id",
                "label",
                "mode",
                "cold",
                "export_s",
                "trace_bytes",
                "events",
                "activities",
                "error",
                "profiler_warmup_step",
            )
        },
        "contract": contract,
        "unknown_contract_fields": unknown,
        "ceiling": ceiling,
        "trace": {
            "path": trace.path if trace else None,
            "bytes_on_disk": trace.bytes_on_disk if trace else None,
            "events": len(events) if trace else None,
            "error": trace.error if trace else None,
        },
    }


def roofline_points(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-step roofline points from probe records: intensity (FLOP/B), GFLOP/s, GB/s."""
    pts = []
    for r in recs:
        b = (r.get("bytes_read") or 0) + (r.get("bytes_written") or 0)
        fl = r.get("flops")
        dt = (r.get("end_ns", 0) - r.get("start_ns", 0)) / 1e9
        if not b or not fl or dt <= 0:
            continue
        # steps under the profiler, its export or the engine's warm-up are not baseline points
        profiled = bool(r.get("flags", 0) & EXCLUDED_FLAGS)
        pts.append(
            {
                "intensity": RL.arithmetic_intensity(fl, b),
                "gflops": RL.achieved_gflops(fl, dt),
                "gbps": RL.achieved_gbps(b, dt),
                "profiled": profiled,
                "window": r.get("window"),
            }
        )
    return pts


def exit_histogram(recs: list[dict[str, Any]]) -> list[int]:
    """Tokens by exit depth summed over the records (empty when the engine reports none)."""
    tot: list[int] = []
    for r in recs:
        h = r.get("exit_hist") or []
        if len(h) > len(tot):
            tot.extend([0] * (len(h) - len(tot)))
        for i, v in enumerate(h):
            tot[i] += int(v)
    return tot if any(tot) else []
