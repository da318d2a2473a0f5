"""Fixtures for the reference engine's tests: a real engine, a real probe, a real socket.

``run_reference(cfg, steps=...)`` builds the engine in this process, starts its probe on
a free port, subscribes with the ``tcp://`` adapter (the monitor's own client), runs the
engine for the given steps (or seconds) and returns everything the subscriber received
(optionally also written to a recording through ``RecordingWriter``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engine_adapters.definitions.records import Bye, Record, RequestRecord, StepRecord


@dataclass
class EngineRun:
    """What a subscriber saw of one engine run, and the engine itself."""

    engine: Any
    records: list[Record]

    @property
    def steps(self) -> list[StepRecord]:
        return [r for r in self.records if isinstance(r, StepRecord)]

    @property
    def requests(self) -> list[RequestRecord]:
        return [r for r in self.records if isinstance(r, RequestRecord)]


def _collect(session: Any, out: list[Record], done: threading.Event) -> None:
    while not session.ended:
        recs = session.read(0.2)
        out.extend(recs)
        if any(isinstance(r, Bye) for r in recs):
            break
    done.set()


@pytest.fixture
def run_reference(tmp_path: Path) -> Callable[..., EngineRun]:
    """Run a reference engine with a live subscriber; see module docstring."""
    from engine_adapters.monitor.tcp import ProbeAdapter
    from engine_adapters.probe import Probe
    from engine_adapters.reference.engine import Engine, EngineConfig

    def run(cfg: EngineConfig, steps: int | None = None, seconds: float | None = None,
            recording: Path | None = None, engine: Any = None) -> EngineRun:  # fmt: skip
        eng = engine or Engine(cfg)
        probe = Probe("127.0.0.1:0", eng.engine_info(), warm_profiler=False, sample_devices=False,
                      snapshot_root=tmp_path / "snapshots")  # fmt: skip
        eng.attach(probe)
        session = ProbeAdapter(f"tcp://{probe.address}", reconnect=False).connect()
        recs: list[Record] = []
        done = threading.Event()
        t = threading.Thread(target=_collect, args=(session, recs, done), daemon=True)
        t.start()
        try:
            eng.run(max_steps=steps, duration=seconds)
        finally:
            probe.close()
            done.wait(15)
            session.close()
        if recording is not None:
            from engine_adapters.monitor.recording import RecordingWriter

            with RecordingWriter(recording, target=f"tcp://{probe.address}") as w:
                w.write(recs)
        return EngineRun(eng, recs)

    return run
