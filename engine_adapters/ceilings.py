"""Peak bandwidth and FLOP/s of a device: calibrated figures first, then a spec table.

``rltperf calibrate`` measures this machine and caches the result (keyed by device name
and host); ``ceiling_for`` returns the calibrated figures when present, otherwise the
spec-table entry matched by name, otherwise None.  The ``source`` field says which.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from engine_adapters.records import Ceiling


def cache_path() -> Path:
    """Where calibrations are cached (``$RLTPERF_CACHE`` or ``~/.cache/rltperf``)."""
    base = os.environ.get("RLTPERF_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rltperf"
    )
    return Path(base) / "calibration.json"


def load_calibrations() -> dict[str, Any]:
    """All cached calibrations, keyed ``"<host>|<device>"``."""
    try:
        data = json.loads(cache_path().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def device_name(device: str | None) -> str:
    """The name a device string (``cpu``, ``cuda:0``) is calibrated and matched under."""
    if device and device.startswith("cuda"):
        try:
            import torch

            idx = int(device.split(":", 1)[1]) if ":" in device else 0
            return str(torch.cuda.get_device_name(idx))
        except Exception:
            return device
    from engine_adapters.probe.contract import cpu_model

    return cpu_model()


def ceiling_for(device: str | None, dtype: str | None = None) -> Ceiling | None:
    """Ceiling of ``device`` for ``dtype``: calibration, else spec table, else None."""
    name = device_name(device)
    cal = load_calibrations().get(f"{socket.gethostname()}|{name}")
    if cal:
        return Ceiling(
            device=name,
            peak_bw_gbps=cal.get("copy_gbps"),
            peak_gflops=cal.get("matmul_gflops"),
            dtype=cal.get("dtype"),
            source="calibration",
        )
    return spec_ceiling(name, dtype)


def spec_ceiling(name: str, dtype: str | None = None) -> Ceiling | None:
    """Spec-table ceiling for a GPU name, or None (filled by the device-truth work)."""
    return None
