"""``rltperf engine``: the reference looped-transformer engine with its load generator."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from typing import Any

from rltperf_tui.commands.stop_signals import STOP_SIGNALS, on_stop_signals

HELP = "run the reference looped-transformer engine (random weights) with a load generator and a probe"
DESCRIPTION = """\
Runs the reference looped transformer (embedding, prelude, a shared block looped
max_loops times with a norm between loops, coda, LM head) with RANDOM weights, driven by
an in-process load generator, with the rltperf probe listening for monitors
(`rltperf attach tcp://HOST:PORT`).  The first line printed is the probe's target alone,
`tcp://HOST:PORT` (a wildcard --listen prints this host's name), the second how to attach
(a token is named, never printed); then a status line every few seconds.  Stops on Ctrl-C / SIGTERM / SIGHUP, at --duration, or when a
finite workload is done.

Presets: tiny (CPU demo, a few ms per decode step on one core), membound (CPU decode
bound by memory bandwidth), ouro-1.4b-shape and huginn-shape (real shapes for GPUs; on
the CPU use --analytic for their counts).

Exit policies (--exit): fixed, fixed:N, gate:Q (Ouro cumulative exit probability),
kl:EPS (Huginn; with random weights the KL between passes is ~0.01-0.02, e.g. kl:0.013),
oracle:P1,P2,... (exit depths drawn from the given distribution).
Workloads (--workload): single-128, burst16-1024, rate-4096[:RATE], poisson:RATE,
closed:CONCURRENCY, steady-bursts[:RATE]; append ,in=N,out=N,n=N to change the shape."""

EPILOG = """\
examples:
  rltperf engine                                   tiny model, steady load with bursts
  rltperf engine --exit gate:0.8 --exit-mode compact --kv-policy shared
  rltperf engine --spec 2,3 --spec-accept oracle:0.7 --workload closed:8
  rltperf engine --inject-stall 20@10 --duration 30
  rltperf engine --preset ouro-1.4b-shape --analytic"""

EXIT_WITHOUT_TEARDOWN = True
"""Stopped, the engine process ends at once (``cli._exit_now``), not after torch's teardown."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny", help="model preset (default tiny)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument(
        "--dtype",
        default=None,
        help="float32, bfloat16 or float16 (default: float32 on cpu, bfloat16 on cuda)",
    )
    p.add_argument("--listen", default="127.0.0.1:7788", metavar="ADDR",
                   help="probe address HOST:PORT (default 127.0.0.1:7788; port 0 picks a free one)")  # fmt: skip
    p.add_argument(
        "--token", default=None, help="probe token, required off loopback (default $RLTPERF_TOKEN)"
    )
    p.add_argument(
        "--workload", default=None, metavar="W", help="load generator workload (default: the preset's)"
    )
    p.add_argument(
        "--exit", default="fixed", metavar="POLICY", help="exit policy (default fixed: every loop)"
    )
    p.add_argument("--exit-mode", default="select", choices=("select", "compact"),
                   help="select: every loop runs, outputs picked by exit depth; compact: exited tokens leave the batch")  # fmt: skip
    p.add_argument("--kv-policy", default="per_depth", choices=("per_depth", "shared"),
                   help="per_depth: one KV cache per loop depth and layer; shared: one per layer (default per_depth)")  # fmt: skip
    p.add_argument("--spec", default=None, metavar="DRAFT_LOOPS,DRAFT_LEN",
                   help="self-speculative decoding: draft DRAFT_LEN tokens at DRAFT_LOOPS loops, verify at full depth")  # fmt: skip
    p.add_argument("--spec-accept", default=None, metavar="greedy|oracle:ALPHA",
                   help="acceptance: greedy (default) or oracle:ALPHA (Bernoulli per drafted token, for tests)")  # fmt: skip
    p.add_argument("--inject-stall", default=None, metavar="MS@EVERY",
                   help="fault injection: a host stall of MS ms in the schedule stage every EVERY steps")  # fmt: skip
    p.add_argument("--sync-every-stage", action="store_true",
                   help="fault injection: a device synchronise at every stage boundary (CUDA)")  # fmt: skip
    p.add_argument("--duration", type=float, default=None, metavar="S", help="stop after S seconds")
    p.add_argument(
        "--snapshots",
        default="snapshots",
        metavar="DIR",
        help="where captures are saved (default ./snapshots)",
    )
    p.add_argument(
        "--capture-idle-timeout",
        type=float,
        default=5.0,
        metavar="S",
        help="a capture window with no engine step for S s ends with a partial bundle (default 5)",
    )
    p.add_argument(
        "--snapshot-budget-mb",
        type=float,
        default=10240,
        metavar="MB",
        help="refuse a capture once the bundles under --snapshots use MB MiB (default 10240; 0: no limit)",
    )
    p.add_argument(
        "--snapshot-budget-count",
        type=int,
        default=1000,
        metavar="N",
        help="refuse a capture once --snapshots holds N bundles (default 1000; 0: no limit)",
    )
    p.add_argument(
        "--no-warm-profiler",
        action="store_true",
        help="skip the profiler's warm-up at start: ~1 s of CPU and ~70 MB of RSS less for an engine "
        "that is never captured (torch's profiler imports torch._inductor on first use); the first "
        "capture then pays it on the step loop",
    )
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="intra-op CPU threads (default 1 for tiny and membound: the demo leaves a core to the monitor; else all cores)")  # fmt: skip
    p.add_argument(
        "--seed", type=int, default=0, help="seed of weights, workload, exits and acceptance (default 0)"
    )
    p.add_argument(
        "--prometheus-port",
        type=int,
        default=None,
        metavar="P",
        help="also serve Prometheus metrics on 127.0.0.1:P: loopback only, whatever --listen says, "
        "because /metrics has no authentication (the probe's --token does not cover it)",
    )
    p.add_argument(
        "--prometheus-listen",
        default=None,
        metavar="HOST:PORT",
        help="serve the Prometheus metrics on HOST:PORT instead (e.g. 0.0.0.0:9400 for a scraper on "
        "another machine: anyone who can reach that port reads the metrics, without a token)",
    )
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        metavar="N",
        help="running requests at most (preset default)",
    )
    p.add_argument(
        "--token-budget", type=int, default=None, metavar="N", help="tokens per step at most (preset default)"
    )
    p.add_argument("--kv-blocks", type=int, default=None, metavar="N",
                   help="KV blocks per depth pool (default: from the preset's KV memory budget)")  # fmt: skip
    p.add_argument(
        "--kv-block-tokens", type=int, default=None, metavar="N", help="tokens per KV block (default 16)"
    )
    p.add_argument(
        "--max-loops", type=int, default=None, metavar="N", help="override the preset's loop count"
    )
    p.add_argument(
        "--status-every", type=float, default=3.0, metavar="S", help="status line period (default 3 s)"
    )
    p.add_argument("--analytic", action="store_true",
                   help="print the preset's parameter count and bytes/FLOPs per decode step, then exit")  # fmt: skip
    p.add_argument("--force", action="store_true", help="run a GPU preset on the CPU anyway (slow, large)")


def _analytic(args: argparse.Namespace) -> int:
    from engine_adapters.reference.analytic import decode_step
    from engine_adapters.reference.presets import get_preset, with_loops

    try:
        preset = get_preset(args.preset)
    except ValueError as exc:
        print(f"rltperf engine: error: {exc}", file=sys.stderr)
        return 2
    cfg = preset.model if args.max_loops is None else with_loops(preset.model, args.max_loops)
    dtype = args.dtype or "bfloat16"
    if dtype not in ("float32", "bfloat16", "float16"):
        print(
            f"rltperf engine: error: --dtype must be float32, bfloat16 or float16, not {dtype!r}",
            file=sys.stderr,
        )
        return 2
    one = decode_step(cfg, dtype)
    out: dict[str, Any] = {
        "preset": args.preset,
        "shape": cfg.describe(),
        "params": int(one["params"]),
        "dtype": dtype,
        "loops": cfg.max_loops,
        "decode_step_batch1": {k: one[k] for k in ("weight_bytes", "bytes_read", "bytes_written", "flops")},
        "per_loops": {
            str(n): decode_step(cfg, dtype, loops=n)["weight_bytes"] for n in range(1, cfg.max_loops + 1)
        },
        "random_weights": True,
    }
    print(f"{args.preset}: {cfg.describe()}")
    print(f"parameters: {out['params']:,} ({out['params'] / 1e9:.3f} B)")
    print(f"one decode step, batch 1, {cfg.max_loops} loops, {dtype}: weights read {one['weight_bytes'] / 1e9:.3f} GB, "
          f"bytes read {one['bytes_read'] / 1e9:.3f} GB, written {one['bytes_written'] / 1e3:.1f} kB, "
          f"{one['flops'] / 1e9:.2f} GFLOP")  # fmt: skip
    print("weights read per decode step by loops run: "
          + ", ".join(f"{n}: {v / 1e9:.3f} GB" for n, v in out["per_loops"].items()))  # fmt: skip
    print(json.dumps(out))
    return 0


def attach_target(address: str) -> str:
    """``tcp://HOST:PORT`` a monitor can connect to for a probe bound to ``address``.

    A wildcard bind (0.0.0.0, ::) is no address to connect to: this host's name stands
    in when it resolves (reachable from other machines too), else loopback.
    """
    import socket

    from engine_adapters.definitions.wire import parse_hostport

    host, port = parse_hostport(address)
    if host in ("0.0.0.0", "::", ""):
        name = socket.gethostname()
        try:
            socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
            host = name
        except OSError:
            host = "127.0.0.1" if host != "::" else "::1"
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def attach_hint(target: str, token: str | None) -> str:
    """The attach command for ``target``; a token is named, never printed (logs get shared)."""
    if not token:
        return f"rltperf attach {target}"
    return (
        f"rltperf attach {target} with RLTPERF_TOKEN set to this engine's token (--token or $RLTPERF_TOKEN)"
    )


def _status(engine: Any, t0: float, last: dict[str, float]) -> None:
    t = engine.totals
    now = time.monotonic()
    dt = max(1e-9, now - last["t"])
    steps = t.steps - last["steps"]
    toks = t.out_tokens - last["tokens"]
    last.update(t=now, steps=t.steps, tokens=t.out_tokens)
    rec = sorted(engine.totals.recent_step_ns)
    p50 = rec[len(rec) // 2] / 1e6 if rec else float("nan")
    used, total, _ = engine.kv.usage()
    extra = ""
    if engine.spec and t.drafts:
        extra = f" | accept len {1 + t.accepted / t.drafts:.2f}"
    print(
        f"[{now - t0:6.1f}s] {steps / dt:6.1f} steps/s | step p50 {p50:6.2f} ms | running {len(engine.sched.running):3d} "
        f"waiting {len(engine.sched.waiting):3d} | {toks / dt:7.1f} tok/s | kv {used}/{total} | "
        f"done {t.finished} failed {t.failed} preempted {t.preempted}{extra}",
        flush=True,
    )


def run(args: argparse.Namespace) -> int:
    if args.analytic:
        return _analytic(args)
    if args.duration is not None and args.duration <= 0:
        print("rltperf engine: error: --duration must be positive", file=sys.stderr)
        return 2
    # torch's profiler (kineto) prints "USDT: ... profiler_start / profiler_stop" on stderr
    # at every profiler start, the probe's warm-up included: noise in the engine's log.
    # Level 6 is above all of kineto's levels (its errors too: a capture that fails is
    # reported by the probe with the reason).  A KINETO_LOG_LEVEL already set wins.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    from engine_adapters.probe import Probe
    from engine_adapters.reference.engine import Engine, EngineConfig, EngineError

    cfg = EngineConfig(
        preset=args.preset, device=args.device, dtype=args.dtype, workload=args.workload, exit=args.exit,
        exit_mode=args.exit_mode, kv_policy=args.kv_policy, spec=args.spec, spec_accept=args.spec_accept,
        inject_stall=args.inject_stall, sync_every_stage=args.sync_every_stage, seed=args.seed,
        threads=args.threads, max_num_seqs=args.max_num_seqs, token_budget=args.token_budget,
        kv_blocks=args.kv_blocks, kv_block_tokens=args.kv_block_tokens, max_loops=args.max_loops,
        force=args.force,
    )  # fmt: skip
    try:
        engine = Engine(cfg)
    except EngineError as exc:
        print(f"rltperf engine: error: {exc}", file=sys.stderr)
        return 2
    except (RuntimeError, MemoryError) as exc:  # allocation failures and the like
        print(f"rltperf engine: error: could not build the model: {exc}", file=sys.stderr)
        return 1
    prom_host: str | None = None
    prom_port = args.prometheus_port
    if args.prometheus_listen is not None:
        from engine_adapters.definitions.wire import parse_hostport

        try:
            prom_host, prom_port = parse_hostport(args.prometheus_listen, default_port=-1)
        except ValueError as exc:
            print(f"rltperf engine: error: --prometheus-listen: {exc}", file=sys.stderr)
            return 2
        if prom_port == -1:
            prom_port = args.prometheus_port
        if prom_port is None:
            print("rltperf engine: error: --prometheus-listen needs HOST:PORT", file=sys.stderr)
            return 2
    try:
        probe = Probe(
            args.listen, engine.engine_info(args.duration), token=args.token, snapshot_root=args.snapshots,
            prometheus_port=prom_port if prom_host is None else None,
            capture_idle_timeout_s=args.capture_idle_timeout,
            snapshot_budget_bytes=int(args.snapshot_budget_mb * 2**20) or None,
            snapshot_budget_count=args.snapshot_budget_count or None,
            warm_profiler=not args.no_warm_profiler,
        )  # fmt: skip
    except ValueError as exc:
        print(f"rltperf engine: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"rltperf engine: error: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except ImportError as exc:
        print(
            f"rltperf engine: error: --prometheus-port is not available in this build ({exc})",
            file=sys.stderr,
        )
        return 2
    exporter = probe._prometheus  # the loopback default, started by the probe
    if prom_host is not None:
        try:
            from engine_adapters.probe.prometheus import PrometheusExporter

            exporter = PrometheusExporter(probe, prom_port, host=prom_host)
        except (OSError, ImportError) as exc:
            probe.close("could not serve Prometheus metrics")
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            print(
                f"rltperf engine: error: --prometheus-listen {args.prometheus_listen}: {why}", file=sys.stderr
            )
            return 1
    engine.attach(probe)
    target = attach_target(probe.address)
    # Line 1 is the target alone (scripts read it: `head -1`); line 2 says how to attach.
    print(target, flush=True)
    print(f"rltperf engine: probe listening on {probe.address}; attach: {attach_hint(target, probe.token)}",
          flush=True)  # fmt: skip
    if exporter is not None:
        from engine_adapters.definitions.wire import is_loopback

        host = exporter.address.rsplit(":", 1)[0].strip("[]")
        reach = "loopback only" if is_loopback(host) else "no authentication: anyone who can reach it"
        print(
            f"rltperf engine: Prometheus metrics on http://{exporter.address}/metrics ({reach})", flush=True
        )
    mc = engine.model_cfg
    kv_note = f" ({engine.kv_raised})" if engine.kv_raised else ""
    print(
        f"model {engine.model_desc}: {mc.describe()}; {engine.model.param_count() / 1e6:.2f} M params, "
        f"{engine.dtype} on {engine.device}, {engine.threads} thread(s)\n"
        f"exit {engine.exit_config()}, kv {engine.kv_policy}: {engine.kv.describe()}{kv_note}; "
        f"spec {engine.spec.describe() if engine.spec else 'off'}\n"
        f"workload {engine.workload.describe()} (seed {engine.seed}, tokens sha256 {engine.loadgen.tokens_sha256[:16]}…)"
        + (f"\nfault injection: stall {args.inject_stall}" if args.inject_stall else "")
        + ("\nfault injection: sync at every stage boundary" if args.sync_every_stage else "")
        + ("\nprofiler not warmed (--no-warm-profiler): the first capture pays its start-up on the step loop"
           if args.no_warm_profiler else ""),
        flush=True,
    )  # fmt: skip
    stop = threading.Event()

    t0 = time.monotonic()
    last = {"t": t0, "steps": 0.0, "tokens": 0.0}
    reason = "stopped"
    try:
        # Ctrl-C, kill, a hang-up: the same orderly stop (the probe ships its last records)
        with on_stop_signals(lambda _signum: stop.set(), (signal.SIGINT, *STOP_SIGNALS)):
            engine.run(
                duration=args.duration,
                stop=stop,
                on_tick=lambda e: _status(e, t0, last),
                tick_s=args.status_every,
            )
        if stop.is_set():
            reason = "stopped by signal"
        elif engine.finite_done:
            reason = "workload done"
        else:
            reason = "duration reached"
    finally:
        # Closing is quick unless a capture is exporting (the probe finishes it, up to
        # 10 s): past half a second, say what the engine is waiting for.
        waiting = threading.Timer(0.5, lambda: print(
            "rltperf engine: stopping: waiting for the probe to finish a capture export in progress "
            "(at most 10 s) and send its last records", flush=True))  # fmt: skip
        waiting.daemon = True
        waiting.start()
        probe.close(reason)  # ships the last steps and requests, then the Bye
        waiting.cancel()
        if exporter is not None and prom_host is not None:
            exporter.close()
    t = engine.totals
    el = time.monotonic() - t0
    mean_depth = (
        sum((i + 1) * v for i, v in enumerate(t.exit_hist)) / max(1, sum(t.exit_hist)) if t.exit_hist else 0.0
    )
    print(
        f"rltperf engine: {reason} after {el:.1f} s: {t.steps} steps, {t.out_tokens} tokens, "
        f"{t.finished} requests done, {t.failed} failed, {t.preempted} preemptions; "
        f"exit depths {t.exit_hist} (mean {mean_depth:.2f})"
        + (
            f"; injected {engine.stalls} stalls ({engine.stall_total_ns / 1e6:.0f} ms)"
            if engine.stalls
            else ""
        ),
        flush=True,
    )
    return 0
