"""``rltperf bench exporting``: are the steps that run while a bundle exports like the
steps that run with no capture at all?

The window's figures leave out the steps flagged ``FLAG_EXPORTING`` only if they are
not the engine as it normally runs.  This bench answers that on a running engine: it
takes captures (``--repeats`` per mode, modes alternating), each after ``--settle``
seconds without one, and compares the steps that overlapped each export with the
uncaptured steps of the settle period just before that capture (same load, same
minute; the machine's own drift cancels):

- **step time**: each capture's exporting-step median (and P90) over its settle
  period's; the ratio's median over the captures and a 95 % bootstrap interval
  (captures resampled);
- **rates**: steps/s and output tokens/s over each export's wall time over the settle
  period's (owned time: from the previous step's end, as the window counts it);
- **stalls**: the share of steps over the limit 3 × uncaptured P50 + 20 ms, exporting
  against uncaptured, pooled over the run;
- **profiler stop**: the gap between the last profiled step and the next one (the
  engine thread stops the profiler there; it is the capture's, not the export's).

A figure is **indistinguishable** when its 95 % interval lies within ±``--margin``
(default 5 %) of 1, **different** when the interval excludes 1 and the median lies
beyond the margin, else **inconclusive**.  ``--load K`` adds K busy processes for the
run (a loaded machine; the report gives the load average it ran at).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from typing import Any

from rltperf_tui.bench.capture import _start_engine
from rltperf_tui.bench.feed import Feed

HELP = "steps during a bundle's export vs uncaptured steps: step time, rates, stalls, per mode"
DESCRIPTION = __doc__ or HELP

LIMIT_FACTOR, LIMIT_MS = 3.0, 20.0
"""A step over LIMIT_FACTOR × uncaptured P50 + LIMIT_MS counts as a stall."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=None, help="a running engine (tcp://HOST:PORT); default: start one")
    p.add_argument(
        "--workload", default="closed:4", help="workload of the engine it starts (default closed:4)"
    )
    p.add_argument("--steps", type=int, default=8, metavar="N", help="steps per capture (default 8)")
    p.add_argument("--repeats", type=int, default=4, help="captures per mode (default 4)")
    p.add_argument("--modes", default="ops,full", help="modes (default ops,full)")
    p.add_argument("--settle", type=float, default=3.0, metavar="S", help="seconds before each capture")
    p.add_argument("--load", type=int, default=0, metavar="K", help="busy processes during the run")
    p.add_argument("--margin", type=float, default=0.05, help="smallest ratio change that matters")
    p.add_argument("--token", default=None, help="probe token for non-loopback targets")


def _q(v: list[float], q: float) -> float | None:
    if not v:
        return None
    s = sorted(v)
    i = (len(s) - 1) * q
    lo = int(i)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (i - lo)


def _interval(ratios: list[float], seed: int = 0) -> tuple[float | None, float | None, float | None]:
    """Median of per-capture ratios and its 95 % bootstrap interval (captures resampled)."""
    if not ratios:
        return None, None, None
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    return statistics.median(ratios), meds[50], meds[1949]


def _verdict(med: float | None, lo: float | None, hi: float | None, margin: float) -> str:
    if med is None or lo is None or hi is None:
        return "no data"
    if 1 - margin <= lo and hi <= 1 + margin:
        return "indistinguishable"
    if (lo > 1 or hi < 1) and abs(med - 1) > margin:
        return "different"
    return "inconclusive"


def _rates(steps: list[Any]) -> tuple[float, float] | None:
    """(steps/s, output tokens/s) over the steps' owned time (previous end to last end)."""
    if len(steps) < 3:
        return None
    span = (steps[-1].end_ns - steps[0].end_ns) / 1e9
    if span <= 0:
        return None
    rest = steps[1:]
    return len(rest) / span, sum(s.out_tokens for s in rest) / span


def _one(feed: Feed, mode: str, n: int, settle: float) -> dict[str, Any]:
    from engine_adapters.definitions.records import CaptureDone, CaptureFailed, Refused

    feed.read(settle)
    t_req = time.perf_counter_ns()
    before = [
        s for s in feed.history if t_req - settle * 1e9 <= s.start_ns and s.end_ns < t_req and not s.flags
    ]
    cid = feed.session.request_capture(n, mode, "bench")
    res = feed.read(
        300, lambda r: isinstance(r, (CaptureDone, CaptureFailed, Refused)) and r.capture_id == cid
    )
    feed.read(0.5)  # the steps of the export's last moments arrive a little later
    if not isinstance(res, CaptureDone):
        return {"mode": mode, "error": getattr(res, "reason", "no answer")}
    print(
        f"  {mode} capture: export {res.export_s:.1f} s, load average {os.getloadavg()[0]:.1f}",
        file=sys.stderr,
    )
    return {
        "mode": mode,
        "before": sorted(before, key=lambda s: s.step_id),
        "t_req": t_req,
        "export_s": res.export_s,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    import tempfile

    from engine_adapters.monitor.registry import adapter_for

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(max(0, args.load))]
    tmp = tempfile.TemporaryDirectory(prefix="rltperf-bench-exporting-")
    proc = None
    feed: Feed | None = None
    runs: list[dict[str, Any]] = []
    load0 = os.getloadavg()[0]
    try:
        if args.target is None:
            proc, target, engine = _start_engine(tmp.name, args.workload)
        else:
            target = engine = args.target
        opts: dict[str, Any] = {"reconnect": False}
        if args.token:
            opts["token"] = args.token
        feed = Feed(adapter_for(target, **opts).connect(), None)
        try:
            for _ in range(max(1, args.repeats)):
                for mode in modes:
                    runs.append(_one(feed, mode, args.steps, args.settle))
            feed.read(args.settle)  # the last export's steps, then some plain ones
        finally:
            feed.session.close()
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        for b in burners:
            b.kill()
            b.wait()
        tmp.cleanup()
    out = _analyse(sorted(feed.history, key=lambda r: r.step_id) if feed else [], runs, modes, args.margin)
    return {
        "engine": engine,
        "load": args.load,
        "loadavg": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
        **out,
        "margin": args.margin,
        "failed": [r["error"] for r in runs if "error" in r],
        "ok": not any("error" in r for r in runs),
    }


def _ms(steps: list[Any]) -> list[float]:
    return [(s.end_ns - s.start_ns) / 1e6 for s in steps]


def _dist(v: list[float]) -> dict[str, float | None]:
    return {"p50": _q(v, 0.5), "p90": _q(v, 0.9), "p99": _q(v, 0.99), "max": max(v, default=None)}


def _analyse(steps: list[Any], runs: list[dict[str, Any]], modes: list[str], margin: float) -> dict[str, Any]:
    """The figures of the run: each capture's exporting steps against its settle period."""
    from engine_adapters.definitions.records import FLAG_EXPORTING, FLAG_PROFILED

    by_id = {s.step_id: s for s in steps}
    plain = [s for s in steps if not s.flags]
    limit = LIMIT_FACTOR * (_q(_ms(plain), 0.5) or 0.0) + LIMIT_MS
    done = [r for r in runs if "t_req" in r]
    # a capture's steps: from its request to the next capture's request
    bounds = [r["t_req"] for r in done] + [float("inf")]
    per_mode: dict[str, Any] = {}
    for mode in modes:
        ratios: dict[str, list[float]] = {
            k: [] for k in ("step_p50", "step_p90", "steps_per_s", "tokens_per_s")
        }
        stops: list[float] = []
        exp_all: list[Any] = []
        for i, r in enumerate(done):
            if r["mode"] != mode:
                continue
            mine = [s for s in steps if bounds[i] <= s.start_ns < bounds[i + 1]]
            exp = [s for s in mine if s.flags & FLAG_EXPORTING and not s.flags & FLAG_PROFILED]
            prof = [s for s in mine if s.flags & FLAG_PROFILED]
            nxt = by_id.get(prof[-1].step_id + 1) if prof else None
            if nxt is not None:
                stops.append((nxt.start_ns - prof[-1].end_ns) / 1e6)
            exp_all += exp
            bt, et = _ms(r["before"]), _ms(exp)
            if len(bt) < 5 or len(et) < 5:
                continue
            ratios["step_p50"].append((_q(et, 0.5) or 0.0) / (_q(bt, 0.5) or 1.0))
            ratios["step_p90"].append((_q(et, 0.9) or 0.0) / (_q(bt, 0.9) or 1.0))
            # the export's steps after the first (the first owns the profiler's stop)
            er, br = _rates(exp[1:]), _rates(r["before"])
            if er and br:
                ratios["steps_per_s"].append(er[0] / br[0])
                if br[1]:
                    ratios["tokens_per_s"].append(er[1] / br[1])
        figs = {}
        for k, v in ratios.items():
            med, lo, hi = _interval(v)
            figs[k] = {
                "median": med,
                "lo": lo,
                "hi": hi,
                "captures": len(v),
                "verdict": _verdict(med, lo, hi, margin),
            }
        exports = [r["export_s"] for r in done if r["mode"] == mode]
        et = _ms(exp_all)
        per_mode[mode] = {
            "ratios": figs,
            "per_capture": {k: [round(x, 3) for x in v] for k, v in ratios.items()},
            "export_s": {"median": _q(exports, 0.5), "max": max(exports, default=None)},
            "exporting_steps": len(exp_all),
            "exporting_over_limit": sum(t > limit for t in et),
            "exporting_step_ms": _dist(et),
            "stop_gap_ms": {"median": _q(stops, 0.5), "max": max(stops, default=None), "n": len(stops)},
        }
    pt = _ms(plain)
    verdicts = [f["verdict"] for m in per_mode.values() for f in m["ratios"].values()]
    verdict = "inconclusive"
    if verdicts and all(v == "indistinguishable" for v in verdicts):
        verdict = "indistinguishable"
    elif "different" in verdicts:
        verdict = "different"
    return {
        "limit_ms": limit,
        "uncaptured_steps": len(plain),
        "uncaptured_over_limit": sum(t > limit for t in pt),
        "uncaptured_step_ms": _dist(pt),
        "modes": per_mode,
        "verdict": verdict,
    }


def print_text(r: dict[str, Any]) -> None:
    def f(v: Any, fmt: str = "{:.3f}") -> str:
        return "n/a" if v is None else fmt.format(v)

    print(
        f"exporting vs uncaptured steps on {r['engine']}, {r['load']} extra busy processes, "
        f"load average {r['loadavg'][0]}→{r['loadavg'][1]} on {r['cpus']} CPUs"
    )
    u = r["uncaptured_step_ms"]
    print(
        f"uncaptured: {r['uncaptured_steps']} steps, ms p50 {f(u['p50'])} p90 {f(u['p90'])} p99 {f(u['p99'])} "
        f"max {f(u['max'], '{:.1f}')}; over the limit {r['limit_ms']:.1f} ms: "
        f"{r['uncaptured_over_limit']} ({r['uncaptured_over_limit'] / max(1, r['uncaptured_steps']):.2%})"
    )
    for mode, m in r["modes"].items():
        e = m["exporting_step_ms"]
        print(
            f"{mode}: export s median {f(m['export_s']['median'], '{:.1f}')} max {f(m['export_s']['max'], '{:.1f}')}; "
            f"{m['exporting_steps']} exporting steps, ms p50 {f(e['p50'])} p90 {f(e['p90'])} "
            f"p99 {f(e['p99'])} max {f(e['max'], '{:.1f}')}; over the limit: {m['exporting_over_limit']} "
            f"({m['exporting_over_limit'] / max(1, m['exporting_steps']):.2%}); profiler stop gap median "
            f"{f(m['stop_gap_ms']['median'], '{:.1f}')} ms, max {f(m['stop_gap_ms']['max'], '{:.1f}')} ms"
        )
        for k, x in m["ratios"].items():
            print(
                f"  {k:<13} exporting / before x{f(x['median'])} [95% {f(x['lo'])}, {f(x['hi'])}] over "
                f"{x['captures']} captures: {x['verdict']}"
            )
    print(f"verdict (margin ±{r['margin']:.0%}): {r['verdict']}")
    for e in r["failed"]:
        print(f"failed: {e}")
