"""``monitor/vllm/plugin_capture.py`` against a real probe over a real socket (the
reference loop engine's; the vLLM servers' path through it is in
``tests/engine_adapters/vllm/test_worker_capture.py``): the capture's records come back
under the probe's id, in order, and a probe that goes away mid-capture ends it with a
sentence."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from engine_adapters.definitions.records import (
    CaptureDone,
    CaptureExporting,
    CaptureFailed,
    CaptureStarted,
    Record,
)
from engine_adapters.monitor.base import AdapterError
from engine_adapters.monitor.vllm.plugin_capture import PluginCapture
from tests.conftest import LOOP_ENGINE, free_ports, start_engine


def _follow(probe: str, steps: int) -> tuple[PluginCapture, list[Record], threading.Event]:
    got: list[Record] = []
    done = threading.Event()
    cap = PluginCapture(probe, got.append, lambda _c: done.set(), None)
    cap.request(steps, "ops", "plug", None)
    return cap, got, done


def test_the_probes_capture_records_come_back_under_its_id(loop_engine: Any) -> None:
    cap, got, done = _follow(loop_engine.address, 4)
    assert done.wait(90), got
    assert {getattr(r, "capture_id", None) for r in got} == {cap.capture_id}
    kinds = [type(r) for r in got]
    assert kinds.index(CaptureStarted) < kinds.index(CaptureExporting) < len(kinds) - 1, kinds
    assert kinds[-1] is CaptureDone and kinds.count(CaptureDone) == 1, kinds
    end = got[-1]
    assert isinstance(end, CaptureDone) and end.steps_captured == 4 and "plug" in end.bundle
    cap.join(5)
    assert not cap.is_alive()
    # another capture may follow at once (the follower closed its connection)
    _cap2, got2, done2 = _follow(loop_engine.address, 2)
    assert done2.wait(90) and isinstance(got2[-1], CaptureDone), got2


def test_a_probe_that_goes_away_mid_capture_fails_it_with_a_sentence(tmp_path: Any) -> None:
    # an engine that stops stepping after 40 steps and exits soon after: the window never fills
    eng = start_engine([str(LOOP_ENGINE), "--duration", "120", "--snapshots", str(tmp_path / "s"),
                        "--steps", "40"])  # fmt: skip
    try:
        time.sleep(1.0)
        cap, got, done = _follow(eng.address, 64)
        time.sleep(0.5)
        eng.proc.kill()
        assert done.wait(30), got
        end = got[-1]
        assert isinstance(end, CaptureFailed) and end.capture_id == cap.capture_id, got
        assert eng.address in end.reason and "closed during the capture" in end.reason, end.reason
    finally:
        eng.stop()


def test_an_unreachable_probe_raises_for_the_session_to_say(tmp_path: Any) -> None:
    port = free_ports()  # a port nobody listens on (no port-0 listener lands there)
    cap = PluginCapture(f"127.0.0.1:{port}", lambda _r: None, lambda _c: None, None)
    with pytest.raises(AdapterError):
        cap.request(4, "ops", None, None)
    assert not cap.is_alive()
