"""A capture's export must not stop the engine (issue 10 A).

The reference engine (tiny preset, CPU, closed:8) in a subprocess; a full-mode capture of
8 steps through a real probe socket; the engine's own step records say how the steps that
ran during the export fared.  Before the fix the export thread held the GIL for seconds
(``key_averages`` over every event, then ``save`` and ``json.load``): steps of 0.5-4.6 s
and the engine's steps/s during the export at 0.2-0.5 of before.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np

from engine_adapters.definitions.records import (
    FLAG_EXPORTING,
    CaptureDone,
    CaptureFailed,
    Refused,
    StepRecord,
)
from engine_adapters.monitor.tcp import ProbeAdapter
from tests.conftest import run_queue_s, start_engine


def _export_figures(target: str, mode: str, pid: int) -> dict[str, float]:
    """An ``mode`` capture of 8 steps on the engine at ``target`` (process ``pid``) and how
    its steps fared during the export.  Rates are steps per second of the time the step
    loop was not queued for a core (``run_queue_s``, sampled as the records are read and
    interpolated at the windows' bounds: the probe's clock is this one's, CLOCK_MONOTONIC)."""
    s = ProbeAdapter(target, reconnect=False).connect()
    hist: list[StepRecord] = []
    queued: list[tuple[int, float]] = []

    def read(seconds: float) -> list[object]:
        recs = s.read(seconds)
        queued.append((time.monotonic_ns(), run_queue_s(pid)))
        hist.extend(r for r in recs if isinstance(r, StepRecord))
        return recs

    try:
        t_end = time.monotonic() + 3.0  # unprofiled steps before
        while time.monotonic() < t_end:
            read(0.1)
        cid = s.request_capture(8, mode)
        done = None
        deadline = time.monotonic() + 180
        while done is None and time.monotonic() < deadline:
            for r in read(0.1):
                if isinstance(r, (CaptureDone, CaptureFailed, Refused)) and r.capture_id == cid:
                    done = r
        assert isinstance(done, CaptureDone), done
        t_end = time.monotonic() + 1.0
        while time.monotonic() < t_end:
            read(0.1)
    finally:
        s.close()
    cap = json.loads((Path(done.bundle) / "meta.json").read_text())["capture"]
    req = cap["requested_ns"]
    w0 = cap["window_end_ns"]
    w1 = w0 + cap["export_s"] * 1e9
    before = [r for r in hist if req - 3e9 <= r.start_ns < req and not r.flags]
    during = [r for r in hist if r.end_ns >= w0 and r.start_ns <= w1]
    inside = [r for r in during if r.start_ns >= w0 and r.end_ns <= w1]
    assert all(r.flags & FLAG_EXPORTING for r in during)
    base = statistics.median((r.end_ns - r.start_ns) / 1e9 for r in before)
    t, q = np.array([x[0] for x in queued], float), np.array([x[1] for x in queued])

    def unqueued_s(a_ns: float, b_ns: float) -> float:
        return (b_ns - a_ns) / 1e9 - float(np.interp(b_ns, t, q) - np.interp(a_ns, t, q))

    return {
        "base_s": base,
        "longest_s": max((r.end_ns - r.start_ns) / 1e9 for r in during),
        "rate_ratio": (len(inside) / unqueued_s(w0, w1))
        / (len(before) / unqueued_s(before[0].start_ns, before[-1].end_ns)),
        "queued_share_before": 1 - unqueued_s(req - 3e9, req) / 3.0,
        "queued_share_during": 1 - unqueued_s(w0, w1) / ((w1 - w0) / 1e9),
        "export_s": cap["export_s"],
        "export_in": cap.get("export_in") or "thread",
    }


def test_steps_during_a_full_export_are_not_frozen(tmp_path):
    eng = start_engine(
        ["-m", "rltperf_tui.cli", "engine", "--preset", "tiny", "--workload", "closed:8",
         "--listen", "127.0.0.1:0", "--duration", "300", "--snapshots", str(tmp_path)],
        timeout=120,
    )  # fmt: skip
    try:
        f = _export_figures(eng.target, "full", eng.proc.pid)
    finally:
        eng.stop()
    print(f)
    # A ratio within this run (steps/s during the export over steps/s just before, each
    # over the time the step loop was not queued for a core, so other tenants' load and the
    # export child's own core are out, and an engine stopped by a lock or the GIL is not).
    # The longest exporting step against 3 x p50 + 20 ms is a figure of
    # ``rltperf bench capture``, not a timed test (issue 24 §6).
    assert f["export_in"] == "child", f
    assert f["rate_ratio"] > 0.5, f
