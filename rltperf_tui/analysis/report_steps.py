"""The named steps of ``analysis.report.analyze_bundle``: each checks or reads one part
of a capture bundle, appending what it finds wrong to ``problems`` and what the reader
should know to ``notes`` (in the order the report lists them)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine_adapters.definitions import figures as F
from engine_adapters.definitions.energy import CAVEATS, MIN_SPAN_S, window_energy
from engine_adapters.definitions.records import FLAG_EXPORTING, FLAG_PROFILED, FLAG_WARMUP
from rltperf_tui.analysis import traces as T


def summary_ms(x: list[float] | np.ndarray) -> dict[str, float | None]:
    """P50/P95/P99 of pooled samples (``figures.pct``), mean and max, rounded for the report."""
    a = np.asarray(x, dtype=np.float64)
    if a.size == 0:
        return {"p50": None, "p95": None, "p99": None, "mean": None, "max": None}
    out: dict[str, float | None] = {k: round(v, 4) for k, v in F.pct(a).items() if v is not None}
    out["mean"] = round(float(a.mean()), 4)
    out["max"] = round(float(a.max()), 4)
    return out


def check_written_files(meta: dict[str, Any] | None, folder: str, problems: list[str]) -> None:
    """Every file meta.json says the writer wrote is in the bundle."""
    files = (meta or {}).get("files")
    if isinstance(files, dict):
        for name in files:
            if not os.path.exists(os.path.join(folder, name)):
                problems.append(f"{name} is listed in meta.json but missing from the bundle")


def read_trace(
    trace_path: str | None, cap: dict[str, Any], problems: list[str]
) -> tuple[T.TraceFile | None, list[dict[str, Any]]]:
    """The trace and its events; damage, emptiness and an event count other than the
    exported one are problems."""
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
    return trace, events


def check_steps(
    scan: T.StepScan | None,
    events: list[dict[str, Any]],
    has_trace: bool,
    meta_ids: list[int],
    steps_requested: int | None,
    steps_recorded: int | None,
    problems: list[str],
    notes: list[str],
) -> dict[str, list[int]]:
    """Step counts (requested, recorded, found) and step ids (meta.json vs the trace)
    agree; returns the report's ``step_ids``."""
    steps_found = scan.found if scan is not None else None
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
    missing_ids = [i for i in meta_ids if i not in set(trace_ids)] if meta_ids and has_trace else []
    unexpected_ids = [i for i in trace_ids if i not in set(meta_ids)] if meta_ids else []
    if missing_ids:
        problems.append(f"steps {_ids(missing_ids)} are recorded in meta.json but missing from the trace")
    if unexpected_ids:
        notes.append(f"steps {_ids(unexpected_ids)} are in the trace but not in meta.json's step_ids")
    if steps_requested is not None and meta_ids and len(meta_ids) != steps_requested:
        problems.append(f"meta.json lists {len(meta_ids)} step ids for {steps_requested} requested steps")
    return {
        "meta": meta_ids,
        "trace": trace_ids,
        "missing_in_trace": missing_ids,
        "unexpected_in_trace": unexpected_ids,
    }


def per_step_table(scan: T.StepScan | None) -> tuple[list[dict[str, Any]], dict[str, Any], list[float]]:
    """Per-step rows from the trace, the per-stage summary, and the step times (ms)."""
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
        s = summary_ms(vals)
        tot = sum(step_ms_list)
        s["share_of_step"] = round(sum(vals) / tot, 4) if tot else None
        stage_summary[name] = s
    if per_step and stage_names and step_ms_list:
        rest = [d["step_ms"] - sum(d["stage_ms"].values()) for d in per_step if d["step_ms"] is not None]
        s = summary_ms(rest)
        s["share_of_step"] = round(sum(rest) / sum(step_ms_list), 4) if sum(step_ms_list) else None
        stage_summary["(outside stages)"] = s
    return per_step, stage_summary, step_ms_list


@dataclass
class Operators:
    """The trace's host operators and device activities inside the window."""

    host_spans: list[T.Span]
    dev_spans: list[T.Span]
    host_ops: list[T.OpStat]
    device_ops: list[T.OpStat]
    device_note: str | None


def operators(
    events: list[dict[str, Any]],
    window: tuple[float, float] | None,
    cap: dict[str, Any],
    has_trace: bool,
    problems: list[str],
    notes: list[str],
) -> Operators:
    """Host and device operators of the window; a device timeline meta.json promises but
    the trace lacks is a problem, a CPU-only capture is said to be one."""
    host_spans = T.spans(events, T.HOST_OP_CATS)
    dev_spans = T.spans(events, T.DEVICE_CATS)
    host_ops = T.host_op_stats(host_spans, window=window)
    device_ops = T.device_op_stats(dev_spans, window=window)
    device_trace_meta = cap.get("device_trace")
    activities = cap.get("activities")
    device_note = None
    if not dev_spans and has_trace:
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
            notes.append(device_note)
    return Operators(host_spans, dev_spans, host_ops, device_ops, device_note)


def full_mode_artifacts(
    events: list[dict[str, Any]],
    host_spans: list[T.Span],
    mode: str | None,
    has_trace: bool,
    window: tuple[float, float] | None,
    nsteps: int | None,
    top: int,
    problems: list[str],
) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]] | None, dict[str, Any] | None]:
    """Shapes, memory peaks and Python stacks (a full capture must hold all three)."""
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
        if mode == "full" and has_trace and events:
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
    return shapes, memory, stacks


def probe_context(
    folder: str, bare_trace: bool, meta_ids: list[int], problems: list[str], notes: list[str]
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """steps.jsonl: the probe's records around the window, and their step times."""
    step_records: list[dict[str, Any]] = []
    context: dict[str, Any] | None = None
    sj = os.path.join(folder, "steps.jsonl")
    if not bare_trace:
        if os.path.exists(sj):
            step_records = _read_steps_jsonl(sj, problems)
            context = _context(step_records, meta_ids)
        else:
            notes.append("steps.jsonl is missing: no probe records around the window")
    return step_records, context


def contract_of(meta: dict[str, Any] | None) -> tuple[dict[str, Any] | None, list[str]]:
    """meta.json's test contract and the fields it says are unknown."""
    contract = (meta or {}).get("contract")
    unknown: list[str] = []
    if isinstance(contract, dict):
        unknown = [k for k, v in contract.items() if isinstance(v, str) and v.startswith("unknown")]
    else:
        contract = None
    return contract, unknown


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


def _ids(ids: list[int]) -> str:
    s = ", ".join(str(i) for i in ids[:12])
    return s + (f" … ({len(ids)} in all)" if len(ids) > 12 else "")


def ceiling_of(
    meta: dict[str, Any] | None, gbps: float | None, gflops: float | None
) -> dict[str, Any] | None:
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
        "unprofiled_before_ms": summary_ms(before),
        "captured_probe_ms": summary_ms(captured),
        "exporting_after_ms": summary_ms(after_exp),
        "steps_before": len(before),
        "steps_captured": len(captured),
        "steps_exporting": len(after_exp),
    }
    b50, c50 = out["unprofiled_before_ms"]["p50"], out["captured_probe_ms"]["p50"]
    out["profiler_slowdown_p50"] = round(c50 / b50, 3) if b50 and c50 else None
    return out


def context_energy(meta: dict[str, Any] | None) -> dict[str, Any]:
    """The energy figures of the unprofiled steps before the window (``meta.json``
    ``energy.base``: up to 30 s of them, excluded steps' spans out): power, joules per
    output token and per step by the window's definition (``energy.window_energy``,
    ``figures.power_w`` / ``joules_per_token``); the source and its caveat, or the reason
    there are none."""
    em = (meta or {}).get("energy")
    out: dict[str, Any] = {"power_w": None, "joules_per_token": None, "joules_per_step": None,
                           "source": None, "caveat": None, "reason": None, "seconds": None}  # fmt: skip
    if not isinstance(em, dict):
        out["reason"] = "the bundle holds no energy counter readings (made before rltperf read them)"
        return out
    readings = [(np.array([t for t, _ in rows], dtype=np.float64), np.array([j for _, j in rows], dtype=np.float64))
                for rows in (em.get("readings") or {}).values() if rows]  # fmt: skip
    base = em.get("base")
    if not readings or not isinstance(base, dict):
        out["reason"] = em.get("reason") or (
            "no energy counter readings" if not readings else "no unprofiled steps before the window"
        )
        return out
    w0, w1 = base["start_ns"], base["end_ns"]
    excl = base.get("excluded") or []
    got = window_energy(readings, w0, w1, [a for a, _ in excl], [b for _, b in excl])
    seconds = ((w1 - w0) - sum(b - a for a, b in excl)) / 1e9
    out["source"] = em.get("source")
    out["caveat"] = CAVEATS.get(em.get("source") or "")
    out["seconds"] = round(seconds, 3)
    if got is None or got[1] < MIN_SPAN_S or seconds <= 0:
        out["reason"] = (
            f"the counter's readings cover under {MIN_SPAN_S:g} s of the unprofiled steps before the window"
        )
        return out
    joules, energy_s = got
    out["power_w"] = round(float(F.power_w(joules, energy_s)), 3)
    if base.get("out_tokens"):
        out["joules_per_token"] = float(F.joules_per_token(joules, energy_s, base["out_tokens"], seconds))
    if base.get("steps"):
        out["joules_per_step"] = float(
            F.quotient(F.power_w(joules, energy_s), F.per_second(base["steps"], seconds))
        )
    return out
