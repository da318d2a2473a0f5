"""Several ranks and the plugin's safety, part by part (no server): vLLM's own config
objects, a real loop ring in a real (tiny) filesystem, the recorder on CPU tensors.

The servers (TP 2, DP 2) are ``test_multirank_tp.py`` and ``test_multirank_dp.py``.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from engine_adapters.definitions.ranks import identity_text, rank_figures, rank_name, worker_tag, worker_tags
from engine_adapters.probe.vllm import announce, faults
from engine_adapters.probe.vllm.ouro import loopring
from engine_adapters.probe.vllm.ouro.recorder import CollectiveTimer, LoopRecorder

ROOT = Path(__file__).resolve().parents[3]


# --------------------------------------------------------------------------- names and figures


def test_rank_names() -> None:
    assert worker_tags(2) == ["tp0", "tp1"]
    assert worker_tags(2, 2) == ["pp0-tp0", "pp0-tp1", "pp1-tp0", "pp1-tp1"]
    assert rank_name(1, worker_tag(0)) == "dp1-tp0" and rank_name(None, "tp1") == "tp1"
    assert loopring.rank_path("/dev/shm/x.ring", 1, 0, 1) == "/dev/shm/x-dp1-pp0-tp1.ring"
    assert identity_text(1, 2, 1, "h") == "DP 1 · TP 2 · h" and identity_text(None, None) == ""


def test_rank_figures_by_hand() -> None:
    # two steps, both ranks busy 10 ms; tp0 waited 6 and 4 ms, tp1 1 and 1 ms
    ms = 1_000_000
    rf = rank_figures(
        ["tp0", "tp1"],
        [[10 * ms, 10 * ms], [10 * ms, 10 * ms], [10 * ms, None]],  # the third: tp1 sent nothing
        [[6 * ms, 1 * ms], [4 * ms, 1 * ms], [0, None]],
        [[[2 * ms, 3 * ms], [4 * ms, 5 * ms]], [[2 * ms, 3 * ms], [4 * ms, 5 * ms]], None],
    )
    assert rf.steps == 2  # only steps every rank reported
    assert rf.busy_ms == [10.0, 10.0] and rf.wait_ms == [5.0, 1.0] and rf.compute_ms == [5.0, 9.0]
    assert rf.loop_ms == [[2.0, 3.0], [4.0, 5.0]]
    assert rf.slowest == "tp1" and rf.skew_ms == pytest.approx(4.0) and rf.skew_frac == pytest.approx(0.8)
    unknown = rank_figures(["tp0", "tp1"], [[5 * ms, 6 * ms]], [None])  # CUDA: wait not measured
    assert unknown.wait_ms == [None, None] and unknown.compute_ms == [5.0, 6.0] and unknown.slowest == "tp1"
    assert rank_figures(["tp0", "tp1"], [], []).slowest is None


def test_the_window_keeps_rank_figures_of_steps_between_idle_ones() -> None:
    """One batch with idle steps (no loop data) at both ends: the per-rank figures still
    come from every step that has them, in the window, excluded (profiled) ones left out."""
    from engine_adapters.definitions.records import FLAG_PROFILED, EngineInfo, Hello, StepRecord
    from rltperf_tui.live.aggregator import TargetStats

    ms = 1_000_000
    hello = Hello(schema=1, engine=EngineInfo(name="vllm", ranks=["tp0", "tp1"], tp_size=2, dp_rank=0),
                  stage_names=[])  # fmt: skip
    steps = [StepRecord(step_id=0, start_ns=1 * ms, end_ns=2 * ms, kind="idle")]
    for i in range(1, 5):
        steps.append(StepRecord(step_id=i, start_ns=i * 10 * ms, end_ns=i * 10 * ms + 9 * ms,
                                rank_busy_ns=[8 * ms, 8 * ms], rank_wait_ns=[3 * ms, 1 * ms],
                                rank_loop_ns=[[4 * ms, 4 * ms], [4 * ms, 4 * ms]],
                                flags=FLAG_PROFILED if i == 4 else 0))  # fmt: skip
    steps.append(StepRecord(step_id=5, start_ns=60 * ms, end_ns=61 * ms, kind="idle"))
    stats = TargetStats()
    stats.add([hello, *steps])
    rf = stats.rank_window(None)
    assert rf is not None and rf.steps == 3  # the profiled one is left out
    assert rf.ranks == ["tp0", "tp1"] and rf.compute_ms == [5.0, 7.0] and rf.slowest == "tp1"
    assert TargetStats().rank_window(None) is None  # a single-rank stream has none


# --------------------------------------------------------------------------- vLLM's own objects


def test_dp_rank_of_an_independent_dense_engine() -> None:
    """vLLM runs each DP rank of a dense model as its own engine, resetting
    ``data_parallel_rank`` to 0: the rank must come from ``data_parallel_index`` (the
    plugin read ``data_parallel_rank``, so both DP engines took the base port)."""
    from vllm.config import ParallelConfig

    from engine_adapters.probe.vllm.engine_facts import dp_index, probe_listen

    pc = ParallelConfig(data_parallel_size=2)
    pc.data_parallel_index = 1  # as vllm.v1.engine.core.run_engine_core does for DP rank 1
    pc.reconfigure_for_independent_dp_rank()
    assert pc.data_parallel_size == 1 and pc.data_parallel_rank == 0  # what the plugin used to read
    assert dp_index(pc) == 1
    assert probe_listen("127.0.0.1", 7788, dp_index(pc)) == ("127.0.0.1", 7789)
    assert probe_listen("127.0.0.1", 0, 1) == ("127.0.0.1", 0)  # a free port stays free


def test_kv_caches_per_depth_from_vllms_kv_cache_config() -> None:
    from types import SimpleNamespace

    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor

    from engine_adapters.probe.vllm.loops import kv_caches

    names = [f"model.loop_attn.{k}" for k in range(8)]  # 4 passes x 2 layers
    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=32, dtype=torch.float32)
    tensors = [KVCacheTensor(size=1024, layers=[n], layer_stride=0, block_stride=64) for n in names]
    cfg = KVCacheConfig(
        num_blocks=16, kv_cache_tensors=tensors, kv_cache_groups=[KVCacheGroupSpec(names, spec)]
    )
    hf = SimpleNamespace(num_hidden_layers=2)
    assert kv_caches(cfg, hf, 4) == [2, 2, 2, 2]
    # a depth whose layers have no cache counts 0 (not the step's blocks)
    cfg.kv_cache_tensors = tensors[:6]
    assert kv_caches(cfg, hf, 4) == [2, 2, 2, 0]
    # two block tables: one kv_used cannot describe them
    cfg.kv_cache_groups = [KVCacheGroupSpec(names[:4], spec), KVCacheGroupSpec(names[4:], spec)]
    assert kv_caches(cfg, hf, 4) is None
    assert kv_caches(None, hf, 4) is None


# --------------------------------------------------------------------------- the loop ring


def test_a_full_filesystem_is_an_oserror_at_creation_not_a_sigbus(tmp_path: Path) -> None:
    """The ring (400 KB) in a 64 KB tmpfs: creating it fails with ENOSPC and leaves
    nothing; a sparse file would be created and the first store past 64 KB would kill
    the process with SIGBUS.  The filesystem is a real tmpfs, mounted in a private mount
    namespace (``unshare``), so nothing outside the child sees it."""
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed for the small-filesystem test")
    mnt = tmp_path / "small"
    mnt.mkdir()
    child = (
        "import os, sys\n"
        "from engine_adapters.probe.vllm.ouro import loopring\n"
        "path = sys.argv[1] + '/ring'\n"
        "try:\n"
        "    w = loopring.RingWriter(path)\n"
        "except OSError as exc:\n"
        "    print('OSError', exc.errno, os.path.exists(path), flush=True); sys.exit(0)\n"
        "for i in range(loopring.SLOTS):\n"
        "    w.write(0, 1, 1, 1, [1], [1], [1])\n"
        "print('wrote', flush=True)\n"
    )
    script = 'mount -t tmpfs -o size=64k tmpfs "$1" && exec "$2" -c "$3" "$1"'
    r = subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", str(mnt), sys.executable, child],
                       capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))  # fmt: skip
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])  # -7 is SIGBUS
    assert r.stdout.split() == ["OSError", "28", "False"], r.stdout  # ENOSPC, no file left


def test_rings_carry_the_collective_wait(tmp_path: Path) -> None:
    path = str(tmp_path / "r.ring")
    w = loopring.RingWriter(path)
    rd = loopring.RingReader(path)
    assert rd.open()
    w.write(10, 20, 4, 2, [3, 4], [4, 4], [1, 1], wait_ns=7)
    w.write(30, 40, 4, 2, [3, 4], [4, 4], [0, 2])
    a, b = rd.read_new()
    assert (a.wait_ns, b.wait_ns) == (7, None) and a.loop_ns == [3, 4] and b.exit_hist == [0, 2]


# --------------------------------------------------------------------------- the recorder


def _forward(rec: LoopRecorder, comm: CollectiveTimer, passes: int = 2, n: int = 6) -> None:
    """What ``OuroModel.forward`` does around its passes (CPU tensors)."""
    rec.begin(n)
    for t in range(passes):
        comm(torch.ones(4))  # one all-reduce per pass
        rec.mark(t)
    rec.end(torch.tensor([1, 2, 2, 1, 2, 2]), torch.tensor([0, 3, 6]))
    rec.add_logits(5)


def test_the_recorder_times_collectives_and_each_fault_stops_only_recording(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def slow_reduce(x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.002)
        return x

    for site in ("begin", "mark", "end", "add_logits"):
        d = tmp_path / site
        d.mkdir()
        path = str(d / "r.ring")
        comm = CollectiveTimer(slow_reduce)
        rec = LoopRecorder(loopring.RingWriter(path), 2, torch.device("cpu"), rank="dp0-tp1", comm=comm,
                           faults=faults.Faults(str(d), "dp0-tp1"))  # fmt: skip
        rd = loopring.RingReader(path)
        rd.open()
        _forward(rec, comm)
        (r,) = rd.read_new()
        assert r.wait_ns is not None and r.wait_ns >= 2 * 2_000_000 and r.logits_ns == 5
        assert sum(r.loop_ns) <= r.end_ns - r.start_ns and r.exit_hist == [0, 2]
        if site == "end":  # not a fault site of its own: make the ring's store fail instead
            rec.writer.mm = None
        else:
            (d / f"dp0-tp1-{site}").touch()
        with caplog.at_level(logging.WARNING, logger="vllm.rltperf"):
            caplog.clear()
            _forward(rec, comm)  # must not raise
            _forward(rec, comm)
        assert rec.dead and not comm.on, site
        msgs = [m for m in caplog.messages if "loop recording stopped" in m]
        assert len(msgs) == 1 and site in msgs[0] and "dp0-tp1" in msgs[0], caplog.messages
        assert len(rd.read_new()) <= 1  # at most the forward the fault interrupted after its record


def test_an_injected_slow_rank_sleeps_inside_the_timed_forward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(faults.ENV_SLOW, "dp0-tp0:0,dp0-tp1:20")
    assert (
        faults.slow_ms("dp0-tp1") == 20 and faults.slow_ms("dp0-tp0") == 0 and faults.slow_ms("dp1-tp1") == 0
    )
    path = str(tmp_path / "r.ring")
    comm = CollectiveTimer(None)
    rec = LoopRecorder(
        loopring.RingWriter(path), 2, torch.device("cpu"), comm=comm, slow_ms=faults.slow_ms("dp0-tp1")
    )
    rd = loopring.RingReader(path)
    rd.open()
    _forward(rec, comm)
    (r,) = rd.read_new()
    assert r.loop_ns[0] >= 20_000_000 and r.wait_ns is None  # one rank: no collectives to wait in


# --------------------------------------------------------------------------- the announcement


def test_the_port_polling_thread_stops_after_its_backoff(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An API server that never listens: the engine core looks a few times and stops,
    saying why (it polled /proc every second for ten minutes)."""
    path = tmp_path / "a.json"
    path.write_text("{}")
    # a process that listens on nothing (not this one: earlier tests' probes may listen here)
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        doc = {"api_pid": idle.pid, "listen": []}
        done = threading.Event()
        t0 = time.monotonic()
        with caplog.at_level(logging.INFO, logger="vllm.rltperf"):
            added = announce._add_listen(str(path), doc, done, backoff=(0.05, 0.1, 0.2))
        took = time.monotonic() - t0
    finally:
        idle.kill()
        idle.wait()
    assert added is False and 0.3 <= took < 5.0
    assert any("did not listen within" in m for m in caplog.messages), caplog.messages
    assert path.read_text() == "{}"
    assert len(announce.LISTEN_BACKOFF_S) <= 8 and sum(announce.LISTEN_BACKOFF_S) <= 120


# --------------------------------------------------------------------------- import circle (issue 24 §4)


def test_the_vllm_monitor_modules_import_each_other_without_a_cycle() -> None:
    """The capture thread reaches its session through ``capture.CaptureHost`` (public
    names), so ``capture`` no longer imports ``adapter`` (it did, under TYPE_CHECKING:
    adapter -> capture -> adapter, and session_capture -> capture -> adapter ->
    session_capture)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_import_hygiene import _cycle, _module_imports

    graph = _module_imports()
    assert "engine_adapters.monitor.vllm.capture" in graph
    assert _cycle(graph, "engine_adapters.monitor.vllm") is None
    assert "engine_adapters.monitor.vllm.adapter" not in graph["engine_adapters.monitor.vllm.capture"]
