"""A capture's export longer than the window (issue 20 §4).

On a loaded machine an export ran 11-14 s; the 10 s window then held only exporting
steps and the latency, device and roofline panels read n/a.  Exporting steps stay out of
the figures (``rltperf bench exporting``: the engine runs slower during an export on a
loaded host), so a live window that they own (``figures.blind``) shows the newest
figures of a window that was not blind, marked stale with their age; the screen, ``attach
--jsonl`` (``summarize``) and the probe's Prometheus gauges all hold them through
``figures.HeldFigures``.  An idle engine during an export is not blind: idle is 100 %.
"""

from __future__ import annotations

import pytest

from engine_adapters.definitions import figures as F
from engine_adapters.definitions.records import FLAG_EXPORTING, FLAG_PROFILED, Stats, StepRecord
from rltperf_tui.analysis.summary import summarize
from rltperf_tui.live.aggregator import TargetStats
from tests.rltperf_tui.test_aggregator import MS, _hello, _steps

S = 1000 * MS


def _flag(steps: list[StepRecord], flags: int) -> list[StepRecord]:
    return [s.__class__(**{**{f: getattr(s, f) for f in s.__struct_fields__}, "flags": flags}) for s in steps]


def _loaded() -> tuple[TargetStats, list[StepRecord], list[StepRecord]]:
    """5 s of 10 ms steps (5 ms busy: idle 0.5), 8 profiled steps, then a 12 s export
    during which the engine steps 40 ms at a time (fully busy), then plain steps again."""
    base = _steps(500, 10, 0, busy_ms=5, t0=S)
    prof = _flag(_steps(8, 30, 0, busy_ms=30, t0=6 * S, start_id=500), FLAG_PROFILED)
    exp = _flag(_steps(300, 40, 0, busy_ms=40, t0=prof[-1].end_ns, start_id=508), FLAG_EXPORTING)
    return TargetStats(), [*base, *prof], exp


def test_a_window_the_export_owns_shows_the_last_figures_marked_stale() -> None:
    a, before, exp = _loaded()
    a.add([_hello(), Stats(ts_ns=S), *before])
    w0 = a.window(10.0)
    assert w0.step_ms["p50"] == pytest.approx(10.0)
    assert w0.idle_fraction == pytest.approx(0.5)
    a.add(exp[:100])  # 4 s into the export: 5 s of 10 baseline, not blind
    w1 = a.window(10.0)
    assert w1.exporting_steps == 100 and w1.step_ms["p50"] == pytest.approx(10.0)
    a.add(exp[100:])  # 12 s of export: every step in the window is exporting
    w = a.window(10.0)
    # was: step p50, idle, tokens/s all None (n/a) for the whole export
    assert w.step_ms["p50"] == pytest.approx(10.0) and w.idle_fraction == pytest.approx(0.5)
    assert w.stale_s is not None, "the figures of the last window that was not blind, marked stale"
    assert w.tokens_per_s == pytest.approx(w1.tokens_per_s)
    # their age: from that window's end (4 s into the export) to now (12 s into it)
    assert w.stale_s == pytest.approx(8.0, abs=0.05)
    # what was left out is this window's: the panel says how many steps
    assert w.exporting_steps == 250 and w.blind
    # the window itself, asked for whole (a recording's summary), is blind: no figures
    raw = a.window(10.0, hold=False)
    assert raw.stale_s is None and raw.step_ms["p50"] is None and raw.tokens_per_s is None
    # attach --jsonl's object says so too, through the same window
    js = summarize(a, window_s=10.0)
    assert js["stale_s"] == pytest.approx(8.0, abs=0.05) and js["step_ms"]["p50"] == pytest.approx(10.0)
    assert "stale" in js["statistics"]
    # the export ends: 6 s of plain steps take the window back, not stale
    a.add(_steps(600, 10, 0, busy_ms=5, t0=exp[-1].end_ns, start_id=808))
    after = a.window(10.0)
    assert after.stale_s is None and not after.blind and after.idle_fraction == pytest.approx(0.5, abs=0.05)
    assert not w0.blind and w0.stale_s is None and not w1.blind and w1.stale_s is None


def test_an_idle_engine_during_an_export_reads_idle_not_stale() -> None:
    a, before, _exp = _loaded()
    a.add([_hello(), Stats(ts_ns=S), *before])
    a.window(10.0)
    # the load stops as the capture ends: the export runs with no steps, heartbeats only
    end = before[-1].end_ns
    a.add([Stats(ts_ns=t, in_step_since_ns=0) for t in range(end + S, end + 13 * S, S)])
    w = a.window(10.0)
    assert w.idle_fraction == pytest.approx(1.0) and w.tokens_per_s == 0.0
    assert w.stale_s is None and not w.blind


def test_triggers_do_not_fire_on_held_figures() -> None:
    from rltperf_tui.live.driver import LiveTarget, TargetSpec
    from rltperf_tui.live.triggers import TriggerSet

    t = LiveTarget(TargetSpec("tcp://x:1"), TargetStats(), TriggerSet.parse(["idle<0.9"], cooldown_s=0))
    _, before, exp = _loaded()
    t.stats.add([_hello(), Stats(ts_ns=S), *before])
    assert t.check_window(t.stats.window(10.0)), "idle 0.5 < 0.9 fires on a current window"
    t.stats.add(exp)
    held = t.stats.window(10.0)
    assert held.stale_s is not None and held.idle_fraction == pytest.approx(0.5)
    assert t.check_window(held) == []


def test_blind_is_more_than_half_excluded() -> None:
    def fig(excluded_s: float) -> F.WindowFigures:
        return F.WindowFigures(0, 10 * S, excluded_s, 10 - excluded_s, 1, None, None, None, 0)

    assert not F.blind(fig(0.0)) and not F.blind(fig(5.0)) and F.blind(fig(5.01))
    h: F.HeldFigures[str] = F.HeldFigures()
    assert h.show("first", True, 10) == ("first", None)  # nothing earlier: its own (n/a)
    assert h.show("ok", False, 2 * S) == ("ok", None)
    assert h.show("blind", True, 5 * S) == ("ok", 3.0)


def test_prometheus_gauges_hold_over_a_blind_window(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The probe's own exporter, fed the records its publisher would feed it."""
    import json
    import socket
    import urllib.request

    from engine_adapters.definitions.contract import cpu_model
    from engine_adapters.probe import Probe

    # a calibration of our own: the exporter's peak without a copy benchmark
    cal = {
        "copy_gbps": 20.0,
        "matmul_gflops": 50.0,
        "dtype": "float32",
        "matmul_gflops_by_dtype": {"float32": 50.0},
    }
    (tmp_path / "calibration.json").write_text(json.dumps({f"{socket.gethostname()}|{cpu_model()}": cal}))
    monkeypatch.setenv("RLTPERF_CACHE", str(tmp_path))

    probe = Probe("127.0.0.1:0", {"name": "blind"}, snapshot_root=tmp_path, warm_profiler=False,
                  sample_devices=False, prometheus_port=0, captures=False)  # fmt: skip
    try:
        exp = probe._prometheus
        assert exp is not None
        t0 = exp._started
        base = _steps(500, 10, 0, busy_ms=5, t0=t0)
        exporting = _flag(_steps(300, 40, 0, busy_ms=40, t0=base[-1].end_ns, start_id=500), FLAG_EXPORTING)
        exp.observe(base)
        idle, _ = exp.window_figures(now_ns=base[-1].end_ns)
        assert idle == pytest.approx(0.5)
        ten_ms = {"p50": pytest.approx(0.010), "p95": pytest.approx(0.010), "p99": pytest.approx(0.010)}
        assert exp.step_pct == ten_ms  # the injected steps: 10 ms each
        exp.observe(exporting)
        idle, _ = exp.window_figures(now_ns=exporting[-1].end_ns)
        # was: NaN (no baseline in the window) for as long as the export ran
        assert idle == pytest.approx(0.5) and exp.stale_s == pytest.approx(12.0)
        assert exp.step_pct == ten_ms  # held with them, not the exporting steps' 40 ms
        text = urllib.request.urlopen(f"http://{exp.address}/metrics", timeout=10).read().decode()
        assert "rltperf_window_stale_seconds" in text
        assert 'rltperf_window_step_duration_seconds{percentile="50"} 0.01' in text
        # quiet: 30 s after the last step the window holds none (not blind): no figure, NaN
        idle, _ = exp.window_figures(now_ns=exporting[-1].end_ns + 30 * 10**9)
        assert idle == pytest.approx(1.0) and exp.stale_s is None
        assert exp.step_pct == {"p50": None, "p95": None, "p99": None}
    finally:
        probe.close()
