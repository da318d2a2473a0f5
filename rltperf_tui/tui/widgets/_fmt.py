"""Number formatting and small text builders shared by the panels.

Every missing figure prints as ``n/a`` (never as zero), after nvitop's ``NA``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from itertools import groupby
from operator import itemgetter
from typing import cast

import numpy as np
from rich.cells import cell_len, get_character_cell_size
from textual.content import Content

from rltperf_tui.elide import cut_at

NA = "n/a"
"""How an unknown figure is shown."""

BLOCKS = " ▁▂▃▄▅▆▇█"
"""Eighth blocks, index = eighths filled (0..8)."""

STAGE_COLORS = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#b07aa1",
    "#edc948",
    "#76b7b2",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)
"""Stage colours by stage index (stable across redraws and targets)."""

STAGE_GLYPHS = "█▓▒░#=+*%@"
"""Stage fill glyphs when colour is off (NO_COLOR): stages stay distinguishable."""


def is_num(v: float | int | None) -> bool:
    """True for a finite number."""
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def num(v: float | int | None, fmt: str = "{:.2f}", unit: str = "") -> str:
    """A number with a format and unit, or ``n/a``."""
    if not is_num(v):
        return NA
    return fmt.format(v) + unit


def ms(v: float | None) -> str:
    """Milliseconds with precision that suits the size (0.012, 1.23, 12.3, 123)."""
    if not is_num(v):
        return NA
    assert v is not None
    a = abs(v)
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def pct(v: float | None, digits: int = 1) -> str:
    """A fraction as a percentage."""
    if not is_num(v):
        return NA
    assert v is not None
    return f"{v * 100:.{digits}f}%"


def si(v: float | None, unit: str = "", digits: int = 1) -> str:
    """1234567 -> ``1.2 M`` (decimal prefixes)."""
    if not is_num(v):
        return NA
    assert v is not None
    for div, p in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.{digits}f} {p}{unit}"
    return f"{v:.{digits}f} {unit}".rstrip() if isinstance(v, float) else f"{v} {unit}".rstrip()


def size(v: float | None) -> str:
    """Bytes with binary prefixes."""
    if not is_num(v):
        return NA
    assert v is not None
    for div, p in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if abs(v) >= div:
            return f"{v / div:.1f} {p}"
    return f"{v:.0f} B"


def bar(frac: float | None, width: int) -> str:
    """A horizontal bar of ``width`` cells filled to ``frac`` (eighth-cell precision)."""
    if width <= 0:
        return ""
    if not is_num(frac):
        return "·" * width
    assert frac is not None
    f = min(1.0, max(0.0, frac))
    eighths = round(f * width * 8)
    full, part = divmod(eighths, 8)
    s = "█" * full
    if part and full < width:
        s += "▏▎▍▌▋▊▉"[part - 1]
    return s + " " * (width - len(s))


SHORT_SPARK = 64
"""Up to this many values a list is drawn in Python: numpy's per-call overhead made a
30-value line cost 44 us, ~0.35 ms of each server-trends repaint (nine lines)."""


def spark(values: Sequence[float] | np.ndarray, top: float | None = None) -> str:
    """One-row sparkline of ``values`` (NaN or infinite = blank) scaled to ``top`` (default
    the largest finite value): a value ``v`` is level ``ceil(v / top * 8)`` kept within 1..8,
    every value level 1 when ``top <= 0``."""
    if not isinstance(values, np.ndarray) and len(values) <= SHORT_SPARK:
        return _spark_short(values, top)
    v = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(v)
    if top is None:
        top = float(v[finite].max()) if finite.any() else 0.0
    if top <= 0:
        level = np.ones(v.shape, dtype=np.int64)
    else:
        with np.errstate(invalid="ignore", over="ignore"):  # past the largest float: level 8
            level = np.clip(np.ceil(np.where(finite, v, 0.0) / top * 8), 1, 8).astype(np.int64)
    level[~finite] = 0
    levels = cast(list[int], level.tolist())
    return "".join([BLOCKS[i] for i in levels])


def _spark_short(values: Sequence[float], top: float | None) -> str:
    """``spark`` of a short sequence, in plain Python (the same levels)."""
    isfinite, ceil = math.isfinite, math.ceil
    vals = [float(x) for x in values]
    if top is None:
        top = max((x for x in vals if isfinite(x)), default=0.0)
    out = []
    for x in vals:
        if not isfinite(x):
            out.append(BLOCKS[0])
        elif top <= 0:
            out.append(BLOCKS[1])
        else:
            r = x / top * 8  # +-inf past the largest float (a tiny top): clipped as numpy's
            out.append(BLOCKS[8 if r >= 8 else 1 if r <= 1 else ceil(r)])
    return "".join(out)


Row = tuple[tuple[str, str], ...]
"""One screen line: (text, style) parts."""

_NARROW = frozenset(
    ch
    for lo, hi in ((0x20, 0x7E), (0xA0, 0x36F), (0x370, 0x52F), (0x2000, 0x23FF), (0x2500, 0x25FF))
    for ch in map(chr, range(lo, hi + 1))
    if get_character_cell_size(ch) == 1
)
"""Characters one cell wide, as Rich measures them: ASCII and the ranges the panels draw
from (Latin-1, Greek, punctuation such as ``…`` and ``·``, arrows, ``≤``, box drawing,
blocks), each kept only where Rich's own width is 1."""


def single_width(text: str) -> bool:
    """Whether ``text`` takes one cell per character (``cell_len(text) == len(text)``).

    A set lookup per character in C for the characters of ``_NARROW``; Rich's
    ``cell_len`` for the rest.  Rich's own fast set leaves out ``…``, ``≤`` and ``→``,
    which most panel rows hold, and measures such a row a character at a time in
    Python (a sixth of the monitor's main thread on the server view), row after row as
    the figures change."""
    return _NARROW.issuperset(text) or cell_len(text) == len(text)


def fit_row(row: Row, width: int) -> Row | None:
    """``row`` cut to ``width`` cells at a word or element boundary, the cut marked with
    ``…`` (see ``rltperf_tui.elide``): a number is shown whole or not at all.  The row
    itself when it fits; None when it holds double-width characters (the caller crops
    by cells instead)."""
    plain = "".join(t for t, _ in row)
    if not single_width(plain):
        return None
    if len(plain) <= width:
        return row
    n, tail = cut_at(plain, width)
    out: list[tuple[str, str]] = []
    left = n
    mark_style = row[-1][1] if row else ""
    for t, st in row:
        if left <= 0:
            break
        out.append((t[:left], st))
        if left <= len(t):
            mark_style = st
        left -= len(t)
    if out and left == 0 and len(out) < len(row):
        mark_style = row[len(out)][1]  # the cut falls at a part's start: the mark is that part's
    out.append((tail, mark_style))
    return tuple(out)


class Lines:
    """Builds lines of styled parts (no markup parsing of data).  Consecutive parts of
    one style are merged, so a line is a few segments however it was built."""

    def __init__(self) -> None:
        self._lines: list[list[tuple[str, str]]] = [[]]

    def add(self, text: str, style: str = "") -> Lines:
        """Append ``text`` in ``style`` (Textual style string, theme variables allowed)."""
        if text:
            cur = self._lines[-1]
            if cur and cur[-1][1] == style:
                cur[-1] = (cur[-1][0] + text, style)
            else:
                cur.append((text, style))
        return self

    def nl(self) -> Lines:
        """End the line."""
        self._lines.append([])
        return self

    def bar(self, frac: float | None, width: int, style: str) -> Lines:
        """Append a bar filled to ``frac`` in ``style`` on a dim track of ``width`` cells."""
        s = bar(frac, width)
        filled = s.rstrip(" ")
        self.add(filled, style)
        if len(filled) < width:
            self.add("░" * (width - len(filled)), "$text-disabled")
        return self

    def extend(self, parts: Iterable[tuple[str, str]]) -> Lines:
        """Append several styled parts (runs of one style joined first)."""
        for st, run in groupby(parts, key=itemgetter(1)):
            self.add("".join(t for t, _ in run), st)
        return self

    def rows(self) -> list[Row]:
        """The lines (a trailing empty line dropped)."""
        lines = self._lines
        if len(lines) > 1 and not lines[-1]:
            lines = lines[:-1]
        return [tuple(line) for line in lines]

    def plain(self) -> str:
        """The text without styles."""
        return "\n".join("".join(t for t, _ in row) for row in self.rows())

    def build(self) -> Content:
        """The lines as one ``Content``."""
        parts: list[tuple[str, str] | str] = []
        for k, row in enumerate(self.rows()):
            if k:
                parts.append("\n")
            parts.extend((t, st) if st else t for t, st in row)
        return Content.assemble(*parts)
