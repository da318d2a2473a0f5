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
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine_adapters.definitions.bundle import missing_meta_fields, read_meta
from engine_adapters.definitions.records import FLAG_EXPORTING, FLAG_PROFILED, FLAG_WARMUP
from rltperf_tui.analysis import traces as T
from rltperf_tui.elide import elide

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


def _pct(x: list[float] | np.ndarray) -> dict[str, float | None]:
    a = np.asarray(x, dtype=np.float64)
    if a.size == 0:
        return {"p50": None, "p95": None, "p99": None, "mean": None, "max": None}
    q = np.percentile(a, [50, 95, 99])
    return {
        "p50": round(float(q[0]), 4),
        "p95": round(float(q[1]), 4),
        "p99": round(float(q[2]), 4),
        "mean": round(float(a.mean()), 4),
        "max": round(float(a.max()), 4),
    }


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


def _read_steps_jsonl(path: str, problems: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    out.append(json.loads(line))
                except ValueError:
                    problems.append(
                        f"steps.jsonl: line {i} is not valid JSON (the file is cut or damaged); "
                        f"{len(out)} records read before it"
                    )
                    break
    except OSError as exc:
        problems.append(f"steps.jsonl cannot be read: {exc.strerror}")
    return out


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

    # ---- files the writer says it wrote
    files = (meta or {}).get("files")
    if isinstance(files, dict):
        for name in files:
            if not os.path.exists(os.path.join(folder, name)):
                problems.append(f"{name} is listed in meta.json but missing from the bundle")

    # ---- trace
    trace: T.TraceFile | None = None
    if trace_path is not None:
        try:
            trace = T.load_trace(trace_path)
        except OSError as exc:
            problems.append(f"the trace {os.path.basename(trace_path)} cannot be read: {exc.strerror}")
    events = trace.events if trace else []
    if trace is not None:
        if trace.error:
            problems.append(
                f"the trace {os.path.basename(trace.path)} is damaged: {trace.error}; "
                f"{len(events)} complete events were read before the damage, everything after is missing"
            )
        elif not events:
            problems.append("the trace holds no events")
        exp_events = cap.get("events")
        if isinstance(exp_events, int) and not trace.error and exp_events != len(events):
            problems.append(
                f"the trace holds {len(events)} events, meta.json says {exp_events} were exported"
            )

    ann = T.spans(events, T.ANNOTATION_CATS)
    scan = T.scan_steps(events, ann) if trace is not None else None
    steps_found = scan.found if scan is not None else None

    # ---- step counts and ids
    if scan is not None:
        if scan.source == "none" and events:
            problems.append(
                "no steps found in the trace (no ProfilerStep spans, rltperf.step ranges or vLLM execute "
                "annotations): the window cannot be delimited"
            )
        if steps_requested is not None and steps_found is not None and steps_found != steps_requested:
            problems.append(
                f"incomplete window: {steps_found} steps found in the trace ({scan.source}), "
                f"{steps_requested} were requested"
            )
        if steps_recorded is not None and steps_found is not None and steps_found != steps_recorded:
            problems.append(
                f"meta.json records {steps_recorded} captured steps, the trace holds {steps_found}"
            )
        if scan.source == "ProfilerStep" and scan.rltperf_steps:
            empty = [p.name for p in scan.profiler_steps if not any(s.cycle is p for s in scan.steps)]
            if empty:
                problems.append(
                    f"{len(empty)} ProfilerStep spans hold no engine step range: {', '.join(empty[:5])}"
                )
    trace_ids = [s.step_id for s in (scan.steps if scan else []) if s.step_id is not None]
    missing_ids = [i for i in meta_ids if i not in set(trace_ids)] if meta_ids and trace is not None else []
    unexpected_ids = [i for i in trace_ids if i not in set(meta_ids)] if meta_ids else []
    if missing_ids:
        problems.append(f"steps {_ids(missing_ids)} are recorded in meta.json but missing from the trace")
    if unexpected_ids:
        notes.append(f"steps {_ids(unexpected_ids)} are in the trace but not in meta.json's step_ids")
    if steps_requested is not None and meta_ids and len(meta_ids) != steps_requested:
        problems.append(f"meta.json lists {len(meta_ids)} step ids for {steps_requested} requested steps")

    # ---- per-step and per-stage
    stage_names = list(scan.stage_names) if scan else []
    per_step: list[dict[str, Any]] = []
    for st in scan.steps if scan else []:
        d: dict[str, Any] = {
            "index": st.index,
            "step_id": st.step_id,
            "kind": st.kind,
            "step_ms": round(st.span.dur / 1e3, 4) if st.span is not st.cycle else None,
            "cycle_ms": round(st.cycle.dur / 1e3, 4) if st.cycle is not None else None,
            "stage_ms": {k: round(v / 1e3, 4) for k, v in st.stages_us.items()},
        }
        if st.batch:
            d["batch"] = st.batch
        per_step.append(d)
    stage_summary: dict[str, Any] = {}
    step_ms_list = [d["step_ms"] for d in per_step if d["step_ms"] is not None]
    for name in stage_names:
        vals = [d["stage_ms"].get(name, 0.0) for d in per_step if d["step_ms"] is not None]
        s = _pct(vals)
        tot = sum(step_ms_list)
        s["share_of_step"] = round(sum(vals) / tot, 4) if tot else None
        stage_summary[name] = s
    if per_step and stage_names and step_ms_list:
        rest = [d["step_ms"] - sum(d["stage_ms"].values()) for d in per_step if d["step_ms"] is not None]
        s = _pct(rest)
        s["share_of_step"] = round(sum(rest) / sum(step_ms_list), 4) if sum(step_ms_list) else None
        stage_summary["(outside stages)"] = s

    # ---- operators
    window = scan.window if scan else None
    nsteps = steps_found or None
    host_spans = T.spans(events, T.HOST_OP_CATS)
    dev_spans = T.spans(events, T.DEVICE_CATS)
    host_ops = T.host_op_stats(host_spans, window=window)
    device_ops = T.device_op_stats(dev_spans, window=window)
    device_trace_meta = cap.get("device_trace")
    activities = cap.get("activities")
    device_note = None
    if not dev_spans and trace is not None:
        if device_trace_meta or (isinstance(activities, list) and "cuda" in activities):
            problems.append(
                "meta.json says device (CUDA) activities were recorded but the trace holds no kernel, memcpy "
                "or memset events: the device timeline is missing (not zero cost)"
            )
            device_note = "device activity missing from the trace"
        else:
            device_note = (
                "CPU-only capture: the trace has no device timeline, so this is not a complete device "
                "capture; host operators are the whole picture"
            )
            if trace is not None:
                notes.append(device_note)

    # ---- full mode artifacts
    shapes: list[dict[str, Any]] | None = None
    memory: list[dict[str, Any]] | None = None
    stacks: dict[str, Any] | None = None
    has_shapes = any("Input Dims" in s.args for s in host_spans)
    mem = T.memory_peaks(events)
    n_py = sum(1 for e in events if e.get("cat") == "python_function")
    if mode == "full" or has_shapes or mem or n_py:
        shapes = [o.as_dict(nsteps) for o in T.host_op_stats(host_spans, by_shape=True, window=window)[:top]]
        memory = mem
        stacks = {"python_function_events": n_py}
        if mode == "full" and trace is not None and events:
            lacking = [
                what
                for what, ok in (
                    ("input shapes", has_shapes),
                    ("memory events", bool(mem)),
                    ("Python stacks", n_py > 0),
                )
                if not ok
            ]
            if lacking:
                problems.append(
                    f"full capture without {', '.join(lacking)} in the trace: those artifacts are missing"
                )

    # ---- idle
    idle = T.idle_breakdown(events, scan, kernel_wait_threshold_us=kernel_wait_us) if events else None

    # ---- steps.jsonl: probe records around the window
    step_records: list[dict[str, Any]] = []
    context: dict[str, Any] | None = None
    sj = os.path.join(folder, "steps.jsonl")
    if not bare_trace:
        if os.path.exists(sj):
            step_records = _read_steps_jsonl(sj, problems)
            context = _context(step_records, meta_ids)
        else:
            notes.append("steps.jsonl is missing: no probe records around the window")

    # ---- contract
    contract = (meta or {}).get("contract")
    unknown: list[str] = []
    if isinstance(contract, dict):
        unknown = [k for k, v in contract.items() if isinstance(v, str) and v.startswith("unknown")]
    else:
        contract = None

    engine = (meta or {}).get("engine") or {}
    ceiling = _ceiling(meta, peak_gbps, peak_gflops)
    complete = not problems and trace is not None and meta is not None
    rep: dict[str, Any] = {
        "bundle": path,
        "engine": engine.get("name") if isinstance(engine, dict) else None,
        "random_weights": engine.get("random_weights") if isinstance(engine, dict) else None,
        "mode": mode,
        "profiled": True,
        "note": PROFILED_NOTE,
        "steps_requested": steps_requested,
        "steps_recorded": steps_recorded,
        "steps_found": steps_found,
        "step_source": scan.source if scan else None,
        "complete": complete,
        "partial": cap.get("partial_reason"),
        "trigger": (meta or {}).get("trigger") if isinstance((meta or {}).get("trigger"), dict) else None,
        "problems": problems,
        "notes": notes,
        "missing_meta_fields": missing_fields,
        "step_ids": {
            "meta": meta_ids,
            "trace": trace_ids,
            "missing_in_trace": missing_ids,
            "unexpected_in_trace": unexpected_ids,
        },
        "steps": per_step,
        "step_ms": _pct(step_ms_list),
        "cycle_ms": _pct([d["cycle_ms"] for d in per_step if d["cycle_ms"] is not None]),
        "stage_ms": stage_summary,
        "idle_fraction": idle.idle_fraction if idle else None,
        "idle_breakdown": idle.as_dict() if idle else None,
        "top_ops": {
            "host": [o.as_dict(nsteps) for o in host_ops[:top]],
            "device": [o.as_dict(nsteps) for o in device_ops[:top]] if dev_spans else None,
            "device_note": device_note,
            "sorted_by": "self time",
        },
        "shapes": shapes,
        "memory": memory,
        "stacks": stacks,
        "unprofiled_context": context,
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
    return BundleAnalysis(path, meta, trace, scan, host_ops, device_ops, idle, step_records, rep)


def _ids(ids: list[int]) -> str:
    s = ", ".join(str(i) for i in ids[:12])
    return s + (f" … ({len(ids)} in all)" if len(ids) > 12 else "")


def _ceiling(meta: dict[str, Any] | None, gbps: float | None, gflops: float | None) -> dict[str, Any] | None:
    """Peak figures for the roofline: command line, else meta.json's ``ceiling``, else None."""
    if gbps or gflops:
        return {"peak_bw_gbps": gbps, "peak_gflops": gflops, "source": "command line"}
    c = (meta or {}).get("ceiling")
    if isinstance(c, dict) and (c.get("peak_bw_gbps") or c.get("peak_gflops")):
        return {
            "peak_bw_gbps": c.get("peak_bw_gbps"),
            "peak_gflops": c.get("peak_gflops"),
            "source": c.get("source", "meta.json"),
        }
    return None


def _context(recs: list[dict[str, Any]], ids: list[int]) -> dict[str, Any] | None:
    """Probe-measured step times: unprofiled steps before the window vs the captured ones."""
    if not recs:
        return None
    idset = set(ids)

    def ms(r: dict[str, Any]) -> float:
        return (r.get("end_ns", 0) - r.get("start_ns", 0)) / 1e6

    before = [
        ms(r)
        for r in recs
        if r.get("window") == "before"
        and not (r.get("flags", 0) & (FLAG_PROFILED | FLAG_WARMUP | FLAG_EXPORTING))
    ]
    captured = [ms(r) for r in recs if r.get("window") == "captured" or r.get("step_id") in idset]
    after_exp = [ms(r) for r in recs if r.get("window") == "after" and r.get("flags", 0) & FLAG_EXPORTING]
    out: dict[str, Any] = {
        "unprofiled_before_ms": _pct(before),
        "captured_probe_ms": _pct(captured),
        "exporting_after_ms": _pct(after_exp),
        "steps_before": len(before),
        "steps_captured": len(captured),
        "steps_exporting": len(after_exp),
    }
    b50, c50 = out["unprofiled_before_ms"]["p50"], out["captured_probe_ms"]["p50"]
    out["profiler_slowdown_p50"] = round(c50 / b50, 3) if b50 and c50 else None
    return out


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
        profiled = bool(r.get("flags", 0) & (FLAG_PROFILED | FLAG_EXPORTING | FLAG_WARMUP))
        pts.append(
            {
                "intensity": fl / b,
                "gflops": fl / dt / 1e9,
                "gbps": b / dt / 1e9,
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


# --------------------------------------------------------------------------- text


def _f(v: Any, fmt: str = "{:.3f}") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return fmt.format(v)


def render_text(rep: dict[str, Any], max_steps: int = 24) -> str:
    """The report as text for a terminal."""
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
    for p in rep["problems"]:
        L.append(f"  problem: {p}")
    for n in rep["notes"]:
        L.append(f"  note:    {n}")
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
    ctx = rep.get("unprofiled_context")
    if ctx and ctx["steps_before"]:
        L.append("")
        L.append(
            f"probe step times: unprofiled before the window p50 {_f(ctx['unprofiled_before_ms']['p50'])} ms "
            f"({ctx['steps_before']} steps); captured p50 {_f(ctx['captured_probe_ms']['p50'])} ms "
            f"→ profiler slow-down x{_f(ctx['profiler_slowdown_p50'], '{:.2f}')}"
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
    L.append("")
    L.append("Reminder: profiled timings, not a baseline.")
    return "\n".join(L)
