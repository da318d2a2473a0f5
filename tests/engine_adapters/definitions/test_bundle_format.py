"""The bundle format has one definition (``engine_adapters.definitions.bundle``).

``data/meta_probe_v1.json`` was written by a real probe capture and
``data/meta_vllm_v1.json`` by the vLLM path's ``_meta``, both by the code *before*
``meta.json`` became a struct: they must still decode, and both writers must still
write exactly those keys, in that order.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import types
from pathlib import Path

import pytest

from engine_adapters.definitions.bundle import (
    MAX_CAPTURE_STEPS,
    BundleMeta,
    CaptureMeta,
    bundle_name,
    capture_request_problem,
    meta_builtins,
    missing_meta_fields,
    new_meta,
    read_meta,
    seal_bundle,
)
from engine_adapters.definitions.records import CaptureDone, CaptureFailed, EngineInfo, Refused
from engine_adapters.monitor.tcp import ProbeAdapter

DATA = Path(__file__).parent / "data"
OLD = {"probe": DATA / "meta_probe_v1.json", "vllm": DATA / "meta_vllm_v1.json"}


def _keys(d: object) -> object:
    """The key structure (names and order, recursively into the two nested objects)."""
    assert isinstance(d, dict)
    return [(k, list(v) if k == "capture" else None) for k, v in d.items()]


def _bundle_with(tmp_path: Path, meta_text: str) -> str:
    b = tmp_path / "b"
    b.mkdir(exist_ok=True)
    (b / "meta.json").write_text(meta_text)
    return str(b)


@pytest.mark.parametrize("writer", ["probe", "vllm"])
def test_meta_written_before_the_struct_decodes_and_encodes_back_identically(tmp_path, writer):
    text = OLD[writer].read_text()
    got = read_meta(_bundle_with(tmp_path, text))
    assert got.problem is None and got.invalid is None, got
    assert isinstance(got.meta, BundleMeta) and isinstance(got.meta.capture, CaptureMeta)
    assert got.meta.capture.steps_requested == got.raw["capture"]["steps_requested"]
    # the same object, the same key order: sealing it again writes the same bytes
    assert json.dumps(meta_builtins(got.meta), indent=2) + "\n" == text
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    sealed = seal_bundle(str(tmp), str(tmp_path / "sealed"), got.meta)
    assert (Path(sealed) / "meta.json").read_text() == text


def test_the_vllm_writer_builds_the_same_keys_as_before(tmp_path):
    # The inputs the fixture was generated from (tests/engine_adapters/definitions/data: see genv in
    # the commit that added it); the session carries data only.
    from engine_adapters.monitor.vllm.capture import HttpCapture, HttpCaptureJob
    from engine_adapters.monitor.vllm.trace_files import TraceFacts

    info = EngineInfo(name="vllm", version="0.32.0", model="tiny", dtype="bfloat16", device="cpu",
                      kv_capacity_blocks=100, contract={"framework": "vLLM 0.32.0", "prefix_caching": "on"})  # fmt: skip
    job = HttpCaptureJob(capture_id="vfix01", steps=2, mode="full", label="lab", prefix="rltperf-vfix01-lab",
                         requested_ns=123, live_at_trigger={"window_s": 5, "steps": 3},
                         trigger={"rule": "step_ms > 5", "figure": "step_ms", "value": 7.5, "threshold": 5.0,
                                  "ts_ns": 100, "step_id": 9})  # fmt: skip
    job.start_call_s, job.stop_call_s, job.steps_at_start = 0.7, 0.2, 41.0
    job.started_ns, job.window_end_ns = 200, 300
    facts = TraceFacts(events=321, vllm_version="0.32.0",
                       annotations=[{"name": "execute_context_1(5)_generation_0(0)", "ts_us": 10.0, "dur_ms": 1.5},
                                    {"name": "execute_context_0(0)_generation_1(1)", "ts_us": 20.0, "dur_ms": 0.5}])  # fmt: skip
    cap = HttpCapture.__new__(HttpCapture)
    cap.session = types.SimpleNamespace(info=info, profiler_dir="/tmp/vllm-prof")  # type: ignore[assignment]
    cap.job = job
    meta = cap._meta(facts, 2, 4567, 1.25, 0.125,
                     {"trace.json.gz": "worker trace x", "ops.txt": "operator table (vLLM profiler_out.txt)"},
                     {"rltperf-vfix01-lab_rank0.1.pt.trace.json.gz": 4567}, "requested full mode, but ...")  # fmt: skip
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    new = json.loads((Path(seal_bundle(str(tmp), str(tmp_path / "b"), meta)) / "meta.json").read_text())
    old = json.loads(OLD["vllm"].read_text())
    assert _keys(new) == _keys(old)
    # EngineInfo fields appended since the fixture (identity of a rank, issue 19; the probes a
    # vLLM plugin announced): last, unset here
    appended = ["dp_rank", "tp_size", "pp_size", "ranks", "probes"]
    assert list(new["engine"])[-len(appended) :] == appended
    assert [new["engine"].pop(k) for k in appended] == [None] * len(appended)
    for d in (new, old):
        d.pop("created_utc")
        d.pop("rltperf_version")
    assert new == old


def _step(probe, x, w):
    with probe.step("decode", 4, 4) as st:
        st.mark("forward")
        (x @ w).relu()
        st.mark("sample")
        st.set(bytes_read=1000, flops=2000)


def test_the_probe_writes_the_same_keys_as_before_and_refuses_as_the_definition_says(tmp_path):
    import torch

    from engine_adapters.probe import Probe

    probe = Probe("127.0.0.1:0", {"name": "fmt", "random_weights": True}, snapshot_root=str(tmp_path),
                  sample_devices=False, warm_profiler=False)  # fmt: skip  # (a warm-up holds the GIL: under load the hello waited)
    x, w = torch.randn(16, 64), torch.randn(64, 64)
    s = ProbeAdapter(f"tcp://{probe.address}", reconnect=False).connect()
    try:
        for _ in range(20):
            _step(probe, x, w)
        # out-of-range N, a bad mode: refused with the definition's own sentence
        replies: dict[str, object] = {}
        bad = {s.request_capture(MAX_CAPTURE_STEPS + 1, "ops"): (MAX_CAPTURE_STEPS + 1, "ops"),
               s.request_capture(4, "fast"): (4, "fast")}  # fmt: skip
        cid = s.request_capture(3, "ops")
        deadline = time.monotonic() + 120
        while cid not in replies and time.monotonic() < deadline:
            _step(probe, x, w)
            for r in s.read(0.005):
                if isinstance(r, (Refused, CaptureDone, CaptureFailed)) and r.capture_id:
                    replies[r.capture_id] = r
    finally:
        s.close()
        probe.close()
    for bid, (n, mode) in bad.items():
        reply = replies[bid]
        assert isinstance(reply, Refused) and reply.reason == capture_request_problem(n, mode), reply
    done = replies[cid]
    assert isinstance(done, CaptureDone), done
    new = json.loads((Path(done.bundle) / "meta.json").read_text())
    old = _keys(json.loads(OLD["probe"].read_text()))
    # the one key added since v1 (issue 20): what the capture cost the engine, after export_in
    assert isinstance(old, list)
    for k, capture_keys in old:
        if k == "capture":
            capture_keys.insert(capture_keys.index("export_in") + 1, "engine_cost")
    # and (issue 22) the energy counter over the unprofiled steps before the window, last
    old.append(("energy", None))
    assert _keys(new) == old
    # no device sampler here: no readings, and the reason says so
    assert new["energy"]["readings"] == {} and new["energy"]["reason"], new["energy"]
    assert set(new["capture"]["engine_cost"]) == {
        f"{name}{unit}"
        for name in ("profiler_start", "profiler_stop", "save", "spawn", "release")
        for unit in ("_ms", "_cpu_ms")
    }  # the export's child is a process started from a file since issue 20 §1 (it was a fork)
    assert new["trigger"] is None and new["capture"]["complete"] is True
    assert Path(done.bundle).name.startswith(bundle_name("fmt", "ops", 3, "")[:9])  # UTC date first


def test_read_meta_says_what_is_wrong_with_a_damaged_file(tmp_path):
    b = tmp_path / "b"
    b.mkdir()
    assert "meta.json is missing" in (read_meta(str(b)).problem or "")
    (b / "meta.json").write_text('{"capture": {"steps_requ')
    assert "meta.json is not valid JSON" in (read_meta(str(b)).problem or "")
    (b / "meta.json").write_text("[1, 2]")
    assert read_meta(str(b)).problem == "meta.json is not a JSON object"
    old = json.loads(OLD["probe"].read_text())
    del old["capture"]["steps_requested"]
    del old["contract"]
    (b / "meta.json").write_text(json.dumps(old))
    got = read_meta(str(b))
    # the object is still there for a report to read; the struct says what does not fit
    assert got.raw is not None and got.meta is None and got.invalid and "steps_requested" in got.invalid
    assert missing_meta_fields(got.raw) == (["capture.steps_requested", "contract"], [])


def test_sealing_never_replaces_a_bundle(tmp_path):
    meta = read_meta(_bundle_with(tmp_path, OLD["probe"].read_text())).meta
    assert meta is not None
    paths = []
    for i in range(3):
        tmp = tmp_path / f".tmp-{i}"
        tmp.mkdir()
        (tmp / "ops.txt").write_text(str(i))
        paths.append(seal_bundle(str(tmp), str(tmp_path / "name"), meta))
    assert [os.path.basename(p) for p in paths] == ["name", "name-2", "name-3"]
    assert [(Path(p) / "ops.txt").read_text() for p in paths] == ["0", "1", "2"]
    shutil.rmtree(tmp_path / "name")


def test_one_capture_request_check_for_every_path():
    from engine_adapters.monitor.vllm.capture import validate_request

    assert validate_request is capture_request_problem
    assert capture_request_problem(MAX_CAPTURE_STEPS, "full") is None
    assert "out of range" in (capture_request_problem(0, "ops") or "")
    assert "out of range" in (capture_request_problem(MAX_CAPTURE_STEPS + 1, "ops") or "")
    assert "unknown capture mode" in (capture_request_problem(4, "fast") or "")
    assert "invalid capture id" in (capture_request_problem(4, "ops", "../x") or "")


def test_new_meta_fills_the_format_and_leaves_other_writers_fields_out():
    cap = CaptureMeta(capture_id="c1", label=None, mode="ops", steps_requested=1, steps_captured=1, step_ids=[5],
                      record_shapes=False, profile_memory=False, with_stack=False, activities=["cpu"],
                      device_trace=False, cold=False, export_s=0.1, trace_bytes=10, events=2, error=None,
                      requested_ns=1, window_start_ns=2, window_end_ns=3)  # fmt: skip
    m = meta_builtins(new_meta(note="n", engine=EngineInfo(name="e"), stage_names=["forward"], capture=cap,
                               live_at_trigger={}, trigger=None, contract={}, files={}))  # fmt: skip
    assert m["bundle_format"] == 1 and m["profiled"] is True and m["engine"]["name"] == "e"
    assert "ceiling" not in m and "via" not in m["capture"] and "complete" not in m["capture"]
