"""Regenerate ``tests/rltperf_tui/tui/data/demo.rltrec``, the fixed recording of the UI snapshot tests.

Default: the reference engine (``rltperf engine``, tiny preset on the CPU, random
weights) with exits spread over depths, self-speculation and an injected host stall, so
every panel has something to show, recorded over a real socket by a real probe client
for ``--seconds``, with one ops capture of 4 steps in the middle.

``--scripted``: a real probe in this process publishes a sleep-timed scripted loop
(no model) with a numpy calibration in a private cache; for when no engine is at hand.

Run from the repository root (the snapshots must then be re-accepted):

    .venv/bin/python tests/rltperf_tui/tui/data/make_recording.py
    .venv/bin/python -m pytest tests/rltperf_tui/tui --snapshot-update
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from time import perf_counter_ns as clk

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))

DEPTHS = 4
KV_TOTAL = 4096
BLOCK = 16
STAGES = ("schedule", "prepare", "forward", "exit_check", "sample", "draft", "verify", "accept", "update")


def calibrate() -> tuple[float, float]:
    """Copy GB/s (read + write) and float32 matmul GFLOP/s of this machine, best of a few."""
    import numpy as np

    a = np.ones(16 * 1024 * 1024, dtype=np.float32)
    b = np.empty_like(a)
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    gbps = 2 * a.nbytes / best / 1e9
    n = 512
    m = np.ones((n, n), dtype=np.float32)
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        m @ m
        best = min(best, time.perf_counter() - t0)
    return gbps, 2 * n**3 / best / 1e9


def sleep_ms(ms: float) -> None:
    """Sleep ``ms`` milliseconds (busy-wait the last part for sub-ms accuracy)."""
    end = time.perf_counter() + ms / 1000
    if ms > 1.0:
        time.sleep(ms / 1000 - 0.0008)
    while time.perf_counter() < end:
        pass


REFERENCE_ARGS = [
    "--preset", "tiny", "--device", "cpu", "--workload", "steady-bursts", "--exit", "oracle:0.35,0.3,0.2,0.15",
    "--exit-mode", "compact", "--spec", "1,3", "--spec-accept", "oracle:0.6", "--inject-stall", "30@150",
    "--seed", "7", "--threads", "1",
]  # fmt: skip
"""The reference engine with every panel lit: exits spread over depths, self-speculation,
a 30 ms host stall every 150 steps (idle gaps), its steady workload with bursts."""


def reference(args: argparse.Namespace) -> int:
    """Record the real reference engine (``rltperf engine``) for ``--seconds`` with one ops capture."""
    import subprocess

    from engine_adapters.definitions.records import CaptureDone, CaptureFailed
    from engine_adapters.monitor.recording import RecordingWriter
    from engine_adapters.monitor.tcp import ProbeAdapter

    snap = tempfile.mkdtemp(prefix="rltperf-fixture-snap-")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    eng = subprocess.Popen(
        [sys.executable, "-m", "rltperf_tui.cli", "engine", *REFERENCE_ARGS, "--listen", "127.0.0.1:0",
         "--snapshots", snap, "--duration", str(args.seconds + 60)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    try:
        assert eng.stdout is not None
        import re

        line = eng.stdout.readline()
        m = re.search(r"(?:^ADDRESS |tcp://)(\S+?:\d+)", line)
        if not m:
            raise SystemExit(f"the engine printed no address: {line!r}")
        target = "tcp://" + m.group(1)
        session = ProbeAdapter(target, reconnect=False).connect()
        if os.path.exists(args.out):
            os.remove(args.out)
        writer = RecordingWriter(args.out, target="rltperf engine " + " ".join(REFERENCE_ARGS))
        t0 = time.monotonic()
        asked = done = False
        while time.monotonic() - t0 < args.seconds or (asked and not done):
            recs = session.read(0.1)
            writer.write(recs)
            done = done or any(isinstance(r, (CaptureDone, CaptureFailed)) for r in recs)
            if not asked and time.monotonic() - t0 > args.seconds * 0.6:
                session.request_capture(4, "ops")
                asked = True
            if time.monotonic() - t0 > args.seconds + 60:
                break
        session.close()
        writer.close()
    finally:
        eng.terminate()
        eng.wait(30)
    print(f"{args.out}: {writer.records} records, {os.path.getsize(args.out) / 1024:.0f} KiB")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).with_name("demo.rltrec")))
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--scripted", action="store_true",
                    help="a sleep-timed scripted loop in this process instead of the reference engine")  # fmt: skip
    args = ap.parse_args()
    return scripted(args) if args.scripted else reference(args)


def scripted(args: argparse.Namespace) -> int:
    """A sleep-timed scripted looped engine published by a real probe in this process."""

    from engine_adapters.definitions.contract import cpu_model

    cache = tempfile.mkdtemp(prefix="rltperf-fixture-cal-")
    os.environ["RLTPERF_CACHE"] = cache
    gbps, gflops = calibrate()
    with open(os.path.join(cache, "calibration.json"), "w") as f:
        json.dump({f"{socket.gethostname()}|{cpu_model()}": {"copy_gbps": round(gbps, 2),
                   "matmul_gflops": round(gflops, 1), "dtype": "float32"}}, f)  # fmt: skip

    from engine_adapters.definitions.records import CaptureDone, CaptureFailed
    from engine_adapters.monitor.recording import RecordingWriter
    from engine_adapters.monitor.tcp import ProbeAdapter
    from engine_adapters.probe import Probe

    snap = tempfile.mkdtemp(prefix="rltperf-fixture-snap-")
    info = {
        "name": "ui-fixture", "version": "1", "model": "scripted-looped-4x", "dtype": "float32",
        "device": "cpu", "max_loops": DEPTHS, "loop_config": "prelude 1 / shared block x4 / coda 1",
        "exit_config": "gate:0.8 compact", "kv_policy": "per_depth", "spec_config": "draft depth 1, 3 tokens",
        "kv_capacity_blocks": KV_TOTAL, "kv_block_tokens": BLOCK, "max_requests": 8, "token_budget": 512,
        "workload": "poisson 40 req/s + bursts (seed 7), sleep-timed steps", "random_weights": True,
    }  # fmt: skip
    probe = Probe("127.0.0.1:0", info, snapshot_root=snap, stages=STAGES, warm_profiler=True)
    session = ProbeAdapter(f"tcp://{probe.address}", reconnect=False).connect()
    if os.path.exists(args.out):
        os.remove(args.out)
    writer = RecordingWriter(args.out, target="ui-fixture")
    stop = threading.Event()
    capture_done = threading.Event()

    def record() -> None:
        while not (stop.is_set() and capture_done.is_set()) and not session.ended:
            recs = session.read(0.1)
            writer.write(recs)
            if any(isinstance(r, (CaptureDone, CaptureFailed)) for r in recs):
                capture_done.set()
        writer.write(session.read(0.5))

    rec_thread = threading.Thread(target=record)
    rec_thread.start()

    rng = random.Random(args.seed)
    weights_bytes = 3 * 1024 * 1024 // 2  # one pass of the shared block
    running: list[dict[str, int]] = []
    waiting: list[dict[str, int]] = []
    next_arrival = clk()
    t_end = time.monotonic() + args.seconds
    t_start = time.monotonic()
    rid = 0
    captured = False
    gap_done = False
    while time.monotonic() < t_end:
        now = clk()
        elapsed = time.monotonic() - t_start
        rate = 120.0 if 2.5 < elapsed < 3.2 else 40.0  # a burst
        while next_arrival <= now:
            waiting.append({"id": rid, "arrival": next_arrival, "prompt": rng.randint(32, 256),
                            "out": rng.randint(8, 48), "done": 0, "first": 0})  # fmt: skip
            rid += 1
            next_arrival += int(rng.expovariate(rate) * 1e9)
        if not captured and elapsed > 2.0:
            session.request_capture(4, "ops")
            captured = True
        admit = []
        while waiting and len(running) + len(admit) < 8:
            admit.append(waiting.pop(0))
        prefill = sum(r["prompt"] for r in admit)
        batch = len(running) + len(admit)
        kind = "mixed" if admit and running else ("prefill" if admit else "decode")
        if batch == 0:
            sleep_ms(2.0)
            continue
        with probe.step(kind, batch, prefill + len(running)) as st:
            st.mark("schedule")
            sleep_ms(0.15 + 0.02 * batch)
            st.mark("prepare")
            sleep_ms(0.1 + prefill / 2000)
            st.mark("forward")
            # exit depth per produced token; compact mode runs fewer tokens at later depths
            exits = [0] * DEPTHS
            for _ in range(batch):
                u = rng.random()
                d = 0 if u < 0.35 else 1 if u < 0.65 else 2 if u < 0.85 else 3
                exits[d] += 1
            alive = batch
            loop_ns, loop_tok = [], []
            f0 = clk()
            for d in range(DEPTHS):
                t0 = clk()
                sleep_ms(0.12 + 0.03 * alive + prefill / 4000)
                loop_ns.append(clk() - t0)
                loop_tok.append(alive)
                alive -= exits[d]
            busy = clk() - f0
            st.mark("exit_check")
            sleep_ms(0.05)
            st.mark("draft")
            sleep_ms(0.1)
            st.mark("verify")
            sleep_ms(0.15)
            drafted = 3 * len(running)
            accepted = sum(rng.choice((0, 1, 1, 2, 2, 3)) for _ in running)
            st.mark("accept")
            sleep_ms(0.04)
            st.mark("sample")
            sleep_ms(0.08)
            st.mark("update")
            slow_update = not gap_done and elapsed > 3.6
            sleep_ms(3.5 if slow_update else 0.1)
            running.extend(admit)
            finished = []
            for r in running:
                r["done"] += 1
                if r["first"] == 0:
                    r["first"] = clk()
                if r["done"] >= r["out"]:
                    finished.append(r)
            kv_depth = [
                sum(math.ceil((r["prompt"] + r["done"]) / BLOCK) for r in running) for _ in range(DEPTHS)
            ]
            for d in range(1, DEPTHS):  # later depths keep KV only for tokens that reached them
                kv_depth[d] = int(kv_depth[d] * (1 - 0.2 * d))
            kv_read = sum(kv_depth) * BLOCK * 2 * 64 * 4
            st.set(
                busy_ns=busy, bytes_read=weights_bytes * DEPTHS + kv_read, bytes_written=batch * DEPTHS * 2 * 64 * 4,
                flops=2.0 * (weights_bytes / 4) * (prefill + len(running)) * DEPTHS / 3, out_tokens=batch,
                exit_hist=exits, loop_ns=loop_ns, loop_tokens=loop_tok, kv_used=sum(kv_depth), kv_total=KV_TOTAL,
                kv_per_depth=kv_depth, waiting=len(waiting), running=len(running), prefill_tokens=prefill,
                spec_drafts=len(running), spec_drafted=drafted, spec_accepted=accepted,
            )  # fmt: skip
        end = clk()
        for r in finished:
            running.remove(r)
            status = "failed" if r["id"] % 23 == 5 else "ok"
            probe.request_done(r["id"], r["arrival"], end, r["first"], r["prompt"], r["done"], status)
        if slow_update:
            gap_done = True
            sleep_ms(40.0)  # a host stall between steps: an idle gap
    stop.set()
    capture_done.wait(60)
    probe.close()
    rec_thread.join(30)
    session.close()
    writer.close()
    size = os.path.getsize(args.out)
    print(f"{args.out}: {writer.records} records, {size / 1024:.0f} KiB (calibration {gbps:.1f} GB/s, "
          f"{gflops:.0f} GFLOP/s)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
