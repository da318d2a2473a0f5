"""Ceilings: spec-table matching by NVML name, the calibration cache, the quick CPU
calibration, and which source the ceiling says it came from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine_adapters.definitions import calibrate, ceilings
from engine_adapters.definitions.ceilings import canonical_dtype, ceiling_for, match_spec, spec_ceiling


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RLTPERF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(ceilings, "_quick_memo", {})
    return tmp_path / "cache" / "calibration.json"


@pytest.mark.parametrize(
    ("nvml_name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
        ("NVIDIA A100-PCIE-40GB", "A100 40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
        ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA B200", "B200"),
        ("nvidia h100 80gb hbm3", "H100 SXM"),
        # look-alikes that are other GPUs: no match rather than a wrong one
        ("NVIDIA A10G", None),
        ("NVIDIA L40", None),
        ("NVIDIA GeForce RTX 4090", None),
        ("NVIDIA GH200 480GB", None),
        ("Intel(R) Xeon(R) Processor (2 logical cores)", None),
        ("", None),
    ],
)
def test_spec_table_matches_nvml_names(nvml_name: str, key: str | None) -> None:
    spec = match_spec(nvml_name)
    assert (spec.key if spec else None) == key


def test_spec_table_covers_the_brief() -> None:
    keys = {s.key for s in ceilings.SPEC_TABLE}
    assert {
        "H100 SXM",
        "H100 PCIe",
        "H200 SXM",
        "A100 40GB",
        "A100 80GB SXM",
        "L40S",
        "L4",
        "A10",
        "B200",
    } <= keys
    for s in ceilings.SPEC_TABLE:
        assert s.bw_gbps > 0 and set(s.tflops) == {"bfloat16", "float16", "float32"}
        assert s.tflops["bfloat16"] > s.tflops["float32"] > 0  # tensor cores vs plain fp32


def test_spec_ceiling_h200_and_its_balance() -> None:
    c = spec_ceiling("NVIDIA H200", "torch.bfloat16")
    assert c is not None
    assert (c.peak_bw_gbps, c.peak_gflops, c.dtype, c.source) == (4800.0, 989_500.0, "bfloat16", "spec table")
    assert c.detail and "H200 SXM" in c.detail
    # machine balance 989.5 TFLOP/s / 4.8 TB/s = 206 FLOP/B (H200.md: "about 206")
    assert c.peak_gflops / c.peak_bw_gbps == pytest.approx(206.1, abs=0.1)
    fp32 = spec_ceiling("NVIDIA H200", "float32")
    assert fp32 is not None and fp32.peak_gflops == 67_000.0
    assumed = spec_ceiling("NVIDIA H100 80GB HBM3", None)
    assert assumed is not None and assumed.dtype == "bfloat16 (assumed)" and assumed.peak_bw_gbps == 3350.0
    fp8 = spec_ceiling("NVIDIA H100 80GB HBM3", "fp8")
    assert fp8 is not None and fp8.peak_gflops is None and fp8.peak_bw_gbps == 3350.0  # bandwidth still known
    assert spec_ceiling("NVIDIA A10G", "bfloat16") is None


def test_canonical_dtype() -> None:
    assert [canonical_dtype(d) for d in ("torch.bfloat16", "bf16", "half", "FP32", "float", "auto", None)] == [
        "bfloat16", "bfloat16", "float16", "float32", "float32", None, None,
    ]  # fmt: skip


def test_gpu_without_calibration_uses_spec_table_else_none(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ceilings, "device_name", lambda d: "NVIDIA H200")
    c = ceiling_for("cuda:0", "bfloat16")
    assert c is not None and c.source == "spec table" and c.peak_bw_gbps == 4800.0
    assert not cache.exists()  # no quick calibration on a GPU: it would take the engine's memory
    monkeypatch.setattr(ceilings, "device_name", lambda d: "Some Future GPU")
    assert ceiling_for("cuda:0", "bfloat16") is None


def test_gpu_calibration_wins_and_fills_missing_dtype_from_spec(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ceilings, "device_name", lambda d: "NVIDIA H200")
    ceilings.store_calibration({"device": "NVIDIA H200", "copy_gbps": 4300.0, "matmul_gflops": 788_000.0,
                                "dtype": "bfloat16", "matmul_gflops_by_dtype": {"bfloat16": 788_000.0},
                                "source": "calibration", "detail": "test entry"})  # fmt: skip
    c = ceiling_for("cuda:0", "bfloat16")
    assert c is not None and (c.source, c.peak_bw_gbps, c.peak_gflops) == ("calibration", 4300.0, 788_000.0)
    c = ceiling_for("cuda:0", "float32")
    assert c is not None and c.peak_bw_gbps == 4300.0 and c.peak_gflops == 67_000.0
    assert c.detail and "float32 from the spec table" in c.detail


def test_full_cpu_calibration_is_used_as_is(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = ceilings.device_name("cpu")
    ceilings.store_calibration({"device": name, "copy_gbps": 12.5, "matmul_gflops": 40.0, "dtype": "float32",
                                "matmul_gflops_by_dtype": {"float32": 40.0, "bfloat16": 90.0},
                                "source": "calibration"})  # fmt: skip

    def boom(*a: Any) -> Any:
        raise AssertionError("must not measure: a calibration is cached")

    monkeypatch.setattr(calibrate, "quick_cpu_calibration", boom)
    monkeypatch.setattr(calibrate, "quick_matmul_cpu", boom)
    c = ceiling_for("cpu", "bfloat16")
    assert c is not None and (c.source, c.peak_bw_gbps, c.peak_gflops, c.dtype) == (
        "calibration",
        12.5,
        90.0,
        "bfloat16",
    )
    c = ceiling_for(None, "float32")  # engine did not name its device: the CPU
    assert c is not None and c.peak_gflops == 40.0


def test_quick_cpu_calibration_when_nothing_cached(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c = ceiling_for("cpu", "float32")
    assert c is not None and c.source == "quick calibration"
    assert c.peak_bw_gbps is not None and c.peak_bw_gbps > 0.5  # any real machine copies faster
    assert c.peak_gflops is not None and c.peak_gflops > 0.1
    assert c.detail and "quick calibration" in c.detail and "rltperf calibrate" in c.detail
    # never written to the machine's cache: a reading taken under load must not stick
    assert not cache.exists()
    # kept in this process: the next lookup does not measure again
    calls: list[str] = []
    real = calibrate.quick_matmul_cpu

    def counting(dt: str) -> float:
        calls.append(dt)
        return real(dt)

    monkeypatch.setattr(calibrate, "quick_cpu_calibration", lambda *a: pytest.fail("measured twice"))
    monkeypatch.setattr(calibrate, "quick_matmul_cpu", counting)
    c2 = ceiling_for("cpu", "float32")
    assert c2 is not None and (c2.peak_bw_gbps, c2.peak_gflops) == (c.peak_bw_gbps, c.peak_gflops)
    assert calls == []
    # a new dtype: one quick matmul for it, added to the same entry
    c3 = ceiling_for("cpu", "bfloat16")
    assert calls == ["bfloat16"]
    assert c3 is not None and c3.peak_bw_gbps == c.peak_bw_gbps and c3.dtype == "bfloat16"
    entry = ceilings._quick_memo[ceilings.cache_key(ceilings.device_name("cpu"))]
    assert set(entry["matmul_gflops_by_dtype"]) == {"float32", "bfloat16"}


def test_a_quick_calibration_cached_by_an_older_version_is_measured_again(cache: Path) -> None:
    key = ceilings.cache_key(ceilings.device_name("cpu"))
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(
        json.dumps({key: {"source": "quick calibration", "copy_gbps": 0.001, "matmul_gflops": 0.001}})
    )
    c = ceiling_for("cpu", "float32")
    assert c is not None and c.source == "quick calibration" and c.peak_bw_gbps and c.peak_bw_gbps > 0.5


def test_quick_calibration_survives_an_unwritable_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("RLTPERF_CACHE", str(blocker / "cache"))
    monkeypatch.setattr(ceilings, "_quick_memo", {})
    c = ceiling_for("cpu", "float32")
    assert c is not None and c.source == "quick calibration"
    monkeypatch.setattr(calibrate, "quick_cpu_calibration", lambda *a: pytest.fail("measured twice"))
    assert ceiling_for("cpu", "float32") == c  # remembered in the process


def test_store_keeps_other_entries(cache: Path) -> None:
    ceilings.store_calibration({"device": "A", "host": "h1", "copy_gbps": 1.0})
    ceilings.store_calibration({"device": "B", "host": "h1", "copy_gbps": 2.0})
    ceilings.store_calibration({"device": "A", "host": "h1", "copy_gbps": 3.0})
    data = ceilings.load_calibrations()
    assert data["h1|A"]["copy_gbps"] == 3.0 and data["h1|B"]["copy_gbps"] == 2.0
    assert [p.name for p in cache.parent.iterdir()] == ["calibration.json"]  # no temp files left
