"""The reference engine's CUDA paths on a real GPU (for a session that is lent one).

Not a pytest module (no GPU in CI).  One script, a few minutes at most on an H200,
printing ONE JSON summary on stdout (also written to ``$OUT/engine_gpu_check.json``
when ``$OUT`` is set).  Sections, each independent (a failure is recorded, the rest run):

  tiny         tiny preset, bf16 on cuda, closed loop of 8, through a real probe socket:
               CUDA-event busy time resolved for every step, per-depth times (events,
               carried a few steps late), requests, idle fraction by the aggregator
  sync         the same with --sync-every-stage: idle fraction and step time beside it
  ouro_decode  ouro-1.4b-shape (1.435 B, bf16): decode GB/s at batch 1 and 16 against
               a device-to-device copy timed like ``rltperf calibrate`` (MBU)
  ouro_exits   oracle exits 0.4,0.3,0.2,0.1 at batch 64: per-depth times, select vs compact
  ouro_spec    self-speculation 2,3 with oracle acceptance 0.7: mean acceptance length
               against (1 - a^4) / (1 - a)
  huginn       huginn-shape (3.56 B, 32 loops, bf16): a few decode steps, GB/s
  capture      a 3-step ops capture through the socket: bundle, kernels in the trace

Run on the device machine like ``tests/gpu/device_check.py`` (carry a msgspec wheel):

    PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 python3 tests/engine_adapters/reference/gpu_check.py

``--allow-cpu`` runs the tiny sections on the CPU (a smoke test of this script).
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

T0 = time.monotonic()


def _section(out: dict[str, Any], name: str, fn: Callable[[], dict[str, Any]]) -> None:
    t = time.monotonic()
    try:
        out[name] = fn()
    except Exception as exc:
        out[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-3000:]}
    out[name]["seconds"] = round(time.monotonic() - t, 2)
    print(
        f"[{time.monotonic() - T0:6.1f}s] {name}: {json.dumps(out[name])[:400]}", file=sys.stderr, flush=True
    )
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:
        pass


def _run(cfg: Any, steps: int | None = None, seconds: float | None = None, capture: int = 0,
         snapshots: str | None = None) -> tuple[Any, list[Any]]:  # fmt: skip
    """Run an engine with a probe and a live subscriber; return (engine, records)."""
    from engine_adapters.definitions.records import Bye
    from engine_adapters.monitor.tcp import ProbeAdapter
    from engine_adapters.probe import Probe
    from engine_adapters.reference.engine import Engine

    eng = Engine(cfg)
    probe = Probe("127.0.0.1:0", eng.engine_info(), warm_profiler=bool(capture), sample_devices=False,
                  snapshot_root=snapshots or "/tmp/rltperf-gpu-check")  # fmt: skip
    eng.attach(probe)
    s = ProbeAdapter(f"tcp://{probe.address}", reconnect=False).connect()
    recs: list[Any] = []

    def collect() -> None:
        while not s.ended:
            r = s.read(0.2)
            recs.extend(r)
            if any(isinstance(x, Bye) for x in r):
                break

    th = threading.Thread(target=collect, daemon=True)
    th.start()
    try:
        if capture:
            eng.run(max_steps=5)
            s.request_capture(capture, "ops", label="gpu-check")
        eng.run(max_steps=steps, duration=seconds)
    finally:
        time.sleep(0.5)  # busy events resolve in the publisher; let the last records go
        probe.close()
        th.join(15)
        s.close()
    return eng, recs


def _stats(recs: list[Any], info_loops: int) -> dict[str, Any]:
    from engine_adapters.definitions.records import RequestRecord, StepRecord
    from rltperf_tui.live.aggregator import TargetStats

    steps = [r for r in recs if isinstance(r, StepRecord)]
    ts = TargetStats(grow=True)
    ts.add(recs)
    w = ts.window(None)
    dur = [(s.end_ns - s.start_ns) / 1e6 for s in steps]
    busy = [s.busy_ns for s in steps if s.busy_ns is not None]
    with_loops = [s for s in steps if s.loop_ns]
    return {
        "steps": len(steps),
        "busy_known": len(busy),
        "step_ms_p50": round(statistics.median(dur), 3) if dur else None,
        "busy_ms_p50": round(statistics.median(busy) / 1e6, 3) if busy else None,
        "idle_fraction": w.idle_fraction,
        "steps_with_loop_ns": len(with_loops),
        "loop_ms_mean": [round(x, 3) for x in w.loop_ms_mean[:info_loops]],
        "loop_tokens_mean": [round(x, 2) for x in w.loop_tokens_mean[:info_loops]],
        "exit_hist": w.exit_hist,
        "requests_ok": sum(1 for r in recs if isinstance(r, RequestRecord) and r.status == "ok"),
        "tokens_per_s": w.tokens_per_s,
        "mean_acceptance_len": w.mean_acceptance_len,
    }


def tiny(device: str, sync: bool = False) -> dict[str, Any]:
    from engine_adapters.reference.engine import EngineConfig

    cfg = EngineConfig(
        preset="tiny", device=device, workload="closed:8,in=64,out=64,n=40", sync_every_stage=sync
    )
    eng, recs = _run(cfg, seconds=60)
    out = _stats(recs, 4)
    out["dtype"] = eng.dtype
    out["workload_done"] = eng.workload_done
    return out


def _decode_gbps(preset: str, device: str, batch: int, steps: int = 20) -> dict[str, Any]:
    import torch

    from engine_adapters.probe import Probe
    from engine_adapters.reference.engine import Engine, EngineConfig

    eng = Engine(EngineConfig(preset=preset, device=device, workload=f"closed:{batch},in=128,out={steps + 40}",
                              max_num_seqs=max(batch, 1)))  # fmt: skip
    probe = Probe("127.0.0.1:0", eng.engine_info(), warm_profiler=False, sample_devices=False)
    eng.attach(probe)
    try:
        eng.run(max_steps=4 + batch * 128 // eng.token_budget)
        torch.cuda.synchronize() if eng.is_cuda else None
        b0, s0, t0 = eng.totals.bytes, eng.totals.steps, time.perf_counter()
        eng.run(max_steps=steps)
        dt = time.perf_counter() - t0
        n = eng.totals.steps - s0
        gbps = (eng.totals.bytes - b0) / dt / 1e9
        return {"batch": batch, "steps": n, "step_ms": round(dt / n * 1e3, 3), "decode_gbps": round(gbps, 1),
                "bytes_per_step_gb": round((eng.totals.bytes - b0) / n / 1e9, 3)}  # fmt: skip
    finally:
        probe.close()
        del eng


def ouro_decode(device: str) -> dict[str, Any]:
    from engine_adapters.definitions import calibrate

    idx = int(device.split(":", 1)[1]) if ":" in device else 0
    copy = calibrate.copy_cuda(idx, 1 << 30, reps=10, warmup=2, inner=5)["copy_gbps"]
    out: dict[str, Any] = {"copy_gbps": round(copy, 1)}
    for b in (1, 16):
        r = _decode_gbps("ouro-1.4b-shape", device, b)
        r["mbu"] = round(r["decode_gbps"] / copy, 3)
        out[f"batch{b}"] = r
    return out


def ouro_exits(device: str) -> dict[str, Any]:
    from engine_adapters.reference.engine import EngineConfig

    out = {}
    for mode in ("select", "compact"):
        cfg = EngineConfig(preset="ouro-1.4b-shape", device=device, exit="oracle:0.4,0.3,0.2,0.1", exit_mode=mode,
                           workload="closed:64,in=32,out=200", max_num_seqs=64)  # fmt: skip
        _, recs = _run(cfg, steps=40)
        out[mode] = _stats(recs, 4)
    return out


def ouro_spec(device: str) -> dict[str, Any]:
    from engine_adapters.reference.engine import EngineConfig
    from engine_adapters.reference.spec import expected_accept_len

    cfg = EngineConfig(preset="ouro-1.4b-shape", device=device, spec="2,3", spec_accept="oracle:0.7",
                       workload="closed:32,in=32,out=400", max_num_seqs=32)  # fmt: skip
    _, recs = _run(cfg, steps=40)
    out = _stats(recs, 4)
    out["theory"] = expected_accept_len(0.7, 3)
    return out


def huginn(device: str) -> dict[str, Any]:
    return _decode_gbps("huginn-shape", device, 1, steps=6)


def capture(device: str, tmp: str) -> dict[str, Any]:
    from engine_adapters.definitions.records import CaptureDone, CaptureFailed
    from engine_adapters.reference.engine import EngineConfig

    cfg = EngineConfig(preset="tiny", device=device, workload="closed:4,in=32,out=400")
    _, recs = _run(cfg, steps=60, capture=3, snapshots=tmp)
    done = [r for r in recs if isinstance(r, (CaptureDone, CaptureFailed))]
    if not done:
        return {"error": "no capture reply"}
    d = done[0]
    if isinstance(d, CaptureFailed):
        return {"error": d.reason}
    trace = Path(d.bundle) / "trace.json.gz"
    with gzip.open(trace) as f:
        ev = json.loads(f.read())
    events = ev.get("traceEvents", ev if isinstance(ev, list) else [])
    kernels = sum(1 for e in events if isinstance(e, dict) and e.get("cat") == "kernel")
    stages = sorted(
        {e.get("name") for e in events if isinstance(e, dict) and str(e.get("name", "")).startswith("stage:")}
    )
    return {"steps_captured": d.steps_captured, "events": d.events, "kernels": kernels, "stages": stages,
            "trace_bytes": d.trace_bytes}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--allow-cpu", action="store_true", help="run the tiny sections on the CPU (smoke test)")
    args = ap.parse_args()
    import torch

    out: dict[str, Any] = {"env": {"torch": torch.__version__, "cuda": torch.version.cuda,
                                   "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}}  # fmt: skip
    gpu = torch.cuda.is_available()
    if not gpu and not args.allow_cpu:
        out["error"] = "no CUDA device (use --allow-cpu for a smoke test on the CPU)"
        print(json.dumps(out))
        return 1
    dev = "cuda:0" if gpu else "cpu"
    tmp = os.environ.get("OUT") or "/tmp"
    _section(out, "tiny", lambda: tiny(dev))
    _section(out, "sync", lambda: tiny(dev, sync=True))
    _section(out, "capture", lambda: capture(dev, os.path.join(tmp, "gpu-check-snapshots")))
    if gpu:
        _section(out, "ouro_decode", lambda: ouro_decode(dev))
        _section(out, "ouro_exits", lambda: ouro_exits(dev))
        _section(out, "ouro_spec", lambda: ouro_spec(dev))
        _section(out, "huginn", lambda: huginn(dev))
    out["total_s"] = round(time.monotonic() - T0, 1)
    text = json.dumps(out, indent=1)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "engine_gpu_check.json").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
