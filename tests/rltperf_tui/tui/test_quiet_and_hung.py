"""The monitor on a real engine that goes quiet, then hangs (SIGSTOP), then resumes.

A monitor that says "busy" when the load stops, or shows figures as current after its
engine stopped answering, misleads exactly when it is watched most (a load test's
pause, a stuck server).
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

import pytest

from rltperf_tui.tui.app import HUNG_AFTER_S, MonitorApp
from rltperf_tui.tui.widgets.device import DevicePanel
from rltperf_tui.tui.widgets.target_header import TargetHeader
from tests.conftest import LOOP_ENGINE, ROOT, start_engine
from tests.rltperf_tui.tui._uihelpers import drain_pty, panel_text, sync, wait_for

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


@sync
async def test_a_reader_that_has_not_run_for_seconds_does_not_make_its_engine_hung(tmp_path: Path) -> None:
    """The monitor's reader held up for 8 s (starved of a CPU, or blocked in a read) while
    the screen ticks on and the engine steps: the engine is not "hung?", its records wait
    in the socket; the silence counted is what the reader saw (``READER_ALIVE_S``)."""
    eng = start_engine([str(LOOP_ENGINE), "--duration", "120", "--rate", "200", "--no-warm",
                        "--snapshots", str(tmp_path)])  # fmt: skip
    try:
        app = MonitorApp([eng.target], refresh_hz=4)
        async with app.run_test(size=(120, 40)) as pilot:
            h = app.handles[0]
            await wait_for(pilot, lambda: len(h.stats.steps) >= 200, timeout=60, what="200 steps")
            read = h.read
            held = []

            def held_up(timeout: float) -> list[Any]:
                held.append(time.monotonic())
                time.sleep(8.0)
                h.read = read  # type: ignore[method-assign]
                return read(timeout)

            h.read = held_up  # type: ignore[method-assign]
            await wait_for(pilot, lambda: bool(held), timeout=10, what="the reader held up")
            n0 = len(h.stats.steps)
            while time.monotonic() - held[0] < 7.5:
                await pilot.pause(0.25)
                app.force_render()
                assert "hung?" not in panel_text(app, TargetHeader), panel_text(app, TargetHeader)
            assert len(h.stats.steps) == n0  # nothing was read meanwhile
            await wait_for(pilot, lambda: len(h.stats.steps) > n0 + 500, timeout=20, what="the backlog read")
    finally:
        eng.stop()


def _read_for(fd: int, seconds: float) -> bytes:
    out: list[bytes] = []
    drain_pty(fd, seconds, out)
    return b"".join(out)


def test_a_monitor_stopped_for_seconds_does_not_call_its_live_engine_hung(tmp_path: Path) -> None:
    """The monitor stopped (SIGSTOP, as Ctrl-Z and ``fg`` do, or a CPU it waits seconds
    for), its engine stepping on: resumed, it read "hung? no heartbeat for 10 s" while the
    engine's records waited in its socket.  The silence it may report is only what its
    reader saw (``READER_ALIVE_S``); a truly stopped engine still reads hung (above)."""
    eng = start_engine([str(LOOP_ENGINE), "--duration", "120", "--rate", "200", "--no-warm",
                        "--snapshots", str(tmp_path)])  # fmt: skip
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    mon = subprocess.Popen([sys.executable, "-m", "rltperf_tui.cli", "attach", eng.target],
                           stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                           env=dict(os.environ, PYTHONPATH=str(ROOT), TERM="xterm-256color"))  # fmt: skip
    os.close(slave)
    try:
        seen = b""
        deadline = time.monotonic() + 60
        while b"step p50" not in seen and time.monotonic() < deadline:
            seen += _read_for(master, 0.5)
        assert b"step p50" in seen, seen[-2000:]
        _read_for(master, 1.5)
        os.kill(mon.pid, signal.SIGSTOP)
        time.sleep(HUNG_AFTER_S + 3.0)
        os.kill(mon.pid, signal.SIGCONT)
        after = _read_for(master, 3.0)
        assert b"step p50" in after or len(after) > 1000, after[-2000:]  # it draws again
        assert b"hung?" not in after, after[-2000:]
        os.write(master, b"q")
        assert mon.wait(15) == 0
    finally:
        if mon.poll() is None:
            mon.kill()
            mon.wait(5)
        os.close(master)
        eng.stop()
