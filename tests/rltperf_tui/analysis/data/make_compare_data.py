"""Regenerate ``tests/rltperf_tui/analysis/data/compare/``: the fixed recordings and
bundles ``test_compare_cmd.py`` runs ``rltperf compare`` on (real engines, recorded over
real sockets; the offline analysis needs no live engine at test time, and its verdicts
no longer depend on the machine's luck that run).

Three reference loop engines run at the same time, so the machine's load hits them
alike (``--sleep-ms 0.5 --requests-every 8 --loops 4``, RANDOM WEIGHTS): A and A2 with
the same configuration, B with an injected stall (20 ms after every 10th step).  Each is
recorded unprofiled for at least 3 s and 800 steps (``a``, ``a2``, ``b``), then B again
(``b2``: rounds are separate recordings).  Then four captures: two 4-step ops captures
of A (``a_ops_1``, ``a_ops_2``), a 4-step full capture of B (``b_full``) and a 6-step
full capture of A (``a_full_6``).

Run from the repository root on a quiet machine, then run the tests:

    .venv/bin/python tests/rltperf_tui/analysis/data/make_compare_data.py
    .venv/bin/python -m pytest tests/rltperf_tui/analysis/test_compare_cmd.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "rltperf_tui" / "analysis"))

from tests.conftest import LOOP_ENGINE, EngineProc, start_engine  # noqa: E402

OUT = Path(__file__).resolve().parent / "compare"
COMMON = ["--sleep-ms", "0.5", "--requests-every", "8", "--loops", "4"]
CONFIGS: dict[str, list[str]] = {"a": [], "a2": [], "b": ["--stall-ms", "20@10"]}
MIN_RECORD_S = 3.0
MIN_STEPS = 800  # P99 needs 500 samples: record until every engine has given this many steps


def record(target: str, path: Path, counts: dict[str, int], stop: threading.Event) -> None:
    """Record ``target`` into ``path`` until ``stop`` (counting its step records)."""
    from engine_adapters.definitions.records import StepRecord
    from engine_adapters.monitor.recording import RecordingWriter
    from engine_adapters.monitor.registry import adapter_for

    s = adapter_for(target, reconnect=False).connect()
    w = RecordingWriter(path, target=target)
    try:
        while not stop.is_set():
            recs = s.read(0.1)
            w.write(recs)
            counts[str(path)] += sum(isinstance(r, StepRecord) for r in recs)
    finally:
        w.close()
        s.close()


def record_together(targets: dict[Path, str]) -> list[int]:
    """Record every target at once until each gave ``MIN_STEPS`` (at least ``MIN_RECORD_S``)."""
    counts = {str(p): 0 for p in targets}
    stop = threading.Event()
    th = [threading.Thread(target=record, args=(t, p, counts, stop)) for p, t in targets.items()]
    for t in th:
        t.start()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 30 and (
        time.monotonic() - t0 < MIN_RECORD_S or min(counts.values()) < MIN_STEPS
    ):
        time.sleep(0.1)
    stop.set()
    for t in th:
        t.join()
    return sorted(counts.values())


def main() -> int:
    from test_report_cmd import capture

    tmp = Path(tempfile.mkdtemp(prefix="rltperf-compare-data-"))
    engines: dict[str, EngineProc] = {}

    def start(name: str) -> None:
        engines[name] = start_engine(
            [str(LOOP_ENGINE), "--duration", "300", "--snapshots", str(tmp / f"snaps_{name}"), *COMMON,
             *CONFIGS[name]],
            timeout=180,
        )  # fmt: skip

    try:
        starters = [threading.Thread(target=start, args=(n,)) for n in CONFIGS]
        for t in starters:
            t.start()
        for t in starters:
            t.join()
        assert set(engines) == set(CONFIGS), "an engine did not start"
        print(
            "recorded", record_together({tmp / f"{n}.rltrec": e.target for n, e in engines.items()}), "steps"
        )
        print("recorded", record_together({tmp / "b2.rltrec": engines["b"].target}), "steps")
        bundles = {
            "a_ops_1": capture(engines["a"].target, 4, "ops"),
            "a_ops_2": capture(engines["a"].target, 4, "ops"),
            "b_full": capture(engines["b"].target, 4, "full"),
            "a_full_6": capture(engines["a"].target, 6, "full"),  # A's engine in the other mode and window
        }
    finally:
        for e in engines.values():
            e.proc.terminate()
        for e in engines.values():
            e.stop()
    shutil.rmtree(OUT, ignore_errors=True)
    (OUT / "bundles").mkdir(parents=True)
    for n in ("a", "a2", "b", "b2"):
        shutil.copy(tmp / f"{n}.rltrec", OUT / f"{n}.rltrec")
    for n, b in bundles.items():
        shutil.copytree(b, OUT / "bundles" / n)
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
