"""``rltperf summary FILE``: the numbers of a recording."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rltperf_tui.analysis.summary import load_recording, summarize

HELP = "summarise a recording: step/gap/TTFT/TPOT percentiles, idle fraction, MBU, tokens/s"
DESCRIPTION = """\
Read a recording and print its figures over the whole of it: step time and gap
P50/P95/P99, device idle fraction (1 - busy/T), MBU (bytes / (T x peak); null when no
peak bandwidth is known), tokens/s, TTFT and TPOT percentiles of pooled samples,
requests ok/failed, and records dropped.  T is the recording's wall time (its first
to its last timestamp: quiet time counts as idle) less the time of profiled,
exporting and warm-up steps, which leave every figure, as do the requests in flight
during them (the output says how many).  JSON keys (--json): steps, wall_s, baseline_s,
excluded_s, step_ms, gap_ms, idle_fraction, mbu, tokens_per_s, ttft_ms, tpot_ms,
requests, excluded, dropped, ... — the same keys for every kind of target, a figure
it cannot give being null.  A recording of a metrics endpoint (vllm+http://) has no
step records: its top-level tokens/s, steps/s, bandwidth, MBU, TTFT/TPOT (histogram
estimates) and requests come from the scrapes ("figures_from": "metrics"), the whole
metrics window is under "metrics".

A damaged file is read around the damage (every readable frame is kept); what was
skipped, with byte offsets, goes to stderr and to "warning" in the JSON.  Exit status:
0 read (with or without damage), 1 no readable record in the file."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="recording (.rltrec)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--peak-gbps", type=float, default=None, help="peak memory bandwidth for MBU (overrides the engine's)"
    )
    p.add_argument("--peak-gflops", type=float, default=None, help="peak FLOP/s (GFLOP/s) for the roofline")
    p.add_argument("--slo-ttft-ms", type=float, default=None, help="TTFT SLO for goodput")
    p.add_argument("--slo-tpot-ms", type=float, default=None, help="TPOT SLO for goodput")


def _f(v: Any, fmt: str = "{:.3f}") -> str:
    return "n/a" if v is None else fmt.format(v)


def _p(d: dict[str, Any]) -> str:
    return "  ".join(f"{k} {_f(v)}" for k, v in d.items())


def run(args: argparse.Namespace) -> int:
    stats, header, warning = load_recording(args.file, args.peak_gbps, args.peak_gflops)
    if not stats.records:
        # Nothing to summarise is an error, not "steps 0" with exit status 0.
        why = f" ({warning})" if warning else ""
        print(f"rltperf summary: error: {args.file}: no readable records{why}", file=sys.stderr)
        return 1
    out = summarize(stats, args.slo_ttft_ms, args.slo_tpot_ms)
    out["warning"] = warning
    if warning:
        print(f"rltperf summary: warning: {args.file}: {warning}", file=sys.stderr)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    peak = out["peak"]
    from_metrics = out["figures_from"] == "metrics"
    lines = [
        f"{args.file}: {header.get('target', '?')} recorded {header.get('created_utc', '?')}",
        f"engine      {out['engine']}" + ("  [random weights]" if out["random_weights"] else ""),
        (
            f"steps       none recorded (the server's metrics: {_f(out['steps_per_s'], '{:.1f}')} engine steps/s "
            f"over {out['wall_s']:.2f} s of scrapes), dropped {out['dropped']}"
            if from_metrics
            else f"steps       {out['steps']} over {out['wall_s']:.2f} s of recording ({_f(out['steps_per_s'], '{:.1f}')} steps/s"
            + (f" over the {out['baseline_s']:.2f} s baseline" if out["excluded_s"] else "")
            + f"), dropped {out['dropped']}"
        ),
        f"step ms     {_p(out['step_ms'])}",
        f"gap ms      {_p(out['gap_ms'])}",
        f"idle        {_f(out['idle_fraction'], '{:.1%}')} of wall time (1 - device busy / wall; the verdict below is on the steps alone)",
        f"bandwidth   {_f(out['achieved_gbps'], '{:.2f}')} GB/s, MBU {_f(out['mbu'], '{:.1%}')}"
        + (
            f" of {peak['bw_gbps']:.1f} GB/s ({peak['source']})"
            if peak and peak.get("bw_gbps")
            else " (no peak known: --peak-gbps)"
        ),
        f"verdict     {out['verdict']}",
        f"tokens/s    {_f(out['tokens_per_s'], '{:.1f}')}"
        + (" (from the server's metrics)" if from_metrics else ""),
        f"TTFT ms     {_p(out['ttft_ms'])}",
        f"TPOT ms     {_p(out['tpot_ms'])}",
        f"requests    ok {out['requests']['ok']}  failed {out['requests']['failed']}"
        + (f"  goodput {out['goodput_rps']:.2f} req/s" if out["goodput_rps"] is not None else ""),
        "(histogram estimates from the server's metrics; see below)"
        if from_metrics
        else "(percentiles of pooled samples over the whole recording)",
    ]
    from engine_adapters.definitions.ranks import identity_text
    from rltperf_tui.analysis.loops import render

    lines[-1:-1] = render(out.get("loop_ms"), out.get("exit_hist"), "mean per step")
    ident, rk = out.get("identity") or {}, out.get("ranks")
    where = identity_text(ident.get("dp_rank"), ident.get("tp_size"), ident.get("pp_size"), ident.get("host"))
    if where and (ident.get("dp_rank") is not None or (ident.get("tp_size") or 1) > 1):
        lines.insert(
            2,
            f"ranks       {where}" + (f"  workers {', '.join(ident['ranks'])}" if ident.get("ranks") else ""),
        )
    if rk:
        per = " · ".join(f"{k} {_f(v, '{:.2f}')}" for k, v in rk["rank_compute_ms"].items())
        lines.insert(3, f"per rank    {per} ms compute/step (busy - wait in all-reduces) over {rk['rank_steps']} steps; "
                        + (f"slowest {rk['slowest_rank']}: +{rk['rank_skew_ms']:.2f} ms/step" if rk["slowest_rank"] else "slowest n/a"))  # fmt: skip
    m = out.get("metrics")
    if m:
        lines += [
            f"server      {m['source']}: {m['samples']} scrapes over {m['span_s']:.1f} s (no per-step records)",
            f"  tokens/s {_f(m['tokens_per_s'], '{:.1f}')}  requests/s {_f(m['requests_per_s'], '{:.2f}')}  "
            f"steps/s {_f(m['steps_per_s'], '{:.1f}')}  tokens/step {_f(m['tokens_per_step'], '{:.2f}')}",
            f"  TTFT ms {_p(m['latency_ms']['ttft'])}   ITL ms {_p(m['latency_ms']['itl'])}",
            f"  TPOT ms {_p(m['latency_ms']['tpot'])}   e2e ms {_p(m['latency_ms']['e2e'])}",
            f"  ({m['percentile_method']})",
            f"  bandwidth {_f(m['achieved_gbps'], '{:.2f}')} GB/s (vLLM's estimate), MBU {_f(m['mbu'], '{:.1%}')}",
        ]
        lines += [f"  note: {n}" for n in m["notes"]]
    ex = out["excluded"]
    if ex["profiled_steps"] or ex["exporting_steps"] or ex["warmup_steps"]:
        parts = [
            f"{ex[k]} {label}"
            for k, label in (
                ("profiled_steps", "profiled"),
                ("exporting_steps", "exporting"),
                ("warmup_steps", "warm-up"),
            )
            if ex[k]
        ]
        lines.append(
            f"note: {', '.join(parts)} steps ({ex['seconds']:.2f} s) and {ex['requests']} requests in flight "
            f"during them are left out: the figures above are the baseline over {out['baseline_s']:.2f} s"
        )
    print("\n".join(lines))
    return 0
