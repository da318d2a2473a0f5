"""The base of every panel, and the per-target context the render tick hands them.

A panel keeps the newest ``PanelContext`` (plain values: the target's ``StatsView`` and
``Window`` of this tick, and the screen's settings) and draws itself from it line by
line: ``body`` reads nothing else, so it can be called as a function of its input.  An
update is one ``refresh()`` (no layout pass: panel heights are fixed in ``app.tcss``); a
resize redraws what the panel has, and asks for a view at the new size (``Resized``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rich.segment import Segment
from rich.style import Style as RichStyle
from textual.color import Color
from textual.dom import NoScreen
from textual.errors import NoWidget
from textual.filter import LineFilter
from textual.geometry import Region, Size
from textual.message import Message
from textual.strip import Strip
from textual.style import Style as VisualStyle
from textual.widget import Widget

from engine_adapters.definitions.cost import Prices
from rltperf_tui.live.view import StatsView
from rltperf_tui.live.window_stats import Window
from rltperf_tui.tui.widgets._fmt import Lines, Row, fit_row

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11


@dataclass(frozen=True)
class _Frame:
    """A panel's content rows as Textual's styles cache frames them (no side border)."""

    width: int
    height: int
    top: int
    """Rows above the content (border, padding)."""
    bottom: int
    pad_left: int
    pad_right: int
    inner: RichStyle
    """The background style of padding and of the cells after a short row."""
    background: Color
    """The widget's background, for the line filters."""

    def frame(self, row: Strip, filters: Sequence[LineFilter]) -> Strip:
        """``row`` (content width) padded to the full width, then filtered."""
        inner = self.inner
        content_width = self.width - self.pad_left - self.pad_right
        segs = list(row.adjust_cell_length(content_width, inner))
        if self.pad_left:
            segs.insert(0, Segment(" " * self.pad_left, inner))
        if self.pad_right:
            segs.append(Segment(" " * self.pad_right, inner))
        strip = Strip(segs, self.width)
        for f in filters:
            strip = strip.apply_filter(f, self.background)
        return strip

    def frame_parts(self, parts: Sequence[tuple[str, RichStyle]], length: int, inner: RichStyle) -> Strip:
        """The same row as ``frame`` makes of ``Strip(parts)`` (``length`` cells, at most the
        content width, single-width text), built as one strip: ``parts`` and ``inner``
        come with their styles already filtered (``Panel._style``)."""
        segs = [Segment(" " * self.pad_left, inner)] if self.pad_left else []
        segs += [Segment(t, st) for t, st in parts]
        fill = self.width - self.pad_left - self.pad_right - length
        if fill > 0:
            segs.append(Segment(" " * fill, inner))
        if self.pad_right:
            segs.append(Segment(" " * self.pad_right, inner))
        return Strip(segs, self.width)


@dataclass(frozen=True)
class PanelContext:
    """What one render tick knows about one target: plain values, built once per tick."""

    target: str
    """The target as the user gave it."""
    stats: StatsView
    """The target's aggregate at this tick (``rltperf_tui.live.view.stats_view``)."""
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
    waiting_text: str = ""
    """Shown instead of the connection error while the target has never answered
    (the demo: "starting the engine")."""
    triggers: str | None = None
    """The trigger rules' state line (``--trigger``), or None without triggers."""
    fire_marks: tuple[int, ...] = ()
    """Probe times at which a trigger rule fired."""
    silent_s: float | None = None
    """Seconds this connected live target has sent nothing, not even its heartbeat, when
    that is longer than a heartbeat allows (hung or cut off); None otherwise.  The
    figures shown are then those of the last data, marked stale."""
    prices: Prices | None = None
    """Prices for the cost figures (``--cost-in/--cost-out/--gpu-cost-hour``), if given."""
    no_color: bool = False
    """Draw without colour (``NO_COLOR``): charts tell their parts apart by glyph."""

    @property
    def window_span(self) -> str:
        """What the window's figures cover, for a title: "last 10 s", or the shorter span
        the step ring still holds when the stream is faster than it keeps for the window
        (``Window.ring_cut``)."""
        if self.window.ring_cut:
            return f"last {self.window.span_s:.1f} s"
        return f"last {self.window_s:g} s"


_WAITING: Row = (("waiting for data…", "$text-muted"),)


class Panel(Widget):
    """A titled box drawn from the latest ``PanelContext``.

    Line API with a per-line cache: ``show()`` builds the panel's lines once, compares
    them with what is on screen and refreshes only the lines that changed; a line is
    turned into a ``Strip`` from its few (text, style) parts with styles resolved once
    per style string.  (``rltperf bench ingest`` measures the monitor at 1000 steps/s:
    repainting every line of every panel through ``Content`` at each tick cost more CPU
    than everything else together.)
    """

    DEFAULT_CSS = """
    Panel {
        height: auto;
        padding: 0 1;
    }
    """

    class Resized(Message):
        """A panel's size changed: what it shows was computed for the old size."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.ctx: PanelContext | None = None
        self._lines: list[Row] = []
        self._strips: dict[int, Strip] = {}
        self._styles: dict[str, RichStyle] = {}
        self._built_for: tuple[int, int] = (0, 0)
        self._frame: _Frame | bool | None = None
        """How content rows are framed (padding, background, filters); False: by Textual."""
        self._framed: dict[int, Strip] = {}
        """Content row -> the row framed and filtered as last drawn (dropped when it changes)."""
        self._edges: dict[tuple[int, int, int], Strip] = {}
        """(row, first column, last column) -> a border or padding row as Textual drew it."""
        self._title_only = False
        """Set while ``show`` sets a new border title (``refresh``)."""
        self._edges_for: tuple[object, object] | None = None
        """The border title and subtitle ``_edges`` were drawn with."""
        self._filtered: dict[str, RichStyle] = {}
        """Style name -> its style with the line filters applied (``_filtered_style``)."""
        self._filters_for: tuple[tuple[LineFilter, ...], Color] | None = None
        """The line filters and background ``_filtered`` was made with."""
        self._inner: tuple[Size, Size] | None = None
        """(outer size, content size) as ``inner_size`` last found them."""

    def panel_title(self, ctx: PanelContext) -> str:
        """The border title: the statistic and its window."""
        return ""

    def show(self, ctx: PanelContext) -> None:
        """Take new data and repaint the lines that changed (no layout)."""
        self.ctx = ctx
        t = self.panel_title(ctx)
        if t != self.border_title:
            self._title_only = True  # Textual's setter repaints the whole widget: see refresh
            try:
                self.border_title = t
            finally:
                self._title_only = False
        self._rebuild()

    def body(self, ctx: PanelContext, width: int, height: int) -> Lines:
        """The panel's lines for the given content size."""
        raise NotImplementedError

    def inner_size(self) -> Size:
        """``content_size``, found again only when the panel's outer size (set as the
        screen is laid out) or its styles (padding, border) changed: Textual's looks the
        panel up in the screen's map at each call, ~18 µs, and a render tick asked 19
        times (``rltperf bench ingest``'s screen at 1,000 steps/s).  A 0x0 answer for a
        nonzero outer size is not kept: Textual gives it while the screen's map does not
        yet hold the panel (a layout in progress), and kept, it left the panel, or the
        status bar, on "waiting for data…" until the next resize (a CI run waited 90 s
        for "rltperf live")."""
        outer = self._size
        inner = self._inner
        if inner is None or inner[0] != outer:
            content = self.content_size
            if outer.area and not content.area:
                return content  # not placed yet: ask again at the next call
            inner = self._inner = (outer, content)
        return inner[1]

    def rows(self) -> list[Row]:
        """The panel's lines now."""
        if self.ctx is None:
            return [_WAITING]
        size = self.inner_size()
        return self.body(self.ctx, max(10, size.width), max(1, size.height)).rows()

    def render_text(self) -> str:
        """The panel's text without styles (tests read it)."""
        return "\n".join("".join(t for t, _ in row) for row in self.rows())

    def _rebuild(self, full: bool = False) -> None:
        size = self.inner_size()
        width, height = size.width, size.height
        if width <= 0 or height <= 0:
            return
        lines = self.rows()[:height]
        if len(lines) < height:
            lines += [()] * (height - len(lines))
        old = self._lines
        self._lines = lines
        if full or (width, height) != self._built_for or len(old) != height:
            self._strips.clear()
            self._framed.clear()
            self._built_for = (width, height)
            self.refresh()
            return
        changed = [y for y in range(height) if lines[y] != old[y]]
        for y in changed:
            self._strips.pop(y, None)
            self._framed.pop(y, None)
        if changed:
            self._repaint_rows(changed)

    def _repaint_rows(self, rows: list[int]) -> None:
        """Have content ``rows`` drawn again at the next screen update.

        Each region is the whole row, padding included: the compositor writes a row that
        lies wholly inside the dirty span as it is, but copies a wider one into a new
        strip cut to the span, and renders that copy afresh (18 copies a tick at 1,000
        steps/s).  A panel that frames its own rows (``render_lines``) marks them on the
        screen (a ``BlankScreen``: nothing of its own to draw again), where the panels
        changed in one render tick make one request (Textual 8.2.8's internals, pinned:
        ``test_panel_frame`` checks what reaches the terminal): the compositor asks every widget
        under a dirty row for its lines anyway, and ``refresh`` on each panel cost each
        a round of Textual messages (the panel's idle, then the screen's update) and
        dropped its layout and style caches (on a metrics target, 5 panels a scrape:
        ~0.3 ms of the main thread's ~5).  Other panels refresh themselves, once for all
        rows (a call per row costs as much as the rows)."""
        if isinstance(self._frame, _Frame):
            try:
                screen = self.screen
                geo = screen.find_widget(self)
            except (NoScreen, NoWidget):
                pass
            else:
                x, width = geo.region.x, geo.region.width
                top = geo.region.y + self.content_offset.y
                clip = geo.clip.intersection
                dirty = [r for y in rows if (r := clip(Region(x, top + y, width, 1)))]
                if dirty:
                    # what Screen._on_update does for a widget's Update, with the screen
                    # as the widget: its regions, and the screen among the widgets the
                    # next update takes.  Not Screen.refresh: it sets the screen's repaint
                    # flag, and an update with that flag takes the screen's regions alone
                    # and drops every widget marked dirty before it in that frame (a
                    # status bar or a title then stays old on the terminal)
                    screen._set_dirty(*dirty)
                    screen._dirty_widgets.add(screen)
                    screen.check_idle()
                return
        left, outer = -self.content_offset.x, self.outer_size.width
        self.refresh(*(Region(left, y, outer, 1) for y in rows))

    def on_resize(self) -> None:
        self._forget_drawn()
        self._rebuild(full=True)
        self.post_message(self.Resized())

    def notify_style_update(self) -> None:
        super().notify_style_update()
        # a theme or CSS change: resolved styles, sizes and cached lines are stale
        self._inner = None
        self._styles.clear()
        self._strips.clear()
        self._forget_drawn()

    def refresh(
        self, *regions: Region, repaint: bool = True, layout: bool = False, recompose: bool = False
    ) -> Self:
        if not regions and self._title_only and repaint and not (layout or recompose):
            # a new border title: only the top border row changed (its cached strips go
            # in render_lines, which draws the edges afresh for a new title).  Textual's
            # title setter would repaint every row (0.31 ms a scrape for a title whose
            # counters moved at every scrape; a title that moves at every update is still
            # a pass through Textual's styles cache for that row: keep such text in rows)
            off = self.content_offset
            return super().refresh(Region(-off.x, -off.y, self.outer_size.width, 1))
        # Textual drops its own drawn lines on a refresh of the whole widget (layout or
        # style changes); so do we
        if not regions:
            self._edges.clear()
        return super().refresh(*regions, repaint=repaint, layout=layout, recompose=recompose)

    def _forget_drawn(self) -> None:
        """Drop every row as drawn (frame, borders, filtered styles): size or style changed."""
        self._frame = None
        self._framed.clear()
        self._edges.clear()
        self._filtered.clear()
        self._filters_for = None

    def render_lines(self, crop: Region) -> list[Strip]:
        """The rows in ``crop``: content rows framed here, the border by Textual.

        Why: at each screen update Textual asks every widget that overlaps the box
        around all dirty regions for all of its rows, and passes each row again
        through its styles cache and line filters.  A panel keeps its rows as they were
        last drawn: content rows framed (padding, background) and filtered here, built
        again only when their text changed, in one strip from styles filtered once per
        style; the border rows (with the title) are Textual's own, drawn again only when
        the title, the size or the styles changed.  A panel styled with what is not
        framed here (side borders, outline, tint, opacity, hatch) is drawn by Textual
        alone.
        """
        frame = self._frame
        if frame is None:
            frame = self._frame = self._measure_frame()
        if not isinstance(frame, _Frame):
            return super().render_lines(crop)
        x1, x2 = crop.column_span
        part = (x1, x2) != (0, frame.width)
        filters = self.get_line_filters()
        fkey = (tuple(filters), frame.background)
        if fkey != self._filters_for:
            self._filtered.clear()
            self._framed.clear()
            self._filters_for = fkey
        titles = (self._border_title, self._border_subtitle)
        if titles != self._edges_for:
            self._edges.clear()
            self._edges_for = titles
        out: list[Strip] = []
        for y in crop.line_range:
            cy = y - frame.top
            if cy < 0 or y >= frame.height - frame.bottom:
                key = (y, x1, x2)
                edge = self._edges.get(key)
                if edge is None:
                    edge = self._edges[key] = super().render_lines(Region(x1, y, x2 - x1, 1))[0]
                out.append(edge)
                continue
            strip = self._framed.get(cy)
            if strip is None:
                strip = self._framed[cy] = self._framed_row(cy, frame, filters)
            out.append(strip.crop(x1, x2) if part else strip)
        return out

    def _framed_row(self, y: int, frame: _Frame, filters: Sequence[LineFilter]) -> Strip:
        """Content row ``y`` framed and filtered (``_Frame``)."""
        width = frame.width - frame.pad_left - frame.pad_right
        row = self._lines[y] if y < len(self._lines) else (_WAITING if y == 0 and not self._lines else ())
        fitted = fit_row(row, width)
        length = sum(len(t) for t, _ in fitted) if fitted is not None else width + 1
        if fitted is None or length > width:  # double-width text: Textual's cell arithmetic
            return frame.frame(self.render_line(y), filters)
        style = self._filtered_style
        return frame.frame_parts([(t, style(st)) for t, st in fitted], length, self._filtered_inner(frame))

    def _filtered_style(self, name: str) -> RichStyle:
        """``_style(name)`` with the line filters applied: each of Textual's filters maps a
        segment's style alone (tests check the rows against Textual's own path)."""
        st = self._filtered.get(name)
        if st is None:
            st = self._filtered[name] = self._apply_filters(self._style(name))
        return st

    def _filtered_inner(self, frame: _Frame) -> RichStyle:
        st = self._filtered.get("\0inner")
        if st is None:
            st = self._filtered["\0inner"] = self._apply_filters(frame.inner)
        return st

    def _apply_filters(self, style: RichStyle) -> RichStyle:
        assert self._filters_for is not None
        filters, background = self._filters_for
        seg = [Segment(" ", style)]
        for f in filters:
            seg = f.apply(seg, background)
        return seg[0].style or RichStyle()

    def _measure_frame(self) -> _Frame | bool:
        styles = self.styles
        (_, _), (right, _), (_, _), (left, _) = styles.border
        outline = any(edge for edge, _ in styles.outline)
        hatch = styles.has_rule("hatch") and styles.hatch != "none"
        if (
            left
            or right
            or outline
            or hatch
            or styles.tint.a
            or self.opacity != 1.0
            or styles.text_opacity != 1.0
        ):
            return False
        width, height = self.outer_size
        if width <= 0 or height <= 0:
            return False
        gutter = styles.gutter
        base_background, background = self.background_colors
        return _Frame(
            width=width,
            height=height,
            top=gutter.top,
            bottom=gutter.bottom,
            pad_left=gutter.left,
            pad_right=gutter.right,
            inner=VisualStyle(background=base_background + background).rich_style,
            background=background,
        )

    def _style(self, name: str) -> RichStyle:
        st = self._styles.get(name)
        if st is None:
            base = self.visual_style
            st = (VisualStyle.combine([base, self._get_style(name)]) if name else base).rich_style
            self._styles[name] = st
        return st

    def render_line(self, y: int) -> Strip:
        strip = self._strips.get(y)
        if strip is not None:
            return strip
        width = self.size.width
        row = self._lines[y] if y < len(self._lines) else (_WAITING if y == 0 and not self._lines else ())
        fitted = fit_row(row, width)  # nowrap: cut at a word boundary, never inside a number
        if fitted is not None:
            row = fitted
        segs = [Segment(text, self._style(style)) for text, style in row]
        strip = Strip(segs)
        if strip.cell_length > width:  # double-width text: crop by cells, ellipsis
            cut = strip.crop(0, max(0, width - 1))
            last = row[-1][1] if row else ""
            strip = Strip([*cut, Segment("…", self._style(last))])
        self._strips[y] = strip
        return strip
