"""``rltperf calibrate --device cpu --json``, its copy convention against a plain copy timed
beside it, and a real engine's hello carrying the calibration (then MBU is computed
against it)."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine_adapters.definitions.records import Hello, Stats, StepRecord
from engine_adapters.monitor.tcp import ProbeAdapter
from rltperf_tui.live.aggregator import TargetStats

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from tests.conftest import LOOP_ENGINE, start_engine  # noqa: E402

MIB = 1 << 20


_PAIRED_COPY = """
import json, sys, time
import numpy as np
import torch
torch.set_num_threads(1)  # copy_cpu then skips its torch copy, whose OpenMP threads spin after it
from engine_adapters.definitions.calibrate import copy_cpu
nbytes, rounds = int(sys.argv[1]), int(sys.argv[2])
a = np.empty(nbytes, dtype=np.uint8)
a.fill(1)
b = np.empty_like(a)
np.copyto(b, a)
def plain():
    t0 = time.perf_counter()
    np.copyto(b, a)
    return 2 * nbytes / (time.perf_counter() - t0) / 1e9
out = []
for _ in range(rounds):
    before = plain()
    cal = copy_cpu(nbytes, reps=1, warmup=1)["copy_methods"]["numpy copyto (1 thread)"]
    out.append([before, cal, plain()])
print(json.dumps(out))
"""


def _paired_copies(nbytes: int, rounds: int) -> list[list[float]]:
    """``rounds`` triples (plain copy GB/s, the calibration's NumPy figure, plain copy GB/s),
    each triple timed within milliseconds in one fresh process, the plain copies counted as
    2·S.  Torch is held to one thread there: after a parallel torch copy its OpenMP threads
    spin for a while on both cores, and a plain copy timed then ran at half speed (ratios
    of 1.5 on every round)."""
    r = subprocess.run([sys.executable, "-c", _PAIRED_COPY, str(nbytes), str(rounds)], capture_output=True,
                       text=True, timeout=120, cwd=str(ROOT), env=dict(os.environ, PYTHONPATH=str(ROOT)))  # fmt: skip
    assert r.returncode == 0, r.stderr
    return [[float(v) for v in row] for row in json.loads(r.stdout)]


def _convention_error(ratio: float) -> float:
    """How far ``ratio`` is from 1 in factors of two (0.5: halfway to a 2x convention slip)."""
    return abs(math.log2(ratio))


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rltperf_tui.cli", *args], capture_output=True, text=True,
                          env=env, cwd=str(ROOT), timeout=180)  # fmt: skip


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Any], dict[str, str]]]:
    """Run the real command once, with a cache of its own."""
    cache = tmp_path_factory.mktemp("cal")
    env = dict(os.environ, RLTPERF_CACHE=str(cache), PYTHONPATH=str(ROOT))
    r = _cli(["calibrate", "--device", "cpu", "--json", "--repetitions", "6"], env)
    assert r.returncode == 0, r.stderr
    yield json.loads(r.stdout), env


def test_calibrate_json_keys(calibrated: tuple[dict[str, Any], dict[str, str]]) -> None:
    res, _ = calibrated
    for k in ("device", "copy_gbps", "matmul_gflops", "dtype", "repetitions"):
        assert k in res, k
    assert res["dtype"] == "float32" and set(res["matmul_gflops_by_dtype"]) == {"float32", "bfloat16"}
    assert res["repetitions"] == 6 and res["copy_bytes"] == 512 * MIB
    assert res["copy_gbps"] == max(res["copy_methods"].values()) > 0
    assert res["matmul_gflops"] > 0


def test_calibrated_copy_counts_two_bytes_moved_per_byte_copied() -> None:
    """The calibration counts a copy of S bytes as 2·S moved, as a plain copy timed beside it
    is counted here: their ratio is near 1, not the 0.5 or 2 a bytes-once count (or a double
    count) would give.  Each calibration figure is bracketed by plain copies milliseconds
    away in the same process, so the machine's bandwidth, which swings by 2x within seconds
    when other jobs come and go, is nearly the same for both (timed seconds apart in
    separate processes, a 1.55 ratio failed a loaded run)."""
    rows = _paired_copies(128 * MIB, 9)
    ratios = [cal / ((before + after) / 2) for before, cal, after in rows]
    ratio = statistics.median(ratios)
    print("calibration / plain copy, per round:", " ".join(f"{r:.2f}" for r in ratios), f"median {ratio:.3f}")
    assert _convention_error(ratio) < 0.5, rows


def test_calibration_is_cached_and_shown(calibrated: tuple[dict[str, Any], dict[str, str]]) -> None:
    res, env = calibrated
    data = json.loads((Path(env["RLTPERF_CACHE"]) / "calibration.json").read_text())
    entry = data[f"{res['host']}|{res['device']}"]
    assert entry["copy_gbps"] == res["copy_gbps"] and entry["source"] == "calibration"
    r = _cli(["calibrate", "--show"], env)
    assert r.returncode == 0 and res["device"] in r.stdout and "[calibration]" in r.stdout


def test_bad_arguments_are_sentences(tmp_path: Path) -> None:
    env = dict(os.environ, RLTPERF_CACHE=str(tmp_path), PYTHONPATH=str(ROOT))
    r = _cli(["calibrate", "--device", "tpu"], env)
    assert (
        r.returncode == 2
        and "--device must be cpu, cuda or cuda:N" in r.stderr
        and "Traceback" not in r.stderr
    )
    r = _cli(["calibrate", "--dtype", "int3"], env)
    assert r.returncode == 2 and "unknown dtype" in r.stderr
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        r = _cli(["calibrate", "--device", "cuda"], env)
        assert r.returncode == 1 and "no CUDA device" in r.stderr and "Traceback" not in r.stderr


def _hello_and_steps(target: str, seconds: float) -> tuple[Hello, list[Any], float]:
    """Connect, return the hello, every record for ``seconds``, and the time to the hello."""
    t0 = time.monotonic()
    sess = ProbeAdapter(target).connect()
    recs: list[Any] = []
    hello: Hello | None = None
    t_hello = 0.0
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for r in sess.read(0.2):
                recs.append(r)
                if isinstance(r, Hello) and hello is None:
                    hello, t_hello = r, time.monotonic() - t0
    finally:
        sess.close()
    assert hello is not None
    return hello, recs, t_hello


def test_engine_hello_carries_the_calibration_and_mbu_uses_it(
    calibrated: tuple[dict[str, Any], dict[str, str]], tmp_path: Path
) -> None:
    res, env = calibrated
    eng = start_engine([str(LOOP_ENGINE), "--duration", "30", "--no-warm", "--rate", "200", "--snapshots", str(tmp_path)],
                       env={"RLTPERF_CACHE": env["RLTPERF_CACHE"]})  # fmt: skip
    try:
        hello, recs, _ = _hello_and_steps(eng.target, 2.5)
    finally:
        eng.stop()
    c = hello.ceiling
    assert c is not None and c.source == "calibration"
    assert c.peak_bw_gbps == res["copy_gbps"] and c.peak_gflops == res["matmul_gflops_by_dtype"]["float32"]
    # grow: the whole stream, however many steps 2.5 s brought (CI's runner once sent more
    # than the default ring's 32 768, whose window then starts at the oldest step kept).
    st = TargetStats(grow=True)
    st.add(recs)
    w = st.window(None)
    steps = [r for r in recs if isinstance(r, StepRecord)]
    assert w.steps == len(steps)
    # The window is wall time (engine_adapters.definitions.figures): from the stream's first
    # timestamp (a step's start or a heartbeat) to the newest moment the data vouches for
    # (a step's end; a heartbeat between steps; a heartbeat inside a step, up to its start).
    beats = [r for r in recs if isinstance(r, Stats)]
    w0 = min([steps[0].start_ns] + [b.ts_ns for b in beats])
    w1 = max(
        [steps[-1].end_ns]
        + [b.ts_ns if b.in_step_since_ns <= 0 else min(b.in_step_since_ns, b.ts_ns) for b in beats]
    )
    span = (w1 - w0) / 1e9
    by_hand = sum((s.bytes_read or 0) + (s.bytes_written or 0) for s in steps) / (span * c.peak_bw_gbps * 1e9)
    assert w.mbu is not None and w.mbu == pytest.approx(by_hand, rel=1e-9)
    print(f"loop engine MBU {w.mbu:.4f} against {c.peak_bw_gbps:.1f} GB/s ({c.source})")


def test_fresh_machine_gets_a_quick_calibration_and_mbu_at_once(tmp_path: Path) -> None:
    """No cache: the probe measures quickly at start; MBU is known from the first window."""
    t_start = time.monotonic()
    eng = start_engine([str(LOOP_ENGINE), "--duration", "30", "--no-warm", "--rate", "200",
                        "--snapshots", str(tmp_path / "s")],
                       env={"RLTPERF_CACHE": str(tmp_path / "fresh")})  # fmt: skip
    try:
        hello, recs, _ = _hello_and_steps(eng.target, 1.5)
    finally:
        eng.stop()
    c = hello.ceiling
    assert c is not None and c.source == "quick calibration" and c.peak_bw_gbps and c.peak_bw_gbps > 0
    assert c.detail and "rltperf calibrate" in c.detail
    st = TargetStats()
    st.add(recs)
    assert st.window(None).mbu is not None
    took = time.monotonic() - t_start
    print(f"engine start to first MBU: {took:.1f} s (quick calibration: {c.detail})")
    assert not (tmp_path / "fresh" / "calibration.json").exists()  # quick readings stay in the process
