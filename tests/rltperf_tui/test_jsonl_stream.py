"""``attach --jsonl`` / ``record --jsonl -`` and ``attach --auto`` as a script uses them,
against a real paced loop engine (a real probe over a real socket): the stream parses,
its keys are ``summary --json``'s, tokens/s agrees with the engine's own step count,
and every way it can end is clean (duration, engine gone, a closed pipe, SIGINT)."""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rltperf_tui.commands.headless import EXIT_TARGETS_ENDED, EXTRA_KEYS
from tests.conftest import LOOP_ENGINE, ROOT, EngineProc, free_ports, run_rltperf, start_engine
from tests.test_documented_commands import run_tui

RATE = 100
ROWS = 16  # the loop engine's tokens per step (--rows default)


def _cli(*args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-m", "rltperf_tui.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _objects(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def _summary_keys(target: str, tmp: Path) -> set[str]:
    rec = tmp / "keys.rltrec"
    p = run_rltperf("record", target, "--duration", "1.5", "-q", "-o", str(rec))
    assert p.returncode == 0, p.stderr
    s = run_rltperf("summary", str(rec), "--json")
    assert s.returncode == 0, s.stderr
    return set(json.loads(s.stdout))


def _paced(tmp: Path, duration: float) -> EngineProc:
    # below the ephemeral range (free_ports): no other test's port-0 listener can fall in
    # the --auto scans around it, nor be "found" there once it is gone
    return start_engine([str(LOOP_ENGINE), "--listen", f"127.0.0.1:{free_ports()}", "--rate", str(RATE),
                         "--duration", str(duration), "--no-warm",
                         "--requests-every", "8", "--out", str(tmp / "truth.json"),
                         "--snapshots", str(tmp / "snap")])  # fmt: skip


def test_stream_keys_tokens_and_the_engine_going_away(tmp_path: Path) -> None:
    duration = 9.0
    eng = _paced(tmp_path, duration)
    t_start = time.monotonic()
    try:
        keys = _summary_keys(eng.target, tmp_path)
        p = _cli("attach", eng.target, "--jsonl", "--window", "2", "--refresh", "4")
        out, err = p.communicate(timeout=duration + 60)
    finally:
        eng.stop()
    objs = _objects(out)  # every line is one valid JSON object
    assert len(objs) >= 3, out[-500:]
    assert "Traceback" not in err, err
    # engine gone: the last object says why, the exit status is the documented one
    assert p.returncode == EXIT_TARGETS_ENDED, err
    last = objs[-1]
    assert last["state"] == "ended" and "goodbye" in last["reason"], last
    for o in objs:
        assert set(o) - set(EXTRA_KEYS) == keys, set(o) ^ keys
        assert o["target"] == eng.target and o["timestamp"].endswith("Z")
    assert all("reason" not in o for o in objs[:-1])
    # tokens/s against the engine's own accounting: the steps it made over its run
    truth = json.loads((tmp_path / "truth.json").read_text())
    engine_tps = ROWS * len(truth["step_ids"]) / duration
    assert engine_tps == pytest.approx(ROWS * RATE, rel=0.15), "the paced engine fell behind"
    full = [o["tokens_per_s"] for o in objs[:-1] if o["wall_s"] >= 1.99 and o["tokens_per_s"]]
    assert len(full) >= 3, [o["wall_s"] for o in objs]
    assert statistics.median(full) == pytest.approx(engine_tps, rel=0.1), (full, engine_tps)
    assert time.monotonic() - t_start < duration + 60


def test_head_closes_the_pipe_sigint_and_record(tmp_path: Path) -> None:
    eng = _paced(tmp_path, 60)
    try:
        # `| head -3`: the reader leaves after three lines; the stream ends quietly, exit 0
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        sh = subprocess.run(
            f"{sys.executable} -m rltperf_tui.cli attach {eng.target} --jsonl --refresh 5 | head -3; "
            "echo status=${PIPESTATUS[0]}",
            shell=True, executable="/bin/bash", capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
        lines = sh.stdout.splitlines()
        assert len(lines) == 4 and lines[-1] == "status=0", sh.stdout + sh.stderr
        assert [json.loads(x)["target"] for x in lines[:3]] == [eng.target] * 3
        assert sh.stderr == "", sh.stderr
        # Ctrl-C: a last object per target, reason "interrupted", exit 0, no traceback
        p = _cli("attach", eng.target, "--jsonl", "--refresh", "5")
        # once the stream runs (its first line): a Ctrl-C during start-up is rightly
        # "interrupted", exit 130, before any object (seen under load after a fixed 2.5 s)
        assert p.stdout is not None
        first = p.stdout.readline()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        out = first + out
        objs = _objects(out)
        assert p.returncode == 0 and "Traceback" not in err, err
        assert objs[-1]["reason"] == "interrupted" and objs[-1]["state"] == "ended"
        assert sum(1 for o in objs if "reason" in o) == 1
        # record --jsonl - with -o: the same objects on stdout, the recording beside them
        rec = tmp_path / "r.rltrec"
        r = run_rltperf("record", eng.target, "--jsonl", "-", "-o", str(rec), "--duration", "2")
        assert r.returncode == 0, r.stderr
        robjs = _objects(r.stdout)
        assert len(robjs) >= 3
        assert set(robjs[0]) == set(objs[0])
        s = json.loads(run_rltperf("summary", str(rec), "--json").stdout)
        assert s["steps"] >= 0.8 * 2 * RATE
        # a recording streams at its own pace; its end is exit 0, the reason on the last line
        rp = run_rltperf("attach", str(rec), "--jsonl")
        assert rp.returncode == 0, rp.stderr
        assert _objects(rp.stdout)[-1]["state"] == "ended"
    finally:
        eng.stop()


def test_auto_finds_the_engine_and_streams_it(tmp_path: Path) -> None:
    eng = _paced(tmp_path, 60)
    try:
        port = int(eng.address.rsplit(":", 1)[1])
        lo, hi = max(1, port - 50), min(65535, port + 49)
        listed = run_rltperf("attach", "--auto", f"{lo}-{hi}", "--list")
        assert listed.returncode == 0, listed.stderr
        # (another test's engine may listen in the range too: ours must be there)
        assert (
            f"{eng.target}  rltperf probe: test-loop, mlp-256, RANDOM WEIGHTS" in listed.stdout.splitlines()
        )
        p = run_rltperf("attach", "--auto", f"127.0.0.1:{lo}-{hi}", "--jsonl", "--duration", "2")
        assert p.returncode == 0, p.stderr
        assert f"{eng.target}" in p.stderr and "rltperf probe: test-loop" in p.stderr
        objs = _objects(p.stdout)
        assert len(objs) >= 3 and eng.target in {o["target"] for o in objs}
        # record --auto: the one target of a narrow range
        rec = tmp_path / "auto.rltrec"
        r = run_rltperf("record", "--auto", f"{port}-{port}", "-o", str(rec), "--duration", "1.5", "-q")
        assert r.returncode == 0 and rec.stat().st_size > 0, r.stderr
        assert eng.target in r.stderr
        # the screen: the target's header says how it was found
        rc, drawn = run_tui(["rltperf", "attach", "--auto", f"{lo}-{hi}"], tmp_path, settle_s=2.0)
        assert rc == 0
        assert "found by --auto: rltperf probe: test-loop" in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", drawn)
    finally:
        eng.stop()
    # nothing there any more: exit 2, and the message says what was scanned
    gone = run_rltperf("attach", "--auto", f"{lo}-{hi}", "--jsonl")
    assert gone.returncode == 2
    assert f"no vLLM server or rltperf probe on 127.0.0.1:{lo}-{hi} ({hi - lo + 1} ports" in gone.stderr
    bad = run_rltperf("attach", "--auto", f"{hi}-{lo}")
    assert bad.returncode == 2 and "first port is above the last" in bad.stderr
