"""``rltperf report BUNDLE``: what a capture bundle holds and whether it is complete."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

HELP = "report on a capture bundle: completeness, steps, stages, top operators, idle breakdown, contract"
DESCRIPTION = """\
Read a capture bundle (the folder `rltperf capture` or the monitor wrote, or a vLLM
bundle, or a bare Chrome trace) and say what it holds:

  - steps requested vs recorded in meta.json vs found in the trace (ProfilerStep spans,
    or vLLM's execute_context_..._generation_... annotations); missing events, an
    incomplete window, a damaged trace or an export error are stated as problems, never
    read as zero cost;
  - per-step and per-stage durations from the trace's stage:<name> ranges;
  - top operators by self time (host) and device activities by time;
  - full captures: time by input shape, allocation peaks, stack events;
  - the trace-based idle breakdown (Holistic Trace Analysis' definition: device busy
    = union of kernel intervals; idle split into host wait / kernel wait / other; on a
    CPU-only trace the operators of the engine thread);
  - the test contract from meta.json with every unknown field listed.

The timings are profiled: they are not a baseline.  Exit status: 0 complete, 3 the
report was made but the bundle is incomplete or damaged, 4 the bundle is complete but
--png could not draw its charts (the report is printed all the same, the reason after
it on stderr), 1 nothing to report on.
JSON keys (--json) include steps_requested, steps_found, complete, problems,
idle_fraction, idle_breakdown, top_ops, unknown_contract_fields (and pngs, png_skipped
or png_error with --png)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", help="bundle folder (or a .json/.json.gz Chrome trace)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--png",
        metavar="DIR",
        default=None,
        help="also write charts to DIR: step time by stage, roofline, exit-depth histogram",
    )
    p.add_argument("--top", type=int, default=15, help="operators listed (default 15)")
    p.add_argument(
        "--kernel-wait-us",
        type=float,
        default=30.0,
        help="idle gap below which a queued launch counts as kernel wait (default 30 µs; HTA's 30)",
    )
    p.add_argument(
        "--peak-gbps", type=float, default=None, help="peak memory bandwidth for the roofline chart"
    )
    p.add_argument("--peak-gflops", type=float, default=None, help="peak GFLOP/s for the roofline chart")


def write_pngs(an: Any, out_dir: str) -> tuple[list[str], list[str]]:
    """Charts of one bundle; returns (written paths, sentences for charts not drawn)."""
    from rltperf_tui.analysis import plots
    from rltperf_tui.analysis.report import exit_histogram, roofline_points

    rep = an.report
    written: list[str] = []
    skipped: list[str] = []
    eng = rep.get("engine") or "engine"
    mode = rep.get("mode") or "?"
    rw = " [random weights]" if rep.get("random_weights") else ""
    steps = rep["steps"]
    if steps:
        bars = []
        totals = []
        for d in steps:
            label = str(d["step_id"]) if d["step_id"] is not None else f"#{d['index']}"
            stages = dict(d["stage_ms"])
            total = d["step_ms"] if d["step_ms"] is not None else d["cycle_ms"]
            rest = (total or 0.0) - sum(stages.values())
            if rest > 0:
                stages["(outside stages)"] = rest
            bars.append((label, stages))
            totals.append(total)
        written.append(
            plots.stacked_bars(
                os.path.join(out_dir, "step_stages.png"),
                bars,
                f"Step time by stage — {eng}, {mode} capture, {len(steps)} steps (PROFILED, not a baseline){rw}",
                ylabel="ms per step (from the trace)",
                totals=totals,
                subtitle="stage:<name> ranges inside each rltperf.step range; outline = whole step",
            )
        )
    else:
        skipped.append("step_stages.png: no steps in the trace")
    pts = roofline_points(an.step_records)
    if pts:
        ceil = rep.get("ceiling") or {}
        unprof = [(p["intensity"], p["gflops"]) for p in pts if not p["profiled"]]
        prof = [(p["intensity"], p["gflops"]) for p in pts if p["profiled"] and p["window"] == "captured"]
        written.append(
            plots.roofline(
                os.path.join(out_dir, "roofline.png"),
                [("unprofiled steps around the capture", unprof), ("captured steps (profiled)", prof)],
                ceil.get("peak_bw_gbps"),
                ceil.get("peak_gflops"),
                f"Roofline — {eng}: analytic FLOPs/bytes per step vs step time{rw}",
                ceiling_source=ceil.get("source"),
            )
        )
    else:
        skipped.append(
            "roofline.png: the step records carry no bytes/FLOPs (the engine does not report them)"
        )
    hist = exit_histogram(an.step_records)
    if hist:
        written.append(
            plots.exit_depth(
                os.path.join(out_dir, "exit_depth.png"),
                [("steps.jsonl records", hist)],
                f"Exit-depth histogram — {eng}, {len(an.step_records)} steps around the capture{rw}",
            )
        )
    else:
        skipped.append("exit_depth.png: the engine reports no exit depths")
    return written, skipped


def run(args: argparse.Namespace) -> int:
    from rltperf_tui.analysis.report import ReportError, analyze_bundle, render_text

    try:
        an = analyze_bundle(
            args.bundle,
            top=args.top,
            kernel_wait_us=args.kernel_wait_us,
            peak_gbps=args.peak_gbps,
            peak_gflops=args.peak_gflops,
        )
    except ReportError as exc:
        print(f"rltperf report: error: {exc}", file=sys.stderr)
        return 1
    rep = an.report
    png_error = None
    if args.png:
        from rltperf_tui.analysis.plots import PlotUnavailable

        try:
            rep["pngs"], rep["png_skipped"] = write_pngs(an, args.png)
        except PlotUnavailable as exc:
            png_error = str(exc)
        except OSError as exc:
            png_error = f"cannot write charts to {args.png}: {exc.strerror or exc}"
        if png_error:
            rep["png_error"] = png_error
    # The report comes first whatever happened to the charts: a missing optional part
    # costs only that part.
    if args.json:
        print(json.dumps(rep, indent=2, default=str))
    else:
        print(render_text(rep))
    if png_error:
        sys.stdout.flush()
        print(f"rltperf report: no charts: {png_error}", file=sys.stderr)
    if not rep["complete"]:
        return 3
    return 4 if png_error else 0
