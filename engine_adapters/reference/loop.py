"""A small torch loop instrumented with the probe: the smallest real engine.

Used by the tests and by ``rltperf bench ingest`` (paced at a fixed step rate), it
measures its own step times — the ground truth a recording is checked against — and
writes them to ``--out`` as JSON when it stops.

It measures its own step times (the ground truth a recording is checked against) and
writes them to ``--out`` as JSON when it stops.  Prints ``ADDRESS host:port`` first.

    python -m engine_adapters.reference.loop --duration 5 --out /tmp/truth.json [--sleep-ms 1]

Options for the evidence tests: ``--stall-ms 20@10`` sleeps 20 ms after every 10th step
(an injected stall: a known gap), ``--requests-every K`` reports a request finishing
every K steps (K output tokens, for TTFT/TPOT), ``--loops D`` runs the block up to D
times with a per-row early exit and reports the exit-depth histogram (random weights:
the exit depths say nothing about a real model), ``--steps N`` stops stepping after N
steps (the probe stays up until ``--duration`` ends), ``--start-delay S`` waits before
the first step (so a recorder can attach first).  The truth file also holds the actual
sleep after each step, by step id.
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
    ap.add_argument("--rows", type=int, default=16, help="rows of the activation (batch)")
    ap.add_argument("--stall-ms", default=None, metavar="MS@EVERY", help="sleep MS after every EVERY-th step")
    ap.add_argument(
        "--requests-every", type=int, default=0, metavar="K", help="a request of K tokens ends every K steps"
    )
    ap.add_argument(
        "--loops", type=int, default=0, metavar="D", help="looped block with early exit, up to D passes"
    )
    ap.add_argument(
        "--steps", type=int, default=0, metavar="N", help="stop stepping after N steps (0: no limit)"
    )
    ap.add_argument(
        "--start-delay", type=float, default=0.0, metavar="S", help="seconds to wait before stepping"
    )
    ap.add_argument(
        "--bare", action="store_true", help="one matmul per step, no stage marks (trace-idle check)"
    )
    ap.add_argument("--prometheus-port", type=int, default=None, help="serve Prometheus metrics on this port")
    args = ap.parse_args()
    stall_ms, stall_every = 0.0, 0
    if args.stall_ms:
        a, b = args.stall_ms.split("@")
        stall_ms, stall_every = float(a), int(b)

    import torch

    from engine_adapters.probe import Probe

    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(args.rows, args.dim)
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
            "max_loops": args.loops or None,
            "contract": {
                "sampling": "argmax",
                "seeds": "torch.manual_seed(0)",
                "warmup": "none",
                "stall": args.stall_ms or "none",
            },
        },
        snapshot_root=args.snapshots,
        token=args.token,
        warm_profiler=not args.no_warm,
        prometheus_port=args.prometheus_port,
    )
    print(f"ADDRESS {probe.address}", flush=True)
    if probe._prometheus is not None:
        print(f"PROMETHEUS {probe._prometheus.address}", flush=True)
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    durations: list[int] = []
    busy: list[int] = []
    sleeps: dict[int, int] = {}
    ids: list[int] = []  # the id the probe gave each step
    wbytes = args.dim * args.dim * 4
    rows = args.rows
    t_end = time.monotonic() + args.duration
    period = 1.0 / args.rate if args.rate > 0 else 0.0
    if args.start_delay:
        time.sleep(args.start_delay)
    next_t = time.monotonic()
    req_start: int | None = None
    req_first: int | None = None
    n = 0
    while not stop and time.monotonic() < t_end:
        if args.steps and n >= args.steps:
            time.sleep(0.05)
            continue
        t0 = clk()
        if args.bare:
            with probe.step("decode", rows, rows) as st:
                f0 = clk()
                torch.mm(x, w)
                f1 = clk()
                st.set(
                    busy_ns=f1 - f0, bytes_read=wbytes, flops=2 * rows * args.dim * args.dim, out_tokens=rows
                )
                sid = st.step_id
        else:
            with probe.step("decode", rows, rows) as st:
                st.mark("schedule")
                h = x + 0.0
                st.mark("forward")
                f0 = clk()
                if args.loops:
                    h = h * torch.rand(rows, 1) * 2  # per-step input scale: exits vary from step to step
                    depth = torch.full((rows,), args.loops, dtype=torch.long)
                    live = torch.ones(rows, dtype=torch.bool)
                    passes = 0
                    for d in range(1, args.loops + 1):
                        nh = torch.tanh(h @ w)
                        passes = d
                        # a row exits when its update is small (a real, data-dependent test)
                        done = live & ((nh - h).abs().mean(dim=-1) < 0.55)
                        depth[done] = d
                        live &= ~done
                        h = nh
                        if not bool(live.any()):
                            break
                    hist = torch.bincount(depth - 1, minlength=args.loops).tolist()
                else:
                    passes = 4
                    for _ in range(4):
                        h = torch.tanh(h @ w)
                    hist = None
                f1 = clk()
                st.mark("sample")
                h.argmax(dim=-1)
                st.set(
                    busy_ns=f1 - f0,
                    bytes_read=passes * wbytes,
                    flops=passes * 2 * rows * args.dim * args.dim,
                    out_tokens=rows,
                    exit_hist=hist,
                )
                sid = st.step_id
        t1 = clk()
        ids.append(sid)
        durations.append(t1 - t0)
        busy.append(f1 - f0)
        n += 1
        if args.requests_every:
            k = args.requests_every
            if req_start is None:
                req_start, req_first = t0, t1
            if n % k == 0:
                probe.request_done(f"r{n // k}", req_start, t1, req_first, prompt_tokens=8, output_tokens=k)
                req_start = None
        pause = args.sleep_ms + (stall_ms if stall_every and n % stall_every == 0 else 0.0)
        if pause:
            s0 = clk()
            time.sleep(pause / 1000)
            sleeps[sid] = clk() - s0
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
            json.dump(
                {"step_ids": ids, "durations_ns": durations, "busy_ns": busy, "sleep_after_ns": sleeps}, f
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
