"""The base of every panel, and the per-target context the render tick hands them.

A panel keeps the newest ``PanelContext`` and draws itself from it in ``render()``, so
a resize redraws at the new width without new data, and an update is one ``refresh()``
(no layout pass: panel heights are fixed in ``app.tcss``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from textual.content import Content
from textual.widget import Widget

if TYPE_CHECKING:
    from rltperf_tui.aggregator import TargetStats, Window


@dataclass
class PanelContext:
    """What one render tick knows about one target."""

    target: str
    """The target as the user gave it."""
    stats: TargetStats
    """The target's aggregator."""
    window: Window
    """Statistics over the last ``window_s`` seconds of data time."""
    window_s: float
    """Length of the statistics window, seconds."""
    timeline_s: float = 30.0
    """Length of the step-timeline chart, seconds."""
    slo_ttft_ms: float | None = None
    """TTFT SLO for goodput, ms."""
    slo_tpot_ms: float | None = None
    """TPOT SLO for goodput, ms."""
    capture_steps: int = 8
    """Capture length N the keys ask for."""
    live: bool = True
    """False for a recording being replayed."""
    supports_capture: bool = True
    """Whether the adapter can run captures."""
    note: str = ""
    """A line about the target from the command (e.g. the demo engine's pid and log)."""
    mono_now: float = 0.0
    """Monitor ``time.monotonic()`` at this tick (elapsed times of exports)."""
    exporting_seen: dict[str, float] = field(default_factory=dict)
    """Capture id -> monitor monotonic time its export was first seen."""
    recording: str | None = None
    """Path of the recording being written for this target, if any."""
    replay: str | None = None
    """Replay state text (speed, paused), for recordings."""


class Panel(Widget):
    """A titled box drawn from the latest ``PanelContext``."""

    DEFAULT_CSS = """
    Panel {
        height: auto;
        padding: 0 1;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.ctx: PanelContext | None = None

    def panel_title(self, ctx: PanelContext) -> str:
        """The border title: the statistic and its window."""
        return ""

    def show(self, ctx: PanelContext) -> None:
        """Take new data and repaint (no layout)."""
        self.ctx = ctx
        t = self.panel_title(ctx)
        if t != self.border_title:
            self.border_title = t
        self.refresh()

    def body(self, ctx: PanelContext, width: int, height: int) -> Content:
        """The panel's content for the given content size."""
        raise NotImplementedError

    def render(self) -> Content:
        if self.ctx is None:
            return Content.styled("waiting for data…", "$text-muted")
        size = self.content_size
        return self.body(self.ctx, max(10, size.width), max(1, size.height))
