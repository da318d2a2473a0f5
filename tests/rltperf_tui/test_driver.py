"""The one live driver (``rltperf_tui.live.driver.LiveTarget``) on real parts: the fixed
recording replayed through it, recordings written through it (from the start, mid-stream,
on a full disk), the one definition of a busy capture, and a triggered capture with its
outcome against a real probe over a real socket."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from engine_adapters.definitions.records import (
    CaptureExporting,
    CaptureStarted,
    Hello,
    SessionEvent,
    StepRecord,
)
from engine_adapters.monitor.recording import RecordingWriter, read_all
from engine_adapters.monitor.registry import adapter_for
from engine_adapters.monitor.replay import ReplayAdapter
from rltperf_tui.live.driver import BUSY_STATES, LiveTarget, TargetSpec, capture_targets
from rltperf_tui.live.triggers import TriggerSet
from tests.conftest import LOOP_ENGINE, start_engine
from tests.rltperf_tui.test_aggregator import _hello, _steps

RECORDING = Path(__file__).resolve().parent / "tui" / "data" / "demo.rltrec"


def _replay(triggers: TriggerSet | None = None, speed: float = 0.0) -> LiveTarget:
    adapter = ReplayAdapter(str(RECORDING), speed=speed)
    return LiveTarget(TargetSpec("demo", session=adapter.connect(), adapter=adapter), triggers=triggers)


def _drive(t: LiveTarget, until: int | None = None) -> None:
    """Poll ``t`` until it ended (or ingested at least ``until`` records)."""
    deadline = time.monotonic() + 60
    while not t.ended and (until is None or t.stats.records < until):
        assert time.monotonic() < deadline, "the replay never ended"
        t.poll(0.05)


def test_a_recording_is_driven_to_its_end():
    _, truth = read_all(RECORDING)
    t = _replay()
    _drive(t)
    assert t.ended and t.end_reason == "end of recording"
    assert t.stats.steps.n == sum(isinstance(r, StepRecord) for r in truth)
    # every record of the file, plus the replay's own connected/ended events
    assert t.stats.records == len(truth) + 2


def test_a_recording_made_through_the_driver_is_the_stream(tmp_path: Path):
    _, truth = read_all(RECORDING)
    t = _replay()
    sink = RecordingWriter(tmp_path / "copy.rltrec", target="demo")
    t.start_recording(sink, str(tmp_path / "copy.rltrec"))
    _drive(t)
    t.stop_recording()
    _, copy = read_all(tmp_path / "copy.rltrec")
    assert copy == truth  # session events are the monitor's, never recorded
    assert not any(isinstance(r, SessionEvent) for r in copy)


def test_a_recording_started_mid_stream_opens_with_the_hello(tmp_path: Path):
    _, truth = read_all(RECORDING)
    t = _replay(speed=40.0)  # paced: at speed 0 one read returns the whole file
    _drive(t, until=300)
    seen = t.stats.records - 1  # less the replay's "connected" event
    assert 0 < seen < len(truth)
    t.start_recording(RecordingWriter(tmp_path / "late.rltrec"))
    _drive(t)
    t.stop_recording()
    _, late = read_all(tmp_path / "late.rltrec")
    assert isinstance(late[0], Hello) and late[0] == truth[0]
    assert late[1:] == truth[seen:]


def test_a_full_disk_stops_the_recording_and_says_why_while_reading_goes_on():
    _, truth = read_all(RECORDING)
    t = _replay()
    t.start_recording(RecordingWriter("/dev/full", overwrite=True))  # ENOSPC once the buffer fills
    _drive(t)
    assert t.recorder is None
    assert t.recording_error is not None and "/dev/full" in t.recording_error
    assert t.stats.steps.n == sum(isinstance(r, StepRecord) for r in truth)


def test_a_busy_capture_is_one_definition():
    t = LiveTarget(TargetSpec("t"))
    assert not t.capture_busy
    t.begin_capture()  # a request on its way: busy before the engine knows of it
    assert t.capture_busy
    t.capture_not_sent()
    assert not t.capture_busy
    for state in ("requested", "armed", "capturing", "exporting", "saved", "failed", "refused"):
        c = t.stats.note_capture_request("c1", "ops", 4)
        c.state = state
        assert t.capture_busy == (state in BUSY_STATES), state
    assert {"requested", "armed", "capturing", "exporting"} == BUSY_STATES


def test_a_step_rule_does_not_capture_while_a_capture_is_busy():
    t = LiveTarget(TargetSpec("t"), triggers=TriggerSet.parse(["step_ms>150"], cooldown_s=0.0))
    t.ingest([_hello(), SessionEvent(state="connected")])
    t.stats.note_capture_request("c1", "ops", 4).state = "exporting"
    slow = _steps(1, 300, 0)
    fires = t.ingest(slow).fires
    assert [f.captured for f in fires] == [False] and fires[0].why_not == "a capture is running"
    t.stats.captures["c1"].state = "saved"
    fires = t.ingest(_steps(1, 300, 0, start_id=1, t0=slow[-1].end_ns)).fires
    assert [f.captured for f in fires] == [True]
    assert list(t.fire_marks) == [slow[0].end_ns, fires[0].ts_ns]


def test_a_recording_marks_where_rules_fire_and_captures_nothing():
    t = _replay(TriggerSet.parse(["step_ms>30"]))
    _drive(t)
    assert t.triggers is not None and t.triggers.fires
    assert not any(f.captured for f in t.triggers.fires)
    assert {f.why_not for f in t.triggers.fires} == {"a recording: nothing to capture"}
    assert not t.can_capture_now and capture_targets(t, [t], every=True) == []


@pytest.fixture(scope="module")
def probe_target(tmp_path_factory: pytest.TempPathFactory):
    snaps = tmp_path_factory.mktemp("snaps")
    eng = start_engine([str(LOOP_ENGINE), "--duration", "60", "--snapshots", str(snaps), "--rate", "200"])
    try:
        yield eng.target
    finally:
        eng.stop()


def test_a_fire_captures_and_the_driver_follows_it_to_the_bundle(probe_target: str):
    adapter = adapter_for(probe_target, reconnect=False)
    t = LiveTarget(
        TargetSpec(probe_target, session=adapter.connect(), adapter=adapter),
        triggers=TriggerSet.parse(["step_ms>0"], cooldown_s=60.0),
    )
    try:
        fire = None
        deadline = time.monotonic() + 30
        while fire is None:
            assert time.monotonic() < deadline, "no step arrived"
            fires = t.poll(0.1).fires
            fire = next((f for f in fires if f.captured), None)
        assert t.can_capture_now and capture_targets(t, [t], every=False) == [t]
        cid = t.request_capture(3, "ops", fire)
        assert t.capture_busy and fire.capture_id == cid
        assert t.stats.captures[cid].trigger is not None and "step_ms>0" in t.stats.captures[cid].trigger
        states: list[str] = []
        outcome = None
        deadline = time.monotonic() + 60
        while outcome is None:
            assert time.monotonic() < deadline, f"no outcome; states seen {states}"
            got = t.poll(0.1)
            states.append(t.stats.captures[cid].state)
            # while it runs, every further fire is counted, not captured
            assert all(not f.captured for f in got.fires)
            outcome = next((o for o in got.outcomes if o.capture_id == cid), None)
        assert outcome.saved and outcome.fire is fire and outcome.steps_captured == 3
        assert outcome.bundle is not None and Path(outcome.bundle, "meta.json").is_file()
        assert not t.capture_busy and not t.triggered
        event = outcome.as_dict()
        assert (event["result"], event["rule"], event["bundle"]) == ("saved", "step_ms>0", outcome.bundle)
        assert "capturing" in states or "exporting" in states
    finally:
        assert t.session is not None
        t.session.close()


def test_capture_records_move_a_capture_the_driver_did_not_ask_for():
    """A capture another monitor asked for still makes this target busy (the engine
    runs one at a time)."""
    t = LiveTarget(TargetSpec("t"))
    t.ingest([CaptureStarted(capture_id="x", first_step=5, steps=4, mode="ops")])
    assert t.capture_busy and t.stats.captures["x"].state == "capturing"
    t.ingest([CaptureExporting(capture_id="x", since_ns=1)])
    assert t.capture_busy
