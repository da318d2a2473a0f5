"""``rltperf compare`` on real recordings of real engines, and on real bundles.

Three engines run at the same time (so the shared machine's load hits all of them
alike): A and A2 with the same configuration, B with an injected stall (20 ms after
every 10th step).  Each is recorded for a few seconds, unprofiled.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LOOP_ENGINE, EngineProc, start_engine

COMMON = ["--sleep-ms", "0.5", "--requests-every", "8", "--loops", "4"]
MIN_RECORD_S = 3.0
MIN_STEPS = 800  # P99 needs 500 samples: record until every engine has given this many steps

_capsys: Any = None


@pytest.fixture(autouse=True)
def _cap(capsys: pytest.CaptureFixture[str]) -> Iterator[None]:
    global _capsys
    _capsys = capsys
    yield
    _capsys = None


def cli(*args: str) -> tuple[int, str, str]:
    """Run ``rltperf`` in this process (an exception here is a traceback a user would see)."""
    from rltperf_tui.cli import main

    _capsys.readouterr()
    rc = main(list(args))
    out = _capsys.readouterr()
    return rc, out.out, out.err


def _record(target: str, path: Path, counts: dict[str, int], stop: threading.Event) -> None:
    from engine_adapters.recording import RecordingWriter
    from engine_adapters.records import StepRecord
    from engine_adapters.registry import adapter_for

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


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("ab")
    engines: dict[str, EngineProc] = {}
    configs = {"a": [], "a2": [], "b": ["--stall-ms", "20@10"]}

    def start(name: str) -> None:
        engines[name] = start_engine(
            [
                str(LOOP_ENGINE),
                "--duration",
                "300",
                "--snapshots",
                str(d / f"snaps_{name}"),
                *COMMON,
                *configs[name],
            ]
        )

    try:
        t_start = time.monotonic()
        starters = [threading.Thread(target=start, args=(n,)) for n in configs]
        for t in starters:
            t.start()
        for t in starters:
            t.join()
        assert set(engines) == set(configs), "an engine did not start"
        print(f"[engines up {time.monotonic() - t_start:.1f} s]", end=" ")
        paths = {n: d / f"{n}.rltrec" for n in engines}
        counts = {str(p): 0 for p in paths.values()}
        stop = threading.Event()
        th = [
            threading.Thread(target=_record, args=(e.target, paths[n], counts, stop))
            for n, e in engines.items()
        ]
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
        print(f"[recorded {time.monotonic() - t0:.1f} s: {sorted(counts.values())} steps]", end=" ")
        from test_report_cmd import capture

        bundles = [
            capture(engines["a"].target, 4, "ops"),
            capture(engines["a"].target, 4, "ops"),
            capture(engines["b"].target, 4, "full"),
        ]
        yield {"rec": {n: str(p) for n, p in paths.items()}, "bundles": bundles}
    finally:
        for e in engines.values():
            e.proc.terminate()
        for e in engines.values():
            e.stop()


def _metric(res: dict[str, Any], key: str) -> dict[str, Any]:
    return next(m for m in res["metrics"] if m["key"] == key)


def test_compare_finds_injected_stall(runs: dict[str, Any]) -> None:
    rc, out, err = cli("compare", runs["rec"]["a"], runs["rec"]["b"], "--json")
    assert rc == 0, err
    res = json.loads(out)
    gap99 = _metric(res, "gap_ms.p99")
    assert gap99["significant"] is True, gap99
    # a 20 ms stall after every 10th step; under heavy machine load A's own P99 gap grows
    # (preemption), so only the sign and a clear margin are asserted
    assert gap99["diff"] > 5 and gap99["ci95"][0] > 0
    assert "gap_ms.p99" in res["significant"]
    # configuration differences come first, and name the stall
    assert [d["field"] for d in res["config_differences"]] == ["contract.stall"]
    assert "isolates that change" in res["config_note"]
    assert "never combined" in res["scope"]
    rc, text, _ = cli("compare", runs["rec"]["a"], runs["rec"]["b"])
    assert text.index("configuration differences") < text.index("metric")
    assert "step gap P99: B is" in text and "significant" in text


def test_compare_same_configuration_finds_nothing(runs: dict[str, Any]) -> None:
    rc, out, err = cli("compare", runs["rec"]["a"], runs["rec"]["a2"], "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["config_differences"] == [] and res["same_configuration"] is True
    assert res["significant"] == [], [m for m in res["metrics"] if m["significant"]]
    assert res["summary"][0].startswith("No significant difference")
    gap99 = _metric(res, "gap_ms.p99")
    assert gap99["verdict"] in ("within noise", "not established (drift)")


def test_compare_rounds_and_refusals(runs: dict[str, Any], tmp_path: Path) -> None:
    r = runs["rec"]
    rc, out, err = cli("compare", r["a"], r["b"], r["a2"], r["b"], "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["drift"]["rounds"]["n"] == 2
    g = next(m for m in res["drift"]["rounds"]["metrics"] if m["key"] == "gap_ms.p99")
    assert g["consistent_sign"] is True and _metric(res, "gap_ms.p99")["significant"]
    # three configurations (base, +X, +Y) would make one claim of two comparisons: refused
    rc, out, err = cli("compare", r["a"], r["b"], r["a2"])
    assert rc == 2 and "refused" in err and "combined mode" in err
    rc, out, err = cli("compare", r["a"], runs["bundles"][0])
    assert rc == 2 and "recording (unprofiled) with a bundle" in err
    rc, out, err = cli("compare", r["a"], str(tmp_path / "missing.rltrec"))
    assert rc == 1 and "does not exist" in err
    from engine_adapters.recording import RecordingWriter

    RecordingWriter(tmp_path / "empty.rltrec").close()
    rc, out, err = cli("compare", str(tmp_path / "empty.rltrec"), r["b"])
    assert rc == 2 and "holds no unprofiled steps" in err


def test_compare_bundles(runs: dict[str, Any]) -> None:
    a1, a2, bfull = runs["bundles"]
    rc, out, err = cli("compare", a1, a2, "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["kind"] == "bundles" and res["profiled"] is True
    names = [o["name"] for o in res["host_ops"]]
    assert "aten::mm" in names
    mm = next(o for o in res["host_ops"] if o["name"] == "aten::mm")
    assert mm["a_count_per_step"] == mm["b_count_per_step"] > 0  # same code: same operator counts
    assert set(res["stages_ms_mean"]) >= {"schedule", "forward", "sample"}
    assert res["config_differences"] == [] or all(
        d["field"] in ("commit", "diff_sha256") for d in res["config_differences"]
    )
    rc, out, err = cli("compare", a1, bfull)
    assert rc == 0, err
    assert out.index("configuration differences") < out.index("host operators")
    assert "contract.stall" not in out and "stall" in out  # the contract field differs: listed
    assert "mode" in out and "not an engine difference" in out


def _png(p: Path) -> tuple[int, int]:
    data = p.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_compare_png(runs: dict[str, Any], tmp_path: Path) -> None:
    rc, out, err = cli("compare", runs["rec"]["a"], runs["rec"]["b"], "--png", str(tmp_path), "--json")
    assert rc == 0, err
    res = json.loads(out)
    names = sorted(os.path.basename(p) for p in res["pngs"])
    assert names == ["cdfs.png", "exit_depth.png", "roofline.png", "step_stages.png"], res["png_skipped"]
    for n in names:
        w, h = _png(tmp_path / n)
        assert w > 300 and h > 200 and (tmp_path / n).stat().st_size > 10_000
