"""The elision helper against hand-cut strings (the cases the issue found)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rltperf_tui.elide import cut_at, elide
from rltperf_tui.tui.widgets._fmt import fit_row, single_width


@pytest.mark.parametrize(
    ("text", "width", "expected"),
    [
        ("20 ms host stall in the schedule stage every 150 steps", 30, "20 ms host stall in the…"),
        ("[[2, 2864, 32], [], [256], [2, 256, 32]]", 32, "[[2, 2864, 32], [], [256], [2,…"),
        ("[[2, 2864, 32], [], [256], [2, 256, 32]]", 12, "[[2, 2864,…"),
        ("forward 0.327", 12, "forward…"),
        ("aten::_scaled_dot_product_flash_attention", 32, "aten::_scaled_dot_product_…"),
        ("step 12345", 9, "step…"),
        ("12345678", 5, "…"),
        ("fits", 4, "fits"),
        ("p=0.0123 after Holm", 12, "p=0.0123 …"),
    ],
)
def test_elide(text: str, width: int, expected: str) -> None:
    out = elide(text, width)
    assert out == expected
    assert len(out) <= width


def test_cut_at_never_splits_a_number() -> None:
    text = "idle 12.5% · MBU 3.25% · 1.2 k tok/s"
    for w in range(1, len(text)):
        n, tail = cut_at(text, w)
        head = text[:n]
        assert len(head) + len(tail) <= w
        if n and n < len(text):
            assert not (head[-1].isdigit() and (text[n].isdigit() or text[n] == "."))
            assert not (head[-1] == "." and text[n].isdigit())


def test_fit_row_keeps_styles_and_marks_the_cut() -> None:
    row = (
        ("ms/step ", "$text-muted"),
        ("█", "red"),
        (" forward 0.327", ""),
        ("  █", "blue"),
        (" sample 1.5", ""),
    )
    assert fit_row(row, 80) == row
    # cut before " sample 1.5": the number goes whole, the mark takes the cut part's style
    assert fit_row(row, 30) == (
        ("ms/step ", "$text-muted"),
        ("█", "red"),
        (" forward 0.327", ""),
        ("  █", "blue"),
        ("…", ""),
    )
    assert fit_row(row, 22) == (("ms/step ", "$text-muted"), ("█", "red"), (" forward", ""), ("…", ""))
    assert fit_row((("界界界", ""),), 2) is None  # double width: cropped by cells by the caller


_CHARS = st.one_of(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E),
    st.characters(min_codepoint=0xA0, max_codepoint=0x52F),
    st.characters(min_codepoint=0x2000, max_codepoint=0x25FF),
    st.sampled_from("界日\u200d\ufe0f\u0301\u00ad\u2028⌚⌛🙂é"),  # wide, zero-width, joiners
)


@given(st.text(_CHARS, max_size=40))
def test_single_width_is_richs_own_measure(text: str) -> None:
    """``single_width`` (a set lookup, for speed) says what Rich's ``cell_len`` says."""
    from rich.cells import _cell_len

    assert single_width(text) == (_cell_len(text, "auto") == len(text))


def test_single_width_on_the_panels_characters() -> None:
    for text in ("TTFT ≤12.3 · TPOT 4.5 ms", "→ compute-bound", "forward…", "█▇▆▅▄▃▂▁ ░", "─┤│┴"):
        assert single_width(text), text
    assert not single_width("日本") and not single_width("ok 🙂")
