"""Bounded captures through a real probe socket into real bundles.

One loop engine (a torch loop with the probe, in a subprocess) serves the module; the
captures go through the `rltperf capture` command exactly as a user runs it.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import time
from pathlib import Path

import msgspec
import pytest

from engine_adapters.definitions.contract import CONTRACT_FIELDS
from engine_adapters.definitions.records import CaptureDone, CaptureFailed, Refused, StepRecord
from engine_adapters.monitor.tcp import ProbeAdapter
from tests.conftest import LOOP_ENGINE, LOOP_PACE, run_rltperf, start_engine, tmpfs_mount


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    # paced (LOOP_PACE): it runs from its first user to the module's end; the tests that
    # start engines of their own come before its users
    snaps = tmp_path_factory.mktemp("snaps")
    eng = start_engine([str(LOOP_ENGINE), "--duration", "300", *LOOP_PACE, "--snapshots", str(snaps)])
    eng.snapshots = snaps  # type: ignore[attr-defined]
    yield eng
    eng.stop()


def _trace_events(bundle: Path) -> list[dict]:
    with gzip.open(bundle / "trace.json.gz", "rt") as f:
        return json.load(f)["traceEvents"]


def test_unwarmed_profiler_flags_the_capture_cold(tmp_path):
    eng = start_engine(
        [str(LOOP_ENGINE), "--duration", "60", *LOOP_PACE, "--snapshots", str(tmp_path), "--no-warm"]
    )
    try:
        out = run_rltperf("capture", eng.target, "--steps", "3", "--mode", "ops", "--json")
        assert out.returncode == 0, out.stderr
        meta = json.loads((Path(json.loads(out.stdout)["bundle"]) / "meta.json").read_text())
        assert meta["capture"]["cold"] is True and meta["capture"]["steps_captured"] == 3
    finally:
        eng.stop()


@pytest.mark.parametrize("kind", ["read-only", "full-disk"])
def test_capture_into_unwritable_root_fails_clearly_and_engine_runs(tmp_path, kind):
    root = tmp_path / "snaps"
    root.mkdir()
    if os.geteuid() != 0 and kind == "read-only":
        root.chmod(0o555)
        mounted = False
    else:
        mounted = tmpfs_mount(root, None if kind == "read-only" else "48k")
        if not mounted:
            pytest.skip("cannot make a read-only / tiny file system here (needs root and mount)")
    try:
        eng = start_engine(
            [str(LOOP_ENGINE), "--duration", "120", *LOOP_PACE, "--snapshots", str(root), "--dim", "512"]
        )
        try:
            out = run_rltperf("capture", eng.target, "--steps", "20", "--mode", "full")
            assert out.returncode == 1
            if kind == "read-only":
                assert "Read-only file system" in out.stderr or "Permission denied" in out.stderr
            else:
                assert "disk full" in out.stderr
            assert "Traceback" not in out.stderr
            assert eng.proc.poll() is None
            assert _engine_keeps_stepping(eng.target) > 50
        finally:
            eng.stop()
    finally:
        if mounted:
            subprocess.run(["umount", str(root)], capture_output=True)


def test_in_thread_export_fallback_writes_the_same_bundle(tmp_path):
    """Without fork (``RLTPERF_EXPORT_FORK=0``, or when the child dies) the export runs
    in the engine's thread as before: slower for the engine, the same bundle."""
    eng = start_engine(
        [str(LOOP_ENGINE), "--duration", "120", *LOOP_PACE, "--snapshots", str(tmp_path)],
        env={"RLTPERF_EXPORT_FORK": "0"},
    )
    try:
        out = run_rltperf("capture", eng.target, "--steps", "4", "--mode", "full", "--json")
    finally:
        eng.stop()
    assert out.returncode == 0, out.stderr
    bundle = Path(json.loads(out.stdout)["bundle"])
    meta = json.loads((bundle / "meta.json").read_text())["capture"]
    assert meta["export_in"] == "thread" and meta["complete"] is True and meta["steps_captured"] == 4
    spans = [e for e in _trace_events(bundle) if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")]
    assert len(spans) == 4 and "Input Shapes" in (bundle / "ops.txt").read_text()
    assert not list(bundle.glob(".export-result*"))


@pytest.mark.parametrize("mode", ["full", "ops"])
def test_capture_bundle_has_exactly_n_steps(engine, mode):
    out = run_rltperf(
        "capture", engine.target, "--steps", "5", "--mode", mode, "--label", f"t-{mode}", "--json"
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    bundle = Path(res["bundle"])
    assert bundle.parent == engine.snapshots and bundle.is_dir()
    assert sorted(p.name for p in bundle.iterdir()) == [
        "meta.json",
        "ops.txt",
        "steps.jsonl",
        "trace.json.gz",
    ]
    events = _trace_events(bundle)
    spans = [e for e in events if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#")]
    assert len(spans) == 5
    meta = json.loads((bundle / "meta.json").read_text())
    cap = meta["capture"]
    assert cap["steps_requested"] == 5 and cap["steps_captured"] == 5 and len(cap["step_ids"]) == 5
    full = mode == "full"
    assert (cap["record_shapes"], cap["profile_memory"], cap["with_stack"]) == (full, full, full)
    assert cap["trace_bytes"] == (bundle / "trace.json.gz").stat().st_size == res["trace_bytes"]
    assert cap["events"] == len(events) == res["events"]
    assert cap["error"] is None and cap["cold"] is False
    assert cap["complete"] is True and cap["export_in"] == "child"  # off the engine's GIL
    assert meta["profiled"] is True and meta["contract"]["profiled"] is True
    # every contract field is present, with a value or "unknown: <why>"
    for key in CONTRACT_FIELDS:
        v = meta["contract"][key]
        assert v is not None and v != "", key
    assert meta["contract"]["random_weights"] is True
    # the window's steps are in steps.jsonl, flagged profiled, with their ids
    rows = [json.loads(line) for line in (bundle / "steps.jsonl").read_text().splitlines()]
    captured = [r for r in rows if r["window"] == "captured"]
    assert [r["step_id"] for r in captured] == cap["step_ids"]
    assert all(r["flags"] & 2 for r in captured)
    assert any(r["window"] == "before" for r in rows)
    warm = [r for r in rows if r["window"] == "profiler_warmup"]
    assert len(warm) == 1 and warm[0]["flags"] & 8 and warm[0]["step_id"] == cap["step_ids"][0] - 1
    # stage ranges emitted by the probe are in the trace, once per captured step
    stage_fwd = [e for e in events if e.get("name") == "stage:forward" and e.get("ph") == "X"]
    assert len(stage_fwd) >= 5
    if full:  # shapes and stacks really recorded
        assert any(e.get("args", {}).get("Input Dims") for e in events)
        assert "Input Shapes" in (bundle / "ops.txt").read_text()


def test_steps_overlapping_the_export_are_flagged(engine):
    out = run_rltperf("capture", engine.target, "--steps", "30", "--mode", "full", "--json")
    assert out.returncode == 0, out.stderr
    bundle = Path(json.loads(out.stdout)["bundle"])
    meta = json.loads((bundle / "meta.json").read_text())
    rows = [json.loads(line) for line in (bundle / "steps.jsonl").read_text().splitlines()]
    after = [r for r in rows if r["window"] == "after"]
    t0, t1 = (
        meta["capture"]["window_end_ns"],
        meta["capture"]["window_end_ns"] + meta["capture"]["export_s"] * 1e9,
    )
    overlapping = [r for r in after if r["end_ns"] >= t0 and r["start_ns"] <= t1]
    assert overlapping, "the loop steps every ~0.2 ms, an export takes longer"
    assert all(r["flags"] & 4 for r in overlapping)
    assert not any(r["flags"] & 4 for r in rows if r["window"] in ("before", "captured"))


def test_second_capture_while_one_runs_is_refused(engine):
    s = ProbeAdapter(engine.target, reconnect=False).connect()
    try:
        s.request_capture(200, "ops")
        time.sleep(0.05)
        cid2 = s.request_capture(5, "ops")
        deadline = time.monotonic() + 60
        refusal = None
        done = None
        while time.monotonic() < deadline and done is None:
            for r in s.read(0.2):
                if isinstance(r, Refused) and r.capture_id == cid2:
                    refusal = r
                if isinstance(r, (CaptureDone, CaptureFailed)):
                    done = r
        assert refusal is not None and "already running" in refusal.reason
        assert isinstance(done, CaptureDone) and done.steps_captured == 200
    finally:
        s.close()


def test_bad_capture_requests_get_clear_errors(engine):
    out = run_rltperf("capture", engine.target, "--steps", "100000", "--mode", "ops")
    # refused before anything is asked of the engine (issue 14): nothing says "armed"
    assert out.returncode == 2 and "out of range: 1 to 1024" in out.stderr and "armed" not in out.stderr
    out = run_rltperf("capture", "--help")
    assert "1 to 1024" in out.stdout
    out = run_rltperf("capture", "tcp://127.0.0.1:1", "--steps", "5")
    assert out.returncode == 1 and "connection refused" in out.stderr and "Traceback" not in out.stderr


def _engine_keeps_stepping(target: str) -> int:
    """Steps a new subscriber sees: read until more than 50 came, or 30 s (a loaded
    machine's connect and first records took over the 1 s this once read for)."""
    s = ProbeAdapter(target, reconnect=False).connect()
    try:
        n = 0
        t0 = time.monotonic()
        while n <= 50 and time.monotonic() - t0 < 30.0:
            n += sum(isinstance(r, StepRecord) for r in s.read(0.1))
        return n
    finally:
        s.close()


def test_capture_command_refused_while_another_runs_never_says_armed(engine):
    """Issue 14: a second concurrent capture printed "armed" before "failed: a capture
    is already running"."""
    s = ProbeAdapter(engine.target, reconnect=False).connect()
    try:
        cid = s.request_capture(1000, "ops")
        deadline = time.monotonic() + 30
        started = False
        while not started and time.monotonic() < deadline:
            started = any(getattr(r, "capture_id", None) == cid for r in s.read(0.1))
        assert started
        out = run_rltperf("capture", engine.target, "--steps", "4", "--mode", "ops")
        assert out.returncode == 1 and "already running" in out.stderr, out.stderr
        assert "armed" not in out.stderr
        deadline = time.monotonic() + 400  # a loaded run's 1,000 steps and export took over 120 s
        done = None
        while done is None and time.monotonic() < deadline:  # let the long one finish
            done = next((r for r in s.read(0.2) if isinstance(r, (CaptureDone, CaptureFailed))), None)
        assert isinstance(done, CaptureDone)
    finally:
        s.close()


def test_capture_command_without_a_terminal_prints_state_changes_only(engine):
    """Issue 14: without a terminal, N=64 printed 64 progress lines."""
    out = run_rltperf("capture", engine.target, "--steps", "64", "--mode", "ops")
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    capturing = [x for x in lines if "capturing" in x]
    assert 1 <= len(capturing) <= 2, lines  # "capturing from step k", then one "k/64" line
    assert sum("armed" in x for x in lines) == 1 and sum("exporting" in x for x in lines) <= 1
    assert len(lines) <= 6, lines


def test_the_windows_steps_survive_an_export_longer_than_the_readers_history(tmp_path, monkeypatch):
    """A fast engine can run more steps during an export than the reader's history holds
    (a loaded .ci/run: a bundle whose steps.jsonl had none of its five captured steps).
    The export is held here until the engine has run HISTORY + 500 steps past the window:
    the window's records, its context and the energy base before it are in the bundle."""
    from engine_adapters.probe import Probe, bundle
    from engine_adapters.probe.reader import HISTORY

    probe = Probe("127.0.0.1:0", {"name": "evict", "random_weights": True}, snapshot_root=str(tmp_path),
                  sample_devices=False)  # fmt: skip
    real_export = bundle.export_trace_files
    held_until: list[int] = []

    def slow_export(job, tmp):  # the real export, then a wait: a loaded machine's long one
        out = real_export(job, tmp)
        target = job.step_ids[-1] + HISTORY + 500
        deadline = time.monotonic() + 60
        while probe.reader.last_step_id < target and time.monotonic() < deadline:
            time.sleep(0.005)
        held_until.append(probe.reader.last_step_id - job.step_ids[-1])
        return out

    monkeypatch.setattr(bundle, "export_trace_files", slow_export)
    s = ProbeAdapter(f"tcp://{probe.address}", reconnect=False).connect()
    done = None
    try:
        for _ in range(100):  # steps before the window: its context and energy base
            with probe.step("decode", 1, 1):
                pass
        cid = s.request_capture(3, "ops")
        deadline = time.monotonic() + 120
        while done is None and time.monotonic() < deadline:
            for _ in range(50):
                with probe.step("decode", 1, 1):
                    pass
            time.sleep(0.0005)  # paced a little: the ring (8192) must not lap the reader
            for r in s.read(0):
                if isinstance(r, (CaptureDone, CaptureFailed, Refused)) and r.capture_id == cid:
                    done = r
    finally:
        s.close()
        probe.close()
    assert isinstance(done, CaptureDone), done
    assert held_until and held_until[0] > HISTORY  # the history did move past the window
    b = Path(done.bundle)
    meta = json.loads((b / "meta.json").read_text())
    cap = meta["capture"]
    rows = [json.loads(line) for line in (b / "steps.jsonl").read_text().splitlines()]
    assert [r["step_id"] for r in rows if r["window"] == "captured"] == cap["step_ids"]
    assert len([r for r in rows if r["window"] == "before"]) == 32
    assert "steps_note" not in cap
    assert meta["energy"]["base"]["steps"] >= 90  # the unprofiled steps before the window


def test_a_bundle_says_which_window_steps_its_steps_file_lacks():
    from engine_adapters.probe.bundle import _missing_steps_note
    from engine_adapters.probe.job import CaptureJob

    job = CaptureJob("c1", 3, "ops", "", 0, step_ids=[10, 11, 12])
    rec = StepRecord(step_id=10, start_ns=0, end_ns=1)
    assert _missing_steps_note(job, [rec]).startswith(
        "steps.jsonl lacks 2 of the window's 3 step records (first 11)"
    )
    assert _missing_steps_note(job, [msgspec.structs.replace(rec, step_id=i) for i in (10, 11, 12)]) is None
