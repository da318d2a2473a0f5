"""`rltperf record` + `rltperf summary` against what a probed torch loop measured itself."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time

from tests.conftest import LOOP_ENGINE, ROOT, run_rltperf, start_engine


def test_summary_matches_the_loops_own_measurement(tmp_path):
    truth = tmp_path / "truth.json"
    rec = tmp_path / "loop.rltrec"
    eng = start_engine(
        [
            str(LOOP_ENGINE),
            "--duration",
            "60",
            "--out",
            str(truth),
            "--sleep-ms",
            "0.5",
            "--snapshots",
            str(tmp_path),
        ]
    )
    try:
        out = run_rltperf("record", eng.target, "--duration", "4", "-o", str(rec), "-q")
        assert out.returncode == 0, out.stderr
        assert rec.stat().st_size > 1000
    finally:
        eng.proc.terminate()  # the loop ends at SIGTERM and writes its truth (it ran 12 s, spinning)
        eng.proc.wait(60)
    summ = json.loads(run_rltperf("summary", str(rec), "--json").stdout)
    loop = json.loads(truth.read_text())
    # The recording covers a slice of the loop; compare over exactly the steps it holds.
    from rltperf_tui.analysis.summary import load_recording

    stats, _, _ = load_recording(rec)
    rec_ids = stats.steps.last("step_id")
    lo, hi = int(rec_ids[0]), int(rec_ids[-1])
    mine = [d for i, d in zip(loop["step_ids"], loop["durations_ns"], strict=True) if lo <= i <= hi]
    assert summ["steps"] > 500
    assert summ["steps"] == len(mine), "every step the loop ran in that span is in the recording"
    med_loop = statistics.median(mine) / 1e6
    assert abs(summ["step_ms"]["p50"] / med_loop - 1) < 0.05, (summ["step_ms"], med_loop)
    for key in (
        "steps",
        "wall_s",
        "step_ms",
        "gap_ms",
        "idle_fraction",
        "mbu",
        "tokens_per_s",
        "ttft_ms",
        "tpot_ms",
        "requests",
        "dropped",
    ):
        assert key in summ
    assert set(summ["step_ms"]) == {"p50", "p95", "p99"}
    assert summ["dropped"] == 0
    # the known host sleep between steps shows up as the gap
    assert 0.5 <= summ["gap_ms"]["p50"] < 1.5
    assert 0.0 < summ["idle_fraction"] < 1.0
    # the text form says which statistic it shows
    text = run_rltperf("summary", str(rec)).stdout
    assert "pooled samples" in text and "step ms" in text


def test_record_refuses_to_overwrite_and_bad_target(tmp_path):
    f = tmp_path / "x.rltrec"
    f.write_bytes(b"keep me")
    out = run_rltperf("record", "tcp://127.0.0.1:1", "--duration", "1", "-o", str(f))
    assert out.returncode == 1 and "connection refused" in out.stderr
    assert f.read_bytes() == b"keep me"
    out = run_rltperf("summary", str(f))
    assert out.returncode == 1 and "not an rltperf recording" in out.stderr
    out = run_rltperf("record", "bogus://x", "--duration", "1", "-o", str(tmp_path / "y.rltrec"))
    assert out.returncode == 1 and "unknown target scheme" in out.stderr
    out = run_rltperf("capture", "tcp://127.0.0.1:1", "--steps", "0")
    assert out.returncode == 2


def test_cut_off_recording_reads_to_its_last_whole_frame(tmp_path):
    eng = start_engine([str(LOOP_ENGINE), "--duration", "30", "--snapshots", str(tmp_path), "--no-warm"])
    rec = tmp_path / "a.rltrec"
    open_ended = tmp_path / "ctrl-c.rltrec"
    try:
        assert run_rltperf("record", eng.target, "--duration", "1.5", "-o", str(rec), "-q").returncode == 0
        # no --duration: records until Ctrl-C, which is a normal end (exit 0), file kept
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        cmd = [sys.executable, "-m", "rltperf_tui.cli", "record", eng.target, "-o", str(open_ended), "-q"]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not open_ended.exists() or open_ended.stat().st_size < 2000):
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "wrote" in out and "stopped early" not in err
    finally:
        eng.stop()
    assert json.loads(run_rltperf("summary", str(open_ended), "--json").stdout)["steps"] > 0
    data = rec.read_bytes()
    cut = tmp_path / "cut.rltrec"
    cut.write_bytes(data[: len(data) - 37])
    full = json.loads(run_rltperf("summary", str(rec), "--json").stdout)
    part = run_rltperf("summary", str(cut), "--json")
    assert part.returncode == 0 and "cut-off frame" in part.stderr
    assert 0 < json.loads(part.stdout)["steps"] <= full["steps"]
