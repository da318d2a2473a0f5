"""The plugin's announcement files without vLLM: real processes, real sockets, real files.

A "server" here is a Python subprocess listening on a TCP port (the API server's role)
with a child of its own (the engine core's role), as vLLM's processes are.  What vLLM
itself writes is checked in ``test_vllm_announce.py``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine_adapters.definitions import announcement as where
from engine_adapters.definitions.contract import is_unknown
from engine_adapters.monitor.vllm.announced import Announcement, find, merge
from engine_adapters.monitor.vllm.info import build_info
from engine_adapters.probe.vllm import announce

_SERVER = r"""
import os, socket, subprocess, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(s.getsockname()[1], child.pid, flush=True)
try:
    time.sleep(120)
finally:
    child.kill()
"""


@dataclass
class FakeServer:
    proc: subprocess.Popen[str]
    port: int
    engine_pid: int

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        try:
            os.kill(self.engine_pid, 9)
        except ProcessLookupError:
            pass


@pytest.fixture
def server() -> Iterator[FakeServer]:
    proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port, engine = (int(x) for x in proc.stdout.readline().split())
    s = FakeServer(proc, port, engine)
    yield s
    s.stop()


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "run"
    monkeypatch.setenv(where.ENV_RUNTIME_DIR, str(root))
    return root / "vllm"


def _doc(srv: FakeServer, profiler_dir: str = "/srv/prof") -> dict:
    """The announcement vLLM's engine core would write for ``srv`` (``describe``'s shape)."""
    return {
        "format": where.FORMAT,
        "api_pid": srv.proc.pid,
        "api_start": where.start_time(srv.proc.pid),
        "engine_pid": srv.engine_pid,
        "engine_start": where.start_time(srv.engine_pid),
        "listen": [list(a) for a in where.tcp_listeners(srv.proc.pid)],
        "hostname": socket.gethostname(),
        "profiler": {"profiler": "torch", "torch_profiler_dir": profiler_dir},
        "engine": {"name": "vllm", "dtype": "bfloat16", "device": "cpu", "quantization": "none",
                   "max_requests": 256, "max_loops": 4, "loop_config": "looped: 4 passes over the layers (config)",
                   "contract": {"tokenizer": "/m/tok", "devices": "CPU (x)"}},
    }  # fmt: skip


def test_listening_sockets_of_a_process_are_read_from_proc() -> None:
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("no /proc: the announcement's listening ports are Linux-only")
    with socket.socket() as lis, socket.socket() as cli, socket.socket() as bound:
        lis.bind(("127.0.0.1", 0))
        lis.listen()
        port = lis.getsockname()[1]
        cli.connect(("127.0.0.1", port))  # a connected socket is not a listener
        bound.bind(("127.0.0.1", 0))  # bound, not listening: the kernel does not list it yet
        got = where.tcp_listeners(os.getpid())
        assert ("127.0.0.1", port) in got and ("127.0.0.1", bound.getsockname()[1]) not in got
        assert all(p != cli.getsockname()[1] for _, p in got)
    assert ("127.0.0.1", port) not in where.tcp_listeners(os.getpid())


def test_alive_tells_a_dead_or_reused_pid() -> None:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(10)
    assert not where.alive(p.pid, None)
    me = where.start_time(os.getpid())
    assert where.alive(os.getpid(), me)
    if me is not None:  # the same pid with another start time is another process
        assert not where.alive(os.getpid(), me + 1)


def test_runtime_dirs_and_privacy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(where.ENV_RUNTIME_DIR, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    dirs = where.runtime_dirs()
    assert dirs == [str(tmp_path / "xdg" / "rltperf" / "vllm"), f"/tmp/rltperf-{os.getuid()}/vllm"]
    monkeypatch.setenv(where.ENV_RUNTIME_DIR, str(tmp_path / "own"))
    assert where.runtime_dirs() == [str(tmp_path / "own" / "vllm")]
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    os.chmod(open_dir, 0o755)
    assert not where.private_dir(str(open_dir))  # others can read it: not used
    link = tmp_path / "link"
    priv = tmp_path / "priv"
    priv.mkdir(mode=0o700)
    link.symlink_to(priv)
    assert where.private_dir(str(priv)) and not where.private_dir(str(link))


def test_enabled_unless_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed is enough (no RLTPERF_PROBE needed); RLTPERF_ANNOUNCE=0 turns it off."""
    monkeypatch.delenv("RLTPERF_PROBE", raising=False)
    monkeypatch.delenv(announce.ENV_ANNOUNCE, raising=False)
    assert announce.enabled()
    monkeypatch.setenv(announce.ENV_ANNOUNCE, "0")
    assert not announce.enabled() and not announce.maybe_enable()  # off: nothing imported or patched
    monkeypatch.setenv("RLTPERF_PROBE", "127.0.0.1:7788")
    assert not announce.enabled()
    monkeypatch.setenv(announce.ENV_ANNOUNCE, "1")
    assert announce.enabled()


def test_find_by_port_and_ignore_what_is_gone(server: FakeServer, runtime: Path) -> None:
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("no /proc")
    path = announce.announce(_doc(server))
    assert path is not None and Path(path).parent == runtime
    assert (
        oct(runtime.stat().st_mode & 0o777) == "0o700" and oct(Path(path).stat().st_mode & 0o777) == "0o600"
    )
    ann, why = find("127.0.0.1", server.port)
    assert ann is not None and ann.profiler_dir == "/srv/prof" and why == ""
    assert find("localhost", server.port)[0] is not None
    other, why = find("127.0.0.1", server.port + 1 if server.port < 65535 else 1)
    assert other is None and "no live rltperf announcement" in why
    far, why = find("192.0.2.1", server.port)  # TEST-NET-1: never an address of this host
    assert far is None and "not this host" in why
    # a newer file for the same port left by processes that are gone is not taken
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(10)
    stale = dict(
        _doc(server, "/stale/prof"), api_pid=dead.pid, engine_pid=dead.pid, api_start=None, engine_start=None
    )
    stale_path = runtime / f"{dead.pid}-{dead.pid}.json"
    stale_path.write_text(json.dumps(stale))
    os.utime(stale_path, (time.time() + 60, time.time() + 60))
    ann, _ = find("127.0.0.1", server.port)
    assert ann is not None and ann.profiler_dir == "/srv/prof"
    assert not stale_path.exists()  # read as stale, so removed (nobody would read it again)
    # the server stops: its announcement no longer counts, and the read removes it too
    server.stop()
    ann, why = find("127.0.0.1", server.port)
    assert ann is None and "left by a server that is gone, removed" in why
    assert not list(runtime.glob("*.json")) and announce.prune(str(runtime)) == 0


def test_a_directory_others_can_write_is_not_read(server: FakeServer, runtime: Path) -> None:
    path = announce.announce(_doc(server))
    assert path is not None and find("127.0.0.1", server.port)[0] is not None
    os.chmod(runtime, 0o777)
    try:
        ann, why = find("127.0.0.1", server.port)
        assert ann is None and "no rltperf runtime directory" in why
        assert announce.announce(_doc(server)) is None  # nor written to
    finally:
        os.chmod(runtime, 0o700)


def test_merge_fills_what_http_cannot_tell(server: FakeServer, runtime: Path) -> None:
    # a model whose config.json this host cannot read: no loop count over HTTP
    http = build_info("http://127.0.0.1:1", "0.32.0", [{"id": "tiny", "root": "/m"}], None, None, None, True)
    assert http.max_loops is None and is_unknown(http.contract["loop_config"])
    assert http.dtype is None and http.device is None and is_unknown(http.contract["dtype"])
    announce.announce(_doc(server))
    ann, _ = find("127.0.0.1", server.port)
    assert ann is not None
    info = merge(http, ann)
    assert (info.dtype, info.device, info.quantization, info.max_requests) == ("bfloat16", "cpu", "none", 256)
    assert info.pid == server.engine_pid and info.model == "tiny"  # the served name stays
    assert info.contract["dtype"] == "bfloat16" and info.contract["tokenizer"] == "/m/tok"
    assert info.contract["devices"] == "CPU (x)"
    assert info.contract["framework"] == "vLLM 0.32.0"  # known over HTTP: kept
    assert info.contract["profiler_config"]["torch_profiler_dir"] == "/srv/prof"
    assert info.max_loops == 4 and info.contract["loop_config"].startswith("looped: 4 passes")


def test_merge_names_the_probes_the_engines_announced(server: FakeServer, runtime: Path) -> None:
    """``probes``: the exact targets of the plugin's probes (``RLTPERF_PROBE``), one per
    engine the target covers; none when the plugin runs without a probe."""
    http = build_info("http://127.0.0.1:1", "0.32.0", [{"id": "tiny", "root": "/m"}], None, None, None, True)
    announce.announce(_doc(server))
    ann, _ = find("127.0.0.1", server.port)
    assert ann is not None and ann.probe is None
    assert merge(http, ann).probes is None
    dp0 = Announcement(ann.path, dict(ann.data, probe="127.0.0.1:7788"))
    dp1 = Announcement(ann.path, dict(ann.data, probe="127.0.0.1:7789", dp_rank=1))
    assert merge(http, dp0).probes == ["tcp://127.0.0.1:7788"]
    summed = merge(http, dp0, identity=False, others=[dp1])
    assert summed.probes == ["tcp://127.0.0.1:7788", "tcp://127.0.0.1:7789"]


def test_written_before_the_port_listens_is_still_found(server: FakeServer, runtime: Path) -> None:
    """vLLM's engine announces before its API server listens: the reader looks itself."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("no /proc")
    path = announce.announce(dict(_doc(server), listen=[]))
    assert path is not None
    ann, why = find("127.0.0.1", server.port)
    assert ann is not None and ann.api_pid == server.proc.pid, why
    assert find("127.0.0.1", 1)[0] is None  # and only for the port it listens on


def test_the_port_is_added_once_the_api_server_listens(server: FakeServer, runtime: Path) -> None:
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("no /proc")
    doc = dict(_doc(server), listen=[])
    path = announce.announce(doc)
    assert path is not None
    announce._add_listen(path, doc, threading.Event())  # returns once it has seen the port
    assert ["127.0.0.1", server.port] in json.loads(Path(path).read_text())["listen"]
    stopped = threading.Event()
    stopped.set()
    announce.withdraw(path)
    announce._add_listen(path, doc, stopped)  # a stopped server's file is not written again
    assert not Path(path).exists()
