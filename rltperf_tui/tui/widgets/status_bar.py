"""The one-line bar at the top: mode, window, capture length N, pause and recording state.

A ``Panel`` without a border: its one row is framed by ``Panel.render_lines`` (styles
resolved once), not by Textual's styles cache.  While the display is paused the bar is
the only thing that changes ("+N records arrived", at each render tick), and drawing it
through Textual's ``Content`` path cost ~1.5 ms a tick, most of the paused screen's
update (``rltperf bench ingest``'s monitor, paused in a 160x48 pane).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rltperf_tui.live.own_wait import WAIT_SPAN_S, OwnWait
from rltperf_tui.tui.widgets._fmt import Lines, Row, fit_row
from rltperf_tui.tui.widgets.panel import Panel


@dataclass
class StatusInfo:
    """What the status bar shows."""

    mode: str = "live"
    """``live`` or a replay description: position / length in the recording, speed and
    state (``replay 00:12.3 / 01:05.0 · 2× ▶``)."""
    targets: int = 1
    """Targets attached."""
    window_s: float = 10.0
    """Statistics window, seconds."""
    held_s: float | None = None
    """The shortest span a target's window covers when its step ring holds less than the
    window (a stream faster than the ring keeps: ``Window.ring_cut``); None: all whole."""
    refresh_hz: float = 2.0
    """Render ticks per second."""
    capture_steps: int = 8
    """Capture length N."""
    paused: bool = False
    """Display paused (data still arriving)."""
    paused_records: int = 0
    """Records that arrived since the display was paused."""
    recording: int = 0
    """Recordings being written."""
    captures_active: str = ""
    """Short text about captures in flight (``ops 3/8``)."""
    cpu_wait_s: float | None = None
    """Seconds the monitor's own drawing thread waited for a CPU over the last
    ``own_wait.WAIT_SPAN_S`` (None: too little to mention, or unknown): the screen is
    late by the machine's load, not by the engine (``rltperf_tui.live.own_wait``)."""


class StatusBar(Panel):
    """Mode, window, N, pause and recording in one line (always visible, even at 80x24)."""

    DEFAULT_CSS = """
    StatusBar {
        dock: top;
        height: 1;
        padding: 0 1;
        background: $panel;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.info = StatusInfo()
        self.own_wait = OwnWait()

    def show_status(self, info: StatusInfo) -> None:
        """Repaint with ``info`` when it changed (the row, when its text changed); live,
        the bar adds the monitor's own wait for a CPU, sampled at each call (each render
        tick)."""
        if info.cpu_wait_s is None and info.mode == "live":  # a replay's pace is its own
            info = replace(info, cpu_wait_s=self.own_wait.shown())
        if info != self.info or self._built_for == (0, 0):  # (never built: not placed when sized)
            self.info = info
            self._rebuild()

    def rows(self) -> list[Row]:
        """The bar's one row (``Panel`` cuts it to the width at a word boundary with "…":
        the CSS ellipsis would cut "+12,345 records" to "+12,3…")."""
        i = self.info
        ln = Lines()
        ln.add("rltperf ", "bold $accent")
        ln.add(i.mode, "bold")
        if i.targets > 1:
            ln.add(f" · {i.targets} targets", "$text-muted")
        ln.add(f" · window {i.window_s:g} s", "$text-muted")
        if i.held_s is not None:  # the panels then cover less: say so where the window is named
            ln.add(f" (ring holds {i.held_s:.1f} s)", "bold $warning")
        ln.add(f" · {i.refresh_hz:g} Hz", "$text-muted")
        if i.cpu_wait_s is not None:  # next to the refresh rate: the refresh is late
            ln.add(f" · late: CPU wait {i.cpu_wait_s:.1f} s in {WAIT_SPAN_S:g} s", "bold $warning")
        ln.add(" · capture ", "$text-muted").add(f"N={i.capture_steps}", "bold")
        if i.captures_active:
            ln.add(" " + i.captures_active, "bold $warning")
        if i.paused:
            ln.add("  ❚❚ DISPLAY PAUSED ", "bold reverse $warning")
            ln.add(f" +{i.paused_records:,} records arrived (space resumes)", "$text-muted")
        if i.recording:
            ln.add("  ● REC", "bold $error")
            if i.recording > 1:
                ln.add(f" x{i.recording}", "bold $error")
        return ln.rows()[:1]

    def shown_text(self) -> str:
        """The row's text as shown at the bar's width, cut where ``Panel`` cuts it (tests read it)."""
        row = self.rows()[0]
        width = self.content_size.width
        fitted = fit_row(row, width) if width > 0 else None
        return "".join(t for t, _ in (fitted or row))
