"""Device-truth check on a real NVIDIA GPU (prepared for a session that is lent one).

Not a pytest module (no GPU in CI).  One short script, well inside 5 minutes (about
1-2 minutes on an H200), printing ONE JSON summary on stdout (and writing it to
``$OUT/device_check.json`` when ``$OUT`` is set).  Sections, each independent (a
failure is recorded and the rest still run):

  env          torch / CUDA / driver versions, GPU name
  cuda_events  torch.cuda.Event timing of a bf16 matmul vs synchronised wall time
  nvml         one NvmlSampler reading: which fields came back, which are N/A, cost
  gpm_copy     GPM DRAM bandwidth while a thread copies 1 GiB arrays back to back
               (should read high, >= 0.5), beside the copy's own bytes/s and NVML util
  gpm_sleep    the same readings across 2 s of sleep (should read near zero, < 0.05)
  thread       SamplerThread end to end (devices=["cuda:0"]): kinds and counts
  calibrate    engine_adapters.definitions.calibrate on cuda:0 (copy GB/s, matmul GFLOP/s) vs spec
  ceiling      ceiling_for("cuda:0") with no cache: the spec-table row matched
  capture      a Probe around a small GPU loop with CUDA-event busy time, a 3-step
               capture through a real socket: bundle, kernel events in the trace,
               device samples of kind cuda on the wire
  loop_recorder the vLLM Ouro model's loop recorder (CUDA events, scatter_add_ exit
               histogram, pinned copies) over 20 forwards under
               torch.cuda.set_sync_debug_mode("error"): it must never synchronise (a
               sync raises, the recorder's guard turns it off: "dead"), and its records
               must hold the exits counted on the host

Run on the device machine (the H200 image has torch, numpy, psutil and nvidia-ml-py,
but not msgspec: carry its wheel).  Here, once:

    echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --implementation cp --platform manylinux_2_17_x86_64 -d .whl msgspec==0.19.0

then ``run`` with carry [".whl"], timeout_s 300:

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl \\
      && PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 python3 tests/gpu/device_check.py

``--allow-cpu`` runs what it can without a GPU (a smoke test of this script itself).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GIB = 1 << 30
T0 = time.monotonic()


def _section(out: dict[str, Any], name: str, fn: Callable[[], dict[str, Any]]) -> None:
    t = time.monotonic()
    try:
        res = fn()
        res["ok"] = bool(res.get("ok", True))
    except Exception as exc:
        res = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-1500:]}
    res["seconds"] = round(time.monotonic() - t, 2)
    out[name] = res
    print(
        f"[{time.monotonic() - T0:6.1f}s] {name}: {'ok' if res['ok'] else 'FAILED'}",
        file=sys.stderr,
        flush=True,
    )


def _fields(sample: Any) -> dict[str, Any]:
    from engine_adapters.definitions.records import to_builtins

    d = to_builtins(sample)
    d.pop("host_cpu", None)
    if isinstance(d.get("util_samples"), list):
        d["util_samples_n"] = len(d["util_samples"])
        d["util_samples"] = d["util_samples"][-8:]
    return d


def check_env(has_cuda: bool) -> dict[str, Any]:
    import torch

    from engine_adapters.definitions.contract import environment

    env = dict(environment())
    env["cuda_available"] = has_cuda
    if has_cuda:
        p = torch.cuda.get_device_properties(0)
        env["gpu"] = {"name": p.name, "sms": p.multi_processor_count, "mem_gib": round(p.total_memory / GIB, 1),
                      "cc": f"{p.major}.{p.minor}"}  # fmt: skip
    return env


def check_cuda_events() -> dict[str, Any]:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    w0 = time.perf_counter()
    e0.record()
    for _ in range(20):
        a @ b
    e1.record()
    e1.synchronize()
    wall_ms = (time.perf_counter() - w0) * 1e3
    ev_ms = e0.elapsed_time(e1)
    return {
        "events_ms": round(ev_ms, 3),
        "wall_ms": round(wall_ms, 3),
        "events_over_wall": round(ev_ms / wall_ms, 3),
        "tflops": round(20 * 2 * 8192**3 / (ev_ms / 1e3) / 1e12, 1),
        "ok": 0.8 < ev_ms / wall_ms <= 1.05,
    }


def check_nvml() -> dict[str, Any]:
    from engine_adapters.probe.devices import NvmlSampler

    s = NvmlSampler(["cuda:0"])
    try:
        t = time.perf_counter()
        first = s.sample()
        cost1 = (time.perf_counter() - t) * 1e3
        time.sleep(1.0)
        t = time.perf_counter()
        second = s.sample()
        cost2 = (time.perf_counter() - t) * 1e3
        res: dict[str, Any] = {"note": s.note, "notes": s.notes(), "gpus": len(s.gpus)}
        if second:
            d = _fields(second[0])
            res["sample"] = d
            res["na_fields"] = sorted(k for k, v in d.items() if v is None and k not in ("note",))
            res["unsupported_calls"] = sorted(s.gpus[0].unsupported)
            res["gpm"] = s.gpus[0]._gpm is not None
            res["has_nvlink"] = s.gpus[0].has_nvlink
        res["sample_ms_first"] = round(cost1, 2)
        res["sample_ms_second"] = round(cost2, 2)
        res["ok"] = bool(first) and bool(second) and second[0].gpu_util is not None
        return res
    finally:
        s.close()


def check_gpm(sleep_too: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    import torch

    from engine_adapters.probe.devices import NvmlSampler

    s = NvmlSampler(["cuda:0"])
    src = torch.empty(GIB, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    stop = threading.Event()
    copies = [0]

    def copier() -> None:
        while not stop.is_set():
            for _ in range(50):
                dst.copy_(src)
            torch.cuda.synchronize()
            copies[0] += 50

    try:
        dst.copy_(src)
        torch.cuda.synchronize()
        th = threading.Thread(target=copier, daemon=True)
        th.start()
        time.sleep(0.3)  # the copy stream is full before the interval starts
        s.sample()  # starts the GPM interval
        c0, t0 = copies[0], time.perf_counter()
        reads = []
        for _ in range(3):
            time.sleep(1.0)
            reads.append(s.sample()[0])
        c1, t1 = copies[0], time.perf_counter()
        stop.set()
        th.join(10)
        copy_gbps = (c1 - c0) * 2 * GIB / (t1 - t0) / 1e9
        dram = [r.dram_bw_util for r in reads]
        copy_res: dict[str, Any] = {
            "dram_bw_util": dram,
            "gpu_util": [r.gpu_util for r in reads],
            "mem_util": [r.mem_util for r in reads],
            "sm_occupancy": [r.sm_occupancy for r in reads],
            "util_samples_last": reads[-1].util_samples[-6:]
            if reads[-1].util_samples
            else reads[-1].util_samples,
            "copy_gbps_measured": round(copy_gbps, 1),
            "power_w": reads[-1].power_w,
            "sm_clock_mhz": reads[-1].sm_clock_mhz,
        }
        from engine_adapters.definitions.ceilings import match_spec

        spec = match_spec(reads[-1].name)
        if spec and dram[-1] is not None:
            copy_res["dram_bw_util_x_spec_gbps"] = round(dram[-1] * spec.bw_gbps, 1)
            copy_res["hw_over_analytic"] = round(dram[-1] * spec.bw_gbps / copy_gbps, 3)
        copy_res["ok"] = all(d is not None and d >= 0.5 for d in dram)
        sleep_res: dict[str, Any] = {}
        if sleep_too:
            torch.cuda.synchronize()
            time.sleep(0.2)
            s.sample()
            idle = []
            for _ in range(2):
                time.sleep(1.0)
                idle.append(s.sample()[0])
            sleep_res = {
                "dram_bw_util": [r.dram_bw_util for r in idle],
                "gpu_util": [r.gpu_util for r in idle],
                "sm_occupancy": [r.sm_occupancy for r in idle],
                "util_samples_last": idle[-1].util_samples[-6:]
                if idle[-1].util_samples
                else idle[-1].util_samples,
                "ok": all(r.dram_bw_util is not None and r.dram_bw_util < 0.05 for r in idle),
            }
        return copy_res, sleep_res
    finally:
        stop.set()
        s.close()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def check_thread(device: str) -> dict[str, Any]:
    from engine_adapters.probe.devices import SamplerThread

    got: list[Any] = []
    th = SamplerThread(got.append, pid=os.getpid(), period_s=0.5, devices=[device])
    th.start()
    time.sleep(2.2)
    th.stop()
    th.join(5)
    kinds: dict[str, int] = {}
    for g in got:
        kinds[g.kind] = kinds.get(g.kind, 0) + 1
    notes = sorted({g.note for g in got if g.note})
    want = {"cpu", "cuda"} if device.startswith("cuda") else {"cpu"}
    return {"kinds": kinds, "notes": notes, "ok": set(kinds) == want and min(kinds.values()) >= 3}


def check_calibrate(device: str) -> dict[str, Any]:
    from engine_adapters.definitions import calibrate

    r = calibrate.calibrate(device, repetitions=10)
    keep = ("device", "copy_gbps", "copy_bytes", "matmul_gflops_by_dtype", "matmul_n", "repetitions", "spec",
            "copy_vs_spec", "matmul_vs_spec", "seconds")  # fmt: skip
    out = {k: r[k] for k in keep if k in r}
    out["ok"] = r["copy_gbps"] > 0 and all(v > 0 for v in r["matmul_gflops_by_dtype"].values())
    return out


def check_ceiling(device: str) -> dict[str, Any]:
    from engine_adapters.definitions.ceilings import ceiling_for
    from engine_adapters.definitions.records import to_builtins

    c = ceiling_for(device, "bfloat16")
    want = "spec table" if device.startswith("cuda") else "quick calibration"
    return {"ceiling": to_builtins(c) if c else None, "ok": c is not None and c.source == want}


def check_capture(device: str, snapshots: str) -> dict[str, Any]:
    import torch

    from engine_adapters.definitions.records import (
        CaptureDone,
        CaptureFailed,
        DeviceSample,
        Hello,
        StepRecord,
    )
    from engine_adapters.monitor.tcp import ProbeAdapter
    from engine_adapters.probe import Probe

    cuda = device.startswith("cuda")
    dt = torch.bfloat16 if cuda else torch.float32
    n = 4096 if cuda else 256
    x = torch.randn(64, n, device=device, dtype=dt)
    w = torch.randn(n, n, device=device, dtype=dt) / n**0.5
    probe = Probe("127.0.0.1:0", {"name": "device-check-loop", "model": f"mlp-{n}", "device": device,
                                  "dtype": str(dt).removeprefix("torch."), "random_weights": True},
                  snapshot_root=snapshots)  # fmt: skip
    stop = threading.Event()
    wbytes = n * n * x.element_size()

    def loop() -> None:
        while not stop.is_set():
            with probe.step("decode", 64, 64) as st:
                st.mark("forward")
                if cuda:
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                h = x
                for _ in range(8):
                    h = torch.tanh(h @ w)
                if cuda:
                    e1.record()
                st.mark("sample")
                h.argmax(dim=-1).cpu()
                facts: dict[str, Any] = {
                    "bytes_read": 8 * wbytes,
                    "flops": 8 * 2.0 * 64 * n * n,
                    "out_tokens": 64,
                }
                if cuda:
                    facts["busy_events"] = [(e0, e1)]
                st.set(**facts)
            time.sleep(0.002)

    th = threading.Thread(target=loop, daemon=True)
    th.start()
    res: dict[str, Any] = {}
    try:
        sess = ProbeAdapter(f"tcp://{probe.address}").connect()
        recs: list[Any] = []
        cid = None
        deadline = time.monotonic() + 120
        done = None
        t_req = time.monotonic()
        while time.monotonic() < deadline and done is None:
            for r in sess.read(0.2):
                recs.append(r)
                if isinstance(r, (CaptureDone, CaptureFailed)) and r.capture_id == cid:
                    done = r
            if cid is None and time.monotonic() - t_req > 2.5:  # a few device samples first
                cid = sess.request_capture(3, "ops", label="device-check")
        sess.close()
        hello = next((r for r in recs if isinstance(r, Hello)), None)
        steps = [r for r in recs if isinstance(r, StepRecord)]
        devs = [r for r in recs if isinstance(r, DeviceSample)]
        res["hello_ceiling"] = None
        if hello is not None and hello.ceiling is not None:
            res["hello_ceiling"] = {"source": hello.ceiling.source, "bw": hello.ceiling.peak_bw_gbps,
                                    "gflops": hello.ceiling.peak_gflops}  # fmt: skip
        busy = [s.busy_ns for s in steps if s.busy_ns is not None]
        res["steps"] = len(steps)
        res["steps_with_busy"] = len(busy)
        if busy:
            res["busy_over_step_median"] = round(
                sorted(b / max(1, s.end_ns - s.start_ns) for b, s in zip(busy, steps, strict=False))[
                    len(busy) // 2
                ],
                3,
            )
        res["device_sample_kinds"] = sorted({d.kind for d in devs})
        res["device_notes"] = sorted({d.note for d in devs if d.note})
        if isinstance(done, CaptureDone):
            b = Path(done.bundle)
            with gzip.open(b / "trace.json.gz") as f:
                trace = json.loads(f.read())
            evs = trace.get("traceEvents", [])
            kernels = [e for e in evs if e.get("cat") == "kernel"]
            res["capture"] = {"bundle": str(b), "steps_captured": done.steps_captured, "events": done.events,
                              "kernel_events": len(kernels), "trace_bytes": done.trace_bytes,
                              "export_s": round(done.export_s, 2)}  # fmt: skip
            ok_kernels = (len(kernels) > 0) if cuda else True
            res["ok"] = done.steps_captured == 3 and ok_kernels and (not cuda or len(busy) > 0)
        else:
            res["capture"] = {"failed": getattr(done, "reason", "no reply in 120 s")}
            res["ok"] = False
        if cuda and "cuda" not in res["device_sample_kinds"]:
            res["ok"] = False
    finally:
        stop.set()
        th.join(10)
        probe.close()
    return res


def check_loop_recorder(device: str) -> dict[str, Any]:
    import torch

    from engine_adapters.probe.vllm.ouro import loopring
    from engine_adapters.probe.vllm.ouro.recorder import LoopRecorder

    cuda = device.startswith("cuda")
    dev = torch.device(device)
    passes, n = 4, 64
    path = os.path.join(tempfile.mkdtemp(prefix="rltperf-ring-"), "loops.ring")
    writer = loopring.RingWriter(path)
    reader = loopring.RingReader(path)
    reader.open()
    rec = LoopRecorder(writer, passes, dev, rank="device-check")
    g = torch.Generator().manual_seed(0)
    depth_h = torch.randint(1, passes + 1, (n,), generator=g)
    qsl_h = torch.tensor([0, 10, 30, n], dtype=torch.int32)
    want = torch.bincount(depth_h[qsl_h[1:].long() - 1], minlength=passes + 1)[1:].tolist()
    depth, qsl = depth_h.to(dev), qsl_h.to(dev)
    x = torch.randn(n, 1024, device=dev)
    w = torch.randn(1024, 1024, device=dev) / 32
    forwards = 20
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    t0 = time.perf_counter()
    try:
        for _ in range(forwards):
            rec.begin(n)
            for t in range(passes):
                x = torch.tanh(x @ w)
                rec.mark(t)
            rec.end(depth, qsl)
    finally:
        if cuda:
            torch.cuda.set_sync_debug_mode("default")
    host_s = time.perf_counter() - t0
    if cuda:
        torch.cuda.synchronize()
        rec._resolve()  # outside the debug mode: every event has completed now
    recs = reader.read_new()
    ok = (not rec.dead and len(recs) == forwards and all(r.exit_hist == want for r in recs)
          and all(len(r.loop_ns) == passes and min(r.loop_ns) > 0 for r in recs))  # fmt: skip
    return {
        "ok": ok,
        "dead": rec.dead,
        "records": len(recs),
        "exit_hist": recs[0].exit_hist if recs else None,
        "want": want,
        "loop_ms_first": [round(v / 1e6, 4) for v in recs[0].loop_ns] if recs else None,
        "host_ms_per_forward": round(host_s / forwards * 1e3, 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--allow-cpu", action="store_true", help="run what can run without a GPU (script smoke test)"
    )
    args = ap.parse_args()
    os.environ.setdefault(
        "RLTPERF_CACHE", tempfile.mkdtemp(prefix="rltperf-cache-")
    )  # never the user's cache
    import torch

    has_cuda = torch.cuda.is_available()
    if not has_cuda and not args.allow_cpu:
        print(
            json.dumps(
                {"ok": False, "error": "no CUDA GPU visible to torch (use --allow-cpu for a smoke test)"}
            )
        )
        return 2
    device = "cuda:0" if has_cuda else "cpu"
    out: dict[str, Any] = {"device": device}
    _section(out, "env", lambda: check_env(has_cuda))
    if has_cuda:
        _section(out, "cuda_events", check_cuda_events)
        _section(out, "nvml", check_nvml)
        gpm: dict[str, Any] = {}

        def _gpm_copy() -> dict[str, Any]:
            c, s = check_gpm(sleep_too=True)
            gpm["sleep"] = s
            return c

        _section(out, "gpm_copy", _gpm_copy)
        _section(
            out, "gpm_sleep", lambda: gpm.get("sleep") or {"ok": False, "error": "gpm_copy failed first"}
        )
    else:
        _section(
            out,
            "nvml",
            lambda: {"note": __import__("engine_adapters.probe.devices").devices.NvmlSampler(["cpu"]).note},
        )
    _section(out, "thread", lambda: check_thread(device))
    _section(out, "calibrate", lambda: check_calibrate(device))
    _section(out, "ceiling", lambda: check_ceiling(device))
    snaps = tempfile.mkdtemp(prefix="rltperf-snap-")
    _section(out, "capture", lambda: check_capture(device, snaps))
    _section(out, "loop_recorder", lambda: check_loop_recorder(device))
    out["ok"] = all(v.get("ok", True) for v in out.values() if isinstance(v, dict))
    out["total_s"] = round(time.monotonic() - T0, 1)
    text = json.dumps(out, indent=1, default=str)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "device_check.json").write_text(text)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
