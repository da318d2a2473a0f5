"""SVG snapshots of the main screen over the fixed recording (replayed at speed 0, so
the screen is the end of the recording and holds no wall-clock text).

Regenerate after an intended change: ``pytest tests/rltperf_tui/tui/test_snapshots.py --snapshot-update``
and look at the SVGs under ``__snapshots__`` before committing them."""

from __future__ import annotations

from typing import Any

from rltperf_tui.tui.app import MonitorApp
from tests.rltperf_tui.tui._uihelpers import replay_finished, replay_spec


def test_main_screen_120x40(snap_compare: Any) -> None:
    app = MonitorApp([replay_spec()], slo_ttft_ms=500, slo_tpot_ms=50)
    assert snap_compare(app, terminal_size=(120, 40), run_before=replay_finished)


def test_main_screen_80x24(snap_compare: Any) -> None:
    app = MonitorApp([replay_spec()])
    assert snap_compare(app, terminal_size=(80, 24), run_before=replay_finished)


def test_triggers_on_a_recording_120x40(snap_compare: Any) -> None:
    """Trigger rules over a recording: where they fire is marked (▲), nothing is captured."""
    app = MonitorApp([replay_spec()], triggers=["step_ms>150", "gap_ms>50"])
    assert snap_compare(app, terminal_size=(120, 40), run_before=replay_finished)
