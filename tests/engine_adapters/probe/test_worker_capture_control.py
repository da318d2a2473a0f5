"""The vLLM worker capture's control path without vLLM: a real ``Probe`` whose capture
service is the engine core's ``WorkerCaptures``, a real control block in a file, and a
real ``WorkerCapture`` driving ``torch.profiler`` on a torch loop, all in one process
(as vLLM's single-process executor runs its worker in the engine core).  The loop does
what the plugin's hooks do per step: ``dispatch`` (the tap's ``execute_model``), then the
worker's ``begin`` and ``end``.  A real socket client asks for the captures.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine_adapters.definitions.records import Capture, CaptureDone, CaptureFailed, Refused
from engine_adapters.definitions.wire import encode
from engine_adapters.monitor.tcp import ProbeAdapter, ProbeSession
from engine_adapters.probe import Probe
from engine_adapters.probe.vllm import capture_block as cb
from engine_adapters.probe.vllm.core_capture import WorkerCaptures
from engine_adapters.probe.vllm.worker_capture import WorkerCapture

RANK = "dp0-tp0"


class OneWorkerEngine:
    """A torch loop stepping while ``go`` is set: the engine core's probe and one worker."""

    def __init__(self, tmp: Path, **probe_opts: Any) -> None:
        self.go = threading.Event()
        self.quit = threading.Event()
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.block_path = str(tmp / "ctl-dp0-pp0-tp0.cap")
        self.snapshots = tmp / "snaps"
        self._opts = probe_opts
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.ready.wait(60) and self.error is None, self.error

    def _run(self) -> None:
        import torch

        try:
            worker = WorkerCapture(cb.ControlBlock.create(self.block_path), RANK)
            blocks: dict[str, cb.ControlBlock | str] = {RANK: cb.ControlBlock.open(self.block_path)}
            self.probe = Probe("127.0.0.1:0", {"name": "onework", "random_weights": True},
                               snapshot_root=str(self.snapshots), sample_devices=False,
                               captures=lambda **deps: WorkerCaptures(blocks, **deps), **self._opts)  # fmt: skip
            self.caps = self.probe.captures
        except BaseException as exc:
            self.error = exc
            self.ready.set()
            return
        self.ready.set()
        x, w = torch.randn(16, 64), torch.randn(64, 64)
        try:
            while not self.quit.is_set():
                if not self.go.wait(0.02):
                    continue
                with self.probe.step("decode", 16, 16) as st:
                    self.caps.dispatch(st.step_id)  # before the step goes to the worker
                    worker.begin()
                    torch.relu(x @ w)
                    worker.end()
                self.caps.step_over()
                time.sleep(0.005)
        except BaseException as exc:
            self.error = exc
        finally:
            self.probe.close("test over")

    def stop(self) -> None:
        self.quit.set()
        self.thread.join(30)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[OneWorkerEngine]:
    # no profiler warm-up in the probe: it holds the GIL, and under load the hello then
    # missed the client's 5 s (the worker's own capture path warms nothing here either)
    eng = OneWorkerEngine(tmp_path, capture_idle_timeout_s=1.0, snapshot_budget_count=3, warm_profiler=False)
    try:
        yield eng
    finally:
        eng.stop()
    assert eng.error is None, eng.error


def _ask(s: ProbeSession, steps: int, mode: str = "ops", timeout: float = 60) -> Any:
    cid = s.request_capture(steps, mode, "t")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for r in s.read(0.1):
            if getattr(r, "capture_id", None) == cid and isinstance(r, (CaptureDone, CaptureFailed, Refused)):
                return r
    raise AssertionError(f"no answer to {cid}")


def test_exactly_n_steps_twice_in_a_row_named_after_the_engine_steps(engine: OneWorkerEngine) -> None:
    s = ProbeAdapter(f"tcp://{engine.probe.address}", reconnect=False).connect()
    try:
        engine.go.set()
        for steps in (3, 5):  # the second right after the first
            r = _ask(s, steps)
            assert isinstance(r, CaptureDone) and r.steps_captured == steps and r.note is None, r
            assert r.via and "1/1 ranks" in r.via
            c = json.loads((Path(r.bundle) / "meta.json").read_text())["capture"]
            assert c["complete"] is True and c["ranks"]["held"] == {RANK: "trace.json.gz"}
            with gzip.open(Path(r.bundle) / "trace.json.gz", "rt") as f:
                names = [str(e.get("name", "")) for e in json.load(f)["traceEvents"]]
            assert sum(n.startswith("ProfilerStep#") for n in names) == steps
            ids = sorted(int(n.split("#")[1]) for n in names if n.startswith("rltperf.step#"))
            assert ids == c["step_ids"] and len(ids) == steps
    finally:
        s.close()


def test_a_quiet_engine_ends_the_window_partial_and_the_next_capture_works(engine: OneWorkerEngine) -> None:
    s = ProbeAdapter(f"tcp://{engine.probe.address}", reconnect=False).connect()
    try:
        r = _ask(s, 4)  # nothing steps: partial after the 1 s idle timeout
        assert isinstance(r, CaptureDone) and r.steps_captured == 0 and "idle timeout" in (r.note or ""), r
        engine.go.set()
        # some of its 400 steps (~55 in 0.3 s on a quiet machine; with 50 asked a quiet
        # machine finished them all), then quiet
        cid = s.request_capture(400, "ops", "t")
        time.sleep(0.3)
        engine.go.clear()
        deadline = time.monotonic() + 30
        got: Any = None
        while got is None and time.monotonic() < deadline:
            got = next((x for x in s.read(0.1) if getattr(x, "capture_id", None) == cid
                        and isinstance(x, (CaptureDone, CaptureFailed))), None)  # fmt: skip
        assert isinstance(got, CaptureDone) and got.note and 0 < got.steps_captured < 400, got
        engine.go.set()  # the worker drops the stale window at its next step; a new one runs
        r = _ask(s, 2)
        assert isinstance(r, CaptureDone) and r.steps_captured == 2 and r.note is None, r
    finally:
        s.close()


def test_ids_are_validated_and_the_budget_refuses(engine: OneWorkerEngine) -> None:
    s = ProbeAdapter(f"tcp://{engine.probe.address}", reconnect=False).connect()
    try:
        with s._send_lock:  # a raw control frame with a bad id, as any client could send it
            assert s._sock is not None
            s._sock.setblocking(True)
            s._sock.sendall(encode(Capture(capture_id="../../etc", steps=2, mode="ops")))
        deadline = time.monotonic() + 10
        bad: Any = None
        while bad is None and time.monotonic() < deadline:
            bad = next((x for x in s.read(0.1) if isinstance(x, Refused)), None)
        assert bad is not None and "invalid capture id" in bad.reason, bad
        engine.go.set()
        for _ in range(3):  # the budget: 3 bundles
            assert isinstance(_ask(s, 1), CaptureDone)
        r = _ask(s, 1)
        assert isinstance(r, Refused) and "snapshot budget reached" in r.reason, r
    finally:
        s.close()
