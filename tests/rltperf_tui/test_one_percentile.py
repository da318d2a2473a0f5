"""One definition of the latency percentiles (``engine_adapters.definitions.figures.pct``),
called by every consumer: the monitor's window, ``report`` and ``compare``; and the
aggregator's parts (connection state, step windows) read as one ``TargetStats``."""

from __future__ import annotations

import numpy as np
import pytest

from engine_adapters.definitions import figures as F
from engine_adapters.definitions.records import EngineInfo, Hello, SessionEvent, Stats, StepRecord
from rltperf_tui.analysis import stats as S
from rltperf_tui.analysis.compare import _metric_values
from rltperf_tui.analysis.report_steps import summary_ms
from rltperf_tui.live.aggregator import TargetStats

MS = 1_000_000


def test_pct_by_hand() -> None:
    # 1..101: linear interpolation puts P50 at 51, P95 at 96, P99 at 100
    v = np.arange(1, 102, dtype=np.float64)
    assert F.pct(v) == {"p50": 51.0, "p95": 96.0, "p99": 100.0}
    # four samples: P95 lies 0.85 of the way from 3 to 4 (rank 0.95 x 3 = 2.85)
    assert F.pct(np.array([1.0, 2.0, 3.0, 4.0]))["p95"] == pytest.approx(3.85)
    assert F.pct(np.zeros(0)) == {"p50": None, "p95": None, "p99": None}
    assert F.percentile(np.array([1.0, 2.0, 3.0, 4.0]), 95) == pytest.approx(3.85)


def _steps(durations_ms: list[float]) -> list[StepRecord]:
    out, t = [], 10**9
    for i, d in enumerate(durations_ms):
        out.append(
            StepRecord(step_id=i, start_ns=t, end_ns=t + int(d * MS), kind="decode", tokens=1, out_tokens=1)
        )
        t += int(d * MS) + MS  # 1 ms gap
    return out


def test_window_report_and_compare_give_the_same_percentiles() -> None:
    durs = [1.0, 2.0, 2.5, 3.0, 10.0, 4.0, 1.5, 2.0, 7.0, 3.3] * 5
    st = TargetStats()
    st.add([Hello(schema=1, engine=EngineInfo(name="t"), stage_names=[]), *_steps(durs)])
    w = st.window(None)
    want = F.pct(np.array(durs))
    assert w.step_ms == pytest.approx(want)
    rep = summary_ms(durs)
    assert {k: rep[k] for k in want} == {k: round(v, 4) for k, v in want.items() if v is not None}
    part = {"step_ms": np.array(durs)}
    assert _metric_values(part, "step_ms", 95) == pytest.approx(want["p95"])
    # compare's statistic on too few samples reports the figure itself, by the same definition
    d = S.compare_stat("step P99", "ms", np.array(durs), np.array(durs[:3]), 99, np.random.default_rng(0))
    assert d.a == pytest.approx(want["p99"])


def test_target_stats_reads_and_writes_through_its_parts() -> None:
    st = TargetStats()
    st.state = "error"
    assert st.stream.state == "error"
    st.add([SessionEvent(state="connected", detail="hi")])
    assert st.state == "connected" and list(st.messages) == ["hi"]
    # a heartbeat between steps (stream state) moves the window end the step windows use
    st.add(_steps([2.0, 2.0]))
    end = st.last_end_ns
    assert end is not None and st.window_bounds(None)[1] == end
    st.add([Stats(ts_ns=end + 500 * MS, in_step_since_ns=0)])
    assert st.clock is st.windows.clock is st.stream.clock
    assert st.window_bounds(None)[1] == end + 500 * MS
    assert st.quiet_s == pytest.approx(0.5)
    assert st.window(None).span_s == pytest.approx((end + 500 * MS - 10**9) / 1e9)
