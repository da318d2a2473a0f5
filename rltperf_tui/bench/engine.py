"""``rltperf bench engine``: the reference engine's decode MBU against this machine's copy bandwidth.

Both figures come from one run, interleaved round by round (copy, decode, copy, decode,
…), so that drift from other tenants hits both alike:

- copy bandwidth: measured exactly as ``rltperf calibrate`` measures the MBU ceiling
  (``engine_adapters.definitions.calibrate``): a large array copy (default 1 GiB, far above the
  caches), counted STREAM-style as bytes read + bytes written (2 x size); on a CPU the
  faster of NumPy's memcpy and torch's multi-threaded ``copy_`` on all cores, on CUDA a
  device-to-device copy timed with CUDA events;
- decode bandwidth: the engine's own analytic bytes (weights read once per loop pass,
  KV read and written) of real decode steps of the reference engine (probe on, batch
  of ``--batch`` sequences), divided by their wall time.

MBU = decode / copy, medians over the rounds.  A streaming read of weights can exceed
the copy figure slightly (a copy also pays write traffic the STREAM convention does not
count); a figure well above 1 would mean a wrong byte count.

The engine runs one thread by default: on a shared machine, OpenMP threads of a GEMV
wait for each other at every barrier whenever another process takes a core, and the
engine then measures its neighbours rather than the memory.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

HELP = "reference engine decode MBU against the copy bandwidth measured in the same run"
DESCRIPTION = __doc__ or HELP


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="membound", help="engine preset (default membound)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--threads", type=int, default=1, help="engine CPU threads (default 1)")
    p.add_argument("--batch", type=int, default=1, help="decode batch: sequences in flight (default 1)")
    p.add_argument("--context", type=int, default=64, help="prompt tokens per sequence (default 64)")
    p.add_argument("--rounds", type=int, default=4, help="interleaved copy/decode rounds (default 4)")
    p.add_argument("--steps", type=int, default=4, help="decode steps per round (default 4)")
    p.add_argument("--copy-mib", type=int, default=1024, help="copy array size, MiB (default 1024)")
    p.add_argument("--dtype", default=None, help="engine dtype (default: the preset's for the device)")
    p.add_argument("--target", type=float, default=0.6, help="MBU target (default 0.6)")


def copy_gbps(device: str, nbytes: int) -> tuple[float, str]:
    """Copy bandwidth of ``device`` (GB/s, read + write) the way ``rltperf calibrate`` times it."""
    from engine_adapters.definitions import calibrate

    if device.startswith("cuda"):
        idx = int(device.split(":", 1)[1]) if ":" in device else 0
        r = calibrate.copy_cuda(idx, nbytes, reps=5, warmup=1, inner=5)
        return float(r["copy_gbps"]), str(r["copy_method"])
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)  # the machine's figure: every core may copy
    try:
        r = calibrate.copy_cpu(nbytes, reps=3, warmup=1)
    finally:
        torch.set_num_threads(old)
    return float(r["copy_gbps"]), str(r["copy_method"])


def run(args: argparse.Namespace) -> dict[str, Any]:
    from engine_adapters.probe import Probe
    from engine_adapters.reference.engine import Engine, EngineConfig, EngineError

    # long enough outputs that no sequence finishes (and re-prefills) inside the measurement
    out = 16 + max(1, args.rounds) * args.steps
    wl = f"closed:{args.batch},in={args.context},out={out}"
    try:
        eng = Engine(EngineConfig(preset=args.preset, device=args.device, threads=args.threads, workload=wl,
                                  dtype=args.dtype))  # fmt: skip
    except EngineError as exc:
        return {"ok": False, "error": str(exc)}
    probe = Probe("127.0.0.1:0", eng.engine_info(), warm_profiler=False, sample_devices=False)
    eng.attach(probe)
    try:
        # admit and prefill every sequence, then a few decode steps to settle
        eng.run(max_steps=2 + -(-args.batch * args.context // eng.token_budget))
        eng.run(max_steps=2)
        copies: list[float] = []
        decodes: list[float] = []
        step_ms: list[float] = []
        method = ""
        b0 = s0 = steps = 0
        for _ in range(max(1, args.rounds)):
            c, method = copy_gbps(eng.device, args.copy_mib << 20)
            copies.append(c)
            if eng.is_cuda:
                import torch

                torch.cuda.synchronize()
            b0 = eng.totals.bytes
            s0 = eng.totals.steps
            t0 = time.perf_counter()
            eng.run(max_steps=args.steps)
            dt = time.perf_counter() - t0  # each step ends with the sampled tokens on the host
            steps = eng.totals.steps - s0
            decodes.append((eng.totals.bytes - b0) / dt / 1e9)
            step_ms.append(dt / max(1, steps) * 1e3)
        per_step = (eng.totals.bytes - b0) / max(1, steps)
    finally:
        probe.close()
    c = statistics.median(copies)
    d = statistics.median(decodes)
    mbu = d / c if c else None
    return {
        "preset": args.preset,
        "device": eng.device,
        "dtype": eng.dtype,
        "threads": eng.threads,
        "batch": args.batch,
        "context": args.context,
        "weights_bytes": eng.model.param_count() * eng.bpe,
        "bytes_per_step": per_step,
        "copy_gbps": round(c, 3),
        "copy_method": method,
        "decode_gbps": round(d, 3),
        "mbu": round(mbu, 4) if mbu is not None else None,
        "copy_gbps_rounds": [round(x, 3) for x in copies],
        "decode_gbps_rounds": [round(x, 3) for x in decodes],
        "step_ms_rounds": [round(x, 2) for x in step_ms],
        "target": f"mbu >= {args.target}",
        "random_weights": True,
        "ok": mbu is not None and mbu >= args.target,
    }


def print_text(r: dict[str, Any]) -> None:
    if "error" in r:
        print(f"rltperf bench engine: error: {r['error']}")
        return
    print(
        f"reference engine, preset {r['preset']} (random weights), {r['dtype']} on {r['device']}, "
        f"{r['threads']} thread(s), batch {r['batch']}, context {r['context']}"
    )
    print(
        f"  weights {r['weights_bytes'] / 1e9:.2f} GB; analytic bytes per decode step "
        f"{r['bytes_per_step'] / 1e9:.3f} GB; step ms per round {r['step_ms_rounds']}"
    )
    print(f"  copy bandwidth (read + write)  {r['copy_gbps']:7.2f} GB/s   rounds {r['copy_gbps_rounds']}")
    print(f"    ({r['copy_method']}, as rltperf calibrate measures it)")
    print(f"  decode achieved bandwidth      {r['decode_gbps']:7.2f} GB/s   rounds {r['decode_gbps_rounds']}")
    print(f"  MBU = decode / copy = {r['mbu']:.3f}   (target {r['target']})")
    print("OK" if r["ok"] else "TARGET MISSED")
