"""``rltperf bench ingest``'s render-tick figure (``bench.tick``): the window and the view
a tick builds, timed on the synthetic stream once its windows are full."""

from __future__ import annotations

from rltperf_tui.bench.ingest import synthetic_stream
from rltperf_tui.bench.tick import tick_model_cost


def test_tick_figures_are_timed_on_full_windows_with_the_injected_gaps_listed() -> None:
    r = tick_model_cost(synthetic_stream(60_000)[0])  # ~57 s of data: ~22 s of ticks after the 35 s fill
    assert 30 <= r["ticks"] <= 60, r
    # the stream's 5 ms gap every 2,000 steps (~2 s) is over the 1 ms threshold (its
    # gaps are otherwise 20 us): every 10 s window holds some, so every tick lists one
    assert r["ticks_with_idle_gaps"] == r["ticks"], r
    assert r["window_ms"] > 0 and r["stats_view_ms"] > 0, r
    assert abs(r["model_ms_per_s_at_2hz"] - 2 * (r["window_ms"] + r["stats_view_ms"])) < 0.02, r


def test_too_short_a_stream_times_no_tick() -> None:
    # ~10 s of data: the windows never fill
    assert tick_model_cost(synthetic_stream(10_000)[0]) == {"ticks": 0}
