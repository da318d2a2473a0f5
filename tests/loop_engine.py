"""A small torch loop instrumented with the probe, run as a subprocess by tests.

It measures its own step times (the ground truth a recording is checked against) and
writes them to ``--out`` as JSON when it stops.  Prints ``ADDRESS host:port`` first.

    python tests/loop_engine.py --duration 5 --out /tmp/truth.json [--sleep-ms 1]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from time import perf_counter_ns as clk


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", default="127.0.0.1:0")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--sleep-ms", type=float, default=0.0, help="host sleep between steps (a known idle gap)")
    ap.add_argument(
        "--rate", type=float, default=0.0, metavar="STEPS_PER_S",
        help="pace the loop to this many steps per second (absolute schedule, no drift); 0 = as fast as it runs",
    )  # fmt: skip
    ap.add_argument("--snapshots", default="snapshots")
    ap.add_argument("--token", default=None)
    ap.add_argument("--no-warm", action="store_true")
    args = ap.parse_args()

    import torch

    from engine_adapters.probe import Probe

    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(16, args.dim)
    w = torch.randn(args.dim, args.dim) / args.dim**0.5
    probe = Probe(
        args.listen,
        {
            "name": "test-loop",
            "model": f"mlp-{args.dim}",
            "dtype": "float32",
            "device": "cpu",
            "random_weights": True,
            "workload": "fixed loop",
        },
        snapshot_root=args.snapshots,
        token=args.token,
        warm_profiler=not args.no_warm,
    )
    print(f"ADDRESS {probe.address}", flush=True)
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    durations: list[int] = []
    busy: list[int] = []
    ids: list[int] = []
    wbytes = args.dim * args.dim * 4
    t_end = time.monotonic() + args.duration
    period = 1.0 / args.rate if args.rate > 0 else 0.0
    next_t = time.monotonic()
    while not stop and time.monotonic() < t_end:
        ids.append(probe.steps_total)  # the id the probe gives this step
        t0 = clk()
        with probe.step("decode", 16, 16) as st:
            st.mark("schedule")
            h = x + 0.0
            st.mark("forward")
            f0 = clk()
            for _ in range(4):
                h = torch.tanh(h @ w)
            f1 = clk()
            st.mark("sample")
            h.argmax(dim=-1)
            st.set(
                busy_ns=f1 - f0, bytes_read=4 * wbytes, flops=4 * 2 * 16 * args.dim * args.dim, out_tokens=16
            )
        durations.append(clk() - t0)
        busy.append(f1 - f0)
        if args.sleep_ms:
            time.sleep(args.sleep_ms / 1000)
        if period:
            # next += period; sleep(next - now): the rate does not drift with step time
            next_t += period
            delay = next_t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            elif delay < -1.0:
                next_t = time.monotonic()  # fell a second behind: do not burst to catch up
    probe.close()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"step_ids": ids, "durations_ns": durations, "busy_ns": busy}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
