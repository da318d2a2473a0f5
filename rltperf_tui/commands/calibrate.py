"""``rltperf calibrate``: measure this machine's copy bandwidth and matmul FLOP/s."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

HELP = "measure achievable copy bandwidth and matmul FLOP/s here; cache them as the MBU ceiling"
DESCRIPTION = """\
Measure what this machine's device achieves and cache it as the ceiling MBU and the
roofline are computed against (keyed by device name and host; see --show):

  copy bandwidth  a large array copied device-to-device (CPU: far larger than the last
                  level cache), counted the STREAM way: a copy of S bytes moves 2*S
                  (read + written), the same way a step's bytes are counted
  matmul FLOP/s   dense n x n x n products, 2*n^3 FLOPs each, per dtype

Each figure is the median of several repetitions after warm-up.  A probe whose engine
runs on this device then reports these figures in its hello (source "calibration")
instead of the datasheet spec table ("spec table") or, on a CPU, the quick
sub-second calibration it makes when nothing is cached ("quick calibration").
Restart the engine (or reattach a fresh one) to pick up a new calibration.

JSON keys (--json): device, copy_gbps, matmul_gflops, dtype, repetitions, plus
copy_method, copy_methods, copy_bytes, matmul_gflops_by_dtype, matmul_n, warmup,
seconds, host, measured_at, cache, and on a known GPU spec / copy_vs_spec."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        default="cpu",
        help="cpu (default) or cuda / cuda:N (needs a CUDA build of torch and a GPU)",
    )
    p.add_argument(
        "--dtype",
        default=None,
        help="comma-separated matmul dtypes, first = main (default: cpu float32,bfloat16; "
        "cuda bfloat16,float16,float32)",
    )
    p.add_argument("--repetitions", type=int, default=None, help="timed repetitions per figure (median)")
    p.add_argument("--copy-mib", type=int, default=None, help="size of the copied array, MiB")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--no-save", action="store_true", help="measure only; do not update the cache")
    p.add_argument("--show", action="store_true", help="print the cached calibrations and exit")


def _fmt(r: dict[str, Any]) -> str:
    lines = [
        f"device        {r['device']} ({r['device_arg']}) on {r['host']}",
        f"copy          {r['copy_gbps']:.1f} GB/s  (read + written; {r['copy_bytes'] / (1 << 20):.0f} MiB, "
        f"median of {r['repetitions']}; {r['copy_method']})",
    ]
    others = {k: v for k, v in r["copy_methods"].items() if k != r["copy_method"]}
    for k, v in others.items():
        lines.append(f"              {v:.1f} GB/s with {k}")
    for dt, g in r["matmul_gflops_by_dtype"].items():
        main = "  <- main" if dt == r["dtype"] else ""
        lines.append(f"matmul {dt:<8} {g:,.1f} GFLOP/s  ({r['matmul_n']}^3, median){main}")
    if r.get("spec"):
        s = r["spec"]
        lines.append(
            f"datasheet     {s['model']}: {s['bw_gbps']:.0f} GB/s -> copy reaches {r['copy_vs_spec']:.0%} "
            f"({s['datasheet']})"
        )
    lines.append(f"took          {r['seconds']:.1f} s")
    if r.get("cache"):
        lines.append(f"saved to      {r['cache']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from engine_adapters.definitions import ceilings

    if args.show:
        data = ceilings.load_calibrations()
        if args.json:
            print(json.dumps({"cache": str(ceilings.cache_path()), "calibrations": data}, indent=2))
        elif not data:
            print(f"no calibrations cached in {ceilings.cache_path()}")
        else:
            for key, r in sorted(data.items()):
                print(f"{key}: copy {r.get('copy_gbps', 0):.1f} GB/s, matmul {r.get('matmul_gflops') or 0:,.1f} "
                      f"GFLOP/s {r.get('dtype')} [{r.get('source')}] {r.get('measured_at', '')}")  # fmt: skip
        return 0
    dev = str(args.device).strip().lower()
    if not (dev == "cpu" or dev == "cuda" or (dev.startswith("cuda:") and dev[5:].isdigit())):
        print(
            f"rltperf calibrate: --device must be cpu, cuda or cuda:N, not {args.device!r}", file=sys.stderr
        )
        return 2
    dtypes = None
    if args.dtype:
        dtypes = []
        for d in args.dtype.split(","):
            c = ceilings.canonical_dtype(d)
            if c is None:
                print(
                    f"rltperf calibrate: unknown dtype {d!r} (use bfloat16, float16, float32)",
                    file=sys.stderr,
                )
                return 2
            dtypes.append(c)
    if args.repetitions is not None and args.repetitions < 1:
        print("rltperf calibrate: --repetitions must be at least 1", file=sys.stderr)
        return 2
    if args.copy_mib is not None and args.copy_mib < 1:
        print("rltperf calibrate: --copy-mib must be at least 1", file=sys.stderr)
        return 2
    from engine_adapters.definitions import calibrate

    if not args.json:
        print(f"calibrating {dev} (a few seconds)...", file=sys.stderr)
    try:
        result = calibrate.calibrate(dev, tuple(dtypes) if dtypes else None, args.repetitions, args.copy_mib)
    except (RuntimeError, AssertionError, ValueError) as exc:
        print(f"rltperf calibrate: {exc}", file=sys.stderr)
        return 1
    except MemoryError:
        print(
            "rltperf calibrate: not enough memory for the copy arrays (try --copy-mib 256)", file=sys.stderr
        )
        return 1
    if not args.no_save:
        try:
            result["cache"] = str(ceilings.store_calibration(result))
        except OSError as exc:
            print(f"rltperf calibrate: could not save to {ceilings.cache_path()}: {exc}", file=sys.stderr)
    print(json.dumps(result, indent=2) if args.json else _fmt(result))
    return 0
