"""The live model's memory is fixed however long a monitor stays attached.

People leave the monitor open on a server for days.  The timeline's per-bucket sums once
grew by one entry every bucket, for ever (~170 MB a day on a 160-column screen), and no
test looked past a few minutes.  Here the committed demo recording (steps, requests,
device samples, heartbeats) is replayed back to back, its clocks shifted, as ten
minutes of stream; at each half second of stream time the render tick's work runs on it
(the window, the panels' view at a full screen's sizes).  Python's own allocation
tracer is the truth: what the model holds after three minutes and after ten must agree.
"""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path
from typing import Any

import msgspec

from engine_adapters.definitions.records import DeviceSample, RequestRecord, Stats, StepRecord
from engine_adapters.monitor.recording import read_all
from rltperf_tui.live.aggregator import TargetStats
from rltperf_tui.live.view import ViewSize, stats_view

DEMO = Path(__file__).resolve().parents[1] / "tui" / "data" / "demo.rltrec"
STREAM = (StepRecord, RequestRecord, Stats, DeviceSample)


def _shifted(rec: Any, dt_ns: int, ids: int) -> Any:
    """``rec`` ``dt_ns`` later, step ids ``ids`` on (every ``*_ns`` field that is set)."""
    change: dict[str, Any] = {
        f: getattr(rec, f) + dt_ns
        for f in rec.__struct_fields__
        if f.endswith("_ns") and isinstance(getattr(rec, f), int)  # times, not stage_ns lists
    }
    if isinstance(rec, StepRecord):
        change["step_id"] = rec.step_id + ids
    return msgspec.structs.replace(rec, **change)


def test_ten_minutes_of_stream_hold_what_three_did() -> None:
    _, recs = read_all(DEMO)
    steps = [r for r in recs if isinstance(r, StepRecord)]
    span = steps[-1].end_ns - steps[0].start_ns + 50_000_000
    n_ids = steps[-1].step_id - steps[0].step_id + 1
    head = [r for r in recs if not isinstance(r, STREAM)][:1]  # the Hello
    st = TargetStats(capacity=4096)
    st.add(head)
    size = ViewSize(timeline_cols=150, trend_cols=150, idle_gap_rows=8)
    held: dict[int, int] = {}
    tracemalloc.start()
    try:
        for k in range(30):  # 30 x 20 s of stream
            batch = [_shifted(r, k * span, k * n_ids) for r in recs if isinstance(r, STREAM)]
            t_next = batch[0].end_ns if isinstance(batch[0], StepRecord) else 0
            pending: list[Any] = []
            for r in batch:
                pending.append(r)
                t = getattr(r, "end_ns", None) or getattr(r, "ts_ns", None) or 0
                if t >= t_next:  # a render tick every half second of stream time
                    st.add(pending)
                    pending = []
                    st.window(10.0)
                    stats_view(st, 10.0, 30.0, size)
                    t_next = t + 500_000_000
            st.add(pending)
            if k in (8, 29):  # after 3 minutes, after 10: what is held, garbage collected
                gc.collect()
                held[k] = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert st.steps.n == 30 * len(steps) and len(st.steps) == 4096  # the ring wrapped
    grown = held[29] - held[8]
    assert grown < 64 * 1024, f"the live model grew {grown} bytes over 7 minutes of stream"
