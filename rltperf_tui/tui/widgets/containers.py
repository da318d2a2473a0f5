"""Containers that draw nothing of their own (``BLANK``), for the monitor's layout.

Why: at each update Textual's compositor takes the box around every region marked
dirty in that frame (the status bar at the top, a trend line near the bottom: the whole
screen) and asks every widget overlapping that box for all of its lines, containers
included, although only the dirty lines reach the terminal.  A container whose children
cover it has nothing to show but its background; ``BLANK`` makes its lines one blank
strip each instead of a pass through the styles cache and the line filters per line.
(Measured on a vLLM /metrics target at 160x48: the screen, the row of targets and the
stacks were 200 of the ~270 lines rendered per update; see ``rltperf bench peers``.)
Only for containers without a border, padding or content of their own.
"""

from __future__ import annotations

from typing import Any

from textual.containers import Horizontal, Vertical
from textual.screen import Screen


class BlankVertical(Vertical):
    """A ``Vertical`` that draws only its background (its children draw the rest)."""

    BLANK = True


class BlankHorizontal(Horizontal):
    """A ``Horizontal`` that draws only its background (its children draw the rest)."""

    BLANK = True


class BlankScreen(Screen[Any]):
    """The monitor's default screen: only a background behind its widgets."""

    BLANK = True
