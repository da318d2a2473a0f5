"""The monitor on a real engine that goes quiet, then hangs (SIGSTOP), then resumes.

A monitor that says "busy" when the load stops, or shows figures as current after its
engine stopped answering, misleads exactly when it is watched most (a load test's
pause, a stuck server).
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from rltperf_tui.tui.app import HUNG_AFTER_S, MonitorApp
from rltperf_tui.tui.widgets.device import DevicePanel
from rltperf_tui.tui.widgets.target_header import TargetHeader
from tests.conftest import LOOP_ENGINE, start_engine
from tests.rltperf_tui.tui._uihelpers import panel_text, sync, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.name != "posix", reason="SIGSTOP")]


def _idle_pct(text: str) -> float:
    m = re.search(r"idle\s+(\d+(?:\.\d+)?)\s*%", text)
    assert m, text
    return float(m.group(1))


@sync
async def test_quiet_engine_reads_idle_and_a_stopped_one_reads_hung(tmp_path: Path) -> None:
    # 100 steps at 200 steps/s (0.5 s of load), then only the probe's heartbeats
    eng = start_engine([str(LOOP_ENGINE), "--duration", "120", "--rate", "200", "--steps", "100", "--start-delay", "3",
                        "--no-warm", "--snapshots", str(tmp_path)])  # fmt: skip
    try:
        app = MonitorApp([eng.target], refresh_hz=4, window_s=4.0)
        async with app.run_test(size=(120, 40)) as pilot:
            h = app.handles[0]
            await wait_for(pilot, lambda: len(h.stats.steps) >= 100, timeout=60, what="100 steps")
            # 5 s of quiet: a 4 s window holds no step, the heartbeats vouch for the time
            await wait_for(pilot, lambda: h.stats.quiet_s >= 5.0, timeout=30, what="5 s quiet")
            app.force_render()
            await pilot.pause(0.1)
            head = panel_text(app, TargetHeader)
            assert re.search(r"no steps for \d+ s", head), head
            assert _idle_pct(panel_text(app, DevicePanel)) == pytest.approx(100.0)
            assert "hung" not in head
            # SIGSTOP: no heartbeat any more; within a few seconds the screen says so
            os.kill(eng.proc.pid, signal.SIGSTOP)
            try:
                await wait_for(pilot, lambda: "hung?" in panel_text(app, TargetHeader),
                               timeout=HUNG_AFTER_S + 6, what="hung shown")  # fmt: skip
                head = panel_text(app, TargetHeader)
                assert re.search(r"stale: as of \d+ s ago", head), head
                assert "stale" in panel_text(app, DevicePanel)
            finally:
                os.kill(eng.proc.pid, signal.SIGCONT)
            await wait_for(pilot, lambda: "hung?" not in panel_text(app, TargetHeader),
                           timeout=10, what="hung cleared after SIGCONT")  # fmt: skip
    finally:
        eng.stop()
