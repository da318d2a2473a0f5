"""Every consumer computes the window figures with the same code (engine_adapters.definitions.figures).

A real recording of the reference engine that spans an ops capture (profiled steps and
an export) must give the same idle, MBU and tokens/s in ``summary`` and ``compare``;
``compare`` used to keep the capture's wall time in its blocks (a B with one capture read
tokens/s 89 vs 99 for identical speed).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_rltperf
from tests.ui._uihelpers import RECORDING


def test_summary_and_compare_agree_on_a_recording_with_a_capture(tmp_path: Path) -> None:
    # B: the same recording with its last frame cut off (a copy would be refused as the
    # same input): another file, nearly the same figures; only A's are checked exactly
    a, b = tmp_path / "a.rltrec", tmp_path / "b.rltrec"
    shutil.copy(RECORDING, a)
    data = RECORDING.read_bytes()
    b.write_bytes(data[: len(data) - 200])
    summ = json.loads(run_rltperf("summary", str(a), "--json").stdout)
    assert summ["excluded"]["profiled_steps"] > 0 and summ["excluded"]["seconds"] > 1.0
    assert summ["baseline_s"] == pytest.approx(summ["wall_s"] - summ["excluded"]["seconds"], abs=1e-5)
    out = run_rltperf("compare", str(a), str(b), "--json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    got = {m["key"]: m for m in res["metrics"]}
    for key in ("tokens_per_s", "idle_fraction", "mbu"):
        assert got[key]["a"] == pytest.approx(summ[key], rel=1e-5), (key, got[key], summ[key])
        summ_b = json.loads(run_rltperf("summary", str(b), "--json").stdout)
        assert got[key]["b"] == pytest.approx(summ_b[key], rel=1e-5)
