"""SVG snapshots of the vLLM server view over real vLLM 0.32 /metrics sessions replayed
at speed 0 (``tests/rltperf_tui/tui/data/vllm_replica_*.rltrec``, see ``make_vllm_recording.py``).

Regenerate after an intended change:
``pytest tests/rltperf_tui/tui/test_server_view_snapshots.py --snapshot-update``, then look at the SVGs."""

from __future__ import annotations

from typing import Any

from engine_adapters.definitions.cost import Prices
from rltperf_tui.tui.app import MonitorApp
from tests.rltperf_tui.tui._uihelpers import replay_finished
from tests.rltperf_tui.tui.test_server_view import vllm_spec


def test_vllm_server_view_120x40(snap_compare: Any) -> None:
    """One vLLM target: window, since-attach totals and peaks, trends over the lower half."""
    app = MonitorApp([vllm_spec("a")], prices=Prices(cost_in=0.5, cost_out=2.0, gpu_cost_hour=3.6))
    assert snap_compare(app, terminal_size=(120, 40), run_before=replay_finished)


def test_vllm_replica_table_120x40(snap_compare: Any) -> None:
    """Two vLLM targets (replicas a, b): the replica table with totals and imbalance above
    the two columns."""
    app = MonitorApp([vllm_spec("a"), vllm_spec("b")])
    assert snap_compare(app, terminal_size=(120, 40), run_before=replay_finished)
