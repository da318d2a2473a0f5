"""``rltperf watch`` on a disk that fills: one sentence and exit 1, what was written kept,
the report written when there is room for it, nothing half written left behind.

Real parts: a probe engine, the real command line, a file-size limit (``RLIMIT_FSIZE``:
writes past it fail as on a full disk, with room left for the small files) and a tiny
tmpfs (a disk that is full).  Before the fix a full disk ended the watch in two
tracebacks (the recording's error, then the run's figures' in ``finally``), with no
report and a ``.run.json.tmp`` left behind.
"""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, EngineProc, finish_cli, tmpfs_mount

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux file-size limits and tmpfs")


def _watch(target: str, out: Path, file_limit: int | None = None) -> subprocess.CompletedProcess[str]:
    """``rltperf watch`` for up to 60 s (it stops long before, when a write fails)."""

    def limit() -> None:
        if file_limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))

    proc = subprocess.Popen([sys.executable, "-m", "rltperf_tui.cli", "watch", target, "--trigger", "step_ms>5000",
                             "--out", str(out), "--duration", "60", "-q"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, preexec_fn=limit)  # fmt: skip
    stdout, stderr = finish_cli(proc, 120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def test_a_recording_that_cannot_grow_stops_the_watch_with_its_report(
    module_loop_engine: EngineProc, tmp_path: Path
) -> None:
    out = tmp_path / "w"
    done = _watch(module_loop_engine.target, out, file_limit=300_000)
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr, done.stderr
    line = done.stderr.strip()
    assert line.count("\n") == 0 and line.startswith("rltperf watch: error: cannot write "), line
    assert "File too large" in line and str(out / "index.html") in line, line
    report = (out / "index.html").read_text()
    assert "(stopped: cannot write " in report
    assert list(out.glob("*.run.json")) and not list(out.glob("*.tmp"))
    (rec,) = out.glob("*.rltrec")
    assert rec.stat().st_size == 300_000  # every byte written up to the limit kept


def test_a_full_disk_stops_the_watch_in_one_sentence_and_leaves_no_half_files(
    module_loop_engine: EngineProc, tmp_path: Path
) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    if not tmpfs_mount(disk, "300k"):
        pytest.skip("cannot mount a tiny tmpfs here (needs root and mount)")
    try:
        out = disk / "w"
        done = _watch(module_loop_engine.target, out)
        names = sorted(p.name for p in out.iterdir())
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr, done.stderr
    line = done.stderr.strip()
    assert line.count("\n") == 0 and "No space left on device" in line and "no report either" in line, line
    assert all(n.endswith(".rltrec") or n.endswith(".run.json") for n in names), (
        names
    )  # no .tmp, no empty chart
