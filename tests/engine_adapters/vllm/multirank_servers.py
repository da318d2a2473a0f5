"""A real multi-rank vLLM server for the tests: the tiny Ouro (RANDOM WEIGHTS) with TP 2 or DP 2.

``start(root, layout)`` builds the tiny Ouro (``tiny_ouro.build``: total_ut_steps 4,
random safetensors whose gate spreads exits; the threshold 0.6 set with
``--hf-overrides``) and serves it as ``tiny_ouro.start_ouro_server`` does, plus the
layout flags (``--tensor-parallel-size 2`` or ``--data-parallel-size 2``) and
``VLLM_CPU_OMP_THREADS_BIND="0|1"`` (one core per rank; vLLM refuses two CPU workers
on this machine's one NUMA node without it).  The rltperf probe is on, its announcements
go to a runtime directory of the test's own (``RLTPERF_RUNTIME_DIR``), and its fault
injection directory is ``root/faults`` (``engine_adapters/probe/vllm/faults.py``).
About 4.5 GB and 100-140 s per start on 2 cores; the first ~40 s after ``/health`` of a
TP 2 server are slow (warm-up).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).parent))
import tiny_ouro
from vllm_fixtures import MODEL_NAME, ROOT, SERVER_ENV, Server, cache_env, free_ports, launch

from engine_adapters.monitor.vllm.metrics import parse_scrape
from tests.conftest import run_queue_s

XDIST_GROUP = "vllm-multirank"
"""The pytest-xdist group of the TP 2 and DP 2 modules (each starts a server of its own):
one worker runs both, one after the other, beside the worker of the shared servers
(``vllm_servers``): the README's ``-n 3`` run took 546 s of pytest instead of 588 s
the same day, all passing."""
PASSES = 4
LAYERS = tiny_ouro.LAYERS
THRESHOLD = 0.6


def start(root: Path, layout: list[str], extra_env: dict[str, str] | None = None) -> Server:
    """Build the tiny Ouro under ``root`` and serve it with ``layout`` (see the module docstring)."""
    model = tiny_ouro.build(root / "model", total_ut_steps=PASSES)
    prof, tmp, faults, run = root / "prof", root / "tmp", root / "faults", root / "run"
    for d in (prof, tmp, faults):
        d.mkdir()  # (``run`` is made by the plugin: 0700, or it announces nothing)
    port, probe = free_ports(), f"127.0.0.1:{free_ports(2)}"  # a DP rank's probe: base + rank
    env = dict(os.environ)
    env.update(SERVER_ENV, **cache_env(tmp), RLTPERF_PROBE=probe, VLLM_CPU_OMP_THREADS_BIND="0|1",
               RLTPERF_RUNTIME_DIR=str(run), RLTPERF_INJECT_FAULTS=str(faults),
               PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))  # fmt: skip
    env.update(extra_env or {})
    profiler_config = {
        "profiler": "torch",
        "torch_profiler_dir": str(prof),
        "torch_profiler_with_stack": False,
    }
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
        "--max-model-len", "512", "--enforce-eager", "--seed", "0", "--profiler-config", json.dumps(profiler_config),
        "--hf-overrides", json.dumps({"early_exit_threshold": THRESHOLD}), *layout,
    ]  # fmt: skip
    return launch(cmd, env, root, port, probe, prof, model)


def generated(server: Server, engine: str | None = None) -> float:
    """vLLM's own count of generated tokens (``vllm:generation_tokens_total``), of one
    engine (its ``engine`` label) or of them all."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as r:
        body = r.read().decode()
    return parse_scrape(body, 0, engine).counters.get("vllm:generation_tokens_total", 0.0)


def cli_env(server: Server) -> dict[str, str]:
    """The environment of an rltperf command that reads this server's announcements."""
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                RLTPERF_RUNTIME_DIR=str(server.log_path.parent / "run"))  # fmt: skip


def worker_queue_s(server: Server) -> dict[str, float]:
    """Seconds each of the server's TP workers (``tp0``, ``tp1``: vLLM titles them
    ``VLLM::Worker_TP0``) has waited on a run queue, runnable but not running, summed over
    its threads (schedstat's second field): the time other tenants of the 2 cores took from
    it.  A worker that spins in ``sched_yield`` waiting for work counts here too, so it is
    an upper bound of what contention added to its steps."""
    import psutil

    assert server.proc is not None
    out: dict[str, float] = {}
    for p in psutil.Process(server.proc.pid).children(recursive=True):
        try:
            title = " ".join(p.cmdline()).strip()
        except psutil.Error:
            continue
        if title.startswith("VLLM::Worker_TP"):
            total = 0.0
            for tid in os.listdir(f"/proc/{p.pid}/task"):
                with contextlib.suppress(OSError):  # a thread that ended
                    total += run_queue_s(p.pid, int(tid))
            out["tp" + title.removeprefix("VLLM::Worker_TP")] = total
    return out


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``cond`` until it holds (a monitor started in a subprocess may take seconds on
    a loaded 2-core machine: the load must not start before it watches)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.1)


def wait_recorded(rec: Path, tokens: float, timeout: float = 60.0) -> None:
    """Wait until the recording ``rec``, still being written (flushed about once a second),
    holds steps whose tokens (``out_tokens``) reach 98 % of ``tokens``: then a recorder
    stopped with Ctrl-C has read the whole load (a recorder short of CPU reads it late)."""
    from engine_adapters.definitions.records import StepRecord
    from engine_adapters.monitor.recording import read_all

    def recorded() -> bool:
        steps = [r for r in read_all(rec)[1] if isinstance(r, StepRecord)]
        return sum(s.out_tokens for s in steps) >= 0.98 * tokens

    wait_until(recorded, timeout, f"{rec.name} holds the load's {tokens:.0f} tokens")


def read_lines(stream: IO[str], into: list[str]) -> threading.Thread:
    """Collect ``stream``'s lines into ``into`` in a thread (the caller waits on them)."""

    def run() -> None:
        for line in stream:
            into.append(line)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def capture_in_process(
    target: str,
    steps: int,
    snapshot_root: Path,
    timeout: float = 150.0,
    failed_ok: bool = False,
    **options: object,
) -> dict[str, Any]:
    """``rltperf capture TARGET --steps N --json``'s result, asked from this (already
    running) process: on 2 cores a loaded multi-rank server left a fresh ``rltperf``
    process ~0.5 % of a CPU (its imports took 60-70 s before the request went out; the
    server runs in its own session, so its own scheduler group).  The CLI's capture on
    vLLM is tested in ``test_worker_capture.py``.  ``failed_ok``: a ``CaptureFailed`` is
    returned as ``{"failed": reason, "bundle": path}`` rather than failing the test."""
    from engine_adapters.definitions.records import CaptureDone, CaptureFailed, Refused
    from engine_adapters.monitor.registry import adapter_for

    s = adapter_for(target, reconnect=False, snapshot_root=str(snapshot_root), **options).connect()
    try:
        cid = s.request_capture(steps, "ops")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for r in s.read(0.2):
                if isinstance(r, (CaptureDone, CaptureFailed, Refused)) and r.capture_id == cid:
                    if failed_ok and isinstance(r, CaptureFailed):
                        return {"failed": r.reason, "bundle": r.bundle}
                    assert isinstance(r, CaptureDone), r
                    return {"bundle": r.bundle, "steps_captured": r.steps_captured, "via": r.via,
                            "complete": r.note is None and r.steps_captured == r.steps_requested}  # fmt: skip
    finally:
        s.close()
    raise AssertionError(f"no capture result from {target} within {timeout:g} s")
