"""A looped model on a real vLLM server: the tiny Ouro (RANDOM WEIGHTS), rltperf's plugin on.

The shared ``ouro_server`` (``vllm_servers.py``: ``tiny_ouro.start_ouro_server``,
total_ut_steps 4, the exit threshold set to 0.6 with ``--hf-overrides``, no
``--trust-remote-code``).  While
clients send completions, ``rltperf record`` records the plugin's probe and ``rltperf
capture`` takes 4 steps through vLLM's profiler; the tests read the recording, the
bundle and what ``rltperf summary`` / ``rltperf report`` say of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import tiny_ouro
from vllm_fixtures import ROOT, Load, Server
from vllm_servers import OURO_THRESHOLD

from engine_adapters.definitions.records import Hello, StepRecord
from engine_adapters.monitor.recording import read_all
from rltperf_tui.analysis import traces
from rltperf_tui.live.aggregator import TargetStats
from tests.conftest import finish_cli, run_cli

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PASSES = 4
THRESHOLD = OURO_THRESHOLD


def _cli(*args: str, timeout: float = 180, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        RLTPERF_VLLM_CAPTURE="vllm",
    )  # its capture is vLLM's profiler's (vLLM's annotations)
    return run_cli(list(args), timeout=timeout, env=env, cwd=cwd)


@pytest.fixture(scope="module")
def ouro_run(ouro_server: Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Record 7 s of the plugin's stream under load, then capture 4 steps under load."""
    d = tmp_path_factory.mktemp("ouro-run")
    rec = d / "ouro.rltrec"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    recorder = subprocess.Popen(
        [sys.executable, "-m", "rltperf_tui.cli", "record", f"tcp://{ouro_server.probe}", "--duration", "7", "-o",
         str(rec), "-q"], env=env, cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(1.5)
    load = Load(ouro_server.url, conc=3, max_tokens=32)
    load.run(4.0)
    _out, err = finish_cli(recorder, 60)
    assert recorder.returncode == 0, err[-2000:]
    # a 4-step capture through vLLM's profiler while clients keep sending
    stop = threading.Event()
    bg = Load(ouro_server.url, conc=2, max_tokens=64)
    t = threading.Thread(target=bg.run_until, args=(stop,), daemon=True)
    t.start()
    try:
        time.sleep(1.0)
        cap = _cli("capture", f"vllm+http://127.0.0.1:{ouro_server.port}", "--steps", "4", "--profiler-dir",
                   str(ouro_server.profiler_dir), "--json", "--timeout", "150", cwd=d)  # fmt: skip
    finally:
        stop.set()
        t.join(90)
    assert cap.returncode == 0, cap.stderr[-3000:]
    _meta, records = read_all(rec)
    result = json.loads(cap.stdout)
    # the bundle goes to ./snapshots of the command's directory: this test's, not the checkout's
    assert (d / result["bundle"]).resolve().parent == (d / "snapshots").resolve(), result["bundle"]
    result["bundle"] = str(d / result["bundle"])
    return {"rec": rec, "records": records, "load": load, "capture": result}


def test_step_records_carry_per_loop_time_exits_and_kv(ouro_run: dict[str, Any]) -> None:
    records = ouro_run["records"]
    assert not ouro_run["load"].errors, ouro_run["load"].errors[:3]
    hello = next(r for r in records if isinstance(r, Hello))
    assert hello.engine.max_loops == PASSES and hello.engine.kv_policy == "per_depth"
    assert hello.engine.random_weights is True  # the test model's RANDOM_WEIGHTS file
    assert "RANDOM_WEIGHTS" in str(hello.engine.contract.get("random_weights"))
    assert f"q={THRESHOLD:g}" in (hello.engine.loop_config or "")  # --hf-overrides reached the model
    # KV per depth is counted, not assumed: vLLM's KV cache config holds one cache per
    # (pass, layer), all on one block table, so each depth holds the step's kv_used blocks
    caches = hello.engine.contract.get("kv_caches_per_depth")
    assert caches == [tiny_ouro.LAYERS] * PASSES, caches
    steps = [r for r in records if isinstance(r, StepRecord) and r.kind != "idle"]
    assert len(steps) >= 20
    timed = [s for s in steps if s.loop_ns]
    assert len(timed) >= 0.9 * len(steps), f"{len(timed)} of {len(steps)} steps have loop times"
    for s in timed:
        assert len(s.loop_ns) == PASSES and all(v > 0 for v in s.loop_ns)
        assert s.loop_tokens == [s.tokens] * PASSES  # select form: every pass runs every token
        assert s.busy_ns is not None and s.busy_ns <= s.end_ns - s.start_ns
        assert s.kv_used is not None and s.kv_used > 0
        assert s.kv_per_depth == [s.kv_used if n else 0 for n in caches]
        assert s.bytes_read and s.flops and s.bytes_written
    # the passes are (nearly) all of the model's forward: the rest is embedding, exit
    # bookkeeping and the LM head
    loops = sum(sum(s.loop_ns) for s in timed)  # type: ignore[arg-type]
    busy = sum(s.busy_ns for s in timed)  # type: ignore[misc]
    assert 0.9 * busy <= loops <= busy, (loops, busy)
    # the gate at q=0.6 spreads exits over the depths; one exit per produced token
    hist = [sum(s.exit_hist[d] for s in timed if s.exit_hist) for d in range(PASSES)]
    assert sum(1 for v in hist if v > 0) >= 2, hist
    produced = sum(s.out_tokens for s in timed)
    assert sum(hist) == pytest.approx(produced, rel=0.05), (hist, produced)


def test_loops_panel_idle_and_rates_fill_as_for_the_reference_engine(ouro_run: dict[str, Any]) -> None:
    stats = TargetStats()
    stats.add(ouro_run["records"])
    w = stats.window(None)
    assert w.tokens_per_s and w.tokens_per_s > 0
    assert w.idle_fraction is not None and 0.0 <= w.idle_fraction < 1.0
    assert len(w.exit_hist) == PASSES and sum(w.exit_hist) > 0 and w.mean_exit_depth is not None
    assert len(w.loop_ms_mean) == PASSES and all(v > 0 for v in w.loop_ms_mean)
    assert stats.latest_kv().get("kv_per_depth")


def test_capture_holds_four_steps_with_a_range_per_loop_pass(ouro_run: dict[str, Any]) -> None:
    cap = ouro_run["capture"]
    bundle = Path(cap["bundle"])
    tf = traces.load_trace(bundle / "trace.json.gz")
    scan = traces.scan_steps(tf.events)
    assert scan.source == "vllm execute annotations" and scan.found == 4
    ranges = [s for s in traces.spans(tf.events) if s.name.startswith("loop[")]
    for st in scan.steps:
        inside = sorted(
            (r for r in ranges if r.ts >= st.span.ts and r.end <= st.span.end + 1), key=lambda r: r.ts
        )
        assert [r.name for r in inside] == [f"loop[{t}]" for t in range(PASSES)], (
            st.index,
            [r.name for r in inside],
        )


def test_summary_and_report_show_per_depth_time_and_exits(ouro_run: dict[str, Any]) -> None:
    s = _cli("summary", str(ouro_run["rec"]), "--json")
    assert s.returncode == 0, s.stderr
    out = json.loads(s.stdout)
    assert len(out["exit_hist"]) == PASSES and sum(out["exit_hist"]) > 0
    assert len(out["loop_ms"]) == PASSES and all(v > 0 for v in out["loop_ms"])
    text = _cli("summary", str(ouro_run["rec"])).stdout
    assert "loops" in text and "depth 4" in text
    r = _cli("report", ouro_run["capture"]["bundle"], "--json")
    assert r.returncode in (0, 3), r.stderr
    rep = json.loads(r.stdout)
    assert len(rep["loop_ms"]) == PASSES and all(v > 0 for v in rep["loop_ms"])
    rtext = _cli("report", ouro_run["capture"]["bundle"]).stdout
    assert "loop[3]" in rtext


def test_output_is_deterministic_for_a_fixed_seed(ouro_server: Server) -> None:
    def gen(seed: int) -> str:
        body = json.dumps({"model": "tiny", "prompt": "def g(y):", "max_tokens": 16, "temperature": 1.0,
                           "seed": seed, "ignore_eos": True}).encode()  # fmt: skip
        req = urllib.request.Request(ouro_server.url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=60) as r:
            return str(json.loads(r.read())["choices"][0]["text"])

    a, b, c = gen(7), gen(7), gen(8)
    assert a == b and a != c


def test_the_server_runs_in_a_one_gpu_servers_process_layout(
    ouro_run: dict[str, Any], ouro_server: Server
) -> None:
    """``vllm_servers.ONE_GPU_LAYOUT``: the API server's one vLLM process is its engine
    core, the worker inside it (vLLM's ``UniProcExecutor``, as on one GPU), and every
    figure the tests above read (per-loop steps from the worker's hooks, the capture
    through vLLM's profiler in the worker) came from that layout.  Without it CPU vLLM
    starts a ``VLLM::Worker`` process, and the suite would run that layout alone."""
    import psutil

    assert ouro_server.proc is not None
    titles = []
    for p in psutil.Process(ouro_server.proc.pid).children(recursive=True):
        try:
            titles.append(" ".join(p.cmdline()).strip())
        except psutil.Error:
            continue
    vllm = [t for t in titles if t.startswith("VLLM::")]
    assert vllm == ["VLLM::EngineCore"], titles
    assert any(isinstance(r, StepRecord) for r in ouro_run["records"]), (
        "no steps from the engine core's worker"
    )
