"""The export process's operator table (``engine_adapters.probe.export_child``) against a
trace computed by hand, and its merge of segment traces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from engine_adapters.probe import export_child


def _op(name: str, ts: float, dur: float, tid: int = 1, dims: list | None = None) -> dict:
    e = {"ph": "X", "cat": "cpu_op", "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur, "args": {}}
    if dims is not None:
        e["args"]["Input Dims"] = dims
    return e


def test_self_time_is_the_span_less_its_direct_children_on_its_thread() -> None:
    events = [
        _op("aten::linear", 0, 100),
        _op("aten::t", 5, 10),  # child of linear
        _op("aten::addmm", 20, 50),  # child of linear
        _op("aten::copy_", 30, 20),  # child of addmm, grandchild of linear
        _op("aten::linear", 200, 40),  # no children
        _op("aten::addmm", 10, 30, tid=2),  # another thread: not linear's child
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 7,
            "tid": 1,
            "ts": 0,
            "dur": 300,
        },
    ]
    rows = {r[0]: r for r in export_child.host_table(events, shapes=False)}
    assert rows["aten::linear"][2:] == (2, 100 - 10 - 50 + 40, 140)  # calls, self, total
    assert rows["aten::addmm"][2:] == (2, 50 - 20 + 30, 80)
    assert rows["aten::copy_"][2:] == (1, 20, 20)
    assert "ProfilerStep#1" not in rows  # annotations are not operators
    assert next(r[0] for r in export_child.host_table(events, shapes=False)) == "aten::linear"  # by self time


def test_full_mode_groups_by_input_shape_and_device_activity_is_its_own_table() -> None:
    events = [
        _op("aten::mm", 0, 10, dims=[[2, 3], [3, 4]]),
        _op("aten::mm", 20, 30, dims=[[8, 3], [3, 4]]),
        {"ph": "X", "cat": "kernel", "name": "gemm_kernel", "pid": 0, "tid": 7, "ts": 5, "dur": 4},
        {"ph": "X", "cat": "kernel", "name": "gemm_kernel", "pid": 0, "tid": 7, "ts": 25, "dur": 6},
    ]
    assert len([r for r in export_child.host_table(events, shapes=True) if r[0] == "aten::mm"]) == 2
    assert len([r for r in export_child.host_table(events, shapes=False) if r[0] == "aten::mm"]) == 1
    assert export_child.device_table(events) == [("gemm_kernel", 2, 10.0)]
    text = export_child.ops_text(events, "c1", "full", 1)
    assert "Input Shapes" in text and "[[8, 3], [3, 4]]" in text and "gemm_kernel" in text


def test_segments_merge_into_one_trace_with_metadata_once(tmp_path: Path) -> None:
    meta = {"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "args": {"name": "python"}}
    parts = []
    for i in range(3):
        p = tmp_path / f".segment-{i}.json"
        step = {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i + 1}", "pid": 7, "tid": 1,
                "ts": 100 * i, "dur": 90}  # fmt: skip
        p.write_text(
            json.dumps({"schemaVersion": 1, "traceEvents": [meta, step, _op("aten::mm", 100 * i + 1, 5)]})
        )
        parts.append(str(p))
    res = export_child.export(str(tmp_path), parts, "c2", "ops", 3)
    assert res["error"] is None and res["steps_found"] == 3 and res["events"] == 7, res
    with gzip.open(tmp_path / "trace.json.gz", "rb") as f:
        data = json.load(f)
    assert data["schemaVersion"] == 1 and data["rltperfSegments"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ops.txt", "trace.json.gz"]
    assert "aten::mm" in (tmp_path / "ops.txt").read_text()


def test_a_damaged_part_is_an_error_and_leaves_nothing_behind(tmp_path: Path) -> None:
    good = tmp_path / ".segment-0.json"
    good.write_text(json.dumps({"traceEvents": []}))
    bad = tmp_path / ".segment-1.json"
    bad.write_text('{"traceEvents": [')
    res = export_child.export(str(tmp_path), [str(good), str(bad)], "c3", "ops", 2)
    assert res["error"] and "trace export failed" in res["error"], res
    assert list(tmp_path.iterdir()) == []
