"""Pilot tests of the live monitor against real engines, real sockets and a real recording."""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine_adapters.definitions.records import SCHEMA_VERSION, EngineInfo, Hello, StepRecord
from engine_adapters.monitor.recording import RecordingWriter, read_all
from engine_adapters.monitor.replay import ReplayAdapter
from rltperf_tui.tui.app import MonitorApp, TargetSpec
from rltperf_tui.tui.screens.help import HelpScreen
from rltperf_tui.tui.widgets.captures import CapturesPanel
from rltperf_tui.tui.widgets.device import DevicePanel
from rltperf_tui.tui.widgets.latency import LatencyPanel
from rltperf_tui.tui.widgets.loops import LoopsPanel
from rltperf_tui.tui.widgets.roofline_panel import RooflinePanel
from rltperf_tui.tui.widgets.status_bar import StatusBar
from rltperf_tui.tui.widgets.step_timeline import StepTimeline
from rltperf_tui.tui.widgets.target_header import TargetHeader
from tests.conftest import LOOP_ENGINE, ROOT, free_ports, start_engine
from tests.rltperf_tui.tui._uihelpers import (
    RECORDING,
    drawn_at_final_size,
    panel_text,
    replay_spec,
    sync,
    wait_for,
)

NUM = r"\d+\.\d+"
MS = r"\d+(?:\.\d+)?"
"""A figure as ms() prints it: decimals below 100 ms, none from 100 ms (a loaded machine's TTFT)."""


def _trace_steps(bundle: Path) -> set[str]:
    """Distinct ``rltperf.step#<id>`` ranges in a bundle's trace."""
    with gzip.open(bundle / "trace.json.gz", "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return {m.group(0) for e in events if (m := re.match(r"rltperf\.step#\d+", str(e.get("name", ""))))}


@pytest.fixture(scope="module")
def paced_engine(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The torch loop engine at 200 steps/s (a live target that leaves CPU to the UI)."""
    snaps = tmp_path_factory.mktemp("snapshots")
    eng = start_engine([str(LOOP_ENGINE), "--duration", "300", "--rate", "200", "--snapshots", str(snaps)])
    eng.snapshots = snaps  # type: ignore[attr-defined]
    try:
        yield eng
    finally:
        eng.stop()


@sync
async def test_live_numbers_and_two_captures(paced_engine) -> None:  # type: ignore[no-untyped-def]
    """Attach to a real engine, see numbers, press c and f, find both bundles on disk."""
    app = MonitorApp([paced_engine.target], refresh_hz=4)
    async with app.run_test(size=(120, 40)) as pilot:
        h = app.handles[0]
        await wait_for(pilot, lambda: len(h.stats.steps) >= 200, what="200 steps")
        app.force_render()
        await pilot.pause(0.1)
        lat = panel_text(app, LatencyPanel)
        assert re.search(rf"step\s+{NUM}\s+{NUM}\s+{NUM}", lat), lat
        head = panel_text(app, TargetHeader)
        assert "connected" in head and "RANDOM WEIGHTS" in head and "test-loop" in head
        # the test engine names no loop or exit policy: an n/a it can never fill is not shown
        config = head.splitlines()[1]
        assert "n/a" not in config and "loops" not in config and "spec off" in config, head
        assert re.search(r"idle\s+\d+\.\d%", panel_text(app, DevicePanel))
        assert "forward" in panel_text(app, StepTimeline)

        await pilot.press("c")
        await wait_for(
            pilot, lambda: any(c.state == "saved" for c in h.stats.captures.values()), what="ops capture"
        )
        await pilot.press("right_square_bracket")  # N 8 -> 16
        assert app.capture_steps == 16
        await pilot.press("left_square_bracket")  # back to 8
        assert app.capture_steps == 8
        await pilot.press("f")
        await wait_for(
            pilot,
            lambda: sum(c.state == "saved" for c in h.stats.captures.values()) == 2,
            what="full capture",
        )
        app.force_render()
        await pilot.pause(0.1)
        caps = panel_text(app, CapturesPanel)
        assert "full N=8   saved 8/8 steps" in caps and "ops  N=8   saved 8/8 steps" in caps, caps
    bundles = {json.loads((b / "meta.json").read_text())["capture"]["mode"]: b for b in
               paced_engine.snapshots.iterdir() if (b / "meta.json").exists()}  # fmt: skip
    assert set(bundles) == {"ops", "full"}
    for mode, b in bundles.items():
        meta = json.loads((b / "meta.json").read_text())["capture"]
        assert meta["steps_requested"] == 8 and meta["steps_captured"] == 8, meta
        assert meta["record_shapes"] is (mode == "full")
        assert len(_trace_steps(b)) == 8, (mode, sorted(_trace_steps(b)))
        assert (b / "ops.txt").stat().st_size > 0 and (b / "steps.jsonl").stat().st_size > 0


@sync
async def test_record_key_writes_a_readable_recording(paced_engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    app = MonitorApp([paced_engine.target], record_dir=str(tmp_path))
    async with app.run_test(size=(120, 40)) as pilot:
        h = app.handles[0]
        await wait_for(pilot, lambda: h.stats.hello is not None and len(h.stats.steps) > 10, what="hello")
        await pilot.press("r")
        assert h.recorder is not None
        start = h.stats.last_step_id or 0
        await wait_for(pilot, lambda: (h.stats.last_step_id or 0) > start + 100, what="100 more steps")
        await pilot.press("r")
        assert h.recorder is None
    files = list(tmp_path.glob("rltperf-127-0-0-1-*.rltrec"))
    assert len(files) == 1, files
    header, recs = read_all(files[0])
    assert isinstance(recs[0], Hello) and header["target"] == paced_engine.target
    ids = [r.step_id for r in recs if isinstance(r, StepRecord)]
    # from the first batch read after the press (records already read but not yet on the
    # screen are not in it) to past the 100 the screen counted, with no step missing
    assert ids and ids[-1] > start + 100 and ids == list(range(ids[0], ids[-1] + 1)), ids


@sync
async def test_engine_restart_shows_reconnecting_and_resumes(tmp_path: Path) -> None:
    port = free_ports()
    args = [str(LOOP_ENGINE), "--listen", f"127.0.0.1:{port}", "--duration", "60", "--rate", "200",
            "--no-warm", "--snapshots", str(tmp_path)]  # fmt: skip
    eng = start_engine(args)
    try:
        app = MonitorApp([eng.target])
        async with app.run_test(size=(100, 30)) as pilot:
            h = app.handles[0]
            await wait_for(pilot, lambda: len(h.stats.steps) > 20, what="steps")
            eng.stop()
            await wait_for(pilot, lambda: h.stats.state == "reconnecting", what="reconnecting")
            app.force_render()
            await pilot.pause(0.1)
            assert "reconnecting" in panel_text(app, TargetHeader)
            eng = start_engine(args)
            n = len(h.stats.steps)
            await wait_for(pilot, lambda: h.stats.state == "connected" and len(h.stats.steps) > n + 20,
                           timeout=40, what="reconnected")  # fmt: skip
    finally:
        eng.stop()


@sync
async def test_unreachable_target_is_a_message_not_a_traceback() -> None:
    port = free_ports()
    app = MonitorApp([f"tcp://127.0.0.1:{port}"], wait=False)
    async with app.run_test(size=(80, 24)) as pilot:
        h = app.handles[0]
        await wait_for(pilot, lambda: h.stats.state == "error", what="error state")
        app.force_render()
        await pilot.pause(0.1)
        assert "nothing listens" in panel_text(app, TargetHeader)


def test_attach_cli_unreachable_exits_with_a_sentence() -> None:
    port = free_ports()
    p = subprocess.run([sys.executable, "-m", "rltperf_tui.cli", "attach", f"tcp://127.0.0.1:{port}"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)  # fmt: skip
    assert p.returncode == 1
    assert "cannot attach" in p.stderr and "nothing listens" in p.stderr and "Traceback" not in p.stderr
    p = subprocess.run([sys.executable, "-m", "rltperf_tui.cli", "replay", "/nonexistent.rltrec"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)  # fmt: skip
    assert p.returncode == 1 and "no such file" in p.stderr and "Traceback" not in p.stderr


@sync
async def test_replay_keys_pause_speed_and_help() -> None:
    app = MonitorApp([replay_spec(speed=1.0)])
    async with app.run_test(size=(120, 40)) as pilot:
        h = app.handles[0]
        session = h.session
        await wait_for(pilot, lambda: len(h.stats.steps) > 0, what="replayed steps")
        await pilot.press("p")
        assert session.paused  # type: ignore[union-attr]
        await pilot.pause(0.5)
        n = len(h.stats.steps)
        await pilot.pause(0.6)
        assert len(h.stats.steps) == n, "a paused replay must not deliver records"
        await pilot.press("p", "plus")
        assert not session.paused and session.speed == 2.0  # type: ignore[union-attr]
        await pilot.press("minus", "minus")
        assert session.speed == 0.5  # type: ignore[union-attr]
        await pilot.press("space")
        assert app.display_paused
        await pilot.pause(0.3)
        assert "DISPLAY PAUSED" in app.query_one(StatusBar).shown_text()
        await pilot.press("space")
        assert not app.display_paused
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        ticks = app.ticks
        await pilot.pause(1.2)  # render ticks keep running under the help screen
        assert app.ticks > ticks and isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("c")  # a recording cannot capture: a notification, no crash
        await pilot.pause(0.1)
        assert any("recording" in n.message for n in app._notifications)
        await pilot.press("q")
    assert app.return_code == 0


@sync
async def test_mbu_above_one_is_flagged() -> None:
    """A peak far below what the byte count implies: MBU > 1 must be flagged on screen."""
    app = MonitorApp([replay_spec()], peak_gbps=0.5)
    async with app.run_test(size=(120, 40)) as pilot:
        h = app.handles[0]
        await wait_for(pilot, lambda: h.stats.state == "ended", what="end of replay")
        app.force_render()
        await pilot.pause(0.1)
        roof = panel_text(app, RooflinePanel)
        assert "⚠ >1" in roof and "--peak-gbps flag" in roof, roof
        assert "steps beat the ceiling" in roof, roof
        assert "⚠" in panel_text(app, TargetHeader)


@sync
async def test_two_targets_side_by_side_and_narrow() -> None:
    app = MonitorApp([replay_spec(name="P"), replay_spec(name="D")])
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_for(pilot, lambda: all(h.stats.state == "ended" for h in app.handles), what="end")
        app.force_render()
        await pilot.pause(0.1)
        c0, c1 = app.query_one("#target-0"), app.query_one("#target-1")
        assert c0.region.x < c1.region.x and c0.region.y == c1.region.y
        assert not c0.has_class("-wide")  # 80 cells each: one stack per column
        assert "MBU" in panel_text(app, TargetHeader, 1)


@sync
async def test_no_color_keeps_stages_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    app = MonitorApp([replay_spec()])
    assert app.no_color
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.handles[0].stats.state == "ended", what="end")
        app.force_render()
        await pilot.pause(0.1)
        await drawn_at_final_size(pilot)
        chart = panel_text(app, StepTimeline)
        assert "▓" in chart and "▒" in chart  # second and third stage glyphs


def _replay_app(path: Path, records: list[Any]) -> MonitorApp:
    """A monitor replaying ``records``, written to ``path``, as fast as they are read."""
    with RecordingWriter(path) as w:
        w.write(records)
    adapter = ReplayAdapter(str(path), speed=0.0)
    return MonitorApp([TargetSpec(target=path.stem, adapter=adapter, session=adapter.connect())])


async def _replayed_to_the_end(app: MonitorApp, pilot: Any) -> None:
    """Wait until the replay has ended, then draw its final figures."""
    await wait_for(pilot, lambda: app.handles[0].stats.state == "ended", what="end")
    app.force_render()
    await pilot.pause(0.1)


@sync
async def test_timeline_axis_clips_a_rare_outlier_and_names_it(tmp_path: Path) -> None:
    """30 s of ~20 ms steps and one 3 s step (a capture's export, a stall): the axis
    follows the typical columns, the outlier's column reaches the top with ↑ and its value
    is named under the chart, so the other columns stay readable."""
    rec = tmp_path / "outlier.rltrec"
    hello = Hello(schema=SCHEMA_VERSION, engine=EngineInfo(name="e"), stage_names=["schedule", "forward"])
    steps, t = [], 0
    for i in range(1500):
        d = 3_000_000_000 if i == 700 else 20_000_000 + (i % 7) * 1_000_000
        steps.append(StepRecord(step_id=i, start_ns=t, end_ns=t + d, stage_ns=[d // 10, d - d // 10]))
        t += d + 1_000_000
    app = _replay_app(rec, [hello, *steps])
    async with app.run_test(size=(120, 40)) as pilot:
        await _replayed_to_the_end(app, pilot)
        await drawn_at_final_size(pilot)
        chart = panel_text(app, StepTimeline)
        tl = app.query_one(StepTimeline).ctx.stats.timeline  # the buckets the chart drew
    top = float(chart.split("ms┤", 1)[0].split()[-1])
    assert 26 <= top <= 100, chart  # the typical columns (20-26 ms), not the 3 s one
    assert "↑" in chart.splitlines()[0], chart  # the clipped column's top cell
    # named: the highest bucket mean (the 3 s step shares its bucket with a few 20 ms ones)
    peak = float(chart.split("↑ ", 2)[-1].split(" ms", 1)[0])
    assert peak > 5 * top, chart
    assert max(v for v in tl.step_ms if v == v) == pytest.approx(peak, rel=0.01)
    rows = chart.splitlines()
    bottom = next(i for i, r in enumerate(rows) if r.strip().startswith("0 ms┤"))
    assert sum(r.count("█") for r in rows[: bottom + 1]) > 150  # the typical columns are tall


@sync
async def test_a_stream_faster_than_the_ring_keeps_says_so_in_the_bar_and_the_titles(tmp_path: Path) -> None:
    """8 s of 0.2 ms steps (5 000 steps/s): the step ring keeps 32 768 of them, 6.55 s,
    less than the 10 s window.  The panels' titles name the span they cover, and the
    status bar, which names the window, says what the ring holds (it read "window 10 s"
    alone while the panels covered 6.6 s)."""
    rec = tmp_path / "fast.rltrec"
    hello = Hello(schema=SCHEMA_VERSION, engine=EngineInfo(name="e"), stage_names=["forward"])
    d = 200_000
    steps = [StepRecord(step_id=i, start_ns=i * d, end_ns=(i + 1) * d, stage_ns=[d]) for i in range(40_000)]
    app = _replay_app(rec, [hello, *steps])
    async with app.run_test(size=(160, 48)) as pilot:
        await _replayed_to_the_end(app, pilot)
        bar = app.query_one(StatusBar).shown_text()
        title = str(app.query_one(LatencyPanel).border_title)
    held = 32_768 * d / 1e9  # the ring's steps, back to back
    assert f"window 10 s (ring holds {held:.1f} s)" in bar, bar
    assert f"last {held:.1f} s" in title, title


def test_recording_fixture_is_small() -> None:
    assert RECORDING.stat().st_size <= 1024 * 1024


@sync
async def test_target_spec_without_session_connects_in_worker(paced_engine) -> None:  # type: ignore[no-untyped-def]
    app = MonitorApp([TargetSpec(target=paced_engine.target)])
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: len(app.handles[0].stats.steps) > 10, what="steps")
        assert app.handles[0].stats.state == "connected"


@sync
async def test_every_key_is_in_the_command_palette() -> None:
    app = MonitorApp([replay_spec()])
    async with app.run_test(size=(120, 40)):
        titles = {c.title for c in app.get_system_commands(app.screen)}
    for t in ("Capture ops-only", "Capture full", "Halve capture length", "Double capture length",
              "Pause display", "Replay play/pause", "Replay faster", "Replay slower", "Help", "Quit"):  # fmt: skip
        assert t in titles, t


def test_monitor_never_imports_torch() -> None:
    code = (
        "import sys, rltperf_tui.tui.app, rltperf_tui.tui.screens.help, rltperf_tui.bench.ingest\n"
        "import rltperf_tui.commands.attach, rltperf_tui.commands.demo, rltperf_tui.commands.replay\n"
        "bad = sorted(m for m in ('torch', 'vllm') if m in sys.modules)\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


HAVE_REFERENCE = importlib.util.find_spec("rltperf_tui.commands.engine") is not None


@pytest.mark.skipif(not HAVE_REFERENCE, reason="the reference engine (rltperf engine) is not in this build")
@sync
async def test_reference_engine_panels_and_captures(tmp_path: Path) -> None:
    """The real reference engine: loops, requests and KV reach the panels; c and f each
    leave a complete bundle of the requested steps."""
    snaps = tmp_path / "snapshots"
    eng = start_engine(["-m", "rltperf_tui.cli", "engine", "--preset", "tiny", "--device", "cpu",
                        "--workload", "steady-bursts", "--listen", "127.0.0.1:0", "--snapshots", str(snaps)],
                       timeout=120)  # fmt: skip
    try:
        app = MonitorApp([eng.target], capture_steps=4)
        async with app.run_test(size=(120, 40)) as pilot:
            h = app.handles[0]
            await wait_for(pilot, lambda: h.stats.reqs.n >= 3 and len(h.stats.steps) >= 100, timeout=90,
                           what="steps and finished requests")  # fmt: skip
            app.force_render()
            await pilot.pause(0.1)
            assert re.search(rf"TTFT\s+{MS}\s", panel_text(app, LatencyPanel))
            assert "rltperf-reference" in panel_text(app, TargetHeader)
            assert "RANDOM WEIGHTS" in panel_text(app, TargetHeader)
            loops = panel_text(app, LoopsPanel)
            assert re.search(r"^\s+1\s", loops, re.M), loops  # a row per loop depth
            await pilot.press("c")
            await wait_for(
                pilot, lambda: any(c.state == "saved" for c in h.stats.captures.values()), timeout=120
            )
            await pilot.press("f")
            await wait_for(pilot, lambda: sum(c.state == "saved" for c in h.stats.captures.values()) == 2,
                           timeout=120)  # fmt: skip
    finally:
        eng.stop()
    metas = [
        json.loads((b / "meta.json").read_text())["capture"]
        for b in snaps.iterdir()
        if (b / "meta.json").exists()
    ]
    assert sorted(m["mode"] for m in metas) == ["full", "ops"]
    assert all(m["steps_requested"] == 4 and m["steps_captured"] == 4 for m in metas), metas


@sync
async def test_capture_states_on_screen() -> None:
    """Each capture state reads right: armed, capturing k/N with a bar, exporting, failed with its reason."""
    from engine_adapters.definitions.records import (
        CaptureExporting,
        CaptureFailed,
        CaptureProgress,
        CaptureStarted,
    )

    app = MonitorApp([replay_spec()])
    async with app.run_test(size=(120, 40)) as pilot:
        h = app.handles[0]
        await wait_for(pilot, lambda: h.stats.state == "ended", what="end")
        h.stats.note_capture_request("c1", "full", 8)
        app.force_render()
        await pilot.pause(0.05)
        assert "full N=8   armed waiting for the next step boundary" in panel_text(app, CapturesPanel)
        h.stats.add([CaptureStarted(capture_id="c1", first_step=100, steps=8, mode="full", cold=True),
                     CaptureProgress(capture_id="c1", steps_done=3, steps=8)])  # fmt: skip
        app.force_render()
        await pilot.pause(0.05)
        text = panel_text(app, CapturesPanel)
        assert (
            re.search(r"full N=8\s+capturing 3/8 █+", text) and "from step 100" in text and "cold" in text
        ), text
        assert "full 3/8" in app.query_one(StatusBar).shown_text()
        h.stats.add([CaptureExporting(capture_id="c1", since_ns=1)])
        app.force_render()
        await pilot.pause(0.05)
        assert "export running" in panel_text(app, CapturesPanel)
        h.stats.add([CaptureFailed(capture_id="c1", reason="disk full: no space left under the snapshot root",
                                   bundle="/snap/x_full_8steps")])  # fmt: skip
        app.force_render()
        await pilot.pause(0.05)
        text = panel_text(app, CapturesPanel)
        assert (
            "failed" in text
            and "disk full: no space left" in text
            and "error kept in /snap/x_full_8steps" in text
        )


@sync
async def test_the_captures_panel_says_which_path_a_vllm_capture_took() -> None:
    """A vLLM server's capture: rltperf inside its workers (with the ranks held), or vLLM's
    own profiler; the panel says which (``CaptureDone.via``); the probe's own says nothing."""
    from engine_adapters.definitions.records import CaptureDone

    app = MonitorApp([replay_spec()])
    async with app.run_test(size=(120, 40)) as pilot:
        h = app.handles[0]
        await wait_for(pilot, lambda: h.stats.state == "ended", what="end")
        vias = {"w": "rltperf in vLLM's workers, traces of 2/2 ranks (dp0-tp0, dp0-tp1)",
                "v": "vLLM's own profiler (--profiler-config)", "p": None}  # fmt: skip
        for cid, via in vias.items():
            h.stats.note_capture_request(cid, "ops", 4)
            h.stats.add([CaptureDone(capture_id=cid, bundle=f"/snap/{cid}_ops_4steps", steps_requested=4,
                                     steps_captured=4, trace_bytes=2048, events=100, export_s=0.2, via=via)])  # fmt: skip
        app.force_render()
        await pilot.pause(0.05)
        text = panel_text(app, CapturesPanel)
        assert "via rltperf in vLLM's workers, traces of 2/2 ranks" in text, text  # (the ranks elided to fit)
        assert "via vLLM's own profiler (--profiler-config)" in text, text
        assert text.count("via ") == 2, text


def _recording_span_s() -> float:
    """The fixture recording's span in data time, from its records' own clocks."""
    from engine_adapters.definitions.records import DeviceSample, RequestRecord, Stats

    _, recs = read_all(RECORDING)
    times = [r.end_ns for r in recs if isinstance(r, StepRecord)]
    times += [r.finish_ns for r in recs if isinstance(r, RequestRecord)]
    times += [r.ts_ns for r in recs if isinstance(r, (DeviceSample, Stats))]
    return (max(times) - min(times)) / 1e9


def _replay_clock(text: str) -> tuple[float, float, str]:
    """(position s, length s, the rest) of ``replay MM:SS.s / MM:SS.s · ...``."""
    m = re.search(r"replay (\d\d):(\d\d\.\d) / (\d\d):(\d\d\.\d) · (.*)", text)
    assert m, text
    return int(m[1]) * 60 + float(m[2]), int(m[3]) * 60 + float(m[4]), m[5]


@sync
async def test_replay_shows_position_length_speed_and_pause() -> None:
    span = _recording_span_s()
    app = MonitorApp([replay_spec(speed=4.0)])
    async with app.run_test(size=(120, 40)) as pilot:
        h = app.handles[0]
        bar = app.query_one(StatusBar)
        await wait_for(pilot, lambda: len(h.stats.steps) > 0 and "…" not in bar.shown_text(),
                       what="replayed steps and the recording's length")  # fmt: skip
        await pilot.pause(1.0)
        app.force_render()
        pos, total, rest = _replay_clock(bar.shown_text())
        assert total == pytest.approx(span, abs=0.051)  # shown to a tenth
        assert 0 < pos < total and rest.startswith("4× ▶")
        await pilot.press("p")
        # The position is the last record read: a reader behind the replay clock when it
        # stopped still reads up to it (a parallel run: 8.2 s shown 0.3 s after `p`, 8.4 s
        # 0.8 s later).  Once two looks 0.3 s apart agree it is there; playing on, it
        # would move 1.2 s between them.
        paused_at, rest = -1.0, ""
        for _ in range(30):
            await pilot.pause(0.3)
            app.force_render()
            at, _, rest = _replay_clock(bar.shown_text())
            if at == paused_at:
                break
            paused_at = at
        assert "❚❚ paused" in rest and paused_at >= pos
        await pilot.pause(0.8)  # 3.2 s of data at 4x, were it playing
        app.force_render()
        assert _replay_clock(bar.shown_text())[0] == paused_at
        await pilot.press("p", "plus")
        await wait_for(pilot, lambda: h.stats.state == "ended", timeout=30, what="end of replay")
        app.force_render()
        await pilot.pause(0.1)
        pos, total, rest = _replay_clock(bar.shown_text())
        assert pos == total and rest.startswith("8×, ended ·")
