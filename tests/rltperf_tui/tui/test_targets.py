"""The screen's ingest worker (``rltperf_tui.tui.targets.ingest``) on a quiet target: a real
``Probe`` in this process that runs no steps (it still sends its ~1 s heartbeat) over a
real socket, read by the real ``MonitorApp``."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from engine_adapters.probe import Probe
from rltperf_tui.tui import app as app_module
from rltperf_tui.tui.app import MonitorApp
from tests.rltperf_tui.tui._uihelpers import sync


def _wakes(tid: int) -> int:
    """The thread's voluntary context switches so far (each blocking wait that ended)."""
    with open(f"/proc/self/task/{tid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches")


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
            deadline = time.monotonic() + 30
            while (not tids or h.stats.state != "connected") and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
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
