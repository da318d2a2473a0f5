"""``_fmt.spark``: a sparkline's cells are the levels its docstring defines, whether the
values come as a short list (drawn in Python) or an array or a long list (numpy)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rltperf_tui.tui.widgets._fmt import BLOCKS, SHORT_SPARK, spark


def _levels(values: list[float], top: float | None) -> list[int]:
    """The definition, written out: blank for NaN/inf; else ceil(v / top * 8) within 1..8,
    1 for every value when top <= 0; top defaults to the largest finite value."""
    finite = [v for v in values if math.isfinite(v)]
    if top is None:
        top = max(finite) if finite else 0.0
    out = []
    for v in values:
        if not math.isfinite(v):
            out.append(0)
        elif top <= 0:
            out.append(1)
        else:
            r = v / top * 8
            out.append(min(8, max(1, math.ceil(r))) if math.isfinite(r) else (8 if r > 0 else 1))
    return out


values = st.lists(
    st.one_of(
        st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
        st.sampled_from([math.nan, math.inf, -math.inf, 0.0]),
    ),
    max_size=2 * SHORT_SPARK,
)
tops = st.one_of(st.none(), st.floats(min_value=-10, max_value=1e6, allow_nan=False))


@settings(max_examples=300, deadline=None)
@given(values, tops)
def test_every_cell_is_the_defined_level_on_both_paths(vals: list[float], top: float | None) -> None:
    want = "".join(BLOCKS[i] for i in _levels(vals, top))
    assert spark(vals, top) == want  # a list: Python up to SHORT_SPARK values, numpy past it
    assert spark(np.asarray(vals, dtype=np.float64), top) == want  # an array: numpy


def test_a_typical_trend_line() -> None:
    assert (
        spark([0.0, 50.0, 100.0, math.nan, 12.5], top=100.0)
        == BLOCKS[1] + BLOCKS[4] + BLOCKS[8] + " " + BLOCKS[1]
    )
    assert spark([2.0, 4.0, 8.0]) == BLOCKS[2] + BLOCKS[4] + BLOCKS[8]
    assert spark([0.0, 0.0]) == BLOCKS[1] * 2
