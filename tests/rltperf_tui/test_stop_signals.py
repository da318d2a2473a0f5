"""A command stopped by a signal loses nothing: ``kill`` (SIGTERM) and a hang-up (SIGHUP,
the SSH connection dropped) take the path Ctrl-C or ``q`` takes
(``rltperf_tui/commands/stop_signals.py``).

Real processes against a real probe engine: the command line as a person or a load-test
harness runs it, in a pseudo-terminal where a terminal matters.  A hang-up is made the
way sshd makes one: the terminal's master side is closed, and the kernel sends SIGHUP
to the session.  Before the fix each signal killed the process where it stood: ``watch``
wrote no report, ``record`` lost its closing line and the last records it held, and the
monitor left the terminal in its alternate screen and raw mode.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine_adapters.definitions.records import StepRecord
from engine_adapters.monitor.recording import RecordingReader
from rltperf_tui.commands.common import Progress
from rltperf_tui.commands.headless import LineWriter
from rltperf_tui.commands.stop_signals import on_stop_signals
from tests.conftest import ROOT, EngineProc, finish_cli
from tests.rltperf_tui.tui._uihelpers import drain_pty, record_in_pty

pty = pytest.importorskip("pty")
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux signals and pseudo-terminals")

ENV = dict(os.environ, TERM="xterm-256color", COLUMNS="120", LINES="40",
           PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))  # fmt: skip


def _steps(path: Path) -> list[int]:
    """The step ids of a recording, which must read back undamaged."""
    reader = RecordingReader(path)
    steps = [r.step_id for r in reader.records() if isinstance(r, StepRecord)]
    assert not reader.damaged, reader.warning
    return steps


def _whole(steps: list[int]) -> None:
    """Every step once, in order, none missing between the first and the last."""
    assert len(steps) > 100, len(steps)
    assert steps == list(range(steps[0], steps[0] + len(steps))), "steps missing or repeated"


def _in_pty(args: list[str], cwd: Path) -> tuple[int, int]:
    """``rltperf ARGS`` in a new pseudo-terminal (its controlling terminal); (pid, master fd)."""
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(cwd)
        os.execve(sys.executable, [sys.executable, "-m", "rltperf_tui.cli", *args], ENV)
    return pid, fd


def _wait_exit(pid: int, fd: int | None, out: list[bytes], timeout: float = 60.0) -> int:
    """The exit code (negative: killed by that signal) once ``pid`` ends, reading its terminal."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        assert time.monotonic() < deadline, f"still running {timeout:.0f} s after the signal"
        if fd is None:
            time.sleep(0.05)
        else:
            drain_pty(fd, 0.05, out)


def test_watch_stopped_by_kill_writes_its_report(module_loop_engine: EngineProc, tmp_path: Path) -> None:
    """``timeout`` or a harness ends a load test's ``watch`` with SIGTERM: the report is
    written (marked interrupted), exit 0 as after Ctrl-C, the recording whole."""
    out = tmp_path / "w"
    proc = subprocess.Popen([sys.executable, "-m", "rltperf_tui.cli", "watch", module_loop_engine.target, "--trigger",
                             "step_ms>5000", "--out", str(out), "-q"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)  # fmt: skip
    deadline = time.monotonic() + 60
    while not list(out.glob("*.rltrec")) or os.path.getsize(next(out.glob("*.rltrec"))) < 20_000:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = finish_cli(proc, 60)
    assert proc.returncode == 0, (proc.returncode, stderr)
    report = (out / "index.html").read_text()
    assert "(interrupted)" in report
    assert stdout.strip().endswith("index.html"), stdout
    (rec,) = out.glob("*.rltrec")
    _whole(_steps(rec))


def test_record_in_a_terminal_that_hangs_up_keeps_every_record(
    module_loop_engine: EngineProc, tmp_path: Path
) -> None:
    """The SSH connection drops under ``rltperf record``: it stops as after Ctrl-C (exit 0),
    every record it took is in the file (as many as it counted), and nothing it writes to
    the dead terminal fails it."""
    rec = tmp_path / "r.rltrec"
    pid, fd = _in_pty(["record", module_loop_engine.target, "-o", str(rec)], tmp_path)
    out: list[bytes] = []
    try:
        deadline = time.monotonic() + 60
        while b"steps" not in b"".join(out[-5:]):  # its progress line: recording
            assert time.monotonic() < deadline, b"".join(out)[-2000:]
            drain_pty(fd, 0.2, out)
        drain_pty(fd, 1.5, out)
    finally:
        os.close(fd)  # the hang-up
    code = _wait_exit(pid, None, out)
    assert code == 0, f"exit {code}"
    _whole(_steps(rec))


@pytest.mark.parametrize("how", ["kill", "hang-up"])
def test_the_monitor_stopped_by_a_signal_quits_as_on_q(
    module_loop_engine: EngineProc, tmp_path: Path, how: str
) -> None:
    """``rltperf attach`` recording its stream (``r``), then SIGTERM (``kill PID``) or a
    hang-up: it quits as on ``q``, exit 128 + the signal, the recording whole; after a
    kill, the terminal is given back (the alternate screen left)."""
    pid, fd = _in_pty(["attach", module_loop_engine.target, "--record-dir", str(tmp_path)], tmp_path)
    out: list[bytes] = []
    closed = False
    try:
        record_in_pty(pid, fd, out, tmp_path)
        drain_pty(fd, 1.5, out)
        if how == "kill":
            os.kill(pid, signal.SIGTERM)
            code, expect = _wait_exit(pid, fd, out), 128 + signal.SIGTERM
        else:
            os.close(fd)
            closed = True
            code, expect = _wait_exit(pid, None, out), 128 + signal.SIGHUP
        pid = 0  # reaped
        assert code == expect, f"exit {code}, not {expect}"
        if how == "kill":
            drain_pty(fd, 1.0, out)  # what it wrote last
            screen = b"".join(out)
            assert screen.rfind(b"\x1b[?1049l") > screen.rfind(b"\x1b[?1049h"), (
                "the terminal was not given back"
            )
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        if not closed:
            os.close(fd)
    (rec,) = tmp_path.glob("*.rltrec")
    _whole(_steps(rec))


def test_writes_to_a_terminal_that_hung_up_end_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hang-up can land while a line is being written, before the handler runs: that
    write fails with EIO.  ``--jsonl``'s writer takes it as a reader that left (as a closed
    pipe), and a progress line turns itself off; neither raises (both did)."""
    master, slave = pty.openpty()
    tty = os.fdopen(slave, "w")
    os.close(master)  # the hang-up: the slave's writes now fail with EIO
    try:
        with pytest.raises(OSError, match="Input/output error"):  # the premise, on this kernel
            tty.write("x\n")
            tty.flush()
        writer = LineWriter(tty)
        assert writer.write({"a": 1}) is False and writer.closed
        monkeypatch.setattr(sys, "stderr", tty)
        prog = Progress()
        prog.tty = True
        prog.show("recording: 3 s")
        prog.done()
        assert not prog.enabled
    finally:
        with contextlib.suppress(OSError):
            tty.close()


def test_only_the_first_stop_signal_acts_and_none_once_closing() -> None:
    """In this process, with real signals: a second SIGTERM does not run the handler again
    (it would cut the first one's cleanup short), and once the command says it is closing
    (``watch`` writing its report at the end of its ``--duration``) none does."""
    assert threading.current_thread() is threading.main_thread()  # where Python runs handlers
    calls: list[int] = []
    before = signal.getsignal(signal.SIGTERM)
    with on_stop_signals(calls.append) as signals:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # handlers run between bytecodes of the main thread
    assert calls == [signal.SIGTERM] and signals.fired == signal.SIGTERM
    with on_stop_signals(calls.append) as signals:
        signals.closing()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
    assert calls == [signal.SIGTERM] and signals.fired is None
    assert signal.getsignal(signal.SIGTERM) is before  # the old handler back
