"""``rltperf bench ingest``'s monitor-cost run (``tui_cost``): a real loop engine, the real
monitor in a pseudo-terminal; it reports what the monitor received and leaves nothing
behind in the temporary folder."""

from __future__ import annotations

import json
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
    # (the figures as a string: pytest cuts a dict's repr, and a loaded .ci/run twice
    # received no step, its other figures cut off)
    assert r["tui_steps_received"] >= 200 and r["tui_dropped"] == 0, json.dumps(r)
    assert r["tui_records_received"] >= r["tui_steps_received"]
    # (a fresh-clone run on 2026-12-07 read 0.0: no CPU at all in the 2 s measured; the
    # figures ride along to tell a monitor blocked from one never scheduled next time)
    assert 0 < r["tui_cpu_fraction"] < 1 and r["warmup_s"] == 3.0, json.dumps(r)
    assert r["tui_ticks"] >= 4, json.dumps(r)  # 2 Hz for at least 2 s
    assert list(tmp_path.iterdir()) == []  # the engine's snapshot folder and tui.json are gone


_GONE_CHILD = """
import json, sys
json.dump({"records": 0, "steps": 0, "dropped": 0, "ticks": 0, "state": "gone"}, open(sys.argv[2], "w"))
print("monitor started, then crashed", flush=True)
"""


def test_a_monitor_that_ended_before_the_measurement_did_is_an_error_not_a_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CPU figure is the monitor process's run time over the seconds measured; a
    process that ended meanwhile ran none of them, and the run returned
    ``tui_cpu_fraction`` 0.0 as if it were a figure (a fresh-clone run of the suite on
    2026-12-07 read exactly 0.0, cause unknown: this is one way to get it).  The run now
    says the monitor ended, with its terminal's last words."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("RLTPERF_BENCH_CHILD", _GONE_CHILD)
    with pytest.raises(RuntimeError, match=r"(?s)monitor process ended \(exit 0\).*started, then crashed"):
        tui_cost(duration=1.0, rate=50.0, refresh=2.0, warmup=0.5)
    assert list(tmp_path.iterdir()) == []  # the engine and its folder are gone all the same


def test_beside_a_baseline_both_screens_watch_one_engine_and_the_ratio_is_theirs(tmp_path: Path) -> None:
    """``--baseline-root``: this checkout's screen and another's (here: this one again) on
    one paced engine over the same seconds; the ratio is the two figures', and vllm-htop,
    which cannot read a probe, is left out with the reason."""
    from rltperf_tui.bench import SOURCE_ROOT
    from rltperf_tui.bench.ingest import beside_baseline

    r = beside_baseline(str(SOURCE_ROOT), duration=3.0, rate=200.0, rounds=1, warmup=4.0)
    assert r["notes"] == [] and r["target"].startswith("tcp://"), r
    mons = r["monitors"]
    assert list(mons) == ["rltperf", f"rltperf ({Path(SOURCE_ROOT).name})"]
    ours, base = (m["cpu_fraction"][0] for m in mons.values())
    assert 0 < ours < 1 and 0 < base < 1, mons
    ratio = mons[f"rltperf ({Path(SOURCE_ROOT).name})"]["rltperf_over_this_median"]
    assert ratio == pytest.approx(ours / base, abs=2e-3)
    assert "probe" in r["htop_missing"] and r["rltperf_scrape_s"] is None


def test_a_baseline_that_is_not_a_checkout_is_one_sentence_before_any_measuring(tmp_path: Path) -> None:
    from tests.conftest import run_rltperf

    r = run_rltperf("bench", "ingest", "--baseline-root", str(tmp_path))
    assert r.returncode == 1 and "not a checkout of rltperf" in r.stderr, r.stderr
    assert r.stdout == ""  # no figure was measured first (the decode run prints one)
