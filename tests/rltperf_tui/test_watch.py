"""``rltperf watch``: a flight recorder on the real reference engine with an injected stall."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from tests.conftest import PACED_WORKLOAD, run_rltperf, start_engine

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stalled_engine(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    # paced (~110 steps/s: a 300 ms stall every ~4 s; ~half a core where closed:4 took
    # a whole one), from its first user to the module's end: its users come last (the
    # long watch, with an engine of its own, ran 34 s beside it before)
    snaps = tmp_path_factory.mktemp("snapshots")
    eng = start_engine(
        ["-m", "rltperf_tui.cli", "engine", "--workload", PACED_WORKLOAD, "--inject-stall", "300@400",
         "--duration", "300", "--listen", "127.0.0.1:0", "--snapshots", str(snaps)],
        timeout=120,
    )  # fmt: skip
    eng.snapshots = snaps  # type: ignore[attr-defined]
    try:
        yield eng
    finally:
        eng.stop()


@pytest.mark.parametrize("rule", ["step_ms=>150", "latency>5", "idle>30"])
def test_a_malformed_rule_is_one_sentence_and_exit_2(rule: str) -> None:
    res = run_rltperf("watch", "tcp://127.0.0.1:9", "--trigger", rule, "--duration", "1")
    assert res.returncode == 2
    err = res.stderr.strip()
    assert err.startswith("rltperf watch: error:") and "\n" not in err, err


@pytest.mark.parametrize("every", ["0", "0.1", "nan", "-5"])
def test_a_save_period_under_half_a_second_is_refused(every: str) -> None:
    res = run_rltperf("watch", "tcp://127.0.0.1:9", "--trigger", "step_ms>150", "--save-every", every)
    assert res.returncode == 2
    assert res.stderr.strip() == "rltperf watch: error: --save-every must be at least 0.5 s", res.stderr


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


def test_a_long_watch_reports_its_whole_run_not_its_last_file(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Issue 20 §5: a watch whose budget rotated its files away reported only the files
    left ("wall s 444.8" of a 25-minute run).  With a budget of a few 4 KiB files the
    run rotates several; its figures must still be the whole run's, against a full
    recording of the same engine made beside it and the engine's own step counter."""
    import os
    import re
    import subprocess
    import sys
    import time

    import numpy as np

    from engine_adapters.definitions.records import Bye, StepRecord
    from engine_adapters.monitor.recording import RecordingReader
    from rltperf_tui.live.whole_run import RELATIVE_ACCURACY
    from tests.conftest import ROOT

    eng = start_engine(
        ["-m", "rltperf_tui.cli", "engine", "--workload", PACED_WORKLOAD, "--duration", "18",
         "--listen", "127.0.0.1:0", "--snapshots", str(tmp_path / "snaps")],
        timeout=120,
    )  # fmt: skip
    full = tmp_path / "full.rltrec"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    recorder = subprocess.Popen(
        [sys.executable, "-m", "rltperf_tui.cli", "record", eng.target, "-o", str(full), "-q"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not full.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        out = tmp_path / "watch"
        # in this process, so that the live model's ring can be as small as a long run
        # makes the default one relative to its length (65536 steps: 7 minutes at 150/s)
        import argparse

        from rltperf_tui.commands import watch

        monkeypatch.setattr(watch, "RING_STEPS", 256)
        p = argparse.ArgumentParser()
        watch.add_arguments(p)
        args = p.parse_args([eng.target, "--trigger", "step_ms>100000", "--max-recording-mb", "0.015",
                             "--out", str(out), "-q"])  # fmt: skip
        assert watch.run(args) == 0
        recorder.wait(60)
        assert eng.proc.wait(30) == 0
        engine_said = eng.proc.stdout.read() if eng.proc.stdout else ""
    finally:
        recorder.kill()
        eng.stop()
    doc = json.loads((out / "events.json").read_text())[0]
    fig = doc["summary"]
    with RecordingReader(full) as rd:
        recs = [r for chunk in rd.chunks() for r in chunk]
    # the recorder started first: the watch saw most of its steps, not its ring's 256
    assert fig["steps"] > 0.6 * sum(isinstance(r, StepRecord) for r in recs), fig
    disk = doc["raw_on_disk"]
    assert disk["rotated_out"] >= 2, disk  # several files rotated away
    first_id, last_id = fig["step_ids"]
    # the engine's own step counter: its last step is the run's last
    m = re.search(r"after [\d.]+ s: (\d+) steps", engine_said)
    assert m and int(m.group(1)) == last_id + 1, engine_said[-500:]
    # the truth: every step of the same ids in the full recording, and its goodbye
    steps = [r for r in recs if isinstance(r, StepRecord) and first_id <= r.step_id <= last_id]
    bye = next(r for r in recs if isinstance(r, Bye))
    assert fig["dropped"] == 0 and len(steps) == last_id - first_id + 1 == fig["steps"]
    assert fig["tokens"] == sum(s.out_tokens for s in steps)
    run = json.loads(next(out.glob("*.run.json")).read_text())
    first_ns = run["clock"][0]
    assert fig["wall_s"] == pytest.approx((bye.ts_ns - first_ns) / 1e9, abs=1e-5)
    assert fig["tokens_per_s"] == pytest.approx(fig["tokens"] / fig["wall_s"], rel=1e-5)
    # the raw steps on disk are the run's end only; the figures are not
    on_disk_s = (disk["span_ns"][1] - disk["span_ns"][0]) / 1e9
    assert on_disk_s < 0.7 * fig["wall_s"] and disk["steps"] < fig["steps"]
    assert (disk["span_ns"][0] - first_ns) / 1e9 > 2.0
    # the sketch's percentiles: within its bound of the steps' own at their rank
    ms = np.sort([(s.end_ns - s.start_ns) / 1e6 for s in steps])
    for q in (50, 95, 99):
        exact = ms[int(np.floor(q / 100 * (ms.size - 1)))]
        assert abs(fig["step_ms"][f"p{q}"] - exact) <= RELATIVE_ACCURACY * exact + 1e-9, (
            q,
            fig["step_ms"],
            exact,
        )
    page = (out / "index.html").read_text()
    assert "Whole run: exact" in page and "Whole run: sketched" in page and "Raw steps on disk" in page
    assert f"{fig['wall_s']:.1f}" in page


def test_watch_captures_the_stall_with_the_step_that_fired(stalled_engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "watch"
    res = run_rltperf("watch", stalled_engine.target, "--trigger", "step_ms>150", "--duration", "18",
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


def test_a_crashed_watch_leaves_its_whole_run_figures(stalled_engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Killed without a word (SIGKILL: no report), the watch has saved its whole-run
    figures within the last ``--save-every`` seconds (2 here: the default 10 s made this
    test wait 22 s); they read back."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from rltperf_tui.live.whole_run import WholeRun
    from tests.conftest import ROOT

    out = tmp_path / "crash"
    SAVE_S = 2.0
    proc = subprocess.Popen(
        [sys.executable, "-m", "rltperf_tui.cli", "watch", stalled_engine.target, "--trigger", "step_ms>100000",
         "--out", str(out), "--save-every", str(SAVE_S), "-q"],
        env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        saved = list(out.glob("*.run.json")) if out.exists() else []
        while not saved and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            saved = list(out.glob("*.run.json")) if out.exists() else []
        assert saved, "the whole-run figures were saved while the watch ran"
        first = json.loads(saved[0].read_text())
        time.sleep(SAVE_S + 2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert not (out / "index.html").exists()
    again = json.loads(saved[0].read_text())
    run = WholeRun.from_json(again)
    fig = run.figures()
    assert fig["steps"] > WholeRun.from_json(first).figures()["steps"] > 0  # saved again since
    assert fig["wall_s"] > SAVE_S and fig["tokens_per_s"] and fig["step_ms"]["p50"]
