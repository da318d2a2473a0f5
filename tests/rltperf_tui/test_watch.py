"""``rltperf watch``: a flight recorder on the real reference engine with an injected stall."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from tests.conftest import run_rltperf, start_engine

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stalled_engine(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    snaps = tmp_path_factory.mktemp("snapshots")
    eng = start_engine(
        ["-m", "rltperf_tui.cli", "engine", "--workload", "closed:4", "--inject-stall", "300@400",
         "--duration", "300", "--listen", "127.0.0.1:0", "--snapshots", str(snaps)],
        timeout=120,
    )  # fmt: skip
    eng.snapshots = snaps  # type: ignore[attr-defined]
    try:
        yield eng
    finally:
        eng.stop()


def test_watch_captures_the_stall_with_the_step_that_fired(stalled_engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "watch"
    res = run_rltperf("watch", stalled_engine.target, "--trigger", "step_ms>150", "--duration", "25",
                      "--cooldown", "8", "--steps", "4", "--out", str(out), "-q", timeout=200)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith("index.html") and (out / "index.html").exists()
    events = json.loads((out / "events.json").read_text())[0]["events"]
    saved = [e for e in events if e["result"] == "saved"]
    assert saved, events
    # every fire inside a cooldown was counted, not captured
    starts = sorted(e["ts_ns"] for e in saved)
    assert all(b - a >= 8e9 for a, b in itertools.pairwise(starts)), starts
    for e in events:
        if e["result"] == "not captured":
            assert any(0 <= e["ts_ns"] - s < 8e9 for s in starts) or "capture is running" in e["reason"], e
    stalls = 0
    for e in saved:
        bundle = Path(e["bundle"])
        meta = json.loads((bundle / "meta.json").read_text())
        trig = meta["trigger"]
        assert trig["rule"] == "step_ms>150" and trig["value"] > 150 and trig["step_id"] == e["step_id"]
        steps = [json.loads(line) for line in (bundle / "steps.jsonl").read_text().splitlines()]
        fired = [s for s in steps if s.get("trigger_step")]
        assert len(fired) == 1, "the step that fired the rule is in the bundle"
        s = fired[0]
        assert s["step_id"] == trig["step_id"] and s["window"] == "before_trigger"
        assert (s["end_ns"] - s["start_ns"]) / 1e6 == pytest.approx(trig["value"], abs=0.01)
        captured = [x for x in steps if x["window"] == "captured"]
        assert len(captured) == 4 and captured[0]["step_id"] > s["step_id"]
        assert [x["step_id"] for x in captured] == meta["capture"]["step_ids"]
        warm = meta["capture"]["profiler_warmup_step"]
        assert warm == captured[0]["step_id"] - 1 and warm >= s["step_id"]
        # the delay runs from the offending step's end to the first captured step's start
        # (the warm-up step before it is not captured), exactly, on the steps' own clock
        assert trig["ts_ns"] == s["end_ns"]
        assert trig["delay_steps"] == captured[0]["step_id"] - s["step_id"]
        assert trig["delay_ms"] == round((captured[0]["start_ns"] - s["end_ns"]) / 1e6, 3)
        stalls += (s["end_ns"] - s["start_ns"]) / 1e6 >= 290
        report = run_rltperf("report", str(bundle))
        assert report.stdout.splitlines()[1].startswith("TRIGGERED by step_ms>150"), report.stdout[:400]
    assert stalls >= 1, "at least one capture was fired by an injected 300 ms stall"
    assert (
        "step_ms&gt;150" in (out / "index.html").read_text()
        or "step_ms>150" in (out / "index.html").read_text()
    )


def test_a_rule_that_never_fires_captures_nothing(stalled_engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    before = set(Path(stalled_engine.snapshots).iterdir())
    out = tmp_path / "quiet"
    res = run_rltperf("watch", stalled_engine.target, "--trigger", "step_ms>100000", "--duration", "4",
                      "--out", str(out), "-q", timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert json.loads((out / "events.json").read_text())[0]["events"] == []
    assert "No rule fired" in (out / "index.html").read_text()
    assert set(Path(stalled_engine.snapshots).iterdir()) == before
    assert list(out.glob("*.rltrec")), "the unprofiled stream was recorded"


@pytest.mark.parametrize("rule", ["step_ms=>150", "latency>5", "idle>30"])
def test_a_malformed_rule_is_one_sentence_and_exit_2(rule: str) -> None:
    res = run_rltperf("watch", "tcp://127.0.0.1:9", "--trigger", rule, "--duration", "1")
    assert res.returncode == 2
    err = res.stderr.strip()
    assert err.startswith("rltperf watch: error:") and "\n" not in err, err


def test_events_kept_are_bounded_and_captures_never_dropped(tmp_path: Path) -> None:
    from rltperf_tui.commands.watch import MAX_EVENTS, _Rotating, _Watched
    from rltperf_tui.live.driver import TargetSpec
    from rltperf_tui.live.triggers import TriggerSet

    rec = _Rotating(str(tmp_path), "t", "t", 1 << 20, 1 << 20)
    w = _Watched(TargetSpec("t"), TriggerSet.parse(["step_ms>1"]), rec)
    w.keep_event({"result": "saved", "ts_ns": 0})
    for i in range(MAX_EVENTS + 500):
        w.keep_event({"result": "not captured", "ts_ns": i + 1})
    assert len(w.events) == MAX_EVENTS and w.dropped_events == 501
    assert w.events[0]["result"] == "saved" and w.events[-1]["ts_ns"] == MAX_EVENTS + 500
