"""Trace reading and the HTA-style idle breakdown: hand-built excerpts and a real capture.

The GPU excerpt below is a thin fake (no NVIDIA GPU on this machine): a few events in
the shape Kineto writes for CUDA (``kernel``/``gpu_memcpy`` on a device pid and stream
tid, ``cuda_runtime``/``cuda_driver`` launches linked by ``args.correlation``), with
every figure of the expected breakdown computed by hand in the comments.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from rltperf_tui.analysis import traces as T


def X(
    name: str, ts: float, dur: float, cat: str, pid: Any = 100, tid: Any = 100, **args: Any
) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def gpu_excerpt() -> list[dict[str, Any]]:
    """Window [0, 1000] µs; engine step [100, 900]; kernels K1..K4 and a memcpy."""
    return [
        X("ProfilerStep#1", 0, 1000, "user_annotation"),
        X("rltperf.step#7 decode", 100, 800, "user_annotation"),
        X("stage:forward", 105, 700, "user_annotation"),
        X("cudaLaunchKernel", 110, 5, "cuda_runtime", correlation=1),
        X("cudaLaunchKernel", 120, 5, "cuda_runtime", correlation=2),
        X("cudaLaunchKernel", 130, 5, "cuda_runtime", correlation=3),
        X("cudaMemcpyAsync", 640, 5, "cuda_runtime", correlation=5),
        X("cuLaunchKernel", 650, 5, "cuda_driver", correlation=4),
        # K1 launched at 110, runs 150-300: the gap 0-150 is host wait (launched after the window start)
        X("gemm_k1", 150, 150, "kernel", pid=0, tid=7, device=0, stream=7, correlation=1),
        # K2 queued at 120 (before K1 ended at 300), gap 300-305 = 5 µs < 30 µs: kernel wait
        X("gemm_k2", 305, 95, "kernel", pid=0, tid=7, device=0, stream=7, correlation=2),
        # K3 queued at 130 (before 400), gap 400-500 = 100 µs >= 30 µs: other
        X("gemm_k3", 500, 100, "kernel", pid=0, tid=7, device=0, stream=7, correlation=3),
        # K4 launched at 650 (after K3 ended at 600): gap 600-700 is host wait
        X("gemm_k4", 700, 100, "kernel", pid=0, tid=7, device=0, stream=7, correlation=4),
        # a copy on another stream overlapping K4: the union runs 700-850
        X("Memcpy DtoH", 750, 100, "gpu_memcpy", pid=0, tid=8, device=0, stream=8, correlation=5),
        # an annotation projected on the GPU timeline is not device work
        X("rltperf.step#7 decode", 100, 800, "gpu_user_annotation", pid=0, tid=7),
        # trailing gap 850-1000: nothing queued any more, host wait
    ]


def test_gpu_idle_breakdown_matches_hand_computation() -> None:
    ev = gpu_excerpt()
    scan = T.scan_steps(ev)
    assert scan.source == "ProfilerStep" and scan.found == 1
    ib = T.idle_breakdown(ev, scan)
    assert ib is not None
    assert ib.basis == "device activity"
    # busy = 150 + 95 + 100 + 150 = 495 µs of a 1000 µs window
    assert ib.busy_s == pytest.approx(495e-6)
    assert ib.idle_fraction == pytest.approx(0.505)
    # host wait = 150 (lead) + 100 (K4 late) + 150 (tail); kernel wait 5; other 100
    assert ib.host_wait_s == pytest.approx(400e-6)
    assert ib.kernel_wait_s == pytest.approx(5e-6)
    assert ib.other_s == pytest.approx(100e-6)
    # inside the step [100, 900]: 50 + 5 + 100 + 100 + 50 = 305 µs; between steps 200 µs
    assert ib.within_steps_s == pytest.approx(305e-6)
    assert ib.between_steps_s == pytest.approx(200e-6)
    assert ib.longest_gap_ms == pytest.approx(0.15)
    assert len(ib.devices) == 1 and ib.devices[0]["activities"] == 5
    # HTA releases that work in ns use 30 ns: then the 5 µs gap is "other", not kernel wait
    ns = T.idle_breakdown(ev, scan, kernel_wait_threshold_us=0.03)
    assert ns is not None and ns.kernel_wait_s == 0.0 and ns.other_s == pytest.approx(105e-6)
    dev = T.device_op_stats(T.spans(ev, T.DEVICE_CATS))
    assert dev[0].name == "gemm_k1" and dev[0].self_us == 150
    assert {o.name for o in dev} == {"gemm_k1", "gemm_k2", "gemm_k3", "gemm_k4", "Memcpy DtoH"}


def vllm_excerpt() -> list[dict[str, Any]]:
    """Two vLLM steps (the annotation pattern from VLLM_CPU.md) with CPU operators."""
    return [
        X("execute_context_1(12)_generation_0(0)", 0, 5000, "user_annotation", tid=1),
        X("execute_context_1(12)_generation_0(0)", 0, 5000, "gpu_user_annotation", tid=1),
        X("aten::linear", 100, 3900, "cpu_op", tid=1),
        X("aten::addmm", 200, 2800, "cpu_op", tid=1),
        X("execute_context_0(0)_generation_1(1)", 6000, 2000, "user_annotation", tid=1),
        X("aten::linear", 6100, 1800, "cpu_op", tid=1),
        X("aten::addmm", 6150, 1700, "cpu_op", tid=1),
        X("some_other_thread_op", 5000, 1000, "cpu_op", tid=2),  # not the engine thread
    ]


def test_vllm_step_annotations_found_and_parsed() -> None:
    ev = vllm_excerpt()
    scan = T.scan_steps(ev)
    assert scan.source == "vllm execute annotations"
    assert scan.found == 2  # the gpu_user_annotation copy is not a step
    s0, s1 = scan.steps
    assert s0.kind == "prefill" and s0.batch == {
        "context_requests": 1,
        "context_tokens": 12,
        "generation_requests": 0,
        "generation_tokens": 0,
    }
    assert s1.kind == "decode" and s1.batch["generation_tokens"] == 1
    assert scan.window == (0, 8000)
    ib = T.idle_breakdown(ev, scan)
    assert ib is not None and ib.basis == "engine-thread operators"
    # busy on thread 1 = 3900 + 1800; the thread-2 op does not count
    assert ib.busy_s == pytest.approx(5700e-6)
    assert ib.idle_fraction == pytest.approx(2300 / 8000)
    assert ib.kernel_wait_s is None and ib.other_s is None  # not defined on a CPU trace, not zero
    assert ib.host_wait_s == pytest.approx(2300e-6)
    assert ib.within_steps_s == pytest.approx(1300e-6) and ib.between_steps_s == pytest.approx(1000e-6)
    ops = {o.name: o for o in T.host_op_stats(T.spans(ev, T.HOST_OP_CATS))}
    # self time of linear = 3900 - 2800 + 1800 - 1700 = 1200 µs
    assert ops["aten::linear"].self_us == pytest.approx(1200) and ops["aten::linear"].count == 2
    assert ops["aten::addmm"].self_us == pytest.approx(4500)


def test_truncated_gzip_keeps_events_before_the_cut(tmp_path: Path) -> None:
    ev = [X(f"aten::op{i}", i * 10, 5, "cpu_op") for i in range(2000)]
    full = tmp_path / "t.json.gz"
    T.save_trace(full, ev, {"schemaVersion": 1})
    ok = T.load_trace(full)
    assert ok.error is None and len(ok.events) == 2000 and ok.top["schemaVersion"] == 1
    raw = full.read_bytes()
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(raw[: len(raw) // 2])
    tr = T.load_trace(cut)
    assert tr.truncated and tr.error is not None and "cut short" in tr.error
    assert 0 < len(tr.events) < 2000
    assert tr.events == ev[: len(tr.events)]  # complete events only, in order
    plain = tmp_path / "cut.json"
    plain.write_text(json.dumps({"traceEvents": ev})[:5000])
    tp = T.load_trace(plain)
    assert tp.truncated and "JSON ends" in (tp.error or "") and 0 < len(tp.events) < 2000


def test_memory_peaks_from_memory_events() -> None:
    def mem(total: int, nbytes: int, dtype: int = 1) -> dict[str, Any]:
        return {
            "ph": "i",
            "name": "[memory]",
            "ts": 1,
            "pid": 1,
            "tid": 1,
            "args": {
                "Total Allocated": total,
                "Total Reserved": 4096,
                "Bytes": nbytes,
                "Device Type": dtype,
                "Device Id": 0,
            },
        }

    peaks = T.memory_peaks([mem(100, 100), mem(300, 200), mem(50, -250), mem(10, 10, dtype=0)])
    assert peaks == [
        {
            "device": "cpu",
            "peak_allocated_bytes": 10,
            "peak_reserved_bytes": 4096,
            "largest_allocation_bytes": 10,
            "events": 1,
        },
        {
            "device": "cuda:0",
            "peak_allocated_bytes": 300,
            "peak_reserved_bytes": 4096,
            "largest_allocation_bytes": 200,
            "events": 3,
        },
    ]


@pytest.mark.slow
def test_real_capture_idle_matches_known_sleeps(tmp_path: Path) -> None:
    """A loop that sleeps 100 ms between 1-op steps of ~100 ms: trace idle = sleeps ± 1 pp,
    plus at most the time the loop waited for a core meanwhile.  (Python's time between
    its ops, when another tenant takes the core, is idle in the trace and in no sleep: a
    run with three test workers on 2 cores read 0.5539 against sleeps of 0.5381.)"""
    from engine_adapters.definitions.records import CaptureDone, CaptureFailed, Refused
    from engine_adapters.monitor.registry import adapter_for
    from tests.conftest import LOOP_ENGINE, run_queue_s, start_engine

    truth = tmp_path / "truth.json"
    eng = start_engine(
        [
            str(LOOP_ENGINE),
            "--duration",
            "120",
            "--snapshots",
            str(tmp_path / "snaps"),
            "--bare",
            "--rows",
            "1024",
            "--dim",
            "2048",
            "--sleep-ms",
            "100",
            "--out",
            str(truth),
        ]
    )
    try:
        s = adapter_for(eng.target, reconnect=False).connect()
        try:
            time.sleep(0.5)
            queued0 = run_queue_s(eng.proc.pid)  # the loop's thread (the main one)
            cid = s.request_capture(4, "ops")
            done = None
            deadline = time.monotonic() + 60
            while done is None and time.monotonic() < deadline:
                for r in s.read(0.2):
                    if isinstance(r, (CaptureDone, CaptureFailed, Refused)) and r.capture_id == cid:
                        done = r
            queued_s = run_queue_s(eng.proc.pid) - queued0  # (over more than the window)
        finally:
            s.close()
    finally:
        eng.stop()
    assert isinstance(done, CaptureDone), done
    meta = json.loads((Path(done.bundle) / "meta.json").read_text())
    sleeps = json.loads(truth.read_text())["sleep_after_ns"]
    cap = meta["capture"]
    # ProfilerStep#k covers the sleep after step k-1 and step k: the window holds the sleeps
    # after the profiler warm-up step and after every captured step but the last
    in_window = [cap["profiler_warmup_step"], *cap["step_ids"][:-1]]
    slept_s = sum(sleeps[str(i)] for i in in_window) / 1e9
    tr = T.load_trace(Path(done.bundle) / "trace.json.gz")
    scan = T.scan_steps(tr.events)
    ib = T.idle_breakdown(tr.events, scan)
    assert ib is not None and scan.found == 4
    sleep_fraction = slept_s / ib.window_s
    print(
        f"window {ib.window_s:.3f} s, trace idle {ib.idle_fraction:.4f}, sleeps {sleep_fraction:.4f}, "
        f"between steps {ib.between_steps_s / ib.window_s:.4f}, loop queued {queued_s:.3f} s"
    )  # shown with -s
    assert sleep_fraction - 0.01 <= ib.idle_fraction <= sleep_fraction + 0.01 + queued_s / ib.window_s
    assert ib.between_steps_s is not None and ib.between_steps_s >= slept_s  # the sleeps are between steps
    assert ib.host_wait_s == pytest.approx(ib.idle_s)
