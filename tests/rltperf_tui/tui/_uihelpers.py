"""Helpers of the UI tests: the fixed recording, waiting on the app, reading panels."""

from __future__ import annotations

import asyncio
import functools
import os
import select
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from textual.pilot import Pilot

from engine_adapters.monitor.replay import ReplayAdapter
from rltperf_tui.tui.app import MonitorApp, TargetSpec
from rltperf_tui.tui.widgets.panel import Panel
from rltperf_tui.tui.widgets.status_bar import StatusBar
from rltperf_tui.tui.widgets.target_column import TargetColumn

DATA = Path(__file__).resolve().parent / "data"
RECORDING = DATA / "demo.rltrec"
RECORDING_NAME = "tests/rltperf_tui/tui/data/demo.rltrec"
"""The target string shown on screen (stable wherever the checkout lives)."""


def replay_spec(speed: float = 0.0, name: str = RECORDING_NAME) -> TargetSpec:
    """The fixed recording as a target, shown under a stable name."""
    adapter = ReplayAdapter(str(RECORDING), speed=speed)
    return TargetSpec(target=name, adapter=adapter, session=adapter.connect())


async def wait_for(
    pilot: Pilot[int], cond: Callable[[], bool], timeout: float = 30.0, what: str = ""
) -> None:
    """Let the app run until ``cond()`` holds (fails the test after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what or cond}")
        await pilot.pause(0.1)


def panel_text(app: MonitorApp, cls: type[Panel], index: int = 0) -> str:
    """The plain text a panel of target ``index`` shows now."""
    col = app.query_one(f"#target-{index}")
    panel = col.query_one(cls)
    return panel.render_text()


async def drawn_at_final_size(pilot: Pilot[int]) -> None:
    """Wait until every target's panels show a view computed for their present sizes (the
    layout can still be settling after the first frames: a view computed before a resize
    is drawn until the resize's new view arrives)."""
    app = pilot.app
    assert isinstance(app, MonitorApp)
    cols = [app.query_one(f"#target-{h.index}", TargetColumn) for h in app.handles]
    await wait_for(
        pilot,
        lambda: all(h.view_size == c.view_size() for h, c in zip(app.handles, cols, strict=True)),
        what="views at the panels' sizes",
    )


async def replay_finished(pilot: Pilot[int]) -> None:
    """``run_before`` for snapshots: every replay read to its end and drawn."""
    app = pilot.app
    assert isinstance(app, MonitorApp)
    await wait_for(pilot, lambda: all(h.stats.state == "ended" for h in app.handles), what="end of replay")
    await wait_for(pilot, lambda: all(h.posted == h.handled for h in app.handles), what="batches handled")
    app.force_render()
    await pilot.pause(0.2)
    await drawn_at_final_size(pilot)


async def paused_with_records_arriving(pilot: Pilot[int]) -> StatusBar:
    """Pause the display of a replay running at its recorded speed (a second in) and wait
    until the status bar counts records that arrived since; the bar."""
    await pilot.pause(1.0)
    await pilot.press("space")
    bar = pilot.app.query_one(StatusBar)
    # records keep arriving while the display is paused (a loaded machine: wait for them)
    await wait_for(pilot, lambda: bar.info.paused and bar.info.paused_records > 0, timeout=20,
                   what="records counted while paused")  # fmt: skip
    return bar


def sync(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test in its own event loop (no pytest-asyncio needed); fixtures pass
    through by name."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return wrapper


def drain_pty(fd: int, seconds: float, out: list[bytes]) -> None:
    """Read a monitor's terminal for ``seconds`` into ``out``, or until it closes (a child
    blocked on a full pty would not be drawing or quitting)."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        r, _, _ = select.select([fd], [], [], left)
        if r:
            try:
                data = os.read(fd, 65536)
            except OSError:
                return
            if not data:
                return
            out.append(data)


def record_in_pty(pid: int, fd: int, out: list[bytes], rec_dir: Path, timeout: float = 90.0) -> None:
    """The monitor ``pid`` in the pty ``fd``: wait until it is connected and counting
    records, press ``r``, and wait for its recording file in ``rec_dir``."""
    deadline = time.monotonic() + timeout
    while b"records" not in b"".join(out[-50:]) or b"connected" not in b"".join(out):
        assert time.monotonic() < deadline, b"".join(out)[-2000:].decode(errors="replace")
        assert os.waitpid(pid, os.WNOHANG) == (0, 0), b"".join(out)[-2000:].decode(errors="replace")
        drain_pty(fd, 0.2, out)
    os.write(fd, b"r")
    while not list(rec_dir.glob("*.rltrec")):
        assert time.monotonic() < deadline, "no recording started"
        drain_pty(fd, 0.2, out)
