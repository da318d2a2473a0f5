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
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any

from engine_adapters.definitions import calibrate
from engine_adapters.definitions.calibrate import SOURCE_CALIBRATION, SOURCE_QUICK
from engine_adapters.definitions.gpu_specs import SOURCE_SPEC, SPEC_TABLE, GpuSpec, match_spec
from engine_adapters.definitions.records import Ceiling

log = logging.getLogger("rltperf.ceilings")

__all__ = [
    "SOURCE_CALIBRATION",
    "SOURCE_QUICK",
    "SOURCE_SPEC",
    "SPEC_TABLE",
    "GpuSpec",
    "canonical_dtype",
    "ceiling_for",
    "match_spec",
    "spec_ceiling",
]

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
