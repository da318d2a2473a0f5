"""``rltperf engine`` as a process, the way a user meets it: its first lines, the
commit it reports when started from another folder, its stderr, and how fast it stops."""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine_adapters.definitions.records import Hello, StepRecord
from engine_adapters.monitor.tcp import ProbeAdapter
from tests.conftest import ADDRESS_RE, cpu_s, run_queue_s, run_s

ROOT = Path(__file__).resolve().parents[3]
TARGET_LINE = re.compile(r"^tcp://(\[[^\]]+\]|[^\s:/\[\]]+):(\d+)$")
TOKEN = "s3cret-token-for-the-test"


class EngineProcess:
    """``python -m rltperf_tui.cli engine ARGS`` in ``cwd``, stdout read line by line."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        e = dict(os.environ, PYTHONPATH=str(ROOT))
        e.update(env or {})
        self.err_path = cwd / "engine.err"
        self._err = open(self.err_path, "w")  # noqa: SIM115 -- closed in stop()
        self.p = subprocess.Popen(
            [sys.executable, "-m", "rltperf_tui.cli", "engine", *args],
            cwd=cwd, env=e, text=True, stdout=subprocess.PIPE, stderr=self._err,
        )  # fmt: skip
        assert self.p.stdout is not None
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.p.stdout, selectors.EVENT_READ)
        self.lines: list[tuple[float, str]] = []
        """Every stdout line so far, with the time it was read."""

    def wait_line(self, pred, timeout: float) -> str:  # type: ignore[no-untyped-def]
        """The next line (after those already read) that satisfies ``pred``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.sel.select(0.2):
                assert self.p.stdout is not None
                line = self.p.stdout.readline()
                if not line:  # EOF: the engine exited
                    break
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                if pred(line.rstrip("\n")):
                    return line.rstrip("\n")
            elif self.p.poll() is not None:
                break
        raise AssertionError(
            f"no such line in {timeout} s; stdout {self.lines}; stderr {self.stderr()[-2000:]}"
        )

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)
        self._err.close()


def _git_head() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@pytest.mark.slow
def test_first_lines_token_commit_kv_and_quiet_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started from a folder outside the checkout, listening on every interface with a
    token, with the README's long-prompt workload and the default KV:

    - line 1 is the target alone, a reachable address (not 0.0.0.0), found by the tests'
      own ``ADDRESS_RE``; line 2 suggests ``rltperf attach`` of that target and never
      prints the token; the suggested target with the token in ``RLTPERF_TOKEN`` connects;
    - the commit in the engine's info is the checkout's HEAD, read from the engine's code;
    - stderr has no profiler ``USDT:`` lines.
    """
    eng = EngineProcess(
        ["--listen", "0.0.0.0:0", "--token", TOKEN, "--workload", "rate-4096:0.5", "--duration", "60"],
        cwd=tmp_path,
    )
    try:
        first = eng.wait_line(lambda s: True, 120)
        m = TARGET_LINE.match(first)
        assert m, f"line 1 is not tcp://HOST:PORT alone: {first!r}"
        host, port = m.group(1), m.group(2)
        assert host not in ("0.0.0.0", "[::]"), first
        found = ADDRESS_RE.search(first)
        assert found and found.group(1) == f"{host}:{port}"
        second = eng.wait_line(lambda s: True, 10)
        assert f"rltperf attach {first}" in second and "RLTPERF_TOKEN" in second, second
        assert all(TOKEN not in line for _, line in eng.lines)
        monkeypatch.setenv("RLTPERF_TOKEN", TOKEN)  # how `rltperf attach` gets the token
        s = ProbeAdapter(first, reconnect=False).connect()
        recs = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(isinstance(r, StepRecord) for r in recs):
            recs.extend(s.read(0.5))
        s.close()
        hello = next(r for r in recs if isinstance(r, Hello))
        assert any(isinstance(r, StepRecord) for r in recs), "no steps: the rate-4096 workload did not run"
        contract = hello.engine.contract
        head = _git_head()
        if head is None:
            pytest.skip("the code under test is not a git checkout: nothing to compare the commit with")
        assert contract["commit"] == head, contract.get("commit_source")
        assert str(ROOT) in contract["commit_source"] and str(tmp_path) not in contract["commit_source"]
        assert "raised from the preset's" in contract["kv_capacity"]
        eng.p.send_signal(signal.SIGINT)
        eng.p.wait(30)
        assert "USDT" not in eng.stderr(), eng.stderr()[-2000:]
    finally:
        eng.stop()


@pytest.mark.slow
@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"]
)
def test_engine_stops_within_a_second_of_a_signal(tmp_path: Path, sig: signal.Signals) -> None:
    """Asked to stop, the engine says so and is gone at once (before: 2-7 s of torch's
    teardown after "stopped by signal" on a busy 2-core machine).  Held to the time its
    main thread neither ran nor waited for a core, and to the CPU it spent after saying
    so (``AFTER_SAID_CPU_S``): a wall-time bound failed in a full parallel run (the engine
    "lived 2.37 s" after the line, waiting for a core), which is the machine's load."""
    eng = EngineProcess(
        ["--listen", "127.0.0.1:0", "--status-every", "0.5", "--duration", "120"], cwd=tmp_path
    )
    try:
        eng.wait_line(lambda s: "steps/s" in s, 120)  # running, not starting
        pid = eng.p.pid
        run0, queued0 = run_s(pid), run_queue_s(pid)
        t0 = time.monotonic()
        eng.p.send_signal(sig)
        said = eng.wait_line(lambda s: "stopped by signal" in s, 10)
        t_said = next(t for t, line in eng.lines if line == said)
        cpu0 = cpu_s(pid)
        run1, queued1 = run_s(pid), run_queue_s(pid)
        run2, queued2, t_read = run1, queued1, time.monotonic()
        while True:
            with contextlib.suppress(OSError):
                run2, queued2 = run_s(pid), run_queue_s(pid)  # the last reading before it is reaped
                t_read = time.monotonic()  # it was alive then
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                break
            assert time.monotonic() - t_said < 60, f"the engine still runs 60 s after '{said}'"
            time.sleep(0.01)
        t_exit = time.monotonic()
        eng.p.returncode = os.waitstatus_to_exitcode(status)
        assert eng.p.returncode == 0
        # the step in flight and the probe's last records, then nothing to wait for
        to_said = (t_said - t0) - (run1 - run0) - (queued1 - queued0)  # blocked, as below
        assert to_said < 1.5, f"{t_said - t0:.2f} s from the signal to '{said}', {to_said:.2f} s blocked"
        # up to the last reading that found it alive, not to when this process saw it gone:
        # a loaded .ci/run read "1.28 s after the line, 1.26 s blocked" with 0.057 s of CPU,
        # this test's own process late to notice the exit
        blocked = (t_read - t_said) - (run2 - run1) - (queued2 - queued1)
        after = usage.ru_utime + usage.ru_stime - cpu0
        print(f"after '{said[:30]}': {t_exit - t_said:.3f} s, {after:.3f} s of CPU, {blocked:.3f} s blocked")
        assert blocked < 1.0, (
            f"the engine lived {t_exit - t_said:.2f} s after '{said}', {blocked:.2f} s blocked"
        )
        assert after < AFTER_SAID_CPU_S, f"{after:.2f} s of CPU after '{said}'"
    finally:
        eng.stop()


AFTER_SAID_CPU_S = 0.3
"""CPU seconds (all threads) the engine may spend after "stopped by signal": closing the
probe and leaving without torch's teardown (``cli._exit_now``).  Measured 0.05-0.07 s;
with the interpreter's teardown (``EXIT_WITHOUT_TEARDOWN`` off) 0.67 s."""
