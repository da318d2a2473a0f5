"""Fit text into a fixed width without cutting a word, an element or a number.

One helper for every place that prints into a fixed width (report and compare tables,
panel lines): a cut is made at a word or element boundary (a space, or after ``,`` /
``;``), never inside a number, and is always marked with ``…``.  A number is never the
part cut: ``forward 0.21 ms`` becomes ``forward …``, not ``forward 0.2…``.
"""

from __future__ import annotations

MARK = "…"
"""What marks a cut."""


def _in_number(text: str, p: int) -> bool:
    """True when a cut before ``text[p]`` would split a number (``12|3``, ``1|.5``, ``1.|5``, ``-|5``)."""
    if p <= 0 or p >= len(text):
        return False
    a, b = text[p - 1], text[p]
    return (a.isdigit() and (b.isdigit() or b == ".")) or (a in ".+-" and b.isdigit())


def cut_at(text: str, width: int) -> tuple[int, str]:
    """Where ``text`` is cut to fit ``width`` characters, mark included.

    Returns ``(n, tail)``: keep ``text[:n]`` (trailing spaces dropped) and append
    ``tail`` (the mark, after a space when the kept text ends in a digit, so that the
    last number kept does not read as cut).  ``(len(text), "")`` when it fits.
    Preference: the last space that fits; then the last element boundary (after a
    ``,`` ``;`` ``:`` ``/`` ``)`` ``]`` or a ``_``); then any place that is not inside a
    number; the head may be empty (just the mark).
    """
    if len(text) <= width:
        return len(text), ""
    if width <= len(MARK):
        return 0, MARK[: max(width, 0)]

    def fits(p: int) -> tuple[int, str] | None:
        head = text[:p].rstrip()
        if not head:
            return None
        tail = (" " + MARK) if head[-1].isdigit() else MARK
        return (len(head), tail) if len(head) + len(tail) <= width else None

    hi = min(len(text), width - len(MARK))
    # 1. a word boundary: the kept text ends just before a space
    for p in range(hi, 0, -1):
        if text[p].isspace() and not text[p - 1].isspace():
            head = text[:p].rstrip()
            if head and head[-1] not in "([{" and (r := fits(p)):
                return r
    # 2. an element boundary inside a token (a shape list, a path, an identifier)
    for p in range(hi, 0, -1):
        if text[p - 1] in ",;:/)]}_|" and not _in_number(text, p) and (r := fits(p)):
            return r
    # 3. anywhere that does not split a number
    for p in range(hi, 0, -1):
        if not _in_number(text, p) and (r := fits(p)):
            return r
    return 0, MARK


def elide(text: str, width: int) -> str:
    """``text`` if it fits ``width`` characters, else its head cut at a boundary plus ``…``."""
    n, tail = cut_at(text, width)
    return text if not tail else text[:n] + tail
