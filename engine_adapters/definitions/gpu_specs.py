"""The datasheet peaks of the GPUs people serve on, matched by NVML device name.

The bottom of the ceiling lookup (``ceilings.ceiling_for``: calibration first, then this
table) and of ``rltperf calibrate``'s measured / datasheet ratios; imports nothing of
rltperf, so both can use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SOURCE_SPEC = "spec table"
"""``Ceiling.source`` of datasheet figures matched by device name."""


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
