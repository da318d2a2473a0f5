"""The shared-server plugin itself (``vllm_servers.py``), run in a child pytest.

Grouping, one start per kind and the stop after the last user are checked with two
FAKE kinds (a few lines of ``http.server`` answering ``/metrics`` as an idle vLLM
does): a real start costs a minute, and what is under test is the plugin's
bookkeeping, not vLLM.  The CI switch is checked on a test marked ``vllm`` that skips.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def _pytest(d: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT)]))
    e.pop("RLTPERF_REQUIRE_VLLM", None)
    e.pop("RLTPERF_TEST_VLLM_CACHE", None)  # (this run's: the child makes a folder of its own)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "vllm_servers", "-p", "no:cacheprovider", "-q",
                           "-rA", *args], cwd=d, env=e, capture_output=True, text=True, timeout=180)  # fmt: skip


def test_a_vllm_test_that_skips_fails_under_the_ci_switch(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text(
        "import pytest\n"
        "@pytest.mark.vllm\n"
        "def test_needs_vllm():\n"
        "    pytest.skip('vllm is not installed')\n"
        "def test_other():\n"
        "    pytest.skip('not a vLLM test')\n"
    )
    (tmp_path / "test_whole.py").write_text(
        "import pytest\npytest.skip('whole module', allow_module_level=True)\n"
    )
    plain = _pytest(tmp_path)
    assert plain.returncode == 0 and "3 skipped" in plain.stdout, plain.stdout
    strict = _pytest(tmp_path, "test_x.py", env={"RLTPERF_REQUIRE_VLLM": "1"})
    assert strict.returncode == 1 and "1 failed, 1 skipped" in strict.stdout, strict.stdout
    assert "RLTPERF_REQUIRE_VLLM=1 and this vLLM test skipped: vllm is not installed" in strict.stdout
    assert "SKIPPED [1] test_x.py" in strict.stdout  # a test not marked vllm may still skip
    # a module skipped whole at collection is a collection error (CI has everything installed)
    whole = _pytest(tmp_path, "test_whole.py", env={"RLTPERF_REQUIRE_VLLM": "1"})
    assert whole.returncode == 2, whole.stdout
    assert "RLTPERF_REQUIRE_VLLM=1 and test_whole.py skipped whole: whole module" in whole.stdout


_CONFTEST = '''
import json, os, socket, subprocess, sys, time
from pathlib import Path
from vllm_fixtures import Server, free_ports
from vllm_servers import server_kind

FAKE = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'vllm:num_requests_running{engine="0"} 0.0\\\\nvllm:num_requests_waiting{engine="0"} 0.0\\\\n'
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""

def fake(root):
    port = free_ports()
    proc = subprocess.Popen([sys.executable, "-c", FAKE, str(port)], start_new_session=True)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    return Server(proc, port, "", root, root / "log", root)

fake_a = server_kind("fake_a", fake, "a FAKE kind")
fake_b = server_kind("fake_b", fake, "another FAKE kind")

def pytest_runtest_call(item):
    with open(os.environ["TRACE"], "a") as f:
        f.write(json.dumps([item.name, os.environ.get("PYTEST_XDIST_WORKER"),
                            os.environ.get("RLTPERF_RUNTIME_DIR"),
                            os.environ.get("RLTPERF_TEST_VLLM_CACHE")]) + "\\n")
'''

_TESTS = {
    "test_1.py": "def test_b1(fake_b):\n    track('b1', b=fake_b)\n",
    "test_2.py": "def test_plain():\n    track('plain')\n",
    "test_3.py": "def test_ab(fake_a, fake_b):\n    track('ab', a=fake_a, b=fake_b)\n",
    "test_4.py": "def test_a1(fake_a):\n    track('a1', a=fake_a)\ndef test_a2(fake_a):\n    track('a2', a=fake_a)\n",
}
_TRACK = """
import json, os, time
def running(pid):  # not yet signalled to death: (the pool reaps its servers in the background)
    time.sleep(0.5)
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
def track(name, **servers):
    path = os.environ["TRACE"] + ".servers"
    seen = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
    alive = sorted({p for _, pids, _ in seen for p in pids.values() if running(p)})
    with open(path, "a") as f:
        f.write(json.dumps([name, {k: s.proc.pid for k, s in servers.items()}, alive]) + "\\n")
"""


def _write_suite(d: Path) -> Path:
    """The child suite (two FAKE kinds, the tests of ``_TESTS``) in ``d``; its trace file."""
    (d / "conftest.py").write_text(_CONFTEST)
    for name, body in _TESTS.items():
        (d / name).write_text(_TRACK + body)
    return d / "trace.jsonl"


def _server_pids(trace: Path) -> tuple[list[Any], dict[str, set[int]]]:
    """The rows ``track`` wrote, and the pids each FAKE kind had in them."""
    seen = [json.loads(line) for line in Path(f"{trace}.servers").read_text().splitlines()]
    return seen, {k: {s[1][k] for s in seen if k in s[1]} for k in ("a", "b")}


def test_kinds_run_grouped_once_each_and_stop_after_their_last_user(tmp_path: Path) -> None:
    trace = _write_suite(tmp_path)
    p = _pytest(tmp_path, env={"TRACE": str(trace)})
    assert p.returncode == 0, p.stdout + p.stderr
    order = [json.loads(line)[0] for line in trace.read_text().splitlines()]
    # plain tests first, then by kind in registration order: a alone, a and b, b alone
    assert order == ["test_plain", "test_a1", "test_a2", "test_ab", "test_b1"], order
    seen, pids = _server_pids(trace)
    assert all(len(v) == 1 for v in pids.values()), pids  # one start per kind
    assert "shared vLLM servers started: fake_a x1, fake_b x1" in p.stdout
    last = seen[-1]  # test_b1: fake_a's last user (test_ab) is done, so fake_a is stopped
    assert last[0] == "b1" and last[2] == sorted(pids["b"]), last
    for pid in (*pids["a"], *pids["b"]):  # stopped, process group and all
        assert not Path(f"/proc/{pid}").exists()
    caches = {json.loads(line)[3] for line in trace.read_text().splitlines()}
    assert len(caches) == 1 and None not in caches, caches  # the session's server cache folder
    assert not Path(caches.pop()).exists()  # removed at the end


def test_in_a_parallel_run_one_worker_runs_every_kind_user_in_order(tmp_path: Path) -> None:
    """``-n 3 --dist loadgroup`` (the README's parallel mode): the tests using a kind all
    run on one worker, in the serial order, so each kind starts once; each worker
    announces into its own runtime directory; the controller sums the workers' starts."""
    trace = _write_suite(tmp_path)
    for i in range(6):  # enough plain modules that every worker gets some
        (tmp_path / f"test_plain_{i}.py").write_text(_TRACK + f"def test_p{i}():\n    track('p{i}')\n")
    # a vllm module using no kind starts a server of its own (the TP 2 and DP 2 modules):
    # it runs on the kind users' worker too, before them, never beside their servers
    (tmp_path / "test_own.py").write_text(
        "import pytest\npytestmark = pytest.mark.vllm\ndef test_own_1():\n    pass\ndef test_own_2():\n    pass\n"
    )
    # one that names a group of its own keeps it (the TP 2 and DP 2 modules' worker)
    (tmp_path / "test_grouped.py").write_text(
        _TRACK + "import pytest\npytestmark = [pytest.mark.vllm, pytest.mark.xdist_group('multi')]\n"
        "def test_g1():\n    track('g1')\n"
    )
    p = _pytest(tmp_path, "-n", "3", "--dist", "loadgroup", env={"TRACE": str(trace)})
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    group = ["test_own_1", "test_own_2", "test_a1", "test_a2", "test_ab", "test_b1"]
    kind_rows = [r for r in rows if r[0] in group]
    assert [r[0] for r in kind_rows] == group, rows
    assert len({r[1] for r in kind_rows}) == 1 and kind_rows[0][1], rows  # one worker
    assert "PASSED test_grouped.py::test_g1@multi" in p.stdout, p.stdout
    assert "test_own.py::test_own_1@vllm-servers" in p.stdout, p.stdout
    dirs: dict[str, set[str]] = {}
    for _, worker, runtime, _cache in rows:
        dirs.setdefault(worker, set()).add(runtime)
    assert len(dirs) == 3 and all(len(d) == 1 for d in dirs.values()), dirs
    assert len(set().union(*dirs.values())) == 3, dirs  # a directory of its own per worker
    # but one server cache folder for the whole run (vllm_fixtures.cache_env): made by the
    # controller, shared by every worker, removed once they all ended
    caches = {r[3] for r in rows}
    assert len(caches) == 1 and None not in caches, caches
    assert not Path(caches.pop()).exists()
    _, pids = _server_pids(trace)
    assert all(len(v) == 1 for v in pids.values()), pids  # one start per kind
    assert "shared vLLM servers started: fake_a x1, fake_b x1" in p.stdout, p.stdout


def test_a_stopped_servers_shared_memory_files_go_and_a_live_ones_stay(tmp_path: Path) -> None:
    """``remove_left_shm`` (run by ``Server.stop``): of the ``vllm_`` files made since the
    start, those no live process maps go; a mapped one (a server still running) and one
    older than the start stay.  The folder stands in for ``/dev/shm``."""
    import mmap
    import time

    from vllm_fixtures import remove_left_shm

    old = tmp_path / "vllm_dist_old-tp:0-[0-1]-cpushm_0"
    old.write_bytes(b"\0" * 4096)
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    since = time.time() - 1
    left = tmp_path / "vllm_dist_a-tp:0-[0-1]-cpushm_0"
    live = tmp_path / "vllm_dist_b-tp:0-[0-1]-cpushm_0"
    other = tmp_path / "not_vllm"
    for f in (left, live, other):
        f.write_bytes(b"\0" * 4096)
    with open(live, "r+b") as fh, mmap.mmap(fh.fileno(), 4096):
        gone = remove_left_shm(since, tmp_path)
    assert gone == [left.name]
    assert sorted(f.name for f in tmp_path.iterdir()) == sorted([old.name, live.name, other.name])
