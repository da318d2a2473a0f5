"""A metrics-endpoint target (vllm+http://) shows the server-metrics panel, not step panels.

The records come from two real vLLM 0.32 /metrics scrapes (tests/engine_adapters/vllm/
data) through the adapter's own parser and derivation, written to a real recording and
replayed in the app.
"""

from __future__ import annotations

from pathlib import Path

from engine_adapters.definitions.records import SCHEMA_VERSION, EngineInfo, Hello
from engine_adapters.monitor.recording import RecordingWriter
from engine_adapters.monitor.replay import ReplayAdapter
from engine_adapters.monitor.vllm.metrics import MfuState, derive, parse_scrape
from rltperf_tui.tui.app import MonitorApp, TargetSpec
from rltperf_tui.tui.widgets.server_metrics import ServerMetricsPanel
from rltperf_tui.tui.widgets.step_timeline import StepTimeline
from tests.rltperf_tui.tui._uihelpers import panel_text, sync, wait_for

DATA = Path(__file__).resolve().parents[2] / "engine_adapters" / "vllm" / "data"


def _recording(path: Path) -> None:
    a = parse_scrape((DATA / "vllm_0.32_metrics_a.txt").read_text(), 1_000_000_000)
    b = parse_scrape((DATA / "vllm_0.32_metrics_b.txt").read_text(), 2_000_000_000)
    sample = derive(a, b, MfuState(), loop_factor=1.0, loop_known=False)
    hello = Hello(schema=SCHEMA_VERSION, engine=EngineInfo(name="vllm", version="0.32.0"), stage_names=[],
                  capabilities=["metrics"])  # fmt: skip
    with RecordingWriter(path, target="vllm+http://test") as w:
        w.write([hello, sample])


@sync
async def test_metrics_target_shows_server_metrics_with_estimate_labels(tmp_path: Path) -> None:
    rec = tmp_path / "vllm.rltrec"
    _recording(rec)
    adapter = ReplayAdapter(str(rec), speed=0)
    app = MonitorApp([TargetSpec(target="vllm+http://test", adapter=adapter, session=adapter.connect())])
    async with app.run_test(size=(120, 40)) as pilot:
        col = app.query_one("#target-0")
        await wait_for(pilot, lambda: col.has_class("-metrics"), what="metrics-only layout")
        app.force_render()
        await pilot.pause(0.3)
        assert not col.query_one(StepTimeline).display
        text = panel_text(app, ServerMetricsPanel)
        assert "tokens/s 862.0" in text  # 4836 - 3974 generated tokens over the 1 s interval
        assert "histogram estimates" in text and "TTFT" in text
        # the looped-model caveat is on screen, its conclusion first (a row cut to the width keeps it)
        assert (
            "bytes/FLOPs not corrected: loop count unknown" in text
            and "counts num_hidden_layers once" in text
        )
