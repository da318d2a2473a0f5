"""Peak bandwidth and FLOP/s of a device: calibrated figures first, then a spec table.

``rltperf calibrate`` measures this machine and caches the result (keyed by device name
and host); ``ceiling_for`` returns the calibrated figures when present, otherwise the
spec-table entry matched by the device's NVML name, otherwise None.  On a CPU with
nothing cached, ``ceiling_for`` runs a *quick calibration* (a few tenths of a second,
kept for the process and labelled as such, never written to the cache) so MBU is known
from the first second; a full ``rltperf calibrate --device cpu`` replaces it.  ``Ceiling.source`` says which:
``"calibration"``, ``"quick calibration"`` or ``"spec table"``; ``Ceiling.detail`` says
what was measured or which datasheet row matched.

Conventions (docs/ARCHITECTURE.md): bandwidth in GB/s (10^9 B/s) counting bytes read plus bytes
written (STREAM: a copy of S bytes moves 2·S); compute in GFLOP/s of *dense* matrix
products (a multiply-add counts 2 FLOPs), in the engine's dtype.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_adapters.definitions.records import Ceiling

log = logging.getLogger("rltperf.ceilings")

SOURCE_CALIBRATION = "calibration"
"""``Ceiling.source`` of figures measured by ``rltperf calibrate``."""
SOURCE_QUICK = "quick calibration"
"""``Ceiling.source`` of the sub-second CPU measurement made when nothing was cached."""
SOURCE_SPEC = "spec table"
"""``Ceiling.source`` of datasheet figures matched by device name."""

DTYPES = ("bfloat16", "float16", "float32")
"""Dtypes with FLOP/s figures (canonical torch names)."""

_DTYPE_ALIASES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "f16": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "f32": "float32",
}


def canonical_dtype(dtype: str | None) -> str | None:
    """``"torch.bfloat16"``, ``"bf16"``, ``"half"``... → ``"bfloat16"``/``"float16"``/``"float32"``;
    anything else (``None``, ``"auto"``, ``"fp8"``) → None."""
    if not dtype:
        return None
    d = str(dtype).strip().lower().removeprefix("torch.")
    return _DTYPE_ALIASES.get(d)


# --------------------------------------------------------------------------- spec table


@dataclass(frozen=True)
class GpuSpec:
    """Datasheet peak figures of one GPU model (dense, no sparsity)."""

    key: str
    """Short model name, e.g. ``"H100 SXM"``."""
    bw_gbps: float
    """Peak memory bandwidth, GB/s."""
    tflops: dict[str, float]
    """Dense peak TFLOP/s by canonical dtype (fp32 is the non-tensor-core rate)."""
    datasheet: str
    """Where the figures come from."""
    needs: tuple[str, ...]
    """Tokens (upper-case, split on non-alphanumerics) that must all be in the NVML name."""


# Ordered most specific first: the first entry whose tokens are all in the name wins.
# Tokens are whole words, so "NVIDIA A10G" does not match A10, nor "NVIDIA L40" L40S/L4.
# Datasheet figures "with sparsity" are halved to the dense rate.
# fmt: off
SPEC_TABLE: tuple[GpuSpec, ...] = (
    # NVIDIA HGX B200 platform page (nvidia.com/en-us/data-center/hgx/), 8-GPU board
    # figures divided by 8: 64 TB/s HBM3e -> 8 TB/s; FP16/BF16 36 PFLOPS sparse -> 2.25 PF
    # dense; FP32 600 TFLOPS -> 75.
    GpuSpec("B200", 8000.0, {"bfloat16": 2250.0, "float16": 2250.0, "float32": 75.0},
            "NVIDIA HGX B200 specifications (per GPU = board / 8)", ("B200",)),
    # NVIDIA H200 Tensor Core GPU datasheet (Nov 2024), H200 NVL column: 4.8 TB/s,
    # BF16/FP16 1,671 TFLOPS sparse, FP32 60 TFLOPS.
    GpuSpec("H200 NVL", 4800.0, {"bfloat16": 835.5, "float16": 835.5, "float32": 60.0},
            "NVIDIA H200 datasheet, H200 NVL", ("H200", "NVL")),
    # Same datasheet, H200 SXM column: 4.8 TB/s, BF16/FP16 1,979 TFLOPS sparse, FP32 67.
    GpuSpec("H200 SXM", 4800.0, {"bfloat16": 989.5, "float16": 989.5, "float32": 67.0},
            "NVIDIA H200 datasheet, H200 SXM", ("H200",)),
    # NVIDIA H100 Tensor Core GPU datasheet, H100 NVL column: 3.9 TB/s, BF16/FP16
    # 1,671 TFLOPS sparse, FP32 60 TFLOPS.
    GpuSpec("H100 NVL", 3900.0, {"bfloat16": 835.5, "float16": 835.5, "float32": 60.0},
            "NVIDIA H100 datasheet, H100 NVL", ("H100", "NVL")),
    # Same datasheet, H100 PCIe column: 2 TB/s, BF16/FP16 1,513 TFLOPS sparse, FP32 51.
    GpuSpec("H100 PCIe", 2000.0, {"bfloat16": 756.5, "float16": 756.5, "float32": 51.0},
            "NVIDIA H100 datasheet, H100 PCIe", ("H100", "PCIE")),
    # Same datasheet, H100 SXM column: 3.35 TB/s, BF16/FP16 1,979 TFLOPS sparse, FP32 67.
    # NVML calls it "NVIDIA H100 80GB HBM3".
    GpuSpec("H100 SXM", 3350.0, {"bfloat16": 989.5, "float16": 989.5, "float32": 67.0},
            "NVIDIA H100 datasheet, H100 SXM", ("H100",)),
    # NVIDIA A100 Tensor Core GPU datasheet: 80GB PCIe 1,935 GB/s, 80GB SXM 2,039 GB/s,
    # 40GB (PCIe and SXM) 1,555 GB/s; BF16/FP16 312 TFLOPS dense (624 sparse); FP32 19.5.
    GpuSpec("A100 80GB PCIe", 1935.0, {"bfloat16": 312.0, "float16": 312.0, "float32": 19.5},
            "NVIDIA A100 datasheet, A100 80GB PCIe", ("A100", "80GB", "PCIE")),
    GpuSpec("A100 80GB SXM", 2039.0, {"bfloat16": 312.0, "float16": 312.0, "float32": 19.5},
            "NVIDIA A100 datasheet, A100 80GB SXM", ("A100", "80GB")),
    GpuSpec("A100 40GB", 1555.0, {"bfloat16": 312.0, "float16": 312.0, "float32": 19.5},
            "NVIDIA A100 datasheet, A100 40GB (PCIe and SXM)", ("A100",)),
    # NVIDIA L40S datasheet: 864 GB/s GDDR6; BF16/FP16 362.05 TFLOPS dense (733 sparse);
    # FP32 91.6 TFLOPS.
    GpuSpec("L40S", 864.0, {"bfloat16": 362.05, "float16": 362.05, "float32": 91.6},
            "NVIDIA L40S datasheet", ("L40S",)),
    # NVIDIA L4 datasheet: 300 GB/s; BF16/FP16 242 TFLOPS sparse -> 121 dense; FP32 30.3.
    GpuSpec("L4", 300.0, {"bfloat16": 121.0, "float16": 121.0, "float32": 30.3},
            "NVIDIA L4 datasheet", ("L4",)),
    # NVIDIA A10 datasheet: 600 GB/s; BF16/FP16 250 TFLOPS sparse -> 125 dense; FP32 31.2.
    GpuSpec("A10", 600.0, {"bfloat16": 125.0, "float16": 125.0, "float32": 31.2},
            "NVIDIA A10 datasheet", ("A10",)),
)
# fmt: on
"""Datasheet peaks of the GPUs people serve on, matched by NVML name (``match_spec``)."""


def _tokens(name: str) -> set[str]:
    return {t for t in re.split(r"[^0-9A-Z]+", name.upper()) if t}


def match_spec(name: str | None) -> GpuSpec | None:
    """The spec-table entry for an NVML device name (``"NVIDIA H100 80GB HBM3"``), or None."""
    if not name:
        return None
    toks = _tokens(name)
    for spec in SPEC_TABLE:
        if all(t in toks for t in spec.needs):
            return spec
    return None


def spec_ceiling(name: str, dtype: str | None = None) -> Ceiling | None:
    """Spec-table ceiling for a GPU name in ``dtype`` (bf16 assumed when not given), or None."""
    spec = match_spec(name)
    if spec is None:
        return None
    dt = canonical_dtype(dtype)
    shown_dtype = dt
    if dt is None and not dtype:
        dt, shown_dtype = "bfloat16", "bfloat16 (assumed)"
    tf = spec.tflops.get(dt) if dt else None
    return Ceiling(
        device=name,
        peak_bw_gbps=spec.bw_gbps,
        peak_gflops=tf * 1e3 if tf is not None else None,
        dtype=shown_dtype or dtype,
        source=SOURCE_SPEC,
        detail=f"{spec.key}: {spec.datasheet} (peak, dense)",
    )


# --------------------------------------------------------------------------- calibration cache


def cache_path() -> Path:
    """Where calibrations are cached (``$RLTPERF_CACHE`` or ``~/.cache/rltperf``)."""
    base = os.environ.get("RLTPERF_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rltperf"
    )
    return Path(base) / "calibration.json"


def cache_key(device_name: str, host: str | None = None) -> str:
    """Cache key of a device on a host: ``"<host>|<device name>"``."""
    return f"{host or socket.gethostname()}|{device_name}"


def load_calibrations() -> dict[str, Any]:
    """All cached calibrations, keyed ``"<host>|<device>"``."""
    try:
        data = json.loads(cache_path().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


_cache_lock = threading.Lock()


def store_calibration(result: dict[str, Any]) -> Path:
    """Save one calibration result (``result["device"]`` names the device) into the cache.

    Written atomically (temp file, then rename); other entries are kept.  Raises OSError
    when the cache folder cannot be written.
    """
    path = cache_path()
    with _cache_lock:
        data = load_calibrations()
        data[cache_key(str(result["device"]), result.get("host"))] = result
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".calibration.", dir=str(path.parent))
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    return path


# --------------------------------------------------------------------------- lookup


def device_name(device: str | None) -> str:
    """The name a device string (``cpu``, ``cuda:0``) is calibrated and matched under."""
    if device and device.startswith("cuda"):
        try:
            import torch

            idx = int(device.split(":", 1)[1]) if ":" in device else 0
            return str(torch.cuda.get_device_name(idx))
        except Exception:
            return device
    from engine_adapters.definitions.contract import cpu_model

    return cpu_model()


def is_cpu_device(device: str | None) -> bool:
    """Whether a device string means the CPU (``cpu``, or nothing said)."""
    return not device or device.split(":", 1)[0] == "cpu"


_quick_lock = threading.Lock()
_quick_memo: dict[str, dict[str, Any]] = {}  # quick calibrations of this process


def _from_calibration(name: str, cal: dict[str, Any], dtype: str | None) -> Ceiling:
    by_dtype = cal.get("matmul_gflops_by_dtype") or {}
    dt = canonical_dtype(dtype) or canonical_dtype(cal.get("dtype")) or cal.get("dtype")
    gflops = by_dtype.get(dt) if dt else None
    if gflops is None and dt == canonical_dtype(cal.get("dtype")):
        gflops = cal.get("matmul_gflops")
    source = str(cal.get("source") or SOURCE_CALIBRATION)
    detail = str(cal.get("detail") or "")
    if gflops is None:
        spec = match_spec(name)
        tf = spec.tflops.get(dt) if spec and dt else None
        if tf is not None:
            gflops = tf * 1e3
            detail += f"; FLOP/s for {dt} from the spec table ({spec.key})"  # type: ignore[union-attr]
        else:
            detail += f"; no FLOP/s figure for {dt or dtype}"
    return Ceiling(
        device=name,
        peak_bw_gbps=cal.get("copy_gbps"),
        peak_gflops=gflops,
        dtype=dt or dtype,
        source=source,
        detail=detail or None,
    )


def ceiling_for(device: str | None, dtype: str | None = None, *, quick: bool = True) -> Ceiling | None:
    """Ceiling of ``device`` for ``dtype``: calibration, else spec table, else None.

    On a CPU with nothing cached (and ``quick``), runs the quick calibration first
    (about 0.3 s, once per machine: the result is cached) and returns it; a CPU
    calibration without a FLOP/s figure for ``dtype`` gets a quick matmul for it.
    """
    name = device_name(device)
    key = cache_key(name)
    cal = _full_calibration(key) or _quick_memo.get(key)
    if is_cpu_device(device) and quick:
        dt = canonical_dtype(dtype) or "float32"
        if cal is None or dt not in (cal.get("matmul_gflops_by_dtype") or {}):
            cal = _quick_cpu(name, dt, cal)
    if cal:
        return _from_calibration(name, cal, dtype)
    return spec_ceiling(name, dtype)


def _full_calibration(key: str) -> dict[str, Any] | None:
    """The cached calibration for ``key`` unless it is a quick one (older versions of
    rltperf cached those too; they are re-measured instead)."""
    cal = load_calibrations().get(key)
    if cal and cal.get("source") == "quick calibration":
        return None
    return cal


def _quick_cpu(name: str, dtype: str, existing: dict[str, Any] | None) -> dict[str, Any] | None:
    """Quick CPU calibration (or one more dtype's matmul), kept for this process; None if
    it failed."""
    from engine_adapters.definitions import calibrate

    with _quick_lock:  # two threads asking at once measure once
        key = cache_key(name)
        cal = _full_calibration(key) or _quick_memo.get(key) or existing
        if cal is not None and dtype in (cal.get("matmul_gflops_by_dtype") or {}):
            return cal
        try:
            if cal is None:
                cal = calibrate.quick_cpu_calibration(dtype)
            else:
                cal = dict(cal)
                extra = calibrate.quick_matmul_cpu(dtype)
                cal.setdefault("matmul_gflops_by_dtype", {})[dtype] = extra
        except Exception as exc:  # never let a measurement break the probe
            log.warning("quick CPU calibration failed: %s", exc)
            return cal
        cal["device"] = name
        # Kept in this process only: a quick reading taken while the machine was busy
        # (seen: 3.6 GB/s against 17 GB/s from a full calibration) must not become the
        # machine's ceiling for good.  Only `rltperf calibrate` writes the cache.
        _quick_memo[key] = cal
        return cal
