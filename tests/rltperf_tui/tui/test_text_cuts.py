"""Text cut to fit a panel is cut at a word or element boundary and marked with "…":
never inside a number (the step-timeline legend once showed "forward 0.3…" and
"exit_check 1.…").  Over the fixed recording of the reference engine, at both
snapshot sizes."""

from __future__ import annotations

import re

import pytest
from textual.widgets._footer import FooterKey

from rltperf_tui.tui.app import MonitorApp
from rltperf_tui.tui.widgets.panel import Panel
from rltperf_tui.tui.widgets.step_timeline import StepTimeline
from tests.conftest import free_ports
from tests.rltperf_tui.tui._uihelpers import (
    paused_with_records_arriving,
    replay_finished,
    replay_spec,
    sync,
    wait_for,
)

CUT_NUMBER = re.compile(r"[\d.]…")


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
@sync
async def test_no_panel_line_cuts_a_number(size: tuple[int, int]) -> None:
    app = MonitorApp([replay_spec()])
    async with app.run_test(size=size) as pilot:
        await replay_finished(pilot)
        shown: list[str] = []
        cut = 0
        for panel in app.query(Panel):
            for y in range(panel.size.height):
                line = panel.render_line(y).text
                shown.append(line)
                assert len(line.rstrip()) <= panel.size.width, (type(panel).__name__, line)
                assert not CUT_NUMBER.search(line), (type(panel).__name__, line)
                cut += "…" in line
        assert cut, "nothing was cut at this size: the test would prove nothing"
        # the legend's items are whole: each "name number" pair a stage really has
        tl = app.query_one(StepTimeline)
        legend = [tl.render_line(y).text for y in range(tl.size.height)]
        legend = [ln for ln in legend if "ms/step" in ln or ln.startswith(" " * 9 + "█")]
        items = re.findall(r"█ (\w+) ([\d.]+)(?=  |$| *…|\s*$)", "\n".join(legend))
        assert items, legend
        full = tl.render_text()
        for name, value in items:
            assert f"{name} {value}" in full


@sync
async def test_status_bar_never_cuts_a_number() -> None:
    """The always-visible status bar, display paused with records arriving, at every
    other width from 60 to 110: a cut is at a word boundary ("+12,3…" was possible)."""
    app = MonitorApp([replay_spec(speed=1.0)])
    async with app.run_test(size=(80, 24)) as pilot:
        sb = await paused_with_records_arriving(pilot)
        cuts = 0
        for w in range(60, 111, 2):
            await pilot.resize_terminal(w, 24)
            await pilot.pause(0.05)
            app.force_render()
            line = sb.render_line(0).text.rstrip()
            assert not re.search(r"[\d.,]…", line), (w, line)
            cuts += line.endswith("…")
        assert cuts, "the bar never overflowed: the test proves nothing"


@pytest.mark.parametrize("width", [80, 60])
@pytest.mark.parametrize("kind", ["live", "replay"])
@sync
async def test_the_quit_and_help_keys_are_whole_in_a_narrow_footer(kind: str, width: int) -> None:
    """In a narrow terminal (80 columns: a default SSH terminal; 60), for a live target
    (the record key shown) and a replay (play, faster, slower shown), ``? help`` and
    ``q quit`` are on screen whole and nothing covers them: they once sat last, the
    command palette's hint docked over them ("q qu" at 80 columns)."""
    spec = replay_spec() if kind == "replay" else f"tcp://127.0.0.1:{free_ports()}"
    app = MonitorApp([spec], wait=True)
    async with app.run_test(size=(width, 24)) as pilot:

        def keys_shown() -> list[FooterKey]:
            return [k for k in app.query(FooterKey) if k.display and k.region.width > 0]

        # the footer's keys come after its first layout: on a loaded .ci/run none was
        # there after a fixed 0.5 s; then 0.5 s more for anything that would dock over them
        await wait_for(pilot, lambda: {"quit", "help"} <= {k.action for k in keys_shown()}, what="the footer")
        await pilot.pause(0.5)
        shown = keys_shown()
        by_action = {k.action: k for k in shown}
        for action in ("quit", "help"):
            assert action in by_action, sorted(by_action)
            region = by_action[action].region
            assert region.right <= width, (action, region)
            covering = [k.action for k in shown if k is not by_action[action] and k.region.overlaps(region)]
            assert not covering, (action, covering)
