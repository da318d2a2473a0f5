"""A capture window profiled in segments (``engine_adapters.probe.segments``): no step
boundary stops the profiler over more than a few steps' events, and the window's trace
and operator table are still whole (issue 20 §1: the stop of one 8-step session put the
whole window's post-processing in the gap after its last step)."""

from __future__ import annotations

import gzip
import itertools
import json

import pytest
import torch

from engine_adapters.probe import export_child
from engine_adapters.probe.capture import new_profiler
from engine_adapters.probe.segments import SegmentedProfile, release_results, segment_steps

OPS_PER_STEP = 40


def _step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    for _ in range(OPS_PER_STEP):
        x = torch.nn.functional.linear(x, w).relu_()
    return x


def _run_window(prof: SegmentedProfile, steps: int) -> None:
    x, w = torch.randn(8, 64), torch.randn(64, 64)
    prof.start()
    for _ in range(steps + 1):  # the warm-up step, then the window's
        _step(x, w)
        prof.step()


def _events(p: object) -> int:
    return len(p.profiler.kineto_results.events())  # type: ignore[attr-defined]


def test_segment_length_follows_the_measured_stop_cost() -> None:
    assert segment_steps(4.0, 1, 10, 8.0) == 2
    assert segment_steps(20.0, 1, 10, 8.0) == 1  # one step over the budget: still whole steps
    assert segment_steps(1.0, 2, 3, 8.0) == 3  # capped by the steps left
    assert segment_steps(0.0, 1, 5, 8.0) == 5
    assert segment_steps(3.0, 1, 0, 8.0) == 0


@pytest.mark.parametrize("full", [False, True], ids=["ops", "full"])
def test_no_boundary_stops_more_than_one_step_of_a_heavy_window(full: bool, tmp_path) -> None:
    """The factory every capture path uses: with steps whose stop costs more than the
    budget, each segment holds one step, so the stop after the window's last step
    handles 1/8 of the window's events, not all of them."""
    prof = new_profiler(8, full)
    prof.budget_ms = 1e-6  # every step over budget: the heaviest case, made certain
    _run_window(prof, 8)
    assert prof.done and prof.current is None
    assert len(prof.segments) == 8
    counts = [_events(p) for p in prof.segments]
    assert max(counts) <= 1.25 * sum(counts) / 8, counts
    assert len(prof.stop_ms) == 8

    parts = prof.save_parts(str(tmp_path))  # the export thread's part: each segment written, then freed
    assert len(parts) == 8 and prof.segments == []
    res = export_child.export(str(tmp_path), parts, "t", "full" if full else "ops", 8)
    assert res["error"] is None and res["steps_found"] == 8, res
    with gzip.open(tmp_path / "trace.json.gz", "rb") as f:
        data = json.load(f)
    assert data["rltperfSegments"] == 8 and res["events"] == len(data["traceEvents"])
    evs = data["traceEvents"]
    spans = sorted(
        (e for e in evs if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"]
    )
    assert [e["name"] for e in spans] == [f"ProfilerStep#{k}" for k in range(1, 9)]
    for a, b in itertools.pairwise(spans):
        assert a["ts"] + a["dur"] <= b["ts"]  # consecutive, not overlapping: the boundary's work is between
    linears = [e for e in evs if e.get("name") == "aten::linear" and e.get("ph") == "X"]
    assert len(linears) == 8 * OPS_PER_STEP  # every step's operators, none of the warm-up's
    for s in spans:
        inside = [e for e in linears if s["ts"] <= e["ts"] <= s["ts"] + s["dur"]]
        assert len(inside) == OPS_PER_STEP
    meta = [e for e in evs if e.get("ph") == "M" and e.get("name") == "process_name"]
    assert len(meta) == 1  # kept once, not once per segment

    # the operator table, built from the merged trace: every step's calls, none of the warm-up's
    rows = [r for r in export_child.host_table(evs, full) if r[0] == "aten::linear"]
    assert sum(r[2] for r in rows) == 8 * OPS_PER_STEP
    assert all(0 < r[3] <= r[4] for r in rows)  # self time within total time
    text = (tmp_path / "ops.txt").read_text()
    assert "aten::linear" in text and ("Input Shapes" in text) == full
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ops.txt", "trace.json.gz"]  # no part left behind
    assert release_results(prof)


def test_cheap_steps_share_a_segment() -> None:
    """Under the budget the window is a few segments, not one per step (each start and
    stop has a fixed cost too)."""
    prof = new_profiler(12, False)
    prof.budget_ms = 1e6
    _run_window(prof, 12)
    assert prof.done
    assert len(prof.segments) == 2  # the one-step probe segment, then the other 11 at once
    assert sum(_events(p) for p in prof.segments[1:]) > 10 * _events(prof.segments[0])
    release_results(prof)


def test_a_window_ended_early_lets_the_next_one_start(tmp_path) -> None:
    """Stopped in its warm-up step (nothing recorded) or mid-window (a cancel, the engine
    stopping): the profiler state is let go and the next capture profiles normally."""
    x, w = torch.randn(8, 64), torch.randn(64, 64)
    first = new_profiler(4, False)
    first.start()
    _step(x, w)
    first.stop()
    assert first.segments == [] and first.done
    release_results(first)

    second = new_profiler(4, False)
    second.budget_ms = 1e-6
    second.start()
    for _ in range(3):  # warm-up + 2 of 4
        _step(x, w)
        second.step()
    second.stop()
    second.step()  # a step after the stop changes nothing
    assert second.done and len(second.segments) == 3  # two steps, and the next one started before the stop
    release_results(second)

    third = new_profiler(2, False)
    _run_window(third, 2)
    res = export_child.export(str(tmp_path), third.save_parts(str(tmp_path)), "t", "ops", 2)
    assert res["error"] is None and res["steps_found"] == 2, res
