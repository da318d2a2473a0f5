"""The step ring's lookups that never copy the ring, against numpy on a plain copy.

Issue 21 §1: every render tick searched and read the oldest row through ``Ring.last``
of the whole column; once the ring wraps (32 768 steps: 33 s at 1 000 steps/s) that
joins its two pieces into a fresh copy, a few times a tick.  ``search`` and ``oldest``
answer from the two pieces as they lie."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rltperf_tui.live.step_rings import Ring


def _ring(cap: int, values: list[int]) -> Ring:
    r = Ring(cap, {"end": (np.int64, ())}, grow=False)
    for i in range(0, len(values), 3):  # appended in batches, as the stream comes
        chunk = values[i : i + 3]
        r.append({"end": chunk}, len(chunk))
    return r


@settings(max_examples=300, deadline=None)
@given(
    cap=st.integers(1, 12),
    steps=st.lists(st.integers(0, 4), min_size=1, max_size=40),
    probe=st.integers(-2, 90),
    side=st.sampled_from(["left", "right"]),
    k=st.integers(0, 14),
)
def test_search_and_oldest_equal_numpy_on_the_kept_rows(
    cap: int, steps: list[int], probe: int, side: str, k: int
) -> None:
    values = np.cumsum(steps).tolist()  # sorted, with repeats (steps of 0)
    r = _ring(cap, values)
    kept = np.asarray(values[-cap:], dtype=np.int64)  # the plain copy: what the ring keeps
    assert np.array_equal(r.last("end"), kept)
    assert np.array_equal(r.last("end", k), kept[len(kept) - min(k, len(kept)) :])
    assert r.search("end", probe, side=side) == int(np.searchsorted(kept, probe, side=side))
    assert r.oldest("end") == kept[0]


def test_a_wrapped_ring_is_searched_across_its_seam() -> None:
    r = _ring(5, [10, 20, 30, 40, 50, 60, 70])  # kept 30..70; the seam after 50
    assert list(r.last("end")) == [30, 40, 50, 60, 70]
    assert [r.search("end", v) for v in (0, 30, 50, 55, 60, 70, 99)] == [0, 0, 2, 3, 3, 4, 5]
    assert [r.search("end", v, side="right") for v in (30, 50, 60, 70)] == [1, 3, 4, 5]
    assert r.oldest("end") == 30


_ROW = st.one_of(st.none(), st.lists(st.integers(0, 2**31 - 1), max_size=20))


@settings(max_examples=300, deadline=None)
@given(
    cap=st.integers(1, 9),
    batches=st.lists(
        st.lists(st.tuples(_ROW, _ROW, _ROW, _ROW), min_size=1, max_size=6).map(
            # some batches with one length per field (the fast path), some ragged
            lambda b: b if len(b) % 2 else [b[0]] * len(b)
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_the_stage_and_depth_lists_land_in_the_ring_zero_padded_and_cut_to_its_width(
    cap: int, batches: list[list[tuple[list[int] | None, ...]]]
) -> None:
    """Whatever lengths a batch's lists have (one length per field converts in one pass,
    ragged or None rows one field at a time), each kept step's row of the ring is its
    list cut to the column's width and padded with zeros, also where the slot last held a
    longer row (the ring wrapped)."""
    from engine_adapters.definitions.records import StepRecord
    from rltperf_tui.live.step_rings import STEP_COLS, step_columns

    ring = Ring(cap, STEP_COLS, grow=False)
    sent: list[tuple[list[int] | None, ...]] = []
    sid = 0
    for b in batches:
        steps = []
        for stage, exits, loop, ltok in b:
            steps.append(StepRecord(step_id=sid, start_ns=sid, end_ns=sid + 1, stage_ns=stage or [],
                                    exit_hist=exits, loop_ns=loop, loop_tokens=ltok))  # fmt: skip
            sent.append((stage or [], exits, loop, ltok))
            sid += 1
        cols, _ = step_columns(steps)
        ring.append(cols, len(steps))
    for j, name in enumerate(("stages", "exit", "loop_ns", "loop_tokens")):
        width = STEP_COLS[name][1][0]
        plain = [((row or []) + [0] * width)[:width] for row in (s[j] for s in sent[-cap:])]
        assert ring.last(name).tolist() == plain, name
