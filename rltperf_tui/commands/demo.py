"""``rltperf demo``: the reference engine as a child process, and the monitor on it.

The child must never outlive the monitor:

- it runs in its own session / process group (``start_new_session``), so stopping it
  is one ``killpg`` and a Ctrl-C typed at a shell does not half-kill it;
- on Linux it asks the kernel (``prctl(PR_SET_PDEATHSIG, SIGKILL)`` through ctypes,
  in ``preexec_fn``) to be killed when the thread that started it dies — so even a
  SIGKILL of the monitor takes it along.  The child is started from the main thread,
  which lives as long as the monitor;
- the normal paths (quit, a UI crash, SIGTERM / SIGHUP / SIGINT, interpreter exit)
  all end in ``EngineChild.stop()``: SIGTERM to the group, a grace period, SIGKILL.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from rltperf_tui.commands.attach import add_monitor_options, check_monitor_options, monitor_kwargs
from rltperf_tui.commands.stop_signals import TUI_STOP_SIGNALS, on_stop_signals, quit_on_signal

HELP = "start here: the reference engine on this machine's CPU, watched live"
EXIT_WITHOUT_TEARDOWN = True
"""Done, the process ends at once (``cli._exit_now``): no interpreter teardown to wait for."""
DESCRIPTION = """\
Start the reference looped-transformer engine (tiny preset, CPU, a steady workload
with bursts) as a child process, attach the live monitor to it, and stop the engine
when you quit (also on Ctrl-C, a closed terminal or a crash of the monitor).  Captures
(c / f) land in ./snapshots.  The engine's output goes to a log file, named in the
header; the weights are random, so exit depths and acceptance rates are illustrative
only: the screen says so."""

GRACE_S = 5.0
"""Seconds the engine gets to stop after SIGTERM before SIGKILL."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--preset", default="tiny", help="reference engine model preset (default tiny)")
    g.add_argument("--device", default="cpu", help="device for the engine (default cpu)")
    g.add_argument(
        "--workload", default="steady-bursts", help="load generator workload (default steady-bursts)"
    )
    g.add_argument(
        "--exit",
        default="gate:0.9",
        metavar="POLICY",
        help="exit policy (default gate:0.9: Ouro-style cumulative gate, so exits spread over the depths)",
    )
    g.add_argument("--exit-mode", default="compact", choices=("select", "compact"), help="default compact")
    g.add_argument(
        "--spec",
        default="2,3",
        metavar="DRAFT_LOOPS,DRAFT_LEN",
        help="self-speculative decoding (default 2,3: draft 3 tokens at 2 loops; 'off' to disable)",
    )
    g.add_argument("--port", type=int, default=0, help="probe port on 127.0.0.1 (default: a free one)")
    g.add_argument(
        "--snapshots",
        default="./snapshots",
        metavar="DIR",
        help="capture output folder (default ./snapshots)",
    )
    g.add_argument("--log", default=None, metavar="FILE",
                   help="engine output log (default: rltperf-demo-<pid>.log in the temp folder)")  # fmt: skip
    g.add_argument(
        "--engine-cmd",
        default=None,
        metavar="CMD",
        help="run CMD instead of the reference engine ({listen} and {snapshots} are filled in); "
        "it must serve an rltperf probe on {listen}",
    )
    add_monitor_options(p)


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def engine_command(args: argparse.Namespace, listen: str) -> tuple[list[str], str]:
    """The child's command line and a note for the header."""
    if args.engine_cmd:
        cmd = shlex.split(args.engine_cmd.format(listen=listen, snapshots=args.snapshots))
        return cmd, "your --engine-cmd"
    cmd = [sys.executable, "-m", "rltperf_tui.cli", "engine", "--preset", args.preset, "--device", args.device,
           "--workload", args.workload, "--exit", args.exit, "--exit-mode", args.exit_mode,
           "--listen", listen, "--snapshots", args.snapshots]  # fmt: skip
    if args.spec and args.spec != "off":
        cmd += ["--spec", args.spec]
    spec = f", spec {args.spec}" if args.spec and args.spec != "off" else ""
    return (
        cmd,
        f"reference engine {args.preset}/{args.device}/{args.workload}, exit {args.exit} {args.exit_mode}{spec}",
    )


def _pdeathsig_preexec(parent_pid: int) -> Any:
    """``preexec_fn`` asking Linux to SIGKILL the child when its parent thread dies."""

    def setup() -> None:
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                libc = ctypes.CDLL(None, use_errno=True)
                pr_set_pdeathsig = 1
                libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
            except Exception:
                pass
            if os.getppid() != parent_pid:  # the parent died before prctl took effect
                os._exit(1)

    return setup


class EngineChild:
    """The engine process: started in its own group, stopped for sure."""

    def __init__(self, cmd: list[str], log_path: str, cwd: str | None = None) -> None:
        self.cmd = cmd
        self.log_path = log_path
        self._lock = threading.Lock()
        self._stopped = False
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log.write(f"# rltperf demo: {shlex.join(cmd)}\n".encode())
        self._log.flush()
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
            preexec_fn=_pdeathsig_preexec(os.getpid()),
        )
        self.pid = self.proc.pid

    def problem(self) -> str | None:
        """A sentence when the engine has exited (with its log's last lines), else None."""
        rc = self.proc.poll()
        if rc is None or self._stopped:
            return None
        return f"the engine exited with status {rc}. Last lines of {self.log_path}:\n{self.log_tail()}"

    def log_tail(self, lines: int = 6) -> str:
        """The last lines of the engine's log."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 4096))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return "(log unreadable)"
        return "\n".join(text.strip().splitlines()[-lines:])

    def stop(self, grace: float = GRACE_S) -> int | None:
        """SIGTERM the engine's process group, wait ``grace`` s, then SIGKILL (idempotent)."""
        with self._lock:
            if self._stopped:
                return self.proc.returncode
            self._stopped = True
        try:
            if self.proc.poll() is None:
                self._signal_group(signal.SIGTERM)
                try:
                    self.proc.wait(grace)
                except subprocess.TimeoutExpired:
                    pass
            # the group too: anything the engine started goes with it
            self._signal_group(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)
        finally:
            with contextlib.suppress(OSError):
                self._log.close()
        return self.proc.returncode

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                if self.proc.poll() is None:
                    self.proc.send_signal(sig)


def run(args: argparse.Namespace) -> int:
    bad = check_monitor_options(args, "demo")
    if bad:
        print(f"rltperf demo: error: {bad}", file=sys.stderr)
        return 2
    from engine_adapters.monitor.tcp import ProbeAdapter
    from rltperf_tui.live.driver import TargetSpec
    from rltperf_tui.tui.app import MonitorApp

    port = args.port or free_port()
    listen = f"127.0.0.1:{port}"
    log_path = args.log or os.path.join(tempfile.gettempdir(), f"rltperf-demo-{os.getpid()}.log")
    os.makedirs(args.snapshots, exist_ok=True)
    cmd, what = engine_command(args, listen)
    try:
        child = EngineChild(cmd, log_path)
    except OSError as exc:
        print(f"rltperf demo: error: cannot start the engine ({shlex.join(cmd)}): {exc}", file=sys.stderr)
        return 1
    atexit.register(child.stop, 2.0)
    app: MonitorApp | None = None

    target = f"tcp://{listen}"
    adapter = ProbeAdapter(target)
    # not connected yet: the engine is still starting; the session connects (and retries) itself
    spec = TargetSpec(
        target=target,
        adapter=adapter,
        session=adapter.session(),
        note=f"demo: {what}, pid {child.pid}, log {log_path}; captures → {os.path.abspath(args.snapshots)}",
        waiting_text="starting the engine (loading torch and warming the profiler takes a few seconds)",
    )
    stopped = f"rltperf demo: engine stopped (pid {child.pid}); its log: {log_path}"
    exit_process = getattr(args, "_exit_process", None)

    def finish(code: int) -> None:
        """On quit (the command line only): stop the engine and say so, then end the
        process without the monitor's teardown (``MonitorApp.quit_now``)."""
        child.stop()
        print(stopped, file=sys.stderr)
        if exit_process is not None:
            exit_process(code)

    def on_signal(signum: int) -> None:
        child.stop(2.0)
        if app is not None:
            quit_on_signal(app)(signum)
        else:
            raise SystemExit(128 + signum)

    with on_stop_signals(on_signal, TUI_STOP_SIGNALS):  # kill, a hang-up, kill -INT: as q
        try:
            app = MonitorApp([spec], **monitor_kwargs(args), wait=True, child_check=child.problem,
                             exit_process=finish if exit_process is not None else None)  # fmt: skip
            app.run()
            app.close_all()
        finally:
            child.stop()
    print(stopped, file=sys.stderr)
    code = app.return_code if app is not None else 1
    return int(code or 0)
