"""``rltperf compare A B``: A/B evidence from recordings (unprofiled) or bundles (profiled)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

HELP = "compare two recordings (distributions, CIs, verdicts) or two bundles (operators, stages)"
DESCRIPTION = """\
Two recordings (unprofiled baselines from `rltperf record`):
  rltperf compare A.rltrec B.rltrec
  rltperf compare A1 B1 A2 B2 A3 B3      interleaved rounds of the same A and B
Step time, step gap, TTFT and TPOT P50/P95/P99 side by side with B-A, tokens/s, idle
fraction and MBU; every difference has a 95% bootstrap confidence interval (moving
blocks: step series are autocorrelated) and a verdict: significant only when it
survives a Holm correction over all metrics AND reaches the smallest effect of interest
(--min-effect, default 5% of A).  Bootstrap blocks span at least --block-s seconds
(0.5 s), so the machine's slow wander is inside the interval.  A drift check computes
each metric over the quarters of every recording: a difference no larger than how much
one recording disagrees with itself is "not established"; with rounds, every round's
difference must have the same sign.  Profiled steps are left out.  One recording per
side cannot see run-to-run variation: interleave rounds to establish small effects.

Two bundles (captures): operator differences (self time and count per step), stage
and step differences, idle fraction.  Profiled: they locate where time moved, they do
not prove a speed-up.

Configuration differences come first, always: a comparison across configurations says
so.  One comparison is one claim: three or more configurations (base, +X, +Y) are
refused, because gains of isolated features never add up to the combined mode's gain.
A damaged recording is read around the damage and compared on what was read; what
was skipped, with byte offsets, goes to stderr.

A regression gate for CI (recordings): --fail-on FIGURE:+N% fails when FIGURE is
significantly higher in B by N% of A or more, FIGURE:-N% when it is significantly
lower (a plain N: in the figure's unit).  FIGURE is a metric key of --json
(step_ms.p99, gap_ms.p50, ttft_ms.p95, tpot_ms.p50, tokens_per_s, idle_fraction, mbu)
or its trigger spelling (step_p99_ms, idle).  N becomes that figure's smallest effect
of interest; only a difference compare calls significant (Holm, that effect, no drift)
in the worse direction fails, and one sentence says which figure, by how much, with
its interval.  Anything not established passes, and the output says so.
Exit status: 0 done (the gate, if any, passed), 1 an input cannot be read, 2 the
inputs cannot be compared, 3 a --fail-on figure significantly regressed, 4 a --fail-on
rule cannot be used."""

EPILOG = """\
examples:
  rltperf compare A1 B1 A2 B2 --fail-on 'step_p99_ms:+5%' --fail-on 'tokens_per_s:-3%'"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "inputs",
        nargs="+",
        metavar="A B",
        help="two recordings, interleaved A B pairs, or two bundle folders",
    )
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument(
        "--png",
        metavar="DIR",
        default=None,
        help="also write charts to DIR: overlaid CDFs, stages, roofline, exit depths",
    )
    p.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (default 1000)")
    p.add_argument("--alpha", type=float, default=0.05, help="family-wise significance level (default 0.05)")
    p.add_argument(
        "--min-effect",
        type=float,
        default=0.05,
        help="smallest relative difference of interest (default 0.05 = 5%% of A; 0 disables)",
    )
    p.add_argument(
        "--block-s", type=float, default=0.5, help="shortest bootstrap block, seconds (default 0.5)"
    )
    p.add_argument("--peak-gbps", type=float, default=None, help="peak memory bandwidth for MBU (both sides)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap random seed (default 0)")
    p.add_argument("--top", type=int, default=20, help="bundles: operators listed (default 20)")
    p.add_argument(
        "--fail-on",
        action="append",
        default=[],
        metavar="FIGURE:±N[%]",
        help="recordings: exit 3 when FIGURE significantly regressed by N (%% of A) in the worse "
        "direction (+ higher is worse, - lower is worse); repeatable, e.g. 'tokens_per_s:-3%%'",
    )


def _kind(path: str) -> str:
    if os.path.isdir(path):
        return "bundle"
    if os.path.isfile(path):
        return "recording"
    return "missing"


def write_pngs_recordings(res: dict[str, Any], out: str) -> tuple[list[str], list[str]]:
    """Charts of a recording comparison."""
    import numpy as np

    from rltperf_tui.analysis import plots

    A, B = res["_series"]
    la = "A: " + ", ".join(os.path.basename(p) for p in A.paths)
    lb = "B: " + ", ".join(os.path.basename(p) for p in B.paths)
    written: list[str] = []
    skipped: list[str] = []
    panels = []
    for key, name in (
        ("step_ms", "step time"),
        ("gap_ms", "gap between steps"),
        ("ttft_ms", "TTFT"),
        ("tpot_ms", "TPOT"),
    ):
        a, b = A.pooled(key), B.pooled(key)
        if a.size or b.size:
            panels.append((f"{name} (ms)", "ms", [(la, a), (lb, b)]))
        else:
            skipped.append(f"cdfs.png: no {name} samples in either recording")
    if panels:
        written.append(
            plots.cdfs(
                os.path.join(out, "cdfs.png"),
                panels,
                "A vs B distributions (unprofiled recordings, pooled samples)",
            )
        )
    st = res["stages_ms_mean"]
    if st:
        bars = [
            ("A", {n: v["a"] or 0.0 for n, v in st.items()}),
            ("B", {n: v["b"] or 0.0 for n, v in st.items()}),
        ]
        pa = res["metrics"][0]  # step time P50
        written.append(
            plots.stacked_bars(
                os.path.join(out, "step_stages.png"),
                bars,
                "Mean step time by stage, A vs B (unprofiled recordings)",
                ylabel="ms per step",
                totals=None,
                subtitle=f"step P50: A {pa['a']:.3g} ms, B {pa['b']:.3g} ms" if pa["a"] else "",
            )
        )
    else:
        skipped.append("step_stages.png: the engine reports no stages")
    series = []
    rng = np.random.default_rng(0)
    for lab, side in ((la, A), (lb, B)):
        xs = np.concatenate([p["roofline"][0] for p in side.parts]) if side.parts else np.zeros(0)
        ys = np.concatenate([p["roofline"][1] for p in side.parts]) if side.parts else np.zeros(0)
        if xs.size > 2000:
            pick = rng.choice(xs.size, 2000, replace=False)
            xs, ys = xs[pick], ys[pick]
        series.append((lab, list(zip(xs.tolist(), ys.tolist(), strict=True))))
    if any(s[1] for s in series):
        c = A.ceiling or B.ceiling
        written.append(
            plots.roofline(
                os.path.join(out, "roofline.png"),
                series,
                c.peak_bw_gbps if c else None,
                c.peak_gflops if c else None,
                "Roofline, A vs B: analytic FLOPs/bytes per step vs step time (unprofiled)",
                ceiling_source=c.source if c else None,
            )
        )
    else:
        skipped.append("roofline.png: the steps carry no bytes/FLOPs")
    ha, hb = res["exit_hist"]["a"], res["exit_hist"]["b"]
    if ha or hb:
        rw = (
            " [random weights: not a real exit distribution]"
            if res["a"]["random_weights"] or res["b"]["random_weights"]
            else ""
        )
        written.append(
            plots.exit_depth(
                os.path.join(out, "exit_depth.png"), [(la, ha), (lb, hb)], f"Exit-depth histogram, A vs B{rw}"
            )
        )
    else:
        skipped.append("exit_depth.png: the engine reports no exit depths")
    return written, skipped


def write_pngs_bundles(res: dict[str, Any], out: str) -> tuple[list[str], list[str]]:
    """Charts of a bundle comparison."""
    from rltperf_tui.analysis import plots
    from rltperf_tui.analysis.report import exit_histogram, roofline_points

    A, B = res["_analyses"]
    written: list[str] = []
    skipped: list[str] = []
    st = res["stages_ms_mean"]
    if st:
        bars = [
            ("A", {n: v["a"] or 0.0 for n, v in st.items()}),
            ("B", {n: v["b"] or 0.0 for n, v in st.items()}),
        ]
        written.append(
            plots.stacked_bars(
                os.path.join(out, "step_stages.png"),
                bars,
                "Mean step time by stage, A vs B (PROFILED captures, not a baseline)",
                ylabel="ms per step (from the traces)",
            )
        )
    else:
        skipped.append("step_stages.png: no stage ranges in the traces")
    panels = [
        (
            "step time in the capture (ms, profiled)",
            "ms",
            [
                ("A", [d["step_ms"] or d["cycle_ms"] for d in A.report["steps"]]),
                ("B", [d["step_ms"] or d["cycle_ms"] for d in B.report["steps"]]),
            ],
        )
    ]
    written.append(
        plots.cdfs(
            os.path.join(out, "cdfs.png"), panels, "A vs B step times in the capture windows (profiled)"
        )
    )
    pa, pb = roofline_points(A.step_records), roofline_points(B.step_records)
    if pa or pb:
        ceil = A.report.get("ceiling") or B.report.get("ceiling") or {}
        written.append(
            plots.roofline(
                os.path.join(out, "roofline.png"),
                [
                    ("A unprofiled steps", [(p["intensity"], p["gflops"]) for p in pa if not p["profiled"]]),
                    ("B unprofiled steps", [(p["intensity"], p["gflops"]) for p in pb if not p["profiled"]]),
                ],
                ceil.get("peak_bw_gbps"),
                ceil.get("peak_gflops"),
                "Roofline, A vs B: steps around the captures",
                ceiling_source=ceil.get("source"),
            )
        )
    else:
        skipped.append("roofline.png: the step records carry no bytes/FLOPs")
    ha, hb = exit_histogram(A.step_records), exit_histogram(B.step_records)
    if ha or hb:
        written.append(
            plots.exit_depth(
                os.path.join(out, "exit_depth.png"),
                [("A", ha), ("B", hb)],
                "Exit-depth histogram, A vs B (steps around the captures)",
            )
        )
    else:
        skipped.append("exit_depth.png: the engine reports no exit depths")
    return written, skipped


def run(args: argparse.Namespace) -> int:
    from rltperf_tui.analysis.compare import (
        COMBINE_REFUSAL,
        CompareError,
        compare_bundles,
        compare_recordings,
        public,
        render_text,
    )
    from rltperf_tui.analysis.gate import EXIT_BAD_RULE, RuleError, parse_rules
    from rltperf_tui.analysis.plots import PlotUnavailable

    try:  # a bad rule is told before anything is read: CI fails fast and says why
        fail_on = parse_rules(args.fail_on)
    except RuleError as exc:
        print(f"rltperf compare: error: {exc}", file=sys.stderr)
        return EXIT_BAD_RULE
    paths = list(args.inputs)
    kinds = [_kind(p) for p in paths]
    for p, k in zip(paths, kinds, strict=True):
        if k == "missing":
            print(f"rltperf compare: error: {p} does not exist", file=sys.stderr)
            return 1
    if len(paths) < 2:
        print("rltperf compare: error: give two inputs, A and B", file=sys.stderr)
        return 2
    if len(set(kinds)) > 1:
        print(
            "rltperf compare: error: cannot compare a recording (unprofiled) with a bundle (profiled capture): "
            "compare recordings with recordings, bundles with bundles",
            file=sys.stderr,
        )
        return 2
    if kinds[0] == "recording":
        from rltperf_tui.commands.common import check_recording

        for p in paths:
            # A damaged recording is compared on what could be read; say so on stderr.
            rc = check_recording(p, "compare")
            if rc is not None:
                return rc
    if fail_on and kinds[0] == "bundle":
        print(
            "rltperf compare: error: --fail-on judges recordings (unprofiled baselines); bundles are profiled "
            "captures that locate where time moved and prove no regression",
            file=sys.stderr,
        )
        return EXIT_BAD_RULE
    try:
        if kinds[0] == "bundle":
            if len(paths) != 2:
                print("rltperf compare: refused: " + COMBINE_REFUSAL.format(n=len(paths)), file=sys.stderr)
                return 2
            res = compare_bundles(paths[0], paths[1], top=args.top)
        else:
            if len(paths) % 2:
                print("rltperf compare: refused: " + COMBINE_REFUSAL.format(n=len(paths)), file=sys.stderr)
                return 2
            res = compare_recordings(
                paths[0::2],
                paths[1::2],
                resamples=args.resamples,
                alpha=args.alpha,
                min_effect=args.min_effect,
                peak_gbps=args.peak_gbps,
                seed=args.seed,
                block_s=args.block_s,
                fail_on=fail_on,
            )
    except CompareError as exc:
        print(f"rltperf compare: error: {exc}", file=sys.stderr)
        return 2
    if args.png:
        try:
            fn = write_pngs_bundles if res["kind"] == "bundles" else write_pngs_recordings
            res["pngs"], res["png_skipped"] = fn(res, args.png)
        except PlotUnavailable as exc:
            print(f"rltperf compare: {exc}", file=sys.stderr)
            return 1
        except OSError as exc:
            print(f"rltperf compare: cannot write charts to {args.png}: {exc.strerror}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(public(res), indent=2, default=str))
    else:
        print(render_text(res))
    gate = res.get("gate")
    if gate is None:
        return 0
    for x in gate["results"]:  # on stderr too: a CI log shows why, whatever stdout went to
        if x["status"] == "regressed":
            print(f"rltperf compare: {x['sentence']}", file=sys.stderr)
    return int(gate["exit_status"])
