"""Shared fixtures: real probes over real sockets, real engines in subprocesses.

The shared real vLLM servers (``vllm_server``, ``ouro_server``: one start per kind for
the whole session, the ``vllm`` marker, the ``RLTPERF_REQUIRE_VLLM=1`` switch under
which a vLLM test that skips fails) are a plugin loaded here:
``tests/engine_adapters/vllm/vllm_servers.py``, whose docstring says how to use them
and how to add a kind.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOOP_ENGINE = ROOT / "engine_adapters" / "reference" / "loop.py"

PACED_WORKLOAD = "poisson:10,in=32,out=16"
"""A reference-engine workload for tests that need steps flowing but not a busy engine:
~110 steps/s of the tiny preset, about half a core where ``closed:4`` took a whole one
(``test_documented_commands``: 80 -> 57 CPU s with it)."""

VLLM_TESTS = ROOT / "tests" / "engine_adapters" / "vllm"

# the vLLM helpers are imported by their plain names (vllm_fixtures, tiny_model, tiny_ouro)
# wherever they are used, so that every test shares one copy of each module
if str(VLLM_TESTS) not in sys.path:
    sys.path.insert(0, str(VLLM_TESTS))
pytest_plugins = ["vllm_servers"]

# A run started in the background by a non-interactive shell (``cmd &``, ``nohup``, some CI
# harnesses) inherits SIGINT ignored, and an ignored signal stays ignored across exec: every
# ``rltperf record`` / ``attach --jsonl`` a test stops with SIGINT, as a user's Ctrl-C does,
# would ignore it (Python installs its KeyboardInterrupt handler only where SIGINT was not
# ignored at start).  The test process handles SIGINT itself, so that its children start
# with the default disposition.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config: pytest.Config) -> None:
    """Compile the project's sources to ``__pycache__`` once, before any test starts a
    process.  Every engine, CLI and vLLM process a test starts imports them again, and
    where ``PYTHONDONTWRITEBYTECODE`` is set (this machine image sets it) none of those
    processes writes what it compiled: each compiled the sources anew.  A process that
    imports the screen, ``watch``, the loop engine and the probe server took 0.76-0.82 s of
    CPU so, 0.51-0.64 s with them compiled (five each, alternated, on a quiet machine); a
    CLI that imports little (``compare --help``) gains nothing.  The controller does it;
    xdist workers share the files."""
    if hasattr(config, "workerinput"):
        return
    import compileall

    for name in ("engine_adapters", "rltperf_tui", "tests"):
        compileall.compile_dir(ROOT / name, quiet=2)  # a failure here only costs the time


@dataclass
class EngineProc:
    """A running engine subprocess and its probe address."""

    proc: subprocess.Popen[str]
    address: str
    log_path: str = ""

    @property
    def target(self) -> str:
        return f"tcp://{self.address}"

    def stop(self, timeout: float = 15.0) -> int:
        census = os.environ.get("RLTPERF_TEST_CPU_CENSUS")
        if census and self.proc.poll() is None:  # where the suite's CPU goes, engine by engine
            try:
                line = {"test": os.environ.get("PYTEST_CURRENT_TEST", ""), "cpu_s": cpu_s(self.proc.pid),
                        "args": [str(a) for a in self.proc.args][1:]}  # fmt: skip
                with open(census, "a", encoding="utf-8") as f:
                    f.write(json.dumps(line) + "\n")
            except OSError:
                pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout:
            self.proc.stdout.close()
        return self.proc.returncode

    def log_text(self) -> str:
        """What the engine wrote to stderr so far."""
        with open(self.log_path, errors="replace") as f:
            return f.read()


def free_ports(n: int = 1) -> int:
    """The first of ``n`` consecutive TCP ports free on loopback now, below the kernel's
    ephemeral range: a vLLM server binds its ports tens of seconds after they were
    chosen, and a port the kernel had handed out (``bind(0)``) could meanwhile go to any
    process's connection, and a listener on port 0 (another test's engine) lands in that
    range too.  A parallel run lost a DP 2 server's second probe that way (base + 1:
    "Address already in use"; the plugin's DP probes are base + DP rank)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            ephemeral = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    lo, hi = (20000, ephemeral - n) if ephemeral - n > 21000 else (1024, ephemeral - n)
    pick = random.SystemRandom()
    for _ in range(500):
        base = pick.randrange(lo, hi)
        if all(bindable(base + i) for i in range(n)):
            return base
    raise RuntimeError(f"no {n} consecutive free ports found in {lo}..{hi}")


def bindable(port: int) -> bool:
    """Whether 127.0.0.1:``port`` is free to bind now."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


_ENGINE_LOGS_ENV = "RLTPERF_TEST_ENGINE_LOGS"
"""Where this test process keeps its engine logs (in the environment: the test modules
import ``tests.conftest``, a module apart from the conftest pytest loaded)."""


def _engine_logs() -> Path:
    """This test process's folder of engine logs (one per run, not one file per engine
    loose in the temporary folder: a thousand were left there after a few dozen runs)."""
    d = os.environ.get(_ENGINE_LOGS_ENV)
    if not d or not os.path.isdir(d):
        d = os.environ[_ENGINE_LOGS_ENV] = tempfile.mkdtemp(prefix="rltperf-test-engines-")
    return Path(d)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The engine logs go with a run that passed; a failed run keeps them and says where."""
    d = os.environ.pop(_ENGINE_LOGS_ENV, None)
    if not d:
        return
    if exitstatus == 0:
        shutil.rmtree(d, ignore_errors=True)
    else:
        print(f"\nengine logs kept in {d}", file=sys.stderr)


ADDRESS_RE = re.compile(r"(?:^ADDRESS |tcp://)(\[[^\]]+\]:\d+|[^\s/:]+:\d+)")


def start_engine(
    args: list[str], cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 60.0
) -> EngineProc:
    """Start ``python <args>`` and wait for a stdout line with ``ADDRESS host:port`` or
    ``tcp://host:port`` (``args`` may start with ``-m module``)."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.update(env or {})
    # stderr goes to a file, never an unread pipe: a full pipe would block the engine.
    log = tempfile.NamedTemporaryFile("w+", prefix="engine-", suffix=".log", dir=_engine_logs(), delete=False)  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        cwd=str(cwd or ROOT),
        env=e,
    )
    assert proc.stdout is not None
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            err = log.read()
            raise RuntimeError(f"engine exited early ({proc.returncode}): {err[-2000:]}")
        if sel.select(0.2):
            line = proc.stdout.readline()
            m = ADDRESS_RE.search(line)
            if m:
                return EngineProc(proc, m.group(1), log.name)
    proc.kill()
    raise RuntimeError("engine did not print its address in time")


def _schedstat(pid: int, tid: int | None, field: int) -> float:
    """A field of ``/proc/PID/task/TID/schedstat`` (ns) in seconds: 0 run time, 1 run-queue wait."""
    with open(f"/proc/{pid}/task/{tid or pid}/schedstat") as f:
        return int(f.read().split()[field]) / 1e9


def run_queue_s(pid: int, tid: int | None = None) -> float:
    """Seconds a thread (default: the process's main thread) has waited on a run queue,
    runnable but not running (schedstat's second field): the time other tenants' load
    took from it.  A thread blocked on a lock or the GIL sleeps instead, so that time is
    not here: a rate over the wall time less this one is immune to other tenants and
    still shows an engine that was stopped (not to a GIL held by one of the engine's own
    threads while that thread waits for a core: ``test_faults.py`` ``Pace``)."""
    return _schedstat(pid, tid, 1)


class QueueSampler:
    """The run-queue wait (``run_queue_s``) of some processes' main threads, summed and
    sampled every ``period_s`` in a thread, stamped with ``time.perf_counter_ns`` (the
    probe's clock: CLOCK_MONOTONIC, shared by every process).  ``queued_ms(t0, t1)`` is
    an upper bound of what those threads waited for a core between two instants of that
    clock: the growth from the last sample at or before ``t0`` to the first at or after
    ``t1`` (a sampler itself kept from a core samples less often, and bounds wider).  A
    test on a shared machine excuses a slow step by it, never more than it."""

    def __init__(self, pids: list[int], period_s: float = 0.005) -> None:
        self.pids = pids
        self.period_s = period_s
        self.samples: list[tuple[int, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0.0
            for pid in self.pids:
                with contextlib.suppress(OSError):  # a process that ended
                    total += run_queue_s(pid)
            self.samples.append((time.perf_counter_ns(), total))
            self._stop.wait(self.period_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def queued_ms(self, t0_ns: int, t1_ns: int) -> float | None:
        """None where the samples do not reach around ``[t0_ns, t1_ns]``."""
        samples = list(self.samples)  # (in time order)
        i = bisect.bisect_right(samples, t0_ns, key=lambda s: s[0]) - 1  # the last at or before t0
        j = bisect.bisect_left(samples, t1_ns, key=lambda s: s[0])  # the first at or after t1
        if i < 0 or j >= len(samples):
            return None
        return (samples[j][1] - samples[i][1]) * 1e3


def run_s(pid: int, tid: int | None = None) -> float:
    """Seconds a thread (default: the process's main thread) has run on a core
    (schedstat's first field, ns resolution)."""
    return _schedstat(pid, tid, 0)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_rltperf(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``rltperf ARGS`` as a user would (a fresh process), capturing its output."""
    return run_cli(list(args), timeout=timeout)


def run_cli(
    args: list[str],
    timeout: float = 120,
    env: dict[str, str] | None = None,
    cwd: Path | str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m rltperf_tui.cli ARGS`` (``env`` default: this one with the checkout
    on ``PYTHONPATH``), capturing its output.  One still running after ``timeout`` fails
    the test with what it was doing (``CliStuck``), not a bare timeout."""
    e = env if env is not None else dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "rltperf_tui.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=e, cwd=None if cwd is None else str(cwd))  # fmt: skip
    out, err = finish_cli(proc, timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def finish_cli(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """``proc.communicate(timeout=timeout)`` for a command started with pipes; past its time,
    ``CliStuck`` saying what it was doing (``stuck_report``)."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise CliStuck(stuck_report(proc, timeout)) from None


class CliStuck(AssertionError):
    """A command a test ran did not end in time; the message says what it was doing."""


def stuck_report(proc: subprocess.Popen[str], timeout: float) -> str:
    """Kill ``proc`` (past its ``timeout``) and say what it was doing: its CPU and run-queue
    time, its threads' states (``D``: waiting on the disk), every thread's stack (the CLI
    prints them on SIGUSR1) and the end of its stderr.  A CI run once failed two vLLM tests
    on bare timeouts of a capture and a recording that had done nothing for 180 and 300 s."""
    facts = []
    with contextlib.suppress(OSError, ValueError, IndexError):
        facts.append(f"ran {run_s(proc.pid):.2f} s, waited {run_queue_s(proc.pid):.2f} s for a core")
    states: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{proc.pid}/task"):
            with contextlib.suppress(OSError, IndexError):
                st = Path(f"/proc/{proc.pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                states[st] = states.get(st, 0) + 1
    facts.append("threads by state: " + (", ".join(f"{k} {v}" for k, v in sorted(states.items())) or "?"))
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGUSR1)
    time.sleep(2.0)
    proc.kill()
    try:
        _out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:  # (a thread in D state holds the process)
        err = "(stderr not read: the killed process did not end within 30 s)"
    return f"{' '.join(map(str, proc.args))[-300:]} still ran after {timeout:g} s; {'; '.join(facts)}; stderr:\n{(err or '')[-6000:]}"


@pytest.fixture(scope="session", autouse=True)
def _private_calibration_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Calibrations made by the tests (probes run a quick one) stay out of ~/.cache."""
    old = os.environ.get("RLTPERF_CACHE")
    os.environ["RLTPERF_CACHE"] = str(tmp_path_factory.mktemp("rltperf-cache"))
    yield
    if old is None:
        os.environ.pop("RLTPERF_CACHE", None)
    else:
        os.environ["RLTPERF_CACHE"] = old


LOOP_PACE = ["--rate", "500"]
"""The pace of a test loop engine whose test needs steps flowing, not as many as a core
makes: unpaced, the loop keeps a whole core busy for as long as it runs, beside the
other workers' tests on the 2 cores (500 steps/s: ~20 % of a core; 1,000: 34 %; 200:
11 %, measured per thread from ``/proc`` after the warm-up).  A test that needs the
loop's full speed (a stalled subscriber's queue must overflow) starts its own."""


@pytest.fixture
def loop_engine(tmp_path: Path) -> Iterator[EngineProc]:
    """The test torch loop with a probe on a free port, snapshots under tmp_path, paced
    (``LOOP_PACE``)."""
    eng = start_engine(
        [str(LOOP_ENGINE), "--duration", "120", *LOOP_PACE, "--snapshots", str(tmp_path / "snapshots")]
    )
    try:
        yield eng
    finally:
        eng.stop()


@pytest.fixture(scope="module")
def module_loop_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProc]:
    """The test loop paced at 1,000 steps/s for a whole module whose tests only read its
    stream (no captures): one start instead of one a test."""
    snaps = tmp_path_factory.mktemp("snapshots")
    eng = start_engine([str(LOOP_ENGINE), "--duration", "600", "--rate", "1000", "--no-warm",
                        "--snapshots", str(snaps)])  # fmt: skip
    try:
        yield eng
    finally:
        eng.stop()


def _checkout_snapshots() -> set[str]:
    return {p.name for p in (ROOT / "snapshots").iterdir()} if (ROOT / "snapshots").is_dir() else set()


@pytest.fixture(scope="session", autouse=True)
def no_bundle_left_in_the_checkout() -> Iterator[None]:
    """Tests write their captures under their own temporary folders: a bundle that turns
    up in the checkout's ``snapshots/`` (a command run with the checkout as its working
    directory) fails the run at the end of the session."""
    before = _checkout_snapshots()
    yield
    new = sorted(_checkout_snapshots() - before)
    assert not new, f"tests left bundles in {ROOT / 'snapshots'}: {new}"


def tmpfs_mount(path: Path, size: str | None = None) -> bool:
    """A tiny tmpfs at ``path`` (``size``, e.g. "48k": a disk that fills), read-only
    without one; False when not possible (needs root and ``mount``; CI runs as root)."""
    opts = f"size={size}" if size else "ro,size=64k"
    if shutil.which("mount") is None or os.geteuid() != 0:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True)
    return done.returncode == 0
