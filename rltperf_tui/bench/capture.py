"""``rltperf bench capture``: the figures a user needs to size a capture window.

For each mode (ops, full), repeated captures of N steps on a running engine measure:

- **keypress → first captured step**: from the moment the probe received the request
  (``capture.requested_ns`` in meta.json, probe clock) to the start of the first captured
  step, in ms and in engine steps (one of those steps is the profiler's warm-up step);
- **slow-down of the captured steps**: their median step time (probe records) over the
  median of the unprofiled steps just before the request;
- **export**: export time, and trace size and event count per captured step;
- **export overlap**: steps that ran while the export worked, and their slow-down;
  the **longest** of them, the **extra engine time** they took (the sum over them of
  step time minus the unprofiled median: net, so noise cancels) and the engine's **steps/s during the export
  over before**; the export runs in a forked child (``export in``: child) unless
  ``RLTPERF_EXPORT_FORK=0`` in the engine's environment (in-thread: the old behaviour);
- **stop**: the gap between the last captured step and the next one, where the engine
  thread itself stops the profiler (torch post-processes every event there, holding
  the GIL; it cannot be moved to another thread: the profiler is thread-local).

Step times come from the probe's own records (host monotonic clock, shared by all
processes on the host), never from the client's clock.  Without ``--target`` the bench
starts the reference engine (``rltperf engine --preset tiny --workload closed:8``) with its snapshots
in a temporary folder; point ``--target`` at the reference engine (``rltperf engine``)
or your own to measure that.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import engine_adapters

HELP = (
    "capture cost: keypress-to-first-step, slow-down of captured steps, export time and trace size per step"
)
DESCRIPTION = __doc__ or HELP


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        default=None,
        help="a running engine (tcp://HOST:PORT); default: start the reference engine (tiny, cpu, closed:8)",
    )
    p.add_argument("--steps", type=int, default=8, metavar="N", help="steps per capture (default 8)")
    p.add_argument("--repeats", type=int, default=3, help="captures per mode (default 3)")
    p.add_argument("--modes", default="ops,full", help="modes to measure (default ops,full)")
    p.add_argument("--token", default=None, help="probe token for non-loopback targets")


def _start_engine(snap: str) -> tuple[subprocess.Popen[str], str, str]:
    """The reference engine (tiny preset, CPU, 8 concurrent requests) on a free port."""
    env = dict(os.environ)
    root = str(Path(engine_adapters.__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    workload = "closed:8"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rltperf_tui.cli", "engine", "--preset", "tiny", "--workload", workload,
         "--listen", "127.0.0.1:0", "--duration", "600", "--snapshots", snap],
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
            return (
                proc,
                f"tcp://{m.group(1)}",
                f"reference engine, tiny preset on cpu, {workload} (random weights)",
            )
    proc.kill()
    raise RuntimeError("the reference engine did not start")


def _med(v: list[float]) -> float | None:
    return statistics.median(v) if v else None


def _one_capture(session: Any, mode: str, steps: int, history: list[Any]) -> dict[str, Any]:
    from engine_adapters.definitions.records import (
        FLAG_EXPORTING,
        FLAG_PROFILED,
        FLAG_WARMUP,
        CaptureDone,
        CaptureFailed,
        Refused,
        StepRecord,
    )

    t_send = time.perf_counter_ns()
    cid = session.request_capture(steps, mode, "bench")
    result: Any = None
    deadline = time.monotonic() + 300  # a low-priority export child on a busy box is slow
    while result is None and time.monotonic() < deadline:
        for r in session.read(0.2):
            if isinstance(r, StepRecord):
                history.append(r)
            elif (
                isinstance(r, (CaptureDone, CaptureFailed, Refused)) and getattr(r, "capture_id", None) == cid
            ):
                result = r
    # the steps that overlap the export arrive a little later
    t_end = time.monotonic() + 0.5
    while time.monotonic() < t_end:
        history.extend(r for r in session.read(0.1) if isinstance(r, StepRecord))
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
    first = by_id.get(ids[0]) if ids else None
    base = [
        (r.end_ns - r.start_ns) / 1e6
        for r in history
        if r.end_ns < req_ns and not r.flags & (FLAG_PROFILED | FLAG_EXPORTING | FLAG_WARMUP)
    ][-400:]
    captured = [(by_id[i].end_ns - by_id[i].start_ns) / 1e6 for i in ids if i in by_id]
    exporting = [
        (r.end_ns - r.start_ns) / 1e6 for r in history if r.flags & FLAG_EXPORTING and r.start_ns > req_ns
    ]
    w0 = cap.get("window_end_ns")
    w1 = w0 + result.export_s * 1e9 if w0 else None
    before = [r for r in history if req_ns - 2e9 <= r.start_ns < req_ns and not r.flags & FLAG_PROFILED]
    inside = [r for r in history if w0 and w1 and r.start_ns >= w0 and r.end_ns <= w1]
    rate_ratio = None
    if before and inside and w0 and w1 and w1 > w0:
        span = (before[-1].end_ns - before[0].start_ns) / 1e9
        if span > 0:
            rate_ratio = (len(inside) / ((w1 - w0) / 1e9)) / (len(before) / span)
    last = by_id.get(ids[-1]) if ids else None
    nxt = by_id.get(ids[-1] + 1) if ids else None
    stop_gap = (nxt.start_ns - last.end_ns) / 1e6 if last is not None and nxt is not None else None
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
        "stop_gap_ms": stop_gap,
        "clock": "probe (meta.json requested_ns)" if cap.get("requested_ns") else "client send time",
    }
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
    from engine_adapters.definitions.records import StepRecord
    from engine_adapters.monitor.registry import adapter_for

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    tmp = None
    proc = None
    engine = args.target
    try:
        if args.target is None:
            tmp = tempfile.mkdtemp(prefix="rltperf-bench-capture-")
            proc, target, engine = _start_engine(tmp)
        else:
            target = args.target
        opts: dict[str, Any] = {"reconnect": False}
        if args.token:
            opts["token"] = args.token
        session = adapter_for(target, **opts).connect()
        history: list[Any] = []
        try:
            t_end = time.monotonic() + 1.5  # unprofiled steps to compare against
            while time.monotonic() < t_end:
                history.extend(r for r in session.read(0.1) if isinstance(r, StepRecord))
            runs = []
            for _ in range(max(1, args.repeats)):
                for mode in modes:
                    runs.append(_one_capture(session, mode, args.steps, history))
                    del history[:-20000]
                    t_end = time.monotonic() + 0.3
                    while time.monotonic() < t_end:
                        history.extend(r for r in session.read(0.1) if isinstance(r, StepRecord))
        finally:
            session.close()
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
    for mode in modes:
        rs = [r for r in runs if r["mode"] == mode and "error" not in r]
        keys = (
            "to_first_step_ms",
            "to_first_step_steps",
            "slowdown",
            "export_s",
            "trace_bytes_per_step",
            "events_per_step",
            "export_overlap_slowdown",
            "baseline_step_ms_p50",
            "captured_step_ms_p50",
            "exporting_step_ms_max",
            "export_extra_engine_ms",
            "export_rate_ratio",
            "stop_gap_ms",
        )
        per_mode[mode] = {k: _med([r[k] for r in rs if r.get(k) is not None]) for k in keys}
        per_mode[mode]["longest_exporting_step_ms"] = max(
            (r["exporting_step_ms_max"] for r in rs if r.get("exporting_step_ms_max") is not None),
            default=None,
        )
        per_mode[mode]["export_in"] = sorted({str(r.get("export_in")) for r in rs})
        per_mode[mode]["captures"] = len(rs)
        per_mode[mode]["failed"] = [r["error"] for r in runs if r["mode"] == mode and "error" in r]
    return {
        "engine": engine,
        "steps_per_capture": args.steps,
        "repeats": args.repeats,
        "modes": per_mode,
        "runs": [{k: v for k, v in r.items() if k != "bundle"} for r in runs],
        "statistics": "medians over the repeats; step times from the probe's records",
        "ok": all(not m["failed"] and m["captures"] for m in per_mode.values()),
    }


def print_text(r: dict[str, Any]) -> None:
    def f(v: Any, fmt: str = "{:.2f}") -> str:
        return "n/a" if v is None else fmt.format(v)

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
        print(
            f"{mode:<6} {f(m['to_first_step_ms'], '{:.2f} ms'):>12} {f(m['to_first_step_steps'], '{:.0f}'):>8} "
            f"{f(m['slowdown'], 'x{:.2f}'):>10} {f(m['export_s'], '{:.3f}'):>9} {f(kib, '{:.1f}'):>9} "
            f"{f(m['events_per_step'], '{:.0f}'):>12} {f(m['export_overlap_slowdown'], 'x{:.2f}'):>15}"
        )
        print(
            f"{'':<6} during export ({'/'.join(m['export_in'])}): longest step "
            f"{f(m['longest_exporting_step_ms'], '{:.1f} ms')} (bound 3 x p50 + 20 = "
            f"{f(None if m['baseline_step_ms_p50'] is None else 3 * m['baseline_step_ms_p50'] + 20, '{:.1f} ms')}), "
            f"extra engine time {f(m['export_extra_engine_ms'], '{:.0f} ms')}, steps/s "
            f"{f(m['export_rate_ratio'], 'x{:.2f}')} of before; profiler stop on the step loop "
            f"{f(m['stop_gap_ms'], '{:.0f} ms')}"
        )
        for e in m["failed"]:
            print(f"   failed: {e}")
    b: dict[str, Any] = next(iter(r["modes"].values()), {})
    print(
        f"unprofiled step p50 {f(b.get('baseline_step_ms_p50'), '{:.3f}')} ms; slow-down = captured step p50 / "
        "unprofiled p50; to 1st step includes the profiler's warm-up step"
    )
    print("OK" if r["ok"] else "SOME CAPTURES FAILED")
