"""``rltperf bench ingest``'s model-half figure: what a render tick's statistics cost.

At each render tick the screen asks the live model for the target's window
(``TargetStats.window``) and the view its panels draw (``view.stats_view``: the
timeline, the idle gaps and their threshold).  Here the synthetic stream of
``bench.ingest.synthetic_stream`` (~950 steps/s of data time, an idle gap every ~2 s)
is fed as the reader delivers it (a batch per 500 ms of data at the default 2 Hz), and
after every batch (a render tick) that pair is timed on this thread's CPU clock, once the windows are
full (35 s of data: more than the 30 s timeline).  No terminal, no Textual: this is the
part of the monitor's CPU that ``tui_cpu_fraction`` cannot separate from drawing.
"""

from __future__ import annotations

import time
from typing import Any

BATCH_NS = 500_000_000
"""Data time per delivered batch: the reader's at the default 2 Hz (``targets.batch_for``)."""
FULL_NS = 35_000_000_000
"""Data time fed before ticks are timed (the 30 s timeline and the 10 s window full)."""


def tick_model_cost(data: bytes) -> dict[str, Any]:
    """CPU ms per render tick of ``window(10 s)`` and ``stats_view`` (medians over the
    ticks after ``FULL_NS``) over the frames ``data`` (``synthetic_stream``'s), and how
    many ticks were timed."""
    from engine_adapters.definitions.records import StepRecord
    from engine_adapters.definitions.wire import FrameReader
    from rltperf_tui.live.aggregator import TargetStats
    from rltperf_tui.live.view import stats_view

    recs = FrameReader().feed(data)
    batches: list[list[Any]] = []
    cur: list[Any] = []
    edge: int | None = None
    for r in recs:
        cur.append(r)
        if isinstance(r, StepRecord):
            if edge is None:
                edge = r.end_ns + BATCH_NS
            elif r.end_ns >= edge:
                batches.append(cur)
                cur, edge = [], edge + BATCH_NS
    st = TargetStats()
    clock = time.thread_time
    window_ms: list[float] = []
    view_ms: list[float] = []
    gaps_listed = 0
    for i, b in enumerate(batches):
        st.add(b)
        t0 = clock()
        st.window(10.0)
        t1 = clock()
        v = stats_view(st, 10.0, 30.0)
        t2 = clock()
        if i * BATCH_NS >= FULL_NS:
            window_ms.append((t1 - t0) * 1e3)
            view_ms.append((t2 - t1) * 1e3)
            gaps_listed += len(v.idle_gaps) > 0
    if not window_ms:
        return {"ticks": 0}
    window_ms.sort()
    view_ms.sort()
    mid = len(window_ms) // 2
    return {
        "ticks": len(window_ms),
        "ticks_with_idle_gaps": gaps_listed,
        "window_ms": round(window_ms[mid], 3),
        "stats_view_ms": round(view_ms[mid], 3),
        "model_ms_per_s_at_2hz": round(2 * (window_ms[mid] + view_ms[mid]), 2),
    }
