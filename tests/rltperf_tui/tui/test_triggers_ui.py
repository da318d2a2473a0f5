"""Triggers in the live monitor against a real engine with an injected stall."""

from __future__ import annotations

from pathlib import Path

import pytest

from rltperf_tui.tui.app import MonitorApp
from rltperf_tui.tui.widgets.captures import CapturesPanel
from rltperf_tui.tui.widgets.step_timeline import StepTimeline
from tests.conftest import LOOP_ENGINE, start_engine
from tests.rltperf_tui.tui._uihelpers import panel_text, replay_finished, replay_spec, sync, wait_for

pytestmark = pytest.mark.slow


@sync
async def test_a_stall_fires_the_rule_and_the_capture_names_it(tmp_path: Path) -> None:
    # 100 steps/s with a 300 ms sleep after every 150th step (the gap before the next one)
    eng = start_engine([str(LOOP_ENGINE), "--duration", "120", "--rate", "100", "--stall-ms", "300@150",
                        "--no-warm", "--snapshots", str(tmp_path)])  # fmt: skip
    try:
        app = MonitorApp([eng.target], refresh_hz=4, capture_steps=4, triggers=["gap_ms>200"],
                         trigger_cooldown_s=30)  # fmt: skip
        async with app.run_test(size=(120, 40)) as pilot:
            h = app.handles[0]
            await wait_for(pilot, lambda: any(c.trigger for c in h.stats.captures.values()), timeout=60,
                           what="a triggered capture")  # fmt: skip
            await wait_for(pilot, lambda: any(c.trigger and c.state == "saved" for c in h.stats.captures.values()),
                           timeout=90, what="its bundle")  # fmt: skip
            c = next(c for c in h.stats.captures.values() if c.trigger)
            assert c.trigger.startswith("gap_ms>200 (") and c.bundle and Path(c.bundle).is_dir()
            assert h.triggers is not None and h.triggers.captures == 1
            # the panels say so from the next render tick on (4 Hz; later on a loaded machine)
            await wait_for(pilot, lambda: "triggered by gap_ms>200" in panel_text(app, CapturesPanel),
                           what="the panel naming the trigger")  # fmt: skip
            text = panel_text(app, CapturesPanel)
            assert "triggers armed: gap_ms>200" in text and "triggered by gap_ms>200" in text
            assert "▲" in panel_text(app, StepTimeline)
            await pilot.press("t")
            await wait_for(pilot, lambda: not h.triggers.armed, what="t to disarm")
            await wait_for(pilot, lambda: "triggers disarmed" in panel_text(app, CapturesPanel),
                           what="the panel saying disarmed")  # fmt: skip
    finally:
        eng.stop()


@sync
async def test_a_recording_shows_where_rules_fire_and_captures_nothing() -> None:
    app = MonitorApp([replay_spec()], triggers=["step_ms>150"])
    async with app.run_test(size=(120, 40)) as pilot:
        await replay_finished(pilot)
        trig = app.handles[0].triggers
        assert trig is not None and trig.fires and trig.captures == 0
        assert all(f.why_not.startswith("a recording") for f in trig.fires)
        assert not [c for c in app.handles[0].stats.captures.values() if c.trigger]
