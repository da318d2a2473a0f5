"""Measure what a device achieves: copy bandwidth and dense matmul FLOP/s.

Used by ``rltperf calibrate`` (a full calibration, a few seconds) and by
``ceilings.ceiling_for`` (the quick CPU calibration, a few tenths of a second, when
nothing is cached).  Every figure is the *median* of several timed repetitions after
warm-up repetitions.

Conventions: a copy of S bytes counts 2·S bytes moved (read + written, the STREAM
convention), so the figure compares directly with a step's bytes read + written; a
matmul of two nxn matrices counts 2·n³ FLOPs.

On a CPU the copy is timed two ways and the faster median is the ceiling: NumPy's
``copyto`` (one thread, glibc ``memcpy``, which switches to non-temporal stores for
large copies) and, when torch runs more than one intra-op thread, torch's ``copy_``
(which wins on many-core servers).  Arrays are far larger than the last-level cache so DRAM is what is timed.
On CUDA, copies and matmuls are timed with CUDA events (``torch.cuda.Event``).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import socket
import statistics
import time
from collections.abc import Callable
from typing import Any

from engine_adapters.definitions.gpu_specs import match_spec

SOURCE_CALIBRATION = "calibration"
"""``Ceiling.source`` of figures measured by ``rltperf calibrate``."""
SOURCE_QUICK = "quick calibration"
"""``Ceiling.source`` of the sub-second CPU measurement made when nothing was cached."""

MIB = 1 << 20

FULL_CPU = {"copy_mib": 512, "reps": 10, "warmup": 2, "matmul_n": 1024}
"""Full CPU calibration: sizes and repetitions."""
QUICK_CPU = {"copy_mib": 128, "reps": 5, "warmup": 1, "matmul_n": 512, "budget_s": 0.15}
"""Quick CPU calibration (at engine start when nothing is cached): ~0.3 s on a 2-core VM."""
FULL_CUDA = {"copy_mib": 1024, "reps": 20, "warmup": 3, "matmul_n": 8192, "inner": 10}
"""Full CUDA calibration: sizes, repetitions, copies per timed repetition."""

DEFAULT_DTYPES = {"cpu": ("float32", "bfloat16"), "cuda": ("bfloat16", "float16", "float32")}
"""Dtypes whose matmul FLOP/s ``rltperf calibrate`` measures by default (first = main)."""


def _median_time(
    fn: Callable[[], Any], reps: int, warmup: int, budget_s: float | None = None
) -> tuple[float, int]:
    """Median wall time of ``fn`` over ``reps`` runs after ``warmup`` runs.

    With ``budget_s``, stops early (after at least 3 runs) once the budget is spent.
    Returns (median seconds, runs timed).
    """
    for _ in range(warmup):
        fn()
    times: list[float] = []
    t_start = time.perf_counter()
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if budget_s is not None and len(times) >= 3 and time.perf_counter() - t_start > budget_s:
            break
    return statistics.median(times), len(times)


def copy_cpu(nbytes: int, reps: int, warmup: int, budget_s: float | None = None) -> dict[str, Any]:
    """CPU copy bandwidth, GB/s (2·S per copy): NumPy memcpy and torch copy_, medians.

    ``budget_s`` bounds each method's timed runs (at least 3 run).
    """
    import numpy as np

    src = np.empty(nbytes, dtype=np.uint8)
    src.fill(1)  # touch every page before timing
    dst = np.empty_like(src)
    t_np, n_np = _median_time(lambda: np.copyto(dst, src), reps, warmup, budget_s)
    methods = {"numpy copyto (1 thread)": 2 * nbytes / t_np / 1e9}
    torch: Any = None
    with contextlib.suppress(ImportError):
        import torch
    threads = torch.get_num_threads() if torch is not None else 1
    if threads > 1:  # with one thread it is the same memcpy, only slower
        ts, td = torch.from_numpy(src), torch.from_numpy(dst)
        t_t, _ = _median_time(lambda: td.copy_(ts), reps, warmup, budget_s)
        methods[f"torch copy_ ({threads} threads)"] = 2 * nbytes / t_t / 1e9
    best = max(methods, key=lambda k: methods[k])
    return {"copy_gbps": methods[best], "copy_method": best, "copy_methods": methods,
            "copy_bytes": nbytes, "repetitions": n_np}  # fmt: skip


def matmul_cpu(n: int, dtype: str, reps: int, warmup: int, budget_s: float | None = None) -> float:
    """Dense nxnxn matmul on the CPU in ``dtype`` through torch, GFLOP/s (2·n³ per product)."""
    import torch

    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(dt)
    b = torch.randn(n, n, generator=g).to(dt)
    t, _ = _median_time(lambda: torch.mm(a, b), reps, warmup, budget_s)
    return 2.0 * n**3 / t / 1e9


def quick_matmul_cpu(dtype: str) -> float:
    """One dtype's matmul GFLOP/s in the quick settings (~50 ms; runs stop after 0.15 s)."""
    q = QUICK_CPU
    return matmul_cpu(int(q["matmul_n"]), dtype, int(q["reps"]), int(q["warmup"]), float(q["budget_s"]))


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def quick_cpu_calibration(dtype: str = "float32") -> dict[str, Any]:
    """The quick CPU calibration (cache-entry shape; ``source`` = ``"quick calibration"``)."""
    from engine_adapters.definitions.contract import cpu_model

    q = QUICK_CPU
    t0 = time.perf_counter()
    cp = copy_cpu(int(q["copy_mib"]) * MIB, int(q["reps"]), int(q["warmup"]), float(q["budget_s"]))
    gf = quick_matmul_cpu(dtype)
    secs = time.perf_counter() - t0
    return {
        "device": cpu_model(),
        "host": socket.gethostname(),
        "kind": "cpu",
        "source": SOURCE_QUICK,
        "detail": (
            f"quick calibration at engine start, {_now()}: copy {q['copy_mib']} MiB x{cp['repetitions']} "
            f"({cp['copy_method']}), matmul {q['matmul_n']}^3 {dtype}, medians, {secs:.2f} s; "
            "`rltperf calibrate --device cpu` makes a full one"
        ),
        **cp,
        "matmul_gflops": gf,
        "dtype": dtype,
        "matmul_gflops_by_dtype": {dtype: gf},
        "matmul_n": q["matmul_n"],
        "warmup": q["warmup"],
        "seconds": secs,
        "measured_at": _now(),
    }


def _cuda_timed(fn: Callable[[], Any], reps: int, warmup: int, inner: int = 1) -> tuple[float, int]:
    """Median seconds per call of ``fn`` on the current CUDA stream, by CUDA events."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(inner):
            fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3 / inner)
    return statistics.median(times), len(times)


def copy_cuda(index: int, nbytes: int, reps: int, warmup: int, inner: int) -> dict[str, Any]:
    """Device-to-device copy bandwidth on ``cuda:index``, GB/s (2·S per copy)."""
    import torch

    dev = torch.device("cuda", index)
    free, _total = torch.cuda.mem_get_info(dev)
    nbytes = int(min(nbytes, free // 4))  # two buffers, leave the engine room
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev).fill_(1)
    dst = torch.empty_like(src)
    with torch.cuda.device(dev):
        t, n = _cuda_timed(lambda: dst.copy_(src), reps, warmup, inner)
    return {"copy_gbps": 2 * nbytes / t / 1e9, "copy_method": "torch copy_ (device to device, CUDA events)",
            "copy_methods": {"torch copy_ (CUDA events)": 2 * nbytes / t / 1e9},
            "copy_bytes": nbytes, "repetitions": n}  # fmt: skip


def matmul_cuda(index: int, n: int, dtype: str, reps: int, warmup: int) -> float:
    """Dense nxnxn matmul on ``cuda:index`` in ``dtype``, GFLOP/s, by CUDA events.

    fp32 runs as true fp32 (torch's default: TF32 off), matching the spec table's
    non-tensor fp32 figure.
    """
    import torch

    dev = torch.device("cuda", index)
    dt = getattr(torch, dtype)
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, device=dev, dtype=dt, generator=g)
    b = torch.randn(n, n, device=dev, dtype=dt, generator=g)
    with torch.cuda.device(dev):
        t, _ = _cuda_timed(lambda: torch.mm(a, b), reps, warmup)
    return 2.0 * n**3 / t / 1e9


def calibrate(device: str = "cpu", dtypes: tuple[str, ...] | None = None,
              repetitions: int | None = None, copy_mib: int | None = None) -> dict[str, Any]:  # fmt: skip
    """A full calibration of ``device`` (``cpu`` or ``cuda[:N]``): the ``rltperf calibrate`` JSON.

    Keys: device (name), device_arg, host, kind, source, detail, copy_gbps, copy_method,
    copy_methods, copy_bytes, matmul_gflops and dtype (the first dtype),
    matmul_gflops_by_dtype, matmul_n, repetitions, warmup, seconds, measured_at, and on
    a GPU found in the spec table ``spec`` (its datasheet figures) with the measured /
    datasheet ratios.
    """
    kind = "cuda" if device.startswith("cuda") else "cpu"
    dts = tuple(dtypes or DEFAULT_DTYPES[kind])
    t0 = time.perf_counter()
    if kind == "cpu":
        from engine_adapters.definitions.contract import cpu_model

        name = cpu_model()
        p: dict[str, Any] = dict(FULL_CPU)
        if repetitions:
            p["reps"] = repetitions
        if copy_mib:
            p["copy_mib"] = copy_mib
        cp = copy_cpu(int(p["copy_mib"]) * MIB, int(p["reps"]), int(p["warmup"]))
        flops = {dt: matmul_cpu(int(p["matmul_n"]), dt, int(p["reps"]), int(p["warmup"])) for dt in dts}
    else:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device is available to torch on this machine (try --device cpu)")
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        name = torch.cuda.get_device_name(index)
        p = dict(FULL_CUDA)
        if repetitions:
            p["reps"] = repetitions
        if copy_mib:
            p["copy_mib"] = copy_mib
        cp = copy_cuda(index, int(p["copy_mib"]) * MIB, int(p["reps"]), int(p["warmup"]), int(p["inner"]))
        flops = {
            dt: matmul_cuda(index, int(p["matmul_n"]), dt, int(p["reps"]), int(p["warmup"])) for dt in dts
        }
    secs = time.perf_counter() - t0
    main = dts[0]
    out: dict[str, Any] = {
        "device": name,
        "device_arg": device,
        "host": socket.gethostname(),
        "kind": kind,
        "source": SOURCE_CALIBRATION,
        "detail": (
            f"rltperf calibrate, {_now()}: copy {cp['copy_bytes'] / MIB:.0f} MiB x{cp['repetitions']} "
            f"({cp['copy_method']}), matmul {p['matmul_n']}^3 x{p['reps']}, medians after {p['warmup']} warm-up"
        ),
        **cp,
        "matmul_gflops": flops[main],
        "dtype": main,
        "matmul_gflops_by_dtype": flops,
        "matmul_n": p["matmul_n"],
        "repetitions": cp["repetitions"],
        "warmup": p["warmup"],
        "seconds": secs,
        "measured_at": _now(),
        "convention": "copy bytes = read + written (STREAM); matmul FLOPs = 2*n^3",
    }
    spec = match_spec(name) if kind == "cuda" else None
    if spec is not None:
        out["spec"] = {"model": spec.key, "bw_gbps": spec.bw_gbps, "tflops": spec.tflops,
                       "datasheet": spec.datasheet}  # fmt: skip
        out["copy_vs_spec"] = cp["copy_gbps"] / spec.bw_gbps
        out["matmul_vs_spec"] = {dt: flops[dt] / (spec.tflops[dt] * 1e3) for dt in flops if dt in spec.tflops}
    return out
