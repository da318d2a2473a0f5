"""Shared fixtures: real probes over real sockets, real engines in subprocesses."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOOP_ENGINE = Path(__file__).resolve().parent / "loop_engine.py"


@dataclass
class EngineProc:
    """A running engine subprocess and its probe address."""

    proc: subprocess.Popen[str]
    address: str

    @property
    def target(self) -> str:
        return f"tcp://{self.address}"

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


ADDRESS_RE = re.compile(r"(?:^ADDRESS |tcp://)(\[[^\]]+\]:\d+|[^\s/:]+:\d+)")


def start_engine(args: list[str], cwd: Path | None = None, env: dict[str, str] | None = None,
                 timeout: float = 60.0) -> EngineProc:  # fmt: skip
    """Start ``python <args>`` and wait for a stdout line with ``ADDRESS host:port`` or
    ``tcp://host:port`` (``args`` may start with ``-m module``)."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.update(env or {})
    proc = subprocess.Popen(
        [sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=str(cwd or ROOT), env=e,
    )  # fmt: skip
    assert proc.stdout is not None
    import selectors
    import time

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"engine exited early ({proc.returncode}): {err[-2000:]}")
        if sel.select(0.2):
            line = proc.stdout.readline()
            m = ADDRESS_RE.search(line)
            if m:
                return EngineProc(proc, m.group(1))
    proc.kill()
    raise RuntimeError("engine did not print its address in time")


@pytest.fixture
def loop_engine(tmp_path: Path) -> Iterator[EngineProc]:
    """The test torch loop with a probe on a free port, snapshots under tmp_path."""
    eng = start_engine([str(LOOP_ENGINE), "--duration", "120", "--snapshots", str(tmp_path / "snapshots")])
    try:
        yield eng
    finally:
        eng.stop()
