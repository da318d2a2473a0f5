"""The screen's ingest worker (``rltperf_tui.tui.targets.ingest``) on a quiet target: a real
``Probe`` in this process that runs no steps (it still sends its ~1 s heartbeat) over a
real socket, read by the real ``MonitorApp``."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine_adapters.probe import Probe
from rltperf_tui.tui import app as app_module
from rltperf_tui.tui.app import MonitorApp
from rltperf_tui.tui.targets import batch_for
from tests.rltperf_tui.tui._uihelpers import sync


def _wakes(tid: int) -> int:
    """The thread's voluntary context switches so far (each blocking wait that ended)."""
    with open(f"/proc/self/task/{tid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches")


async def _until(ready: Callable[[], bool], timeout: float = 30.0) -> None:
    """Let the app run until ``ready()`` or ``timeout`` seconds (the caller asserts)."""
    deadline = time.monotonic() + timeout
    while not ready() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)


@sync
async def test_the_worker_of_a_quiet_target_sleeps_until_records_come(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nothing pending no batch is due, so the worker waits for the next record
    (``IDLE_READ_S``) instead of waking every ``READ_S``: on a /metrics target, which
    sends one record a scrape, it woke 6.8 times a second.  Each heartbeat still reaches
    the screen."""
    probe = Probe("127.0.0.1:0", {"name": "quiet", "random_weights": True},
                  snapshot_root=str(tmp_path), sample_devices=False)  # fmt: skip
    tids: list[int] = []
    real = app_module.ingest

    def traced(*args: Any, **kwargs: Any) -> None:
        tids.append(threading.get_native_id())
        real(*args, **kwargs)

    monkeypatch.setattr(app_module, "ingest", traced)
    try:
        app = MonitorApp([f"tcp://{probe.address}"], refresh_hz=2)
        async with app.run_test(size=(100, 30)):
            h = app.handles[0]
            await _until(lambda: bool(tids) and h.stats.state == "connected")
            assert tids and h.stats.state == "connected", h.stats.state
            await asyncio.sleep(1.5)  # past the hello's batch
            w0, n0, t0 = _wakes(tids[0]), h.handled, time.monotonic()
            await asyncio.sleep(4.0)
            wakes, batches, span = _wakes(tids[0]) - w0, h.handled - n0, time.monotonic() - t0
    finally:
        probe.close("test over")
    print(f"{wakes} wakes and {batches} batches in {span:.1f} s")
    assert batches >= 2, batches  # the heartbeats came through
    # ~2 wakes a heartbeat (its record, then the batch's flush) and the odd GIL wait: 9 in
    # 4 s; reading at most READ_S (0.25 s) at a time, as before, it woke 20 times
    assert wakes <= 3.5 * span, (wakes, span)


@sync
async def test_the_worker_of_a_busy_target_reads_in_batches_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 1 000 steps/s the probe sends 20 times a second; the worker lets a slow stream
    gather until the next batch is due (``PACE_RECORDS``) instead of reading each send as
    it comes, and every step still reaches the aggregate, in order, with no id missing."""
    from rltperf_tui.tui.targets import TargetHandle
    from tests.conftest import LOOP_ENGINE, start_engine

    eng = start_engine([str(LOOP_ENGINE), "--duration", "60", "--rate", "1000", "--no-warm",
                        "--snapshots", str(tmp_path / "snapshots")])  # fmt: skip
    reads: list[int] = []
    real = TargetHandle.read

    def counted(self: TargetHandle, timeout: float) -> list[Any]:
        recs = real(self, timeout)
        if recs:
            reads.append(len(recs))
        return recs

    monkeypatch.setattr(TargetHandle, "read", counted)
    try:
        app = MonitorApp([f"tcp://{eng.address}"], refresh_hz=2)
        async with app.run_test(size=(100, 30)):
            h = app.handles[0]
            await _until(lambda: len(h.stats.steps) >= 500)
            assert len(h.stats.steps) >= 500, h.stats.state
            r0, s0, t0 = len(reads), h.stats.steps.n, time.monotonic()
            await asyncio.sleep(4.0)
            n_reads, steps, span = len(reads) - r0, h.stats.steps.n - s0, time.monotonic() - t0
            ids = h.stats.steps.last("step_id")
    finally:
        eng.stop()
    print(f"{n_reads} reads with records, {steps} steps in {span:.1f} s")
    assert steps > 500 * span, steps  # the engine ran at pace and the worker kept up
    assert h.stats.id_gaps == 0 and h.stats.dropped == 0
    assert (ids[1:] - ids[:-1] == 1).all()
    # a read for each of the probe's 20 sends a second once (78 in 4 s), then two or three
    # a 0.25 s batch (38, 39: the stream gathered for at most 0.2 s); now one a batch, a
    # batch a render tick (8)
    assert h.batch_s == batch_for(2.0) == 0.5
    assert n_reads <= 3 * span, (n_reads, span)


def test_a_batch_a_render_tick_and_never_less_than_a_quarter_second() -> None:
    assert [batch_for(hz) for hz in (0.5, 1.0, 2.0, 4.0, 10.0)] == [0.5, 0.5, 0.5, 0.25, 0.25]
