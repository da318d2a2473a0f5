"""``rltperf bench ingest``: what the monitor costs.

1. ``records_per_s`` (and ``tick_model``, ``rltperf_tui.bench.tick``: a render tick's
   statistics on the same stream): records decoded from frames (``FrameReader``) and aggregated
   (``TargetStats.add``) per second on one core, over a synthetic stream shaped like a
   looped engine's (nine stages, four loop depths, KV per depth, speculation; one
   request record per eight steps, a device sample and probe stats per thousand),
   fed in 256 KiB chunks as a socket read delivers them.  Goal >= 200 000.
2. ``tui_cpu_fraction``: the monitor (``MonitorApp`` at its default 2 Hz refresh, in a
   real pseudo-terminal of 120x40) attached to the test loop engine paced at 1 000
   steps/s: the monitor process's CPU time over wall time (1.0 = one core; the
   scheduler's run time of its threads, ``peers.proc_cpu_s``, as every bench here), measured
   after 35 s attached (its windows full: the steady state).  Goal <= 0.02
   (``TUI_CPU_GOAL``: half the 0.04 the screen cost when issue 21 was filed).  Also its
   RSS at the start and the end (``--duration 600`` for the ten-minute figure) and the
   records it received.
3. ``metrics_only`` (with ``--metrics-target vllm+http://HOST:PORT``, a running vLLM
   server): the monitor's CPU on a /metrics-only target, scraped at ``--metrics-hz``
   (default 2) with the window's figures at the same rate, over ``--metrics-duration``
   seconds (default 20), and one scrape's cost split into GET, parse and derive
   (``rltperf_tui.bench.metrics_ingest``).  No target is set for it: it is stated.
4. ``screen`` (with ``--metrics-target``): the monitor's whole screen on that server,
   ``rltperf attach`` in a 160x48 tmux pane, beside vllm-htop (``--htop``, else on
   ``PATH``; polling at rltperf's 2 Hz) for the same ``--metrics-duration`` seconds after a
   30 s trend window: each one's CPU as a fraction of one core and the ratio
   (``rltperf_tui.bench.peers``, one round; ``rltperf bench peers`` for more rounds).

For profiling, ``$RLTPERF_BENCH_CHILD`` replaces the monitor child's script (it gets the
target, an output JSON path and the refresh rate; the warm-up counts from its first output).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from rltperf_tui.bench import SOURCE_ROOT

HELP = "monitor cost: records decoded+aggregated per second, monitor CPU at 1000 steps/s"
DESCRIPTION = __doc__ or HELP

ROOT = SOURCE_ROOT
"""The folder holding the packages (``rltperf_tui.bench.SOURCE_ROOT``)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--records", type=int, default=300_000, help="records for the decode+aggregate rate (default 300000)"
    )
    p.add_argument("--duration", type=float, default=30.0, metavar="S",
                   help="seconds the monitor is measured while attached (default 30; 600 for the RSS figure)")  # fmt: skip
    p.add_argument("--rate", type=float, default=1000.0, help="engine steps per second (default 1000)")
    p.add_argument("--refresh", type=float, default=2.0, help="monitor refresh rate, Hz (default 2)")
    p.add_argument("--skip-tui", action="store_true", help="only the decode+aggregate rate")
    p.add_argument("--metrics-target", default=None, metavar="vllm+http://HOST:PORT",
                   help="also measure the monitor's CPU on this running vLLM server's /metrics")  # fmt: skip
    p.add_argument(
        "--metrics-hz", type=float, default=2.0, help="scrapes per second for --metrics-target (default 2)"
    )
    p.add_argument("--htop", default=None, metavar="PATH",
                   help="vllm-htop, measured beside the screen on --metrics-target (default: on PATH)")  # fmt: skip
    p.add_argument("--metrics-duration", type=float, default=20.0, metavar="S",
                   help="seconds the /metrics-only monitor is measured (default 20)")  # fmt: skip
    p.add_argument("--baseline-root", default=None, metavar="DIR",
                   help="also run another checkout's screen beside this one's on one paced engine, and "
                        "print this / that (before/after in one period; --rounds of --duration s)")  # fmt: skip
    p.add_argument(
        "--rounds", type=int, default=3, help="rounds of the --baseline-root comparison (default 3)"
    )


# --------------------------------------------------------------------------- decode + aggregate


def synthetic_stream(n: int, seed: int = 1) -> tuple[bytes, int]:
    """Frames of ``n`` records shaped like a looped engine's stream, and the step count."""
    from engine_adapters.definitions.records import (
        STANDARD_STAGES,
        DeviceSample,
        EngineInfo,
        Hello,
        RequestRecord,
        Stats,
        StepRecord,
    )
    from engine_adapters.definitions.wire import FrameEncoder

    rng = random.Random(seed)
    enc = FrameEncoder()
    hello = Hello(schema=1, engine=EngineInfo(name="bench", max_loops=4), stage_names=list(STANDARD_STAGES))
    recs: list[Any] = [hello]
    t = 1_000_000_000
    steps = 0
    while len(recs) < n:
        dur = 900_000 + rng.randrange(200_000)
        stages = [rng.randrange(10_000, 300_000) for _ in range(9)]
        exits = [rng.randrange(8) for _ in range(4)]
        recs.append(
            StepRecord(
                step_id=steps, start_ns=t, end_ns=t + dur, kind="decode", stage_ns=stages, batch=16, tokens=16,
                busy_ns=dur // 2, bytes_read=50_000_000, bytes_written=100_000, flops=8e8, out_tokens=16,
                exit_hist=exits, loop_ns=[dur // 8] * 4, loop_tokens=[16, 12, 8, 4], kv_used=1200, kv_total=4096,
                kv_per_depth=[400, 350, 250, 200], waiting=3, running=16, spec_drafts=16, spec_drafted=48,
                spec_accepted=rng.randrange(48),
            )
        )  # fmt: skip
        steps += 1
        t += dur + (5_000_000 if steps % 2000 == 0 else 20_000)  # an idle gap every ~2 s
        if steps % 8 == 0:
            recs.append(RequestRecord(req_id=str(steps), arrival_ns=t - 50_000_000, finish_ns=t,
                                      first_token_ns=t - 40_000_000, prompt_tokens=128, output_tokens=40))  # fmt: skip
        if steps % 1000 == 0:
            recs.append(DeviceSample(ts_ns=t, proc_cpu=1.0, proc_rss=1 << 30, host_cpu=[0.5, 0.5]))
            recs.append(Stats(ts_ns=t, steps_total=steps))
    # As the probe sends them: one frame per publisher tick (50 ms; 50 records at 1 000 steps/s).
    recs = recs[:n]
    return b"".join(enc.encode_batched(recs[i : i + 50]) for i in range(0, len(recs), 50)), steps


def decode_aggregate_rate(n: int) -> dict[str, Any]:
    """Records/s of FrameReader.feed + TargetStats.add, and of each alone (one thread)."""
    from engine_adapters.definitions.wire import FrameReader
    from rltperf_tui.live.aggregator import TargetStats

    data, steps = synthetic_stream(n)
    chunk = 1 << 18
    mv = memoryview(data)

    # CPU time of this thread, not wall time: on a shared machine other processes take the
    # core away part of the time, and "per second on one core" means per CPU second.
    clock = time.thread_time

    def run(aggregate: bool) -> tuple[float, float]:
        reader = FrameReader()
        stats = TargetStats()
        w0, t0 = time.perf_counter(), clock()
        for off in range(0, len(data), chunk):
            recs = reader.feed(mv[off : off + chunk])
            if aggregate:
                stats.add(recs)
        return clock() - t0, time.perf_counter() - w0

    run(True)  # warm
    totals = [run(True) for _ in range(3)]
    best_total = min(t for t, _ in totals)
    best_total_wall = min(w for _, w in totals)
    best_decode = min(run(False)[0] for _ in range(3))
    # aggregate alone: records already decoded, in the same chunks
    reader = FrameReader()
    chunks = [reader.feed(mv[off : off + chunk]) for off in range(0, len(data), chunk)]
    best_agg = float("inf")
    for _ in range(3):
        stats = TargetStats()
        t0 = clock()
        for c in chunks:
            stats.add(c)
        best_agg = min(best_agg, clock() - t0)
    # sanity: the aggregate saw every step
    assert stats.last_step_id == steps - 1, (stats.last_step_id, steps)
    return {
        "records": n,
        "bytes": len(data),
        "records_per_s": round(n / best_total),
        "records_per_wall_s": round(n / best_total_wall),
        "decode_records_per_s": round(n / best_decode),
        "aggregate_records_per_s": round(n / best_agg),
    }


# --------------------------------------------------------------------------- the monitor at 1000 steps/s

WARMUP_S = 35.0
"""Seconds the monitor runs attached before its CPU time is measured (> the 30 s timeline)."""

_CHILD = r"""
import json, sys, threading, time
from rltperf_tui.tui.app import MonitorApp
target, out, refresh = sys.argv[1], sys.argv[2], float(sys.argv[3])
app = MonitorApp([target], refresh_hz=refresh)
def ready():  # <out>.ready once the screen has ingested steps
    while not (app.handles and app.handles[0].stats.steps.n): time.sleep(0.05)
    open(out + ".ready", "w").close()
threading.Thread(target=ready, daemon=True).start()
try:
    app.run()
finally:
    h = app.handles[0]
    with open(out, "w") as f:
        json.dump({"records": h.stats.records, "steps": int(h.stats.steps.n), "dropped": h.stats.dropped,
                   "ticks": app.ticks, "state": h.stats.state}, f)
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def paced_engine(rate: float, seconds: float, snaps: str) -> tuple[subprocess.Popen[str], str]:
    """The test loop engine (``engine_adapters.reference.loop``) paced at ``rate`` steps/s
    for ``seconds``, its snapshots in ``snaps``; the process and its probe's address."""
    from engine_adapters.definitions.wire import parse_hostport

    eng = subprocess.Popen(
        [sys.executable, "-m", "engine_adapters.reference.loop", "--duration", str(seconds), "--rate", str(rate),
         "--no-warm", "--snapshots", snaps],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=_env(),
    )  # fmt: skip
    assert eng.stdout is not None
    addr = ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not addr:
        line = eng.stdout.readline()
        if line.startswith("ADDRESS "):
            addr = line.split()[1]
        elif not line and eng.poll() is not None:
            break
    if not addr:
        _stop(eng)
        raise RuntimeError("the loop engine did not start")
    parse_hostport(addr)
    return eng, addr


def _stop(eng: subprocess.Popen[str]) -> None:
    eng.terminate()
    try:
        eng.wait(15)
    except subprocess.TimeoutExpired:
        eng.kill()
        eng.wait(5)


def beside_baseline(
    root: str, duration: float, rate: float, rounds: int, warmup: float = WARMUP_S
) -> dict[str, Any]:
    """This checkout's screen and the one of the checkout at ``root`` (``rltperf attach``
    from each, in 120x40 tmux panes), attached at once to one loop engine paced at
    ``rate`` steps/s: ``bench.peers`` with ``--baseline-root``, so both are measured over
    the same seconds of the same machine, and the ratio holds when the machine's speed
    drifts (a lone figure moved 0.019-0.026 within a day)."""
    from rltperf_tui.bench import peers

    snaps = tempfile.mkdtemp(prefix="rltperf-bench-ingest-")
    eng, addr = paced_engine(rate, rounds * (warmup + duration + 15) + 60, snaps)
    try:
        ns = argparse.Namespace(target=f"tcp://{addr}", duration=duration, warmup=warmup, rounds=rounds,
                                interval=0.5, htop=None, baseline_root=root, size="120x40")  # fmt: skip
        res = peers.run(ns)
    finally:
        _stop(eng)
        shutil.rmtree(snaps, ignore_errors=True)
    res["engine_rate_steps_per_s"] = rate
    return res


def tui_cost(duration: float, rate: float, refresh: float, warmup: float = WARMUP_S) -> dict[str, Any]:
    """CPU fraction and RSS of the monitor process attached to a paced engine, measured
    for ``duration`` seconds after ``warmup``.  Its working folder (the engine's snapshot
    folder, the monitor's figures) is removed at the end."""
    import fcntl
    import pty
    import struct
    import termios

    import psutil

    snaps = tempfile.mkdtemp(prefix="rltperf-bench-ingest-")
    env = _env()
    eng, addr = paced_engine(rate, duration + warmup + 60, snaps)
    child: subprocess.Popen[bytes] | None = None
    master = -1
    try:
        out = os.path.join(snaps, "tui.json")
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        cenv = dict(env, TERM="xterm-256color", COLUMNS="120", LINES="40")
        child = subprocess.Popen(
            [sys.executable, "-c", os.environ.get("RLTPERF_BENCH_CHILD") or _CHILD, f"tcp://{addr}", out, str(refresh)],
            stdin=slave, stdout=slave, stderr=slave, env=cenv, start_new_session=True,
        )  # fmt: skip
        os.close(slave)
        drained = [0]
        tail = bytearray()

        def drain() -> None:
            while True:
                try:
                    data = os.read(master, 65536)
                except OSError:
                    return
                if not data:
                    return
                drained[0] += len(data)
                tail.extend(data)
                del tail[:-4096]

        threading.Thread(target=drain, daemon=True).start()
        proc = psutil.Process(child.pid)
        from rltperf_tui.bench.peers import proc_cpu_s  # (the one CPU figure of every bench)

        # Start-up and the first 30 s (the timeline's window fills, each tick's work grows)
        # are not the steady state a user keeps open.  The warm-up counts from the first
        # steps the screen ingested (<out>.ready; a $RLTPERF_BENCH_CHILD's first bytes):
        # Textual writes its set-up long before it has mounted and connected (~5 s loaded).
        t_start = time.monotonic()
        custom = bool(os.environ.get("RLTPERF_BENCH_CHILD"))
        while child.poll() is None and time.monotonic() < t_start + 120:
            if drained[0] if custom else os.path.exists(out + ".ready"):
                break
            time.sleep(0.05)
        start_s = time.monotonic() - t_start

        def still_running() -> None:
            # an ended process runs no more: its CPU over the seconds measured would read
            # 0, which is no figure (a fresh-clone run of the suite once read exactly 0.0)
            if child.poll() is not None:
                text = tail.decode("utf-8", "replace")
                raise RuntimeError(
                    f"the monitor process ended (exit {child.returncode}) before the {duration:g} s "
                    f"measured were over; its terminal ended with:\n{text}"
                )

        time.sleep(warmup)
        still_running()
        rss0 = proc.memory_info().rss
        c0, e0 = proc_cpu_s(child.pid), proc_cpu_s(eng.pid)
        t0 = time.monotonic()
        rss_samples = []
        while time.monotonic() - t0 < duration:
            time.sleep(min(5.0, duration - (time.monotonic() - t0)) if duration > 5 else duration)
            still_running()
            rss_samples.append(proc.memory_info().rss)
        wall = time.monotonic() - t0
        c1, e1 = proc_cpu_s(child.pid), proc_cpu_s(eng.pid)
        rss1 = proc.memory_info().rss
        still_running()
        os.write(master, b"q")
        child.wait(30)
        try:
            with open(out) as f:
                seen = json.load(f)
        except OSError:
            text = tail.decode("utf-8", "replace")
            raise RuntimeError(
                f"the monitor process wrote no figures; its terminal ended with:\n{text}"
            ) from None
        cpu, ecpu = c1 - c0, e1 - e0
        return {
            "tui_cpu_fraction": round(cpu / wall, 4),
            "engine_cpu_fraction": round(ecpu / wall, 3),
            "measured_s": round(wall, 1),
            "engine_rate_steps_per_s": rate,
            "tui_steps_received": seen["steps"],
            "tui_records_received": seen["records"],
            "tui_dropped": seen["dropped"],
            "tui_ticks": seen["ticks"],
            "tui_state": seen.get("state"),
            "warmup_s": warmup,
            "tui_start_s": round(start_s, 2),
            "tui_rss_mb_start": round(rss0 / 2**20, 1),
            "tui_rss_mb_end": round(rss1 / 2**20, 1),
            "tui_rss_mb_max": round(max([*rss_samples, rss1]) / 2**20, 1),
            "refresh_hz": refresh,
            "terminal_bytes_written": drained[0],
        }
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait(10)
        if master >= 0:
            try:
                os.close(master)
            except OSError:
                pass
        _stop(eng)
        shutil.rmtree(snaps, ignore_errors=True)


RECORDS_GOAL = 200_000
"""Records decoded and aggregated per CPU second, at least."""
TUI_CPU_GOAL = 0.02
"""The monitor's CPU on a 1 000 steps/s probe stream, at most (fraction of one core)."""


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.baseline_root:  # a wrong path is said before minutes of measuring
        from rltperf_tui.bench.peers import checkout

        checkout(args.baseline_root)
    res: dict[str, Any] = {"decode_aggregate": decode_aggregate_rate(max(10_000, args.records))}
    res["records_per_s"] = res["decode_aggregate"]["records_per_s"]
    from rltperf_tui.bench.tick import tick_model_cost

    res["tick_model"] = tick_model_cost(synthetic_stream(max(10_000, args.records))[0])
    ok = res["records_per_s"] >= RECORDS_GOAL
    if not args.skip_tui:
        tui = tui_cost(args.duration, args.rate, args.refresh)
        res["tui"] = tui
        res["tui_cpu_fraction"] = tui["tui_cpu_fraction"]
        ok = ok and tui["tui_cpu_fraction"] <= TUI_CPU_GOAL
        # A monitor that died early uses no CPU: the figure only counts if it kept up.
        expected = args.rate * args.duration
        tui["kept_up"] = tui.get("tui_steps_received", 0) >= 0.8 * expected
        if not tui["kept_up"]:
            tui["problem"] = (
                f"the monitor received {tui.get('tui_steps_received', 0)} of ~{expected:.0f} steps: "
                "it stopped or fell behind, so its CPU figure means nothing"
            )
        ok = ok and tui["kept_up"]
    if args.metrics_target:
        from rltperf_tui.bench.metrics_ingest import metrics_only_cost

        res["metrics_only"] = metrics_only_cost(args.metrics_target, args.metrics_duration, args.metrics_hz)
        from rltperf_tui.bench.peers import screen_beside_htop

        res["screen"] = screen_beside_htop(args.metrics_target, args.metrics_duration, args.htop)
    else:
        res["metrics_only"] = {
            "measured": False,
            "why": "give --metrics-target vllm+http://HOST:PORT of a running vLLM server",
        }
    if args.baseline_root:
        res["baseline"] = beside_baseline(args.baseline_root, args.duration, args.rate, args.rounds)
    from rltperf_tui.bench.metrics_ingest import stored_page_parse

    res["metrics_only"]["stored_page_parse"] = stored_page_parse()
    res["targets"] = {"records_per_s": f">= {RECORDS_GOAL}", "tui_cpu_fraction": f"<= {TUI_CPU_GOAL:g}"}
    res["ok"] = ok
    return res


def print_text(r: dict[str, Any]) -> None:
    d = r["decode_aggregate"]
    print(
        f"decode + aggregate, one thread, {d['records']:,} records ({d['bytes'] / 2**20:.1f} MiB of frames):"
    )
    print(f"  {d['records_per_s']:,} records per CPU second (target >= {RECORDS_GOAL:,}); "
          f"{d['records_per_wall_s']:,} per wall second on this machine")  # fmt: skip
    print(
        f"  decode alone {d['decode_records_per_s']:,}/s, aggregate alone {d['aggregate_records_per_s']:,}/s"
    )
    k = r.get("tick_model") or {}
    if k.get("ticks"):
        print(f"  a render tick's statistics ({k['ticks']} ticks, {k['ticks_with_idle_gaps']} listing idle gaps; "
              f"bench.tick): window {k['window_ms']:.3f} ms + view {k['stats_view_ms']:.3f} ms of CPU, "
              f"{k['model_ms_per_s_at_2hz']:.2f} ms a second at 2 Hz")  # fmt: skip
    t = r.get("tui")
    if t:
        print(f"monitor attached to the loop engine at {t['engine_rate_steps_per_s']:g} steps/s, "
              f"{t['refresh_hz']:g} Hz refresh, 120x40 pty, {t['measured_s']:.0f} s after {t['warmup_s']:.0f} s warm-up:")  # fmt: skip
        print(
            f"  CPU {t['tui_cpu_fraction']:.3f} of one core (target <= {TUI_CPU_GOAL:g}); engine used {t['engine_cpu_fraction']:.2f}"
        )
        print(f"  received {t['tui_steps_received']:,} steps ({t['tui_records_received']:,} records), "
              f"dropped {t['tui_dropped']}, {t['tui_ticks']} render ticks")  # fmt: skip
        print(f"  RSS {t['tui_rss_mb_start']:.1f} MiB after warm-up, {t['tui_rss_mb_end']:.1f} MiB at the end "
              f"(max {t['tui_rss_mb_max']:.1f})")  # fmt: skip
        if t.get("problem"):
            print(f"  PROBLEM: {t['problem']}")
    from rltperf_tui.bench import peers

    if r.get("baseline"):
        peers.print_baseline(r["baseline"])
    if r.get("screen"):
        peers.print_screen(r["screen"])
    from rltperf_tui.bench.metrics_ingest import print_metrics_only

    print_metrics_only(r.get("metrics_only"))
    print("OK" if r["ok"] else "TARGET MISSED")
