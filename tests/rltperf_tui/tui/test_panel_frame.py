"""A panel frames its own content rows (``Panel.render_lines``, for the monitor's CPU):
what it hands the compositor must be exactly what Textual's styles cache would have
made of the same rows (padding, background, line filters, the border and its title),
for every row, after the data changed and after a theme change, with and without
colour.  Textual's own path is called on the same panel as the independent truth."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from textual._compositor import ChopsUpdate, CompositorUpdate
from textual.geometry import Region, Size
from textual.pilot import Pilot
from textual.strip import Strip
from textual.widget import Widget

from rltperf_tui.live.view import LifetimeView
from rltperf_tui.tui.app import MonitorApp, TargetSpec
from rltperf_tui.tui.widgets.panel import Panel
from rltperf_tui.tui.widgets.status_bar import StatusBar
from tests.rltperf_tui.tui._uihelpers import (
    drawn_at_final_size,
    paused_with_records_arriving,
    replay_finished,
    replay_spec,
    sync,
    wait_for,
)
from tests.rltperf_tui.tui.test_server_view import vllm_spec


def _segments(strips: list[Strip]) -> list[list[tuple[str, object]]]:
    return [[(s.text, s.style) for s in strip] for strip in strips]


def _check_every_panel(app: MonitorApp) -> int:
    """Every shown panel's rows, whole and cropped, against Textual's; returns the panels
    checked."""
    checked = 0
    for panel in app.query(Panel):
        if not panel.display or panel.outer_size.area == 0:
            continue
        w, h = panel.outer_size
        for crop in (Region(0, 0, w, h), Region(3, 1, max(1, w - 7), max(1, h - 2))):
            ours = panel.render_lines(crop)
            panel._styles_cache.clear()  # Textual's path from scratch, not from its cache
            theirs = Widget.render_lines(panel, crop)
            assert _segments(ours) == _segments(theirs), (type(panel).__name__, crop)
        checked += 1
    return checked


@contextlib.asynccontextmanager
async def _drawn(spec: TargetSpec) -> AsyncIterator[tuple[MonitorApp, Pilot[int]]]:
    """The monitor on ``spec`` (a 140x44 headless screen), its data in and drawn."""
    app = MonitorApp([spec])
    async with app.run_test(size=(140, 44)) as pilot:
        await replay_finished(pilot)
        await drawn_at_final_size(pilot)
        await pilot.pause()
        yield app, pilot


def _updates_written(monkeypatch: pytest.MonkeyPatch) -> list[ChopsUpdate]:
    """The partial updates the app writes from now on (a headless app writes nothing)."""
    updates: list[ChopsUpdate] = []

    def display(app: MonitorApp, screen: object, renderable: object) -> None:
        if isinstance(renderable, ChopsUpdate):
            updates.append(renderable)

    monkeypatch.setattr(MonitorApp, "_display", display)
    return updates


def _written_line(update: ChopsUpdate, y: int) -> str:
    """Screen row ``y`` as ``update`` holds it (its chops, left to right)."""
    return "".join(strip.text for _, strip in sorted(update.chops[y].items()) if strip is not None)


def _show_other_figures(app: MonitorApp, panels: list[Panel]) -> None:
    """Show each panel other figures: a shorter window, nothing scraped yet, a note."""
    short = app.handles[0].stats.window(1.0)
    for panel in panels:
        ctx = panel.ctx
        assert ctx is not None
        stats = replace(ctx.stats, records=ctx.stats.records + 12345, metrics=None, trends=None,
                        lifetime=LifetimeView())  # fmt: skip
        panel.show(replace(ctx, window=short, stats=stats, note="changed"))


@pytest.mark.parametrize("no_color", [False, True])
@sync
async def test_framed_rows_equal_textuals_own_on_the_step_and_server_views(
    no_color: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if no_color:
        monkeypatch.setenv("NO_COLOR", "1")
    for spec in (replay_spec(), vllm_spec("a")):
        async with _drawn(spec) as (app, pilot):
            assert _check_every_panel(app) >= 5
            # new data: every panel shows another context; no row may come from the old one
            for panel in app.query(Panel):
                if panel.ctx is not None:
                    panel.show(replace(panel.ctx, window_s=panel.ctx.window_s * 3, note="changed"))
            await pilot.pause()
            assert _check_every_panel(app) >= 5
            # another theme: the background and the colours of every row change
            app.theme = "textual-light" if app.theme != "textual-light" else "nord"
            await pilot.pause()
            await pilot.pause()
            assert _check_every_panel(app) >= 5


@sync
async def test_a_changed_row_reaches_the_terminal_without_being_copied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A panel marks each changed row dirty across its whole width, padding included.

    The compositor writes a row that lies wholly inside the dirty span as it is, but
    copies a wider one into a new strip cut to the span (``Strip.crop``) and renders the
    copy afresh: with the content's width alone, every changed row of every tick was
    copied (18 a tick at 1,000 steps/s)."""
    crops: list[tuple[int, int]] = []
    crop = Strip.crop

    def counted(self: Strip, start: int, end: int | None = None) -> Strip:
        if end is None or end > start:  # (Textual also cuts an empty strip for a chop
            crops.append((start, -1 if end is None else end))  # that starts where the span ends)
        return crop(self, start, end)

    written: list[int] = []

    def display(app: MonitorApp, screen: object, renderable: object) -> None:
        # a headless app writes nothing: make the terminal sequence as a terminal's would
        if isinstance(renderable, CompositorUpdate):
            written.append(len(renderable.render_segments(app.console)))

    monkeypatch.setattr(MonitorApp, "_display", display)
    for spec in (replay_spec(), vllm_spec("a")):
        async with _drawn(spec) as (app, pilot):
            panels = [p for p in app.query(Panel) if p.display and p.ctx is not None and p.outer_size.area]
            assert len(panels) >= 3
            monkeypatch.setattr(Strip, "crop", counted)
            for panel in panels:  # new data: rows change in every panel shown
                assert panel.ctx is not None
                panel.show(replace(panel.ctx, window_s=panel.ctx.window_s * 3, note="changed"))
            # a panel framed by itself marks its rows on the screen (``Panel._repaint_rows``)
            changed = sum(len(p._repaint_regions) for p in panels) + len(app.screen._repaint_regions)
            written.clear()
            await pilot.pause()
            await pilot.pause()
            monkeypatch.setattr(Strip, "crop", crop)
            assert changed > 0 and sum(written) > 0
            assert crops == [], f"{len(crops)} rows copied to fit the dirty span, of {changed} changed"


@sync
async def test_the_changed_rows_of_every_panel_reach_the_terminal_at_the_next_update(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows that changed in several panels at one tick are written at the next screen
    update, each across its panel's whole width, with the panel's new text.

    The panels mark their changed rows on the screen, in screen coordinates (one request
    per tick instead of a refresh per panel): a row placed one line off, or cut to the
    content's width, would leave the old text on the terminal.  The truth is what the
    panel draws for that row now, read back from the update written."""
    updates = _updates_written(monkeypatch)
    for spec in (replay_spec(), vllm_spec("a")):
        async with _drawn(spec) as (app, pilot):
            panels = [p for p in app.query(Panel) if p.display and p.ctx is not None and p.outer_size.area]
            assert len(panels) >= 3
            before = {p: list(p._lines) for p in panels}
            _show_other_figures(app, panels)
            expected: dict[int, tuple[Panel, int, int]] = {}  # screen row -> panel, first column, width
            for panel in panels:
                region = app.screen.find_widget(panel).region
                top = region.y + panel.content_offset.y
                for y, row in enumerate(panel._lines):
                    if row != before[panel][y]:
                        expected[top + y] = (panel, region.x, region.width)
            assert len({p for p, _, _ in expected.values()}) >= 3  # rows changed in several panels
            updates.clear()
            await pilot.pause()
            await pilot.pause()
            assert updates, "no screen update after the panels changed"
            update = updates[0]
            for y, (panel, x, width) in expected.items():
                spans = [(x1, x2) for sy, x1, x2 in update.spans if sy == y]
                assert any(x1 <= x and x + width <= x2 for x1, x2 in spans), (type(panel).__name__, y, spans)
                line = _written_line(update, y)
                py = y - app.screen.find_widget(panel).region.y
                drawn = panel.render_lines(Region(0, py, width, 1))[0].text
                assert line[x : x + width] == drawn, (type(panel).__name__, y)


@sync
async def test_rows_and_a_new_title_changed_in_one_frame_all_reach_the_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A panel whose title alone changed marks its own top row (the screen takes it among
    the widgets to update); then, before the screen updates, other panels' rows change
    and are marked on the screen.  The terminal must get both.

    Marking rows with ``Screen.refresh`` set the screen's own repaint flag, and an update
    with that flag set takes the screen's regions alone and drops every widget marked
    dirty before it in that frame: the title stayed old on the terminal."""
    updates = _updates_written(monkeypatch)
    async with _drawn(vllm_spec("a")) as (app, pilot):
        panels = [p for p in app.query(Panel) if p.display and p.ctx is not None and p.outer_size.area]
        assert len(panels) >= 3
        titled, *others = panels
        updates.clear()
        titled.panel_title = lambda ctx: "a title of its own"  # type: ignore[method-assign]
        assert titled.ctx is not None
        titled.show(titled.ctx)  # the title alone changes: the panel's own refresh
        for _ in range(20):  # its idle tells the screen, which has not updated yet
            if titled in app.screen._dirty_widgets:
                break
            await asyncio.sleep(0)
        assert titled in app.screen._dirty_widgets and not updates
        _show_other_figures(app, others)  # rows change, marked on the screen
        await pilot.pause()
        await pilot.pause()
        rows = {y for u in updates for y, _, _ in u.spans}
        for panel in others:
            region = app.screen.find_widget(panel).region
            assert rows & set(range(region.y, region.bottom)), type(panel).__name__
        region = app.screen.find_widget(titled).region
        written = [
            _written_line(u, region.y)
            for u in updates
            if any(y == region.y and x1 <= region.x and region.right <= x2 for y, x1, x2 in u.spans)
        ]
        assert written and "a title of its own" in written[-1], written


@sync
async def test_a_new_title_repaints_the_top_row_alone() -> None:
    """A panel whose title changed (e.g. a window's length after ``[``) marks its top border row dirty, not the whole panel as Textual's
    title setter does, and that row is drawn with the new title as Textual draws it."""
    async with _drawn(vllm_spec("a")) as (app, pilot):
        panels = [p for p in app.query(Panel) if p.display and p.ctx is not None and p.outer_size.area]
        assert len(panels) >= 3
        for n, panel in enumerate(panels):
            assert panel.ctx is not None
            title = f"new title {n}"
            panel.panel_title = lambda ctx, title=title: title  # type: ignore[method-assign]
            panel.show(panel.ctx)
            assert panel.border_title == title
            assert panel._repaint_regions == {Region(0, 0, panel.outer_size.width, 1)}, type(panel).__name__
        await pilot.pause()
        await pilot.pause()
        assert _check_every_panel(app) == len(panels) + 1  # and the status bar (no data of its own)
        for n, panel in enumerate(panels):
            top = panel.render_lines(Region(0, 0, panel.outer_size.width, 1))[0].text
            assert f"new title {n}" in top, top


@sync
async def test_a_paused_display_writes_the_status_row_framed_by_the_bar_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Paused, with records arriving, the status bar's "+N records arrived" is what changes
    at each tick.  Its row reaches the terminal with the new count, framed by the bar
    itself (``Panel.render_lines``, styles resolved once) and never through Textual's
    styles cache: that path cost ~1.5 ms a tick, most of a paused screen's update."""
    from textual._styles_cache import StylesCache

    through_textual: list[str] = []
    render_widget = StylesCache.render_widget

    def spy(self: StylesCache, widget: Widget, crop: Region) -> list[Strip]:
        through_textual.append(type(widget).__name__)
        return render_widget(self, widget, crop)

    updates = _updates_written(monkeypatch)
    app = MonitorApp([replay_spec(speed=1.0)])
    async with app.run_test(size=(120, 30)) as pilot:
        bar = await paused_with_records_arriving(pilot)
        monkeypatch.setattr(StylesCache, "render_widget", spy)
        updates.clear()
        seen = bar.info.paused_records
        await wait_for(pilot, lambda: bar.info.paused_records > seen, timeout=20, what="more records")
        await pilot.pause()
        await pilot.pause()
        monkeypatch.setattr(StylesCache, "render_widget", render_widget)
        rows = [_written_line(u, 0) for u in updates if u.chops[0]]
        assert any(f"+{bar.info.paused_records:,} records arrived" in r for r in rows), rows
        assert "StatusBar" not in through_textual, through_textual


@sync
async def test_after_the_terminal_shrinks_and_grows_back_every_panel_draws_at_its_new_size() -> None:
    """A panel keeps its content size between layouts (``Panel.inner_size``: Textual's
    ``content_size`` looks the panel up in the screen's map, ~18 µs a call, 19 calls a
    render tick).  After the terminal shrinks and after it grows back, every shown
    panel's kept size, the size its rows were built for, and its rows are Textual's own."""
    app = MonitorApp([replay_spec()])
    async with app.run_test(size=(140, 44)) as pilot:
        await replay_finished(pilot)
        for w, h in ((100, 30), (140, 44)):
            await pilot.resize_terminal(w, h)
            await pilot.pause(0.3)
            await drawn_at_final_size(pilot)
            await pilot.pause()
            for panel in app.query(Panel):
                if panel.display and panel.outer_size.area:
                    size = panel.content_size
                    assert (panel.inner_size(), panel._built_for) == (size, (size.width, size.height)), (
                        type(panel).__name__, (w, h))  # fmt: skip
            assert _check_every_panel(app) >= 5


@sync
async def test_a_panel_asked_its_size_before_the_layout_placed_it_still_draws(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A panel may learn its outer size before the screen's map holds it: Textual's
    ``content_size`` is then 0x0 (seen in the TUI tests: the device panel at 119x10, the
    step timeline at 58x9, …).  That answer must not stick: every panel, the status bar
    included, still draws its rows, not "waiting for data…" and not a blank bar.  Here
    each panel's first ``content_size`` at a nonzero outer size is 0x0, as in that race."""
    real = Widget.content_size
    asked: set[int] = set()

    def content_size(self: Panel) -> Size:
        if self.outer_size.area > 0 and id(self) not in asked:
            asked.add(id(self))
            return Size(0, 0)
        return real.fget(self)  # type: ignore[attr-defined,no-any-return]

    monkeypatch.setattr(Panel, "content_size", property(content_size))
    async with _drawn(replay_spec()) as (app, pilot):
        await pilot.pause(0.6)  # a render tick or so
        shown = [p for p in app.query(Panel) if p.display and p.outer_size.area > 0]
        assert len(shown) >= 5 and asked >= {id(p) for p in shown}
        for panel in shown:
            w, h = panel.outer_size
            text = "\n".join(strip.text for strip in panel.render_lines(Region(0, 0, w, h)))
            assert "waiting for data" not in text and text.strip(), (type(panel).__name__, text)
        bar = app.query_one(StatusBar)
        assert "rltperf replay" in bar.render_lines(Region(0, 0, bar.outer_size.width, 1))[0].text
    # a live target that never answers: the bar's text never changes after its first
    # resize, so nothing but that resize would ever draw it
    asked.clear()
    app = MonitorApp(["tcp://127.0.0.1:9"])
    async with app.run_test(size=(140, 44)) as pilot:
        bar = app.query_one(StatusBar)
        await wait_for(pilot, lambda: id(bar) in asked, what="the bar's first size")
        await pilot.pause(1.2)  # two render ticks
        text = bar.render_lines(Region(0, 0, bar.outer_size.width, 1))[0].text
        assert "rltperf live" in text, text
