"""Trigger rules: the grammar, and firing against numbers computed by hand."""

from __future__ import annotations

import pytest

from rltperf_tui.live.aggregator import TargetStats
from rltperf_tui.live.triggers import RuleError, TriggerSet, parse_rule
from tests.rltperf_tui.test_aggregator import MS, _hello, _steps


def test_grammar_accepts_the_documented_rules() -> None:
    r = parse_rule("step_ms>150")
    assert (r.figure, r.op, r.threshold, r.per_step) == ("step_ms", ">", 150.0, True)
    assert parse_rule("idle>30%").threshold == pytest.approx(0.3)
    assert parse_rule(" mbu < 0.2 ").text == "mbu<0.2"
    assert parse_rule("ttft_p99_ms>=500").op == ">="
    assert not parse_rule("idle>0.3").per_step


@pytest.mark.parametrize(
    "bad, says",
    [
        ("step_ms=>150", "cannot read"),
        ("latency>5", "unknown figure 'latency'"),
        ("idle>30", "fraction from 0 to 1"),
        ("step_ms>150%", "only idle and mbu"),
        ("", "cannot read"),
    ],
)
def test_a_malformed_rule_is_one_sentence(bad: str, says: str) -> None:
    with pytest.raises(RuleError) as e:
        parse_rule(bad)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_step_rule_fires_once_then_cooldown_then_again() -> None:
    ts = TriggerSet.parse(["step_ms>150"], cooldown_s=1.0, max_captures=2)
    steps = _steps(100, 10, 0)  # 10 ms steps, 0..1 s
    slow = _steps(1, 300, 0, start_id=100, t0=steps[-1].end_ns)
    more = _steps(10, 200, 0, start_id=101, t0=slow[0].end_ns)  # 10 slow steps, 2 s
    # one capture per batch at most (the next batch sees it running or finished)
    fires = ts.check_steps([*steps, *slow, *more[:3]]) + ts.check_steps(more[3:])
    assert [f.step_id for f in fires] == list(range(100, 111))
    captured = [f for f in fires if f.captured]
    # the 300 ms step captures; the cooldown (1 s) holds until step 105 ends at 1.0+0.3+1.2 s
    assert [f.step_id for f in captured] == [100, 105]
    assert fires[0].value == pytest.approx(300.0)
    assert fires[1].why_not.startswith("cooldown")
    assert fires[-1].why_not.startswith("maximum of 2")
    assert ts.captures == 2 and ts.suppressed == 9
    assert "2 captured, 9 not" in ts.status()


def test_gap_rule_ignores_holes_from_dropped_records() -> None:
    ts = TriggerSet.parse(["gap_ms>50"])
    a = _steps(5, 10, 0)
    b = _steps(5, 10, 0, start_id=7, t0=a[-1].end_ns + 100 * MS)  # ids 5, 6 lost: not a gap
    c = _steps(1, 10, 0, start_id=12, t0=b[-1].end_ns + 60 * MS)
    fires = ts.check_steps([*a, *b, *c])
    assert [(f.step_id, round(f.value)) for f in fires] == [(12, 60)]


def test_window_rule_over_the_aggregator_window() -> None:
    st = TargetStats()
    st.add([_hello(), *_steps(100, 8, 2, busy_ms=4)])  # idle 1 - 0.4/1.0 ≈ 0.6
    ts = TriggerSet.parse(["idle>0.5", "step_p99_ms>100"])
    w = st.window(None)
    fires = ts.check_window(w, st.vouched_ns)
    assert [f.rule.text for f in fires] == ["idle>0.5"]
    assert fires[0].value == pytest.approx(w.idle_fraction) and fires[0].captured
    ts.armed = False
    assert not ts.check_window(w, st.vouched_ns + 10**12)[0].captured
