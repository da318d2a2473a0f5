"""``rltperf bench ingest``'s monitor-cost run (``tui_cost``): a real loop engine, the real
monitor in a pseudo-terminal; it reports what the monitor received and leaves nothing
behind in the temporary folder."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from rltperf_tui.bench.ingest import tui_cost


def test_monitor_cost_run_reports_the_stream_and_leaves_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    r = tui_cost(duration=2.0, rate=200.0, refresh=2.0, warmup=3.0)
    # the monitor got the engine's steps without loss, and its CPU is a fraction of a core
    assert r["tui_steps_received"] >= 200 and r["tui_dropped"] == 0, r
    assert r["tui_records_received"] >= r["tui_steps_received"]
    assert 0 < r["tui_cpu_fraction"] < 1 and r["warmup_s"] == 3.0
    assert r["tui_ticks"] >= 4  # 2 Hz for at least 2 s
    assert list(tmp_path.iterdir()) == []  # the engine's snapshot folder and tui.json are gone
