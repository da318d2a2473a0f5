"""``rltperf calibrate --device cpu --json`` against a plain copy timed in the same run,
and a real engine's hello carrying the calibration (then MBU is computed against it)."""

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


_PLAIN_COPY = """
import json, sys, time
import numpy as np
method, nbytes, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
a = np.empty(nbytes, dtype=np.uint8)
a.fill(1)
b = np.empty_like(a)
if method.startswith("torch"):
    import torch
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    fn = lambda: tb.copy_(ta)
else:
    fn = lambda: np.copyto(b, a)
fn()
out = []
for _ in range(reps):
    t0 = time.perf_counter()
    fn()
    out.append(time.perf_counter() - t0)
print(json.dumps(out))
"""


def _plain_copy_times(method: str, nbytes: int, reps: int) -> list[float]:
    """A plain large-array copy, timed in a fresh process as the calibration is: the
    reference it is checked against.  (Timed inside pytest, an earlier test's
    ``torch.set_num_threads(1)`` made a torch copy single-threaded: half the bandwidth
    of the calibration's own process, and a false failure.)"""
    r = subprocess.run([sys.executable, "-c", _PLAIN_COPY, method, str(nbytes), str(reps)],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return [float(v) for v in json.loads(r.stdout)]


def _convention_error(ratio: float) -> float:
    """How far ``ratio`` is from 1 in factors of two (0.5: halfway to a 2x convention slip)."""
    return abs(math.log2(ratio))


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rltperf_tui.cli", *args], capture_output=True, text=True,
                          env=env, cwd=str(ROOT), timeout=180)  # fmt: skip


@pytest.fixture(scope="module")
def calibrated(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[dict[str, Any], float, dict[str, str]]]:
    """Run the real command; time a plain copy of the same kind right before and after it.

    This machine is shared: its memory bandwidth swings by 2x within seconds as other
    jobs come and go, so a bracketing pair that disagrees with itself by more than 25 %
    says the load changed mid-run, and the run is repeated (at most 3 times).
    """
    cache = tmp_path_factory.mktemp("cal")
    env = dict(os.environ, RLTPERF_CACHE=str(cache), PYTHONPATH=str(ROOT))
    nbytes = 512 * MIB
    method = "numpy"
    for _attempt in range(3):
        before = _plain_copy_times(method, nbytes, 5)
        r = _cli(["calibrate", "--device", "cpu", "--json", "--repetitions", "6"], env)
        assert r.returncode == 0, r.stderr
        res = json.loads(r.stdout)
        if not res["copy_method"].startswith(method):
            method = res["copy_method"]
            before = _plain_copy_times(method, nbytes, 5)
        after = _plain_copy_times(method, nbytes, 5)
        b, a = statistics.median(before), statistics.median(after)
        plain = 2 * nbytes / statistics.median(before + after) / 1e9
        steady = max(a, b) / min(a, b) < 1.25
        print(f"plain copy {2 * nbytes / b / 1e9:.1f} GB/s before, {2 * nbytes / a / 1e9:.1f} after; "
              f"calibrate {res['copy_gbps']:.1f}")  # fmt: skip
        if steady and _convention_error(res["copy_gbps"] / plain) < 0.25:
            break
    yield res, plain, env


def test_calibrate_json_keys_and_stream_convention(
    calibrated: tuple[dict[str, Any], float, dict[str, str]],
) -> None:
    res, plain, _ = calibrated
    for k in ("device", "copy_gbps", "matmul_gflops", "dtype", "repetitions"):
        assert k in res, k
    assert res["dtype"] == "float32" and set(res["matmul_gflops_by_dtype"]) == {"float32", "bfloat16"}
    assert res["repetitions"] == 6 and res["copy_bytes"] == 512 * MIB
    assert res["copy_gbps"] == max(res["copy_methods"].values())
    # the headline counts a copy of S bytes as 2·S moved, as the plain copy timed in this
    # run does: their ratio is nearer 1 than the 0.5 or 2 a bytes-once count (or a double
    # count) would give.  (±25 % failed under load: the machine's bandwidth swings by 2x
    # within seconds, and the two copies are timed seconds apart in separate processes.)
    ratio = res["copy_gbps"] / plain
    print(f"calibrate copy {res['copy_gbps']:.1f} GB/s vs plain copy {plain:.1f} GB/s: ratio {ratio:.3f}")
    assert _convention_error(ratio) < 0.5, (res["copy_gbps"], plain)
    assert res["matmul_gflops"] > 0


def test_calibration_is_cached_and_shown(calibrated: tuple[dict[str, Any], float, dict[str, str]]) -> None:
    res, _, env = calibrated
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
    calibrated: tuple[dict[str, Any], float, dict[str, str]], tmp_path: Path
) -> None:
    res, _, env = calibrated
    eng = start_engine([str(LOOP_ENGINE), "--duration", "30", "--no-warm", "--snapshots", str(tmp_path)],
                       env={"RLTPERF_CACHE": env["RLTPERF_CACHE"]})  # fmt: skip
    try:
        hello, recs, _ = _hello_and_steps(eng.target, 2.5)
    finally:
        eng.stop()
    c = hello.ceiling
    assert c is not None and c.source == "calibration"
    assert c.peak_bw_gbps == res["copy_gbps"] and c.peak_gflops == res["matmul_gflops_by_dtype"]["float32"]
    st = TargetStats()
    st.add(recs)
    w = st.window(None)
    steps = [r for r in recs if isinstance(r, StepRecord)]
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
    eng = start_engine([str(LOOP_ENGINE), "--duration", "30", "--no-warm", "--snapshots", str(tmp_path / "s")],
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
