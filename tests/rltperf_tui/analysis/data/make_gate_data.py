"""Regenerate ``tests/rltperf_tui/analysis/data/gate/``: the fixed recordings the
regression gate's end-to-end tests (``test_gate.py``) judge with ``rltperf compare
--fail-on``, made as a CI job would make them.

Three ``rltperf engine`` processes (reference engine, tiny preset, CPU, ``--workload
closed:4``, RANDOM WEIGHTS) start at once: A and A2 of one configuration, B with an
injected host stall (``--inject-stall 100@1``: 100 ms of busy host time in every
step).  ``rltperf record`` records A and A2 together for 4 s while B is stopped
(SIGSTOP: it takes no CPU), then A again (``a3``) and B together while A2 is stopped:
two engines at a time, one thread each, on two cores.

Run from the repository root on a quiet machine, then run the tests:

    .venv/bin/python tests/rltperf_tui/analysis/data/make_gate_data.py
    .venv/bin/python -m pytest tests/rltperf_tui/analysis/test_gate.py
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))

from tests.conftest import EngineProc, start_engine  # noqa: E402

OUT = Path(__file__).resolve().parent / "gate"
STALL = "100@1"  # 100 ms of busy host time in every step's schedule stage
RECORD_S = "4"


def record(target: str, out: Path) -> None:
    """``rltperf record TARGET`` for ``RECORD_S`` seconds into ``out``."""
    p = subprocess.run(
        [sys.executable, "-m", "rltperf_tui.cli", "record", target, "--duration", RECORD_S, "-q", "-o", str(out)],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr


def engine(d: Path, name: str, *extra: str) -> EngineProc:
    """An ``rltperf engine`` (tiny, closed:4) with a probe on a free port."""
    return start_engine(
        ["-m", "rltperf_tui.cli", "engine", "--listen", "127.0.0.1:0", "--workload", "closed:4",
         "--duration", "300", "--snapshots", str(d / f"snaps_{name}"), *extra],
        cwd=d, timeout=180,
    )  # fmt: skip


def record_pair(pair: dict[str, tuple[EngineProc, Path]]) -> None:
    """Record two engines at once, so the machine's load hits both alike."""
    th = [threading.Thread(target=record, args=(e.target, p)) for e, p in pair.values()]
    for t in th:
        t.start()
    for t in th:
        t.join()
    assert all(p.exists() for _, p in pair.values())


def main() -> int:
    d = Path(tempfile.mkdtemp(prefix="rltperf-gate-data-"))
    engines: dict[str, EngineProc] = {}
    configs: dict[str, tuple[str, ...]] = {"a": (), "a2": (), "b": ("--inject-stall", STALL)}

    def start(name: str) -> None:
        engines[name] = engine(d, name, *configs[name])

    paths = {n: d / f"{n}.rltrec" for n in ("a", "a2", "a3", "b")}
    try:
        th = [threading.Thread(target=start, args=(n,)) for n in configs]
        for t in th:
            t.start()
        for t in th:
            t.join()
        assert set(engines) == set(configs), "an engine did not start"
        os.kill(engines["b"].proc.pid, signal.SIGSTOP)
        record_pair({"a": (engines["a"], paths["a"]), "a2": (engines["a2"], paths["a2"])})
        os.kill(engines["a2"].proc.pid, signal.SIGSTOP)
        os.kill(engines["b"].proc.pid, signal.SIGCONT)
        record_pair({"a3": (engines["a"], paths["a3"]), "b": (engines["b"], paths["b"])})
    finally:
        for e in engines.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(e.proc.pid, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
            e.stop()
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    for n, p in paths.items():
        shutil.copy(p, OUT / f"{n}.rltrec")
    shutil.rmtree(d, ignore_errors=True)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
