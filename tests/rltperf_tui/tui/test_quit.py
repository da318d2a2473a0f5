"""Quitting is immediate whatever the targets do: the real CLI in a pseudo-terminal.

The targets are real sockets: two listeners that accept connections and never answer
(a hung vLLM HTTP server, a hung probe), and a port nobody listens on (a target that
keeps reconnecting); the baseline, timed in the same test, is three such closed ports.  The listeners drop the first connection at once, so that
``rltperf attach --wait`` opens its screen quickly and the monitor's own retries are the
ones left hanging when ``q`` is pressed.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from engine_adapters.definitions.records import StepRecord
from engine_adapters.monitor.recording import RecordingReader
from engine_adapters.monitor.tcp import HELLO_TIMEOUT_S
from tests.conftest import LOOP_ENGINE, ROOT, cpu_s, free_ports, start_engine
from tests.rltperf_tui.tui._uihelpers import drain_pty, record_in_pty

pty = pytest.importorskip("pty")

DEFECT_S = HELLO_TIMEOUT_S
"""What the defect cost: ``q`` waited out a probe attempt's hello timeout (5 s) in the
ingest worker, which Textual joins on exit."""


class HungServer:
    """Accepts connections, closes the first one at once, holds the others silently."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.accepted = 0
        self.held: list[socket.socket] = []
        self._stop = False
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            if self.accepted == 1:
                conn.close()
            else:
                self.held.append(conn)

    def close(self) -> None:
        self._stop = True
        self.sock.close()
        for c in self.held:
            c.close()


def _quit_time(targets: list[str], ready: Callable[[bytes], bool]) -> float:
    """Start ``rltperf attach --wait TARGETS`` in a pseudo-terminal, wait for ``ready``
    (given everything drawn so far), press q; the seconds until the shell is back."""
    env = dict(os.environ, TERM="xterm-256color", COLUMNS="160", LINES="45",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))  # fmt: skip
    pid, fd = pty.fork()
    if pid == 0:  # the child: the real command line, as a person types it
        os.chdir(ROOT)
        os.execve(
            sys.executable, [sys.executable, "-m", "rltperf_tui.cli", "attach", "--wait", *targets], env
        )
    out: list[bytes] = []
    try:
        deadline = time.monotonic() + 60
        while not ready(b"".join(out)):
            assert time.monotonic() < deadline, b"".join(out)[-2000:].decode(errors="replace")
            assert os.waitpid(pid, os.WNOHANG) == (0, 0), b"".join(out)[-2000:].decode(errors="replace")
            drain_pty(fd, 0.1, out)
        drain_pty(fd, 0.5, out)
        t0 = time.monotonic()
        os.write(fd, b"q")
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            assert time.monotonic() - t0 < 30, "the monitor did not quit within 30 s"
            drain_pty(fd, 0.01, out)
        took = time.monotonic() - t0
        pid = 0
        assert os.waitstatus_to_exitcode(status) == 0
        return took
    finally:
        if pid:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.close(fd)


@pytest.mark.skipif(sys.platform != "linux", reason="a Linux pseudo-terminal")
def test_q_quits_at_once_with_hung_and_reconnecting_targets() -> None:
    """``q`` with a hung vLLM, a hung probe and a closed port costs no more than ``q`` with
    three closed ports, measured in this same test: the difference is a ratio to the
    hello timeout the defect waited, not a bound the machine's load could break (the old
    "within 1 s + 2 s slack" failed under load)."""
    closed = [free_ports() for _ in range(3)]
    plain = [
        f"vllm+http://127.0.0.1:{closed[0]}",
        f"tcp://127.0.0.1:{closed[1]}",
        f"tcp://127.0.0.1:{closed[2]}",
    ]
    base = _quit_time(plain, lambda out: out.count(b"reconnecting") >= 1)
    http_hung, probe_hung = HungServer(), HungServer()
    try:
        targets = [f"vllm+http://127.0.0.1:{http_hung.port}", f"tcp://127.0.0.1:{probe_hung.port}",
                   f"tcp://127.0.0.1:{closed[2]}"]  # fmt: skip
        # the monitor's own attempts are under way: both servers hold a connection
        took = _quit_time(
            targets, lambda out: bool(http_hung.held and probe_hung.held and b"reconnecting" in out)
        )
    finally:
        http_hung.close()
        probe_hung.close()
    print(f"q took {took:.2f} s with hung targets, {base:.2f} s with closed ports only")
    assert took - base < DEFECT_S / 2, f"q took {took:.2f} s with hung targets, {base:.2f} s without"


HOG = "while True: pass"
LOADED_LIMIT_S = 3.0
"""``q`` to shell with every core saturated, less the time the monitor's main thread
waited in the run queue for a core (the scheduler's share, not the monitor's: in a full
parallel run beside a loaded vLLM server, q took 5.09 s of wall for 0.057 s of CPU): the
requirement (1 s) with room for a shared 2-core machine.  Measured with a hog per core on an otherwise quiet 2-core machine:
0.01-0.03 s (Textual's teardown before: 0.22-0.24 s, mostly joining its input thread); with
the monitor's share of the CPU cut to a tenth (its autogroup at nice 10): 0.09-0.72 s
(before: 0.44-1.31 s).  The issue measured 1-18 s before, at load ~24."""
QUIT_CPU_S = 0.1
"""CPU seconds the monitor may spend between ``q`` and its end: what a starved CPU
multiplies into waiting.  Measured 0.01-0.02 s (before: 0.02-0.04 s); the interpreter's
own teardown, which the command line skips, alone costs 0.2-0.3 s."""


def _sched_s(pid: int) -> tuple[float, float]:
    """(run, run-queue wait) seconds of process ``pid``'s main thread so far
    (``/proc/PID/schedstat``; still readable while it is a zombie)."""
    with open(f"/proc/{pid}/schedstat") as f:
        run, wait = f.read().split()[:2]
    return int(run) / 1e9, int(wait) / 1e9


@pytest.mark.skipif(sys.platform != "linux", reason="a Linux pseudo-terminal")
def test_q_gives_the_shell_back_at_once_with_every_core_busy_and_the_recording_complete(
    tmp_path: Path,
) -> None:
    """A CPU hog on every core (as a loaded server's engine), a real probe engine at
    1 000 steps/s, the real command line in a pty recording its stream (``r``); then
    ``q``: the process ends within ``LOADED_LIMIT_S`` of time it neither ran nor waited
    for a core (wall time less its main thread's CPU and run-queue wait), having spent less than
    ``QUIT_CPU_S`` of CPU on the way (the wall time hides how much work is left when the
    machine happens to be idle; the CPU time does not), and the recording is whole (it
    reads back undamaged, every step once and in order)."""
    eng = start_engine([str(LOOP_ENGINE), "--duration", "300", "--rate", "1000", "--no-warm",
                        "--snapshots", str(tmp_path / "snaps")])  # fmt: skip
    hogs: list[subprocess.Popen[bytes]] = []
    pid, fd = 0, -1
    out: list[bytes] = []
    try:
        env = dict(os.environ, TERM="xterm-256color", COLUMNS="160", LINES="45",
                   PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))  # fmt: skip
        env.pop("NO_COLOR", None)
        pid, fd = pty.fork()
        if pid == 0:  # the child: the real command line, as a person types it
            os.chdir(tmp_path)
            os.execve(sys.executable, [sys.executable, "-m", "rltperf_tui.cli", "attach", eng.target,
                                       "--record-dir", str(tmp_path)], env)  # fmt: skip
        record_in_pty(pid, fd, out, tmp_path)
        hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(os.cpu_count() or 2)]
        drain_pty(fd, 3.0, out)  # recording under load, the hogs at full speed
        cpu0 = cpu_s(pid)
        run0, wait0 = run1, wait1 = _sched_s(pid)
        t0 = time.monotonic()
        os.write(fd, b"q")
        while True:
            with contextlib.suppress(OSError):
                run1, wait1 = _sched_s(pid)  # the last reading before it is reaped
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                break
            assert time.monotonic() - t0 < 60, "the monitor did not quit within 60 s"
            drain_pty(fd, 0.01, out)
        took = time.monotonic() - t0
        pid = 0
        after_q = usage.ru_utime + usage.ru_stime - cpu0  # CPU it spent leaving, whatever the wait
        queued = wait1 - wait0
        blocked = took - (run1 - run0) - queued  # neither running nor waiting for a core
        print(f"q to shell {took:.3f} s, {after_q:.3f} s of CPU, {queued:.3f} s waiting for a core, "
              f"{blocked:.3f} s otherwise; every core busy")  # fmt: skip
        assert os.waitstatus_to_exitcode(status) == 0
        assert blocked < LOADED_LIMIT_S, (
            f"q took {took:.2f} s to give the shell back with every core busy, {queued:.2f} s of it "
            "waiting for a core"
        )
        assert after_q < QUIT_CPU_S, f"leaving took {after_q:.3f} s of CPU"
        drain_pty(fd, 1.0, out)  # what it wrote last, still in the pty (until EOF)
        screen = b"".join(out)
        assert screen.rfind(b"\x1b[?1049l") > screen.rfind(b"\x1b[?1049h")  # the alternate screen left
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        if pid:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        if fd >= 0:
            os.close(fd)
        eng.stop()
    (rec,) = tmp_path.glob("*.rltrec")
    reader = RecordingReader(rec)
    steps = [r.step_id for r in reader.records() if isinstance(r, StepRecord)]
    assert not reader.damaged, reader.warning
    assert len(steps) > 500 and steps == sorted(set(steps))
