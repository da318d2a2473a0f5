"""Panels called as functions: ``body(ctx, width, height)`` of a panel built outside any
app, on a ``PanelContext`` of plain values (``rltperf_tui.live.view.stats_view``) made
from records written by hand or read from the fixed recordings.  A panel reads nothing
but its input: the same context draws the same lines, and what the model learns after
the view was built never shows through it."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec

from engine_adapters.definitions.records import FLAG_PROFILED, MetricsSample, Record, SessionEvent, Stats
from engine_adapters.monitor.recording import read_all
from engine_adapters.monitor.replay import ReplayAdapter
from rltperf_tui.live.aggregator import TargetStats
from rltperf_tui.live.driver import LiveTarget, TargetSpec
from rltperf_tui.live.view import ViewSize, stats_view
from rltperf_tui.tui.widgets._fmt import STAGE_GLYPHS, ms, si
from rltperf_tui.tui.widgets.captures import CapturesPanel
from rltperf_tui.tui.widgets.device import DevicePanel, gap_rows
from rltperf_tui.tui.widgets.latency import LatencyPanel
from rltperf_tui.tui.widgets.loops import LoopsPanel
from rltperf_tui.tui.widgets.panel import Panel, PanelContext
from rltperf_tui.tui.widgets.roofline_panel import RooflinePanel
from rltperf_tui.tui.widgets.server_metrics import ServerMetricsPanel
from rltperf_tui.tui.widgets.server_totals import ServerTotalsPanel
from rltperf_tui.tui.widgets.step_timeline import StepTimeline, timeline_columns
from tests.rltperf_tui.test_aggregator import MS, _hello, _steps

DATA = Path(__file__).resolve().parent / "data"


def _text(panel: Panel, ctx: PanelContext, width: int, height: int) -> str:
    return "\n".join("".join(t for t, _ in row) for row in panel.body(ctx, width, height).rows())


def _ctx(st: TargetStats, size: ViewSize | None = None, **kw: Any) -> PanelContext:
    """This tick's context of ``st`` (a 10 s window, a 30 s timeline)."""
    return PanelContext(
        target="t", stats=stats_view(st, 10.0, 30.0, size), window=st.window(10.0), window_s=10.0, **kw
    )


def _stats(*batches: list[Record]) -> TargetStats:
    st = TargetStats()
    st.add([_hello(), SessionEvent(state="connected")])
    for b in batches:
        st.add(b)
    return st


def test_latency_panel_is_a_function_of_its_view():
    st = _stats(_steps(100, 10, 0))  # 10 ms steps back to back over 1 s
    ctx = _ctx(st)
    panel = LatencyPanel()
    text = _text(panel, ctx, 80, 8)
    assert text == _text(panel, ctx, 80, 8)
    step_row = next(ln for ln in text.splitlines() if ln.startswith("step"))
    assert step_row.split()[1:4] == ["10.0", "10.0", "10.0"] and "100 steps 100/s" in step_row
    # the model moves on: the view drawn before does not (no half-updated model on screen)
    st.add(_steps(100, 20, 0, start_id=100, t0=1000 * MS))
    assert _text(panel, ctx, 80, 8) == text
    new_row = next(ln for ln in _text(panel, _ctx(st), 80, 8).splitlines() if ln.startswith("step"))
    assert new_row.split()[3] == "20.0"  # p99 of the newer steps
    assert panel.panel_title(_ctx(st)).endswith("last 10 s")


def test_latency_title_says_when_the_ring_holds_less_than_the_window():
    st = TargetStats(capacity=1024)
    st.add([_hello(), SessionEvent(state="connected"), *_steps(3000, 1, 0)])  # 3 s of 1 ms steps
    ctx = _ctx(st)
    assert ctx.window.ring_cut and ctx.window.steps == 1024
    assert LatencyPanel().panel_title(ctx) == "Latency · P50/P95/P99 · last 1.0 s: all the ring keeps"
    # the other window panels name the span they cover, not the 10 s asked for
    for panel in (DevicePanel(), RooflinePanel(), LoopsPanel()):
        assert panel.panel_title(ctx).endswith(" last 1.0 s"), panel.panel_title(ctx)
        assert panel.panel_title(_ctx(_stats(_steps(100, 10, 0)))).endswith(" last 10 s")


def test_device_panel_lists_the_gaps_of_its_view():
    first = _steps(50, 10, 0)  # ends at 500 ms
    second = _steps(45, 10, 0, start_id=50, t0=550 * MS)  # a 50 ms gap, then to 1000 ms
    st = _stats(first, second)
    height = 8
    ctx = _ctx(st, ViewSize(idle_gap_rows=gap_rows(height)))
    assert len(ctx.stats.idle_gaps) == 1
    text = _text(DevicePanel(), ctx, 80, height)
    thr = ctx.stats.idle_gap_threshold_ms
    assert thr == 1.0  # max(1 ms, 5 x the median gap of 0)
    assert f"idle gaps > {ms(thr)} ms: 1, newest first" in text
    gap_line = next(ln for ln in text.splitlines() if "after #" in ln)
    assert gap_line.split() == ["t-0.5", "s", "50.0", "ms", "after", "#49"]


def test_device_panel_says_more_when_the_view_holds_more_than_fit():
    batches = [_steps(10, 10, 0, start_id=10 * k, t0=k * 200 * MS) for k in range(6)]  # 5 gaps of 100 ms
    height = 6  # room for 2 gap lines (idle, NVML, energy and the gaps heading above them)
    st = _stats(*batches)
    ctx = _ctx(st, ViewSize(idle_gap_rows=gap_rows(height)))
    assert len(ctx.stats.idle_gaps) == 3  # 2 that fit, and one to know there are more
    text = _text(DevicePanel(), ctx, 80, height)
    assert "more than 2, newest first" in text


def test_step_timeline_draws_the_buckets_of_its_view():
    steps = _steps(100, 10, 0)
    steps[40] = msgspec.structs.replace(steps[40], flags=FLAG_PROFILED)
    st = _stats(steps)
    width, height = 80, 12
    ctx = _ctx(st, ViewSize(timeline_cols=timeline_columns(width)), timeline_s=30.0)
    tl = ctx.stats.timeline
    assert tl is not None and len(tl.step_ms) == timeline_columns(width) and tl.flagged.sum() == 1
    text = _text(StepTimeline(), ctx, width, height)
    assert "10 ms┤" in text  # the axis top: 10 ms steps
    # the legend: mean ms per step by stage (1, 8.5 and 0.5 ms: _steps' stages)
    for name, v in (("schedule", 1.0), ("forward", 8.5), ("sample", 0.5)):
        assert f"{name} {ms(v)}" in text
    assert "P profiled" in text and "P" in next(ln for ln in text.splitlines() if "gap┤" in ln)
    # without colour the stages are told apart by glyph
    mono = _text(StepTimeline(), replace(ctx, no_color=True), width, height)
    assert sum(g in mono for g in STAGE_GLYPHS[:3]) >= 2


def test_captures_panel_shows_the_captures_as_they_were_at_the_tick():
    st = _stats(_steps(10, 10, 0))
    st.note_capture_request("c1", "ops", 4)
    ctx = _ctx(st, capture_steps=4)
    st.captures["c1"].state = "saved"  # the engine's reply, after the view was built
    text = _text(CapturesPanel(), ctx, 80, 6)
    assert "armed" in text and "saved" not in text


def test_server_panels_draw_a_recorded_vllm_stream():
    path = DATA / "vllm_replica_a.rltrec"
    _, recs = read_all(path)
    adapter = ReplayAdapter(str(path), speed=0.0)
    t = LiveTarget(TargetSpec("a", session=adapter.connect(), adapter=adapter))
    deadline = time.monotonic() + 30
    while not t.ended:
        assert time.monotonic() < deadline
        t.poll(0.05)
    ctx = _ctx(t.stats)
    view = ctx.stats
    assert view.metrics_only and view.timeline is None and view.metrics is not None
    scrapes = sum(isinstance(r, MetricsSample) for r in recs)
    assert view.lifetime.samples == scrapes
    totals = ServerTotalsPanel()
    assert totals.panel_title(ctx) == "Since attach"  # fixed: the counters are its first row
    text = _text(totals, ctx, 100, 10)
    assert text.splitlines()[0].endswith(f" · {scrapes:,} scrapes"), text
    assert f"{view.lifetime.requests:,.0f} req" in text
    metrics = _text(ServerMetricsPanel(), ctx, 100, 20)
    assert metrics.startswith("tokens/s " + si(view.metrics.tokens_per_s, digits=1))


def test_a_heartbeat_only_stream_draws_without_steps():
    st = _stats([Stats(ts_ns=5 * 10**9, ring_dropped=0, sub_dropped=0, steps_total=0)])
    ctx = _ctx(st)
    assert "no steps in the last 30 s" in _text(StepTimeline(), ctx, 80, 12)
    assert "idle gaps > 1.00 ms: none" in _text(DevicePanel(), ctx, 80, 8)
