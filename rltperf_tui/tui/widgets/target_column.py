"""One target's column: the header above two stacks of panels.

At 100 cells or wider the two stacks sit side by side (class ``-wide``); narrower
they stack in one scrollable column, header and timeline first.  The column decides
from its own width, so several targets side by side each pick what fits.
"""

from __future__ import annotations

from textual import events
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.css.query import NoMatches

from rltperf_tui.live.view import ViewSize
from rltperf_tui.tui.widgets.captures import CapturesPanel
from rltperf_tui.tui.widgets.containers import BlankVertical
from rltperf_tui.tui.widgets.device import DevicePanel, gap_rows
from rltperf_tui.tui.widgets.latency import LatencyPanel
from rltperf_tui.tui.widgets.loops import LoopsPanel
from rltperf_tui.tui.widgets.panel import Panel, PanelContext
from rltperf_tui.tui.widgets.queue_kv import QueuePanel
from rltperf_tui.tui.widgets.roofline_panel import RooflinePanel
from rltperf_tui.tui.widgets.server_metrics import ServerMetricsPanel
from rltperf_tui.tui.widgets.server_totals import ServerTotalsPanel
from rltperf_tui.tui.widgets.server_trends import ServerTrendsPanel, trend_cells
from rltperf_tui.tui.widgets.step_timeline import StepTimeline, timeline_columns
from rltperf_tui.tui.widgets.target_header import TargetHeader

WIDE_AT = 100
"""Column width (cells) from which the panels go in two stacks."""


class TargetColumn(VerticalScroll):
    """Every panel of one target."""

    DEFAULT_CSS = """
    TargetColumn { width: 1fr; height: 1fr; }
    """

    def __init__(self, index: int, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.index = index
        """Position of the target in the app's target list."""
        self._panels: list[Panel] | None = None
        self._sized: tuple[StepTimeline, DevicePanel, ServerTrendsPanel] | None = None
        """The panels whose sizes make the ``ViewSize`` (found once: a query a tick cost
        0.17 ms a scrape on a metrics target)."""

    @property
    def BLANK(self) -> bool:  # type: ignore[override]  # Textual's name
        """Blank (see ``containers``) unless it draws the border between targets (``-follow``)."""
        return not self.has_class("-follow")

    def compose(self) -> ComposeResult:
        yield TargetHeader(classes="panel")
        with BlankVertical(classes="panes"):
            with BlankVertical(classes="stack left"):
                yield ServerMetricsPanel(classes="panel metrics-only")
                yield StepTimeline(classes="panel")
                yield LatencyPanel(classes="panel")
                yield DevicePanel(classes="panel")
            with BlankVertical(classes="stack right"):
                yield ServerTotalsPanel(classes="panel metrics-only")
                yield RooflinePanel(classes="panel")
                yield LoopsPanel(classes="panel")
                yield QueuePanel(classes="panel")
                yield CapturesPanel(classes="panel")
        yield ServerTrendsPanel(classes="panel metrics-only")

    def on_resize(self, event: events.Resize) -> None:
        self.set_class(event.size.width >= WIDE_AT, "-wide")

    def on_mount(self) -> None:
        self.set_class(self.size.width >= WIDE_AT, "-wide")

    def view_size(self) -> ViewSize:
        """The sizes this column's panels draw at now (defaults for one not laid out)."""
        d = ViewSize()
        if self._sized is None:
            try:
                self._sized = (
                    self.query_one(StepTimeline),
                    self.query_one(DevicePanel),
                    self.query_one(ServerTrendsPanel),
                )
            except NoMatches:  # not composed yet, or being taken down
                return d
        tl, dev, tr = (p.inner_size() for p in self._sized)
        return ViewSize(
            timeline_cols=timeline_columns(tl.width) if tl.width > 0 else d.timeline_cols,
            idle_gap_rows=gap_rows(dev.height) if dev.height > 0 else d.idle_gap_rows,
            trend_cols=trend_cells(tr.width) if tr.width > 0 else d.trend_cols,
        )

    def show(self, ctx: PanelContext) -> None:
        """Hand the tick's data to every panel shown."""
        if self._panels is None:
            self._panels = list(self.query(Panel))
        # A metrics endpoint (vllm+http://) sends no step records: its column shows the
        # server-metrics panel instead of the step-based ones (class -metrics in app.tcss).
        metrics_only = ctx.stats.metrics_only
        if metrics_only != self.has_class("-metrics"):
            self.set_class(metrics_only, "-metrics")
        for panel in self._panels:
            if panel.display:
                panel.show(ctx)
