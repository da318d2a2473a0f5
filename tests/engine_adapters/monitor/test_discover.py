"""``--auto`` discovery against real things: a reference loop engine's probe (with and
without a token), a plain HTTP server that is not vLLM, a port that accepts and says
nothing, closed ports.  The vLLM server half is in tests/engine_adapters/vllm/test_vllm_headless.py."""

from __future__ import annotations

import http.server
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from engine_adapters.monitor import discover
from engine_adapters.monitor.discover import (
    MAX_PORTS,
    PortRange,
    RangeError,
    identify,
    parse_range,
    scan,
)
from tests.conftest import LOOP_ENGINE, bindable, free_ports, start_engine

LONG_S = 20.0
"""A connect timeout no refused port may cost."""
SILENT = (40, 41, 42, 43, 44, 45)
"""Offsets of the ports that accept and never answer."""
TRY_S = 1.0
"""Each identification try's timeout in the scan with silent ports."""
BUSY_TRY_S = 3.0
"""The identification timeout against a stopped engine: the time a just-resumed engine
has to answer the hello, on a loaded machine."""


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def plain_http() -> Iterator[int]:
    """An HTTP server that is not vLLM (directory listing; /metrics is a 404)."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


def test_ranges_parse_and_bad_ones_say_why() -> None:
    assert parse_range("8000-8010") == PortRange("127.0.0.1", 8000, 8010)
    assert parse_range("localhost:9000") == PortRange("localhost", 9000, 9000)
    assert parse_range("[::1]:7000-7001") == PortRange("::1", 7000, 7001)
    assert str(parse_range("[::1]:7000-7001")) == "[::1]:7000-7001"
    with pytest.raises(RangeError, match=r"first port is above the last .*8000-8010"):
        parse_range("8010-8000")
    with pytest.raises(RangeError, match=f"at most {MAX_PORTS}"):
        parse_range("1000-3000")
    parse_range(f"1000-{1000 + MAX_PORTS - 1}")  # exactly the maximum is fine
    with pytest.raises(RangeError, match="outside 1-65535"):
        parse_range("0-10")
    with pytest.raises(RangeError, match="outside 1-65535"):
        parse_range("65530-70000")
    with pytest.raises(RangeError, match=r"cannot resolve host 'no-such-host\.invalid'"):
        parse_range("no-such-host.invalid:80-81")
    for bad in ("", "8000-", "abc", "8000-80x0", "h:8000:8001"):
        with pytest.raises(RangeError, match="expected \\[HOST:\\]PORT-PORT"):
            parse_range(bad)


def test_closed_ports_cost_no_timeout() -> None:
    """A range with nothing listening is answered by the refusals, not by waiting out
    the connect timeout per port (or at all).  The timeout is set long here so that the
    claim is a ratio to it, whatever the machine's load: a scan that waited would take
    at least the whole timeout."""
    base = free_ports(100)
    t0 = time.monotonic()
    res = scan(PortRange("127.0.0.1", base, base + 99), connect_timeout=LONG_S)
    took = time.monotonic() - t0
    assert res.found == [] and res.closed == 100
    assert took < LONG_S / 4, took
    assert f"127.0.0.1:{base}-{base + 99} (100 ports" in res.describe_empty()


def test_finds_the_probe_and_not_the_plain_http_server(plain_http: int) -> None:
    base = free_ports(100)
    eng = start_engine([str(LOOP_ENGINE), "--listen", f"127.0.0.1:{base + 7}", "--duration", "60", "--no-warm",
                        "--rate", "200", "--prometheus-port", str(base + 8)])  # fmt: skip
    prom_line = eng.proc.stdout.readline() if eng.proc.stdout else ""
    assert prom_line.startswith("PROMETHEUS "), prom_line  # it listens
    t0 = time.monotonic()
    scan(PortRange("127.0.0.1", base, base + 99), timeout=TRY_S)  # the same scan without silent ports
    took_without = time.monotonic() - t0
    silent = []  # ports that accept (the kernel does) and never answer
    for p in SILENT:
        sock = socket.socket()
        sock.bind(("127.0.0.1", base + p))
        sock.listen(4)
        silent.append(sock)
    try:
        t0 = time.monotonic()
        res = scan(PortRange("127.0.0.1", base, base + 99), timeout=TRY_S)
        took = time.monotonic() - t0
        extra = scan(PortRange("127.0.0.1", plain_http, plain_http))
    finally:
        for sock in silent:
            sock.close()
        eng.stop()
    assert [(f.port, f.kind, f.target) for f in res.targets] == [
        (base + 7, "probe", f"tcp://127.0.0.1:{base + 7}")
    ]
    assert "test-loop" in res.targets[0].what and "RANDOM WEIGHTS" in res.targets[0].what
    others = {f.port: f for f in res.others}
    assert set(others) == {base + 8} | {base + p for p in SILENT}, res.found
    assert others[base + 8].what.startswith("rltperf Prometheus exporter")
    assert all(f"said nothing within {TRY_S:g} s" in others[base + p].what for p in SILENT)
    assert res.closed == 100 - 2 - len(SILENT)
    # identification runs in parallel: the silent ports' two tries (HTTP, then the hello)
    # are waited once, not once per port.  What they add to the same scan without them is
    # held to a ratio of the tries' own timeout (one after the other would add len(SILENT)
    # times 2 tries); the rest of the scan's time is the machine's load (a -n auto run: 6.3 s)
    serial = len(SILENT) * 2 * TRY_S
    print(f"scan with {len(SILENT)} silent ports: {took:.2f} s, without: {took_without:.2f} s "
          f"(one after the other: >= {serial:g} s more)")  # fmt: skip
    assert took - took_without < serial / 2, (took, took_without)
    # a plain HTTP server is not a target, and says what it is
    assert extra.targets == []
    assert extra.others[0].kind == "other" and "HTTP server, not vLLM (HTTP 404" in extra.others[0].what


def test_a_probe_that_wants_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    eng = start_engine(
        [str(LOOP_ENGINE), "--duration", "60", "--no-warm", "--rate", "200", "--token", "s3cret"]
    )
    try:
        host, port = eng.address.rsplit(":", 1)
        monkeypatch.delenv("RLTPERF_TOKEN", raising=False)
        refused = identify(host, int(port))
        monkeypatch.setenv("RLTPERF_TOKEN", "s3cret")
        res = scan(PortRange(host, int(port), int(port)))
    finally:
        eng.stop()
    assert refused.kind == "probe-refused" and refused.target is None
    assert "token" in refused.what
    assert [f.target for f in res.targets] == [f"tcp://{eng.address}"]


def _wait_stopped(pid: int, timeout: float = 10.0) -> None:
    """Return once every thread of ``pid`` is stopped: SIGSTOP takes effect as each thread
    next runs, so on a loaded machine the probe's thread can still answer a connection for
    a moment after ``kill`` returned (seen: a GET closed 1 ms after it, state still R)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        if all(s in ("T", "t") for s in states):
            return
        time.sleep(0.005)
    raise AssertionError(f"{pid} not stopped {timeout:g} s after SIGSTOP: {states}")


def test_a_probe_busy_past_the_timeout_is_still_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine that holds its probe's threads longer than the timeout (start-up, a
    stall: here SIGSTOP) leaves the HTTP try unanswered; the hello is tried next.

    The stall starts once every thread has stopped and lasts exactly until the HTTP try
    has given up: the engine is resumed as the hello starts, not after a fixed time (a
    1.3 s timer raced the 1.0 s try on a loaded CI machine: the engine answered the try,
    and the hello then timed out)."""
    eng = start_engine([str(LOOP_ENGINE), "--duration", "60", "--no-warm", "--rate", "200"])
    host, port = eng.address.rsplit(":", 1)
    real_hello = discover.probe_hello
    resumed: list[float] = []

    def resume_then_hello(*args: object, **kw: object) -> object:
        resumed.append(time.monotonic())
        os.kill(eng.proc.pid, signal.SIGCONT)
        return real_hello(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(discover, "probe_hello", resume_then_hello)
    try:
        os.kill(eng.proc.pid, signal.SIGSTOP)
        _wait_stopped(eng.proc.pid)
        t0 = time.monotonic()
        found = identify(host, int(port), timeout=BUSY_TRY_S)
    finally:
        os.kill(eng.proc.pid, signal.SIGCONT)
        eng.stop()
    # the HTTP try waited out its whole timeout on the stopped engine before the hello
    assert resumed and resumed[0] - t0 >= BUSY_TRY_S * 0.95, (resumed, t0)
    assert found.kind == "probe" and found.target == f"tcp://{eng.address}", found


def test_a_bare_auto_scans_the_usual_ports() -> None:
    """``--auto`` with no range scans ``DEFAULT_RANGES``: a probe on a port of the probes'
    usual range (7788 and the ports after it) is found and listed by ``rltperf attach
    --auto --list``, and ``rltperf record --auto`` takes the same default."""
    import argparse
    import subprocess
    import sys

    from rltperf_tui.commands import record
    from rltperf_tui.commands.auto_targets import DEFAULT_RANGES, expand
    from tests.conftest import ROOT

    assert expand([""]) == list(DEFAULT_RANGES) and expand(["9000-9001", ""]) == [
        "9000-9001",
        *DEFAULT_RANGES,
    ]
    parser = argparse.ArgumentParser()
    record.add_arguments(parser)
    assert parser.parse_args(["--auto"]).auto == "" and parser.parse_args([]).auto is None
    port = next(p for p in range(7788, 7800) if bindable(p))
    eng = start_engine([str(LOOP_ENGINE), "--listen", f"127.0.0.1:{port}", "--duration", "60", "--no-warm",
                        "--rate", "200"])  # fmt: skip
    try:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        out = subprocess.run([sys.executable, "-m", "rltperf_tui.cli", "attach", "--auto", "--list"],
                             capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    finally:
        eng.stop()
    assert out.returncode == 0, out.stderr
    assert f"tcp://127.0.0.1:{port}" in out.stdout.split(), out.stdout
