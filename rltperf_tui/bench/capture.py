"""``rltperf bench capture``: what a capture costs the engine, and what a user needs to
size a capture window.

For each mode (ops, full), repeated captures of N steps on a running engine measure:

- **keypress → first captured step**: from the moment the probe received the request
  (``capture.requested_ns`` in meta.json, probe clock) to the start of the first captured
  step, in ms and in engine steps (one of those steps is the profiler's warm-up step);
- **window start**: the gap before the profiler's warm-up step (the profiler starts
  there, on the engine thread) and the warm-up step itself;
- **window end**: the gap between the last captured step and the next one, where the
  engine thread stops the profiler;
- **slow-down of the captured steps**: their median step time (probe records) over the
  median of the unprofiled steps just before the request;
- **export**: export time, and trace size and event count per captured step;
- **export overlap**: steps that ran while the export worked, and their slow-down;
  the **longest** of them, the **extra engine time** they took (the sum over them of
  step time minus the unprofiled median: net, so noise cancels) and the engine's **steps/s during the export
  over before**; the export runs in a child process (``export in``: child) unless
  ``RLTPERF_EXPORT_FORK=0`` in the engine's environment (in-thread: the old behaviour).

Each gap and step is held against the limit 3 × unprofiled p50 + 20 ms.

**Memory** (``--rss-captures K``, default 12): K sequential captures (``--rss-mode``),
back to back, the engine's resident memory after each once its export is over; the
growth over the captures after the first ``--rss-warmup`` (default 2: the first captures grow the
allocator's arenas to their working size) is what a flight recorder capturing for
hours would pay per capture.  Before them the run waits for the engine's RSS to settle
(``capture_rss``); after them, as long again without captures, and the growth net of that
drift is the capture's (``net_growth_mb``).  RSS is read from ``/proc/PID`` when the bench started the
engine (or ``--pid``), else from the probe's own ``DeviceSample.proc_rss``.

Step times come from the probe's own records (host monotonic clock, shared by all
processes on the host), never from the client's clock.  Without ``--target`` the bench
starts the reference engine (``rltperf engine --preset tiny --workload closed:4``) with its snapshots
in a temporary folder; point ``--target`` at the reference engine (``rltperf engine``)
or your own to measure that.  ``--vllm-url`` (with ``--target`` the plugin's probe):
a vLLM server, rltperf's worker capture beside vLLM's own profiler (``capture_vllm.py``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import engine_adapters
from rltperf_tui.bench.capture_rss import SETTLE_MAX_S, rss_run
from rltperf_tui.bench.capture_vllm import print_vllm, run_vllm
from rltperf_tui.bench.feed import LIMIT_FACTOR, LIMIT_MS, Feed, unprofiled_steps_ms

HELP = "capture cost: window start/end gaps, export overlap, RSS growth per capture, keypress-to-first-step"
DESCRIPTION = __doc__ or HELP

COST_KEYS = tuple(
    f"{n}{u}"
    for n in ("profiler_start", "profiler_stop", "save", "spawn", "release")
    for u in ("_ms", "_cpu_ms")
)
"""``meta.json`` ``capture.engine_cost``: the probe's wall and thread-CPU time of each."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        default=None,
        help="a running engine (tcp://HOST:PORT); default: start the reference engine (tiny, cpu, --workload)",
    )
    p.add_argument(
        "--workload", default="closed:4", help="workload of the engine the bench starts (default closed:4)"
    )
    p.add_argument("--steps", type=int, default=8, metavar="N", help="steps per capture (default 8)")
    p.add_argument("--repeats", type=int, default=3, help="captures per mode (default 3)")
    p.add_argument("--modes", default="ops,full", help="modes to measure (default ops,full)")
    p.add_argument(
        "--rss-captures",
        type=int,
        default=12,
        metavar="K",
        help="sequential captures for RSS (default 12; 0: none)",
    )
    p.add_argument(
        "--rss-warmup", type=int, default=2, metavar="W", help="of those, warm-up captures (default 2)"
    )
    p.add_argument(
        "--rss-mode", default="ops", choices=("ops", "full"), help="mode of the RSS captures (default ops)"
    )
    p.add_argument("--rss-settle-max", type=float, default=SETTLE_MAX_S, metavar="S",
                   help=f"longest wait for the engine's RSS to settle before them (default {SETTLE_MAX_S:g}; "
                        "0: none, the figure then includes a young engine's own growth)")  # fmt: skip
    p.add_argument(
        "--pid", type=int, default=None, help="the --target engine's process id: its RSS from /proc"
    )
    p.add_argument("--token", default=None, help="probe token for non-loopback targets")
    p.add_argument(
        "--vllm-url",
        default=None,
        metavar="URL",
        help="a vLLM server (http://HOST:PORT) with rltperf's plugin and --profiler-config; --target is its "
        "plugin probe: compares rltperf's worker capture with vLLM's own profiler (first of --modes)",
    )
    p.add_argument(
        "--load", type=int, default=0, metavar="C", help="--vllm-url: C closed-loop clients (default 0)"
    )


def _start_engine(snap: str, workload: str) -> tuple[subprocess.Popen[str], str, str]:
    """The reference engine (tiny preset, CPU, ``workload``) on a free port."""
    env = dict(os.environ)
    root = str(Path(engine_adapters.__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rltperf_tui.cli", "engine", "--preset", "tiny", "--workload", workload,
         "--listen", "127.0.0.1:0", "--duration", "3600", "--snapshots", snap],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        m = re.search(r"tcp://(\S+:\d+)", line)
        if m:
            # its status lines, read so that a full pipe never blocks it
            threading.Thread(target=_drain, args=(proc.stdout,), daemon=True).start()
            return (
                proc,
                f"tcp://{m.group(1)}",
                f"reference engine, tiny preset on cpu, {workload} (random weights)",
            )
    proc.kill()
    raise RuntimeError("the reference engine did not start")


def _drain(stream: Any) -> None:
    for _line in stream:
        pass


def _med(v: list[float]) -> float | None:
    return statistics.median(v) if v else None


def _one_capture(feed: Feed, mode: str, steps: int) -> dict[str, Any]:
    from engine_adapters.definitions.records import FLAG_EXPORTING, FLAG_PROFILED, CaptureDone

    result, t_send = feed.capture(mode, steps)
    history = feed.history
    if not isinstance(result, CaptureDone):
        return {"mode": mode, "error": getattr(result, "reason", "no answer within 300 s")}
    meta: dict[str, Any] = {}
    try:
        with open(os.path.join(result.bundle, "meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError):
        pass
    cap = meta.get("capture") or {}
    req_ns = cap.get("requested_ns") or t_send
    ids = cap.get("step_ids") or []
    by_id = {r.step_id: r for r in history}

    def ms(r: Any) -> float:
        return (r.end_ns - r.start_ns) / 1e6

    def gap(a: Any, b: Any) -> float | None:
        return (b.start_ns - a.end_ns) / 1e6 if a is not None and b is not None else None

    first = by_id.get(ids[0]) if ids else None
    base = unprofiled_steps_ms(history, req_ns)
    captured = [ms(by_id[i]) for i in ids if i in by_id]
    exporting = [ms(r) for r in history if r.flags & FLAG_EXPORTING and r.start_ns > req_ns]
    w0 = cap.get("window_end_ns")
    w1 = w0 + result.export_s * 1e9 if w0 else None
    before = [r for r in history if req_ns - 2e9 <= r.start_ns < req_ns and not r.flags & FLAG_PROFILED]
    inside = [r for r in history if w0 and w1 and r.start_ns >= w0 and r.end_ns <= w1]
    rate_ratio = None
    if before and inside and w0 and w1 and w1 > w0:
        span = (before[-1].end_ns - before[0].start_ns) / 1e9
        if span > 0:
            rate_ratio = (len(inside) / ((w1 - w0) / 1e9)) / (len(before) / span)
    warm_id = cap.get("profiler_warmup_step")
    warm = by_id.get(warm_id) if warm_id is not None else None
    pairs = [(warm_id, ids[0])] if ids and warm_id is not None else []
    pairs += list(itertools.pairwise(ids))
    inside_gaps = [g for a, b in pairs if (g := gap(by_id.get(a), by_id.get(b))) is not None]
    out: dict[str, Any] = {
        "mode": mode,
        "bundle": result.bundle,
        "steps_captured": result.steps_captured,
        "export_s": result.export_s,
        "trace_bytes": result.trace_bytes,
        "events": result.events,
        "trace_bytes_per_step": result.trace_bytes / max(1, result.steps_captured),
        "events_per_step": result.events / max(1, result.steps_captured),
        "baseline_step_ms_p50": _med(base),
        "captured_step_ms_p50": _med(captured),
        "exporting_steps": len(exporting),
        "exporting_step_ms_p50": _med(exporting),
        "export_in": cap.get("export_in"),
        "exporting_step_ms_max": max(exporting) if exporting else None,
        "export_extra_engine_ms": (
            sum(exporting) - len(exporting) * statistics.median(base) if exporting and base else None
        ),
        "export_rate_ratio": rate_ratio,
        "window_start_gap_ms": gap(by_id.get(warm_id - 1), warm) if warm_id is not None else None,
        "warmup_step_ms": ms(warm) if warm is not None else None,
        "window_end_gap_ms": gap(by_id.get(ids[-1]), by_id.get(ids[-1] + 1)) if ids else None,
        # inside the window: the profiler's segment boundaries (segments.py) fall in these gaps
        "window_gap_ms_max": max(inside_gaps, default=None),
        "captured_step_ms_max": max(captured, default=None),
        "clock": "probe (meta.json requested_ns)" if cap.get("requested_ns") else "client send time",
    }
    cost = cap.get("engine_cost") or {}  # the probe's own timing of its work (absent before issue 20)
    for k in COST_KEYS:
        out[k] = cost.get(k)
    if first is not None:
        out["to_first_step_ms"] = (first.start_ns - req_ns) / 1e6
        out["to_first_step_steps"] = sum(
            1 for r in history if r.start_ns >= req_ns and r.step_id < first.step_id
        )
    b, c, e = out["baseline_step_ms_p50"], out["captured_step_ms_p50"], out["exporting_step_ms_p50"]
    out["slowdown"] = c / b if b and c else None
    out["export_overlap_slowdown"] = e / b if b and e else None
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from engine_adapters.monitor.registry import adapter_for

    if getattr(args, "vllm_url", None):
        if not args.target:
            raise SystemExit("rltperf bench capture: --vllm-url needs --target tcp://<the plugin's probe>")
        return run_vllm(args)

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    workload = getattr(args, "workload", "closed:4")
    rss_count = getattr(args, "rss_captures", 0)
    tmp = None
    proc = None
    engine = args.target
    rss: dict[str, Any] | None = None
    try:
        if args.target is None:
            tmp = tempfile.mkdtemp(prefix="rltperf-bench-capture-")
            proc, target, engine = _start_engine(tmp, workload)
        else:
            target = args.target
        opts: dict[str, Any] = {"reconnect": False}
        if args.token:
            opts["token"] = args.token
        pid = proc.pid if proc is not None else getattr(args, "pid", None)
        feed = Feed(adapter_for(target, **opts).connect(), pid)
        try:
            # unprofiled steps to compare against: 1.5 s and at least 50 (an engine beside a
            # saturated machine ran none in its first 1.5 s, and its slow-down read n/a)
            t0 = time.monotonic()
            while time.monotonic() - t0 < 60 and (
                time.monotonic() - t0 < 1.5 or len(unprofiled_steps_ms(feed.history, 1 << 62)) < 50
            ):
                feed.read(0.3)
            runs = []
            for _ in range(max(1, args.repeats)):
                for mode in modes:
                    runs.append(_one_capture(feed, mode, args.steps))
                    del feed.history[:-20000]
                    feed.read(0.3)
            if rss_count > 0:
                rss = rss_run(feed, args.rss_mode, args.steps, rss_count, args.rss_warmup,
                              getattr(args, "rss_settle_max", SETTLE_MAX_S))  # fmt: skip
        finally:
            feed.session.close()
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    per_mode: dict[str, Any] = {}
    keys = (
        "to_first_step_ms", "to_first_step_steps", "slowdown", "export_s", "trace_bytes_per_step",
        "events_per_step", "export_overlap_slowdown", "baseline_step_ms_p50", "captured_step_ms_p50",
        "exporting_step_ms_max", "export_extra_engine_ms", "export_rate_ratio", "window_start_gap_ms",
        "warmup_step_ms", "window_end_gap_ms", "window_gap_ms_max", "captured_step_ms_max",
    )  # fmt: skip
    for mode in modes:
        rs = [r for r in runs if r["mode"] == mode and "error" not in r]
        m = per_mode[mode] = {k: _med([r[k] for r in rs if r.get(k) is not None]) for k in keys + COST_KEYS}
        worst = {"exporting_step_ms_max": "longest_exporting_step_ms", "window_start_gap_ms": "window_start_gap_ms_worst",
                 "warmup_step_ms": "warmup_step_ms_worst", "window_end_gap_ms": "window_end_gap_ms_worst",
                 "window_gap_ms_max": "window_gap_ms_worst", "captured_step_ms_max": "captured_step_ms_worst"}  # fmt: skip
        for k, name in worst.items():
            m[name] = max((r[k] for r in rs if r.get(k) is not None), default=None)
        base = m["baseline_step_ms_p50"]
        m["limit_ms"] = LIMIT_FACTOR * base + LIMIT_MS if base is not None else None
        m["export_in"] = sorted({str(r.get("export_in")) for r in rs})
        m["captures"] = len(rs)
        m["failed"] = [r["error"] for r in runs if r["mode"] == mode and "error" in r]
    return {
        "engine": engine,
        "steps_per_capture": args.steps,
        "repeats": args.repeats,
        "modes": per_mode,
        "rss": rss,
        "runs": [{k: v for k, v in r.items() if k != "bundle"} for r in runs],
        "statistics": "medians over the repeats (worst: the largest); step times from the probe's records",
        "ok": all(not m["failed"] and m["captures"] for m in per_mode.values())
        and not (rss and rss["failed"]),
    }


def print_text(r: dict[str, Any]) -> None:
    if r.get("kind") == "vllm":
        return print_vllm(r)

    def f(v: Any, fmt: str = "{:.2f}") -> str:
        return "n/a" if v is None else fmt.format(v)

    def held(v: Any, limit: Any) -> str:
        return "" if v is None or limit is None else (" ok" if v <= limit else " OVER")

    print(
        f"capture cost on {r['engine']}: {r['repeats']} captures of {r['steps_per_capture']} steps per mode "
        f"({r['statistics']})"
    )
    print(
        f"{'mode':<6} {'to 1st step':>12} {'(steps)':>8} {'slow-down':>10} {'export s':>9} {'KiB/step':>9} "
        f"{'events/step':>12} {'export-overlap':>15}"
    )
    for mode, m in r["modes"].items():
        kib = m["trace_bytes_per_step"] / 1024 if m["trace_bytes_per_step"] is not None else None
        lim = m["limit_ms"]
        print(
            f"{mode:<6} {f(m['to_first_step_ms'], '{:.2f} ms'):>12} {f(m['to_first_step_steps'], '{:.0f}'):>8} "
            f"{f(m['slowdown'], 'x{:.2f}'):>10} {f(m['export_s'], '{:.3f}'):>9} {f(kib, '{:.1f}'):>9} "
            f"{f(m['events_per_step'], '{:.0f}'):>12} {f(m['export_overlap_slowdown'], 'x{:.2f}'):>15}"
        )
        print(
            f"{'':<6} limit 3 x p50 + 20 = {f(lim, '{:.1f} ms')}; window start: gap "
            f"{f(m['window_start_gap_ms'], '{:.1f}')} (worst {f(m['window_start_gap_ms_worst'], '{:.1f}')}"
            f"{held(m['window_start_gap_ms_worst'], lim)}), warm-up step {f(m['warmup_step_ms'], '{:.1f}')} "
            f"(worst {f(m['warmup_step_ms_worst'], '{:.1f}')}{held(m['warmup_step_ms_worst'], lim)}) ms; "
            f"window end: gap {f(m['window_end_gap_ms'], '{:.1f}')} (worst "
            f"{f(m['window_end_gap_ms_worst'], '{:.1f}')}{held(m['window_end_gap_ms_worst'], lim)}) ms"
        )
        print(
            f"{'':<6} inside the window (the profiler's segment boundaries): worst gap "
            f"{f(m['window_gap_ms_worst'], '{:.1f}')}{held(m['window_gap_ms_worst'], lim)} ms, worst captured "
            f"step {f(m['captured_step_ms_worst'], '{:.1f}')}{held(m['captured_step_ms_worst'], lim)} ms"
        )
        print(
            f"{'':<6} the probe's own timing (wall / engine-thread CPU): profiler start "
            f"{f(m['profiler_start_ms'], '{:.1f}')} / {f(m['profiler_start_cpu_ms'], '{:.1f}')} ms, stop "
            f"{f(m['profiler_stop_ms'], '{:.1f}')} / {f(m['profiler_stop_cpu_ms'], '{:.1f}')} ms; export thread "
            f"(GIL held): traces saved and freed segment by segment {f(m['save_ms'], '{:.1f}')} / "
            f"{f(m['save_cpu_ms'], '{:.1f}')} ms, export process started {f(m['spawn_ms'], '{:.1f}')} / "
            f"{f(m['spawn_cpu_ms'], '{:.1f}')} ms, results freed "
            f"at the export's end {f(m['release_ms'], '{:.1f}')} / {f(m['release_cpu_ms'], '{:.1f}')} ms"
        )
        print(
            f"{'':<6} during export ({'/'.join(m['export_in'])}): longest step "
            f"{f(m['longest_exporting_step_ms'], '{:.1f} ms')}{held(m['longest_exporting_step_ms'], lim)}, "
            f"extra engine time {f(m['export_extra_engine_ms'], '{:.0f} ms')}, steps/s "
            f"{f(m['export_rate_ratio'], 'x{:.2f}')} of before"
        )
        for e in m["failed"]:
            print(f"   failed: {e}")
    rss = r.get("rss")
    if rss:
        print(
            f"memory ({rss['source']}): "
            + (
                f"RSS settled after {rss['settled_s']} s; "
                if rss.get("settled_s") is not None
                else "RSS still growing when the captures began; "
            )
            + f"{rss['captures']} sequential {rss['mode']} captures of {rss['steps']} "
            f"steps; RSS MB {rss['rss_mb']}; after {rss['warmup']} warm-up captures, the next "
            f"{rss['captures'] - rss['warmup']} grew it {f(rss['growth_mb'], '{:+.1f} MB')} "
            f"({f(rss['per_capture_mb'], '{:+.2f} MB')} per capture) in {rss['counted_s']} s; "
            f"{rss['control_s']} s without captures after them: {f(rss['control_mb'], '{:+.1f} MB')}; net of that "
            f"drift (when it grew) {f(rss['net_mb'], '{:+.1f} MB')} in all, {f(rss['net_per_capture_mb'], '{:+.2f} MB')} per "
            "capture (goal: at most 10 MB for the ten after 2 warm-up captures)"
        )
        for e in rss["failed"]:
            print(f"   failed: {e}")
    b: dict[str, Any] = next(iter(r["modes"].values()), {})
    print(
        f"unprofiled step p50 {f(b.get('baseline_step_ms_p50'), '{:.3f}')} ms; slow-down = captured step p50 / "
        "unprofiled p50; to 1st step includes the profiler's warm-up step"
    )
    print("OK" if r["ok"] else "SOME CAPTURES FAILED")
