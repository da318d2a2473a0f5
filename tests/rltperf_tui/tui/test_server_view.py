"""The vLLM server view at 120x40 over a real vLLM 0.32 /metrics session
(``tests/rltperf_tui/tui/data/vllm_replica_a.rltrec``, made by ``make_vllm_recording.py``): trends fill
the lower half, totals and peaks since attach sit beside the window, costs appear when
prices are given."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_adapters.definitions.cost import Prices
from engine_adapters.definitions.records import EngineInfo, MetricsSample
from engine_adapters.monitor.recording import RecordingReader
from engine_adapters.monitor.replay import ReplayAdapter
from rltperf_tui.tui.app import MonitorApp, TargetSpec
from rltperf_tui.tui.widgets._fmt import Lines
from rltperf_tui.tui.widgets.replicas import ReplicaPanel
from rltperf_tui.tui.widgets.server_metrics import ServerMetricsPanel
from rltperf_tui.tui.widgets.server_totals import ServerTotalsPanel
from rltperf_tui.tui.widgets.server_trends import ServerTrendsPanel
from rltperf_tui.tui.widgets.target_header import (
    NO_PROBE_HINT,
    PLUGIN_HINT,
    TargetHeader,
    _server_config,
    server_hint,
)
from tests.rltperf_tui.tui._uihelpers import panel_text, replay_finished, sync

DATA = Path(__file__).resolve().parent / "data"
REPLICAS = {"a": DATA / "vllm_replica_a.rltrec", "b": DATA / "vllm_replica_b.rltrec"}


def vllm_spec(name: str = "a") -> TargetSpec:
    """A recorded vLLM replica as a target, under a stable name."""
    adapter = ReplayAdapter(str(REPLICAS[name]), speed=0)
    return TargetSpec(target=f"tests/rltperf_tui/tui/data/vllm_replica_{name}.rltrec", adapter=adapter,
                      session=adapter.connect())  # fmt: skip


@sync
async def test_trends_use_the_lower_half_and_agree_with_the_recording() -> None:
    app = MonitorApp([vllm_spec("a")], timeline_s=30.0)
    async with app.run_test(size=(120, 40)) as pilot:
        await replay_finished(pilot)
        trends = app.query_one("#target-0").query_one(ServerTrendsPanel)
        assert trends.display and trends.region.y >= 20 and trends.region.bottom >= 37  # the lower half
        assert trends.region.width >= 118  # the full width, not one stack
        text = panel_text(app, ServerTrendsPanel)
        for label in ("running", "waiting", "KV cache %", "prompt tok/s", "gen tok/s", "TTFT p95 ms",
                      "TPOT p95 ms", "queue p95 ms"):  # fmt: skip
            assert label in text
        queue = next(line for line in text.splitlines() if line.startswith("queue p95 ms"))
        lo, hi, now = queue.split()[-3:]
        assert lo.startswith("≤") and hi.startswith("≤")  # upper limits from the exact mean
        assert float(hi[1:]) < 1.0  # ms: never the 0-300 ms bucket's interpolation
        assert now == "n/a"  # the recording ends quiet: no request finished in the last columns
        totals = panel_text(app, ServerTotalsPanel)
        recs = [r for r in RecordingReader(REPLICAS["a"]).records() if isinstance(r, MetricsSample)]
        done = sum(sum(m.requests_finished.values()) for m in recs)
        assert f"finished   {done:,.0f} req" in totals
        peak = max(m.running for m in recs if m.running is not None)
        assert f"running {peak:.0f}" in totals and "peak tok/s" in totals
        assert "cost" not in panel_text(app, ServerMetricsPanel)  # no prices, no cost line


@sync
async def test_cost_next_to_tokens_per_second_when_prices_are_given() -> None:
    app = MonitorApp([vllm_spec("a")], prices=Prices(cost_in=0.5, cost_out=2.0, gpu_cost_hour=3.6))
    async with app.run_test(size=(120, 40)) as pilot:
        await replay_finished(pilot)
        text = panel_text(app, ServerMetricsPanel)
        w = app.handles[0].stats.metrics_window(app.window_s)
        assert w is not None and w.tokens_per_s and w.prompt_tokens_per_s
        p, g = w.prompt_tokens_per_s, w.tokens_per_s
        lst = (p * 0.5 + g * 2.0) / (p + g)
        gpu = 3.6 / (g * 3600) * 1e6
        assert f"list ${lst:.3g}/1M tok" in text and f"GPU ${gpu:.3g}/1M out" in text, text
        assert "cost " in panel_text(app, ServerTotalsPanel)


@sync
async def test_two_vllm_targets_show_one_replica_table_with_totals_and_v_hides_it() -> None:
    app = MonitorApp([vllm_spec("a"), vllm_spec("b")])
    async with app.run_test(size=(120, 40)) as pilot:
        await replay_finished(pilot)
        panel = app.query_one(ReplicaPanel)
        assert panel.display and panel.totals is not None
        text = panel.render_text()
        rows = {line.split()[0]: line.split() for line in text.splitlines()[1:4]}
        a = rows["…ta/vllm_replica_a.rltrec"]
        b = rows["…ta/vllm_replica_b.rltrec"]
        wa = app.handles[0].stats.metrics_window(app.window_s)
        wb = app.handles[1].stats.metrics_window(app.window_s)
        assert wa is not None and wb is not None and wa.requests_per_s and wb.requests_per_s
        assert float(a[6]) == pytest.approx(wa.requests_per_s, abs=0.006)
        assert float(b[6]) == pytest.approx(wb.requests_per_s, abs=0.006)
        assert float(rows["total"][6]) == pytest.approx(wa.requests_per_s + wb.requests_per_s, abs=0.01)
        assert ("IMBALANCED" in text) == bool(panel.totals.flagged)
        await pilot.press("v")
        await pilot.pause(0.2)
        assert not panel.display
        await pilot.press("v")
        await pilot.pause(0.2)
        assert panel.display


@sync
async def test_one_vllm_target_has_no_replica_table() -> None:
    app = MonitorApp([vllm_spec("a")])
    async with app.run_test(size=(120, 40)) as pilot:
        await replay_finished(pilot)
        assert not app.query_one(ReplicaPanel).display


@sync
async def test_header_of_a_server_seen_over_http_shows_no_figure_it_can_never_have() -> None:
    """A vLLM server seen through /metrics only sends no steps, ever: its header shows no
    step, loop, exit, spec or drop figure (not even as n/a), says where per-step figures
    come from (the plugin), and heads with the scrapes' own tokens/s (the same figure as
    the server-metrics panel's)."""
    app = MonitorApp([vllm_spec("a")])
    async with app.run_test(size=(160, 48)) as pilot:
        await replay_finished(pilot)
        head = panel_text(app, TargetHeader)
        metrics = panel_text(app, ServerMetricsPanel)
    for never in ("n/a", "?", "step p50", "idle", "loops", "exit", "spec", "dropped"):
        assert never not in head, (never, head)
    assert PLUGIN_HINT in head and "/metrics" in head, head
    tok_s = metrics.split("tokens/s ", 1)[1].split()[0]
    assert float(tok_s) > 0 and f"{tok_s} tok/s" in head, (head, metrics)


def test_the_hint_names_the_announced_probes_or_what_the_server_needs() -> None:
    """Where per-step figures come from, as something to type: the exact ``rltperf attach``
    of the probes the plugin announced (whole, even in a narrow column); the plugin
    without a probe: the variable to start the server with; no plugin: install it."""
    assert server_hint(EngineInfo(name="vllm"))[0] == PLUGIN_HINT
    assert server_hint(EngineInfo(name="vllm", pid=123))[0] == NO_PROBE_HINT
    probes = ["tcp://127.0.0.1:7788", "tcp://127.0.0.1:7789"]
    cmd = "rltperf attach tcp://127.0.0.1:7788 tcp://127.0.0.1:7789"
    for width in (70, 160):
        ln = Lines()
        _server_config(ln, EngineInfo(name="vllm", pid=123, probes=probes), width)
        line = "".join(t for t, _ in ln.rows()[0])
        assert cmd in line and len(line) <= max(width, len("per-step: " + cmd) + 16), (width, line)
