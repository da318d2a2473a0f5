"""Shared real vLLM servers for the whole test session: one per kind, started once.

A pytest plugin (``tests/conftest.py`` loads it).  A vLLM start costs 50-100 s and
≈ 3 GB on a 2-core machine, so every test that needs a kind of server shares one.

Kinds (fixture name: what it serves; both as ``vllm_fixtures.serve`` starts them: the
rltperf plugin's probe at ``Server.probe``, ``--enable-mfu-metrics``,
``--enable-logging-iteration-details``, ``--seed 0``, float32, served as ``tiny``):

- ``vllm_server``: the tiny random Llama (``tiny_model``), a plain (not looped) model,
  started the way people start vLLM: no ``--profiler-config`` (rltperf captures in its
  workers), with a fault directory ``<root>/faults`` (``vllm_fixtures.start_shared_llama``);
- ``ouro_server``: the tiny random Ouro (``tiny_ouro``: ``total_ut_steps`` 4,
  ``--hf-overrides '{"early_exit_threshold": 0.6}'``, weights written so exits vary,
  ``--max-logprobs`` of the whole vocabulary), in a one-GPU server's process layout
  (``ONE_GPU_LAYOUT``: its worker inside the engine core, which runs on the second core),
  with ``--profiler-config`` into ``Server.profiler_dir`` without stacks: the tests of
  vLLM's own profiler path use it;
- ``vllm_server_to_stop``: the ``vllm_server`` handed to a test that stops it (the
  announcement goes with the server).  Such tests run after every other user of it.

Use one by asking for the fixture (module scope, so module fixtures may use it too).

Order and lifetime.  Tests that use a kind run after all the others, grouped by kind
in the order of ``KINDS``; a test using two kinds runs between their groups (at most
two servers are up at once).  A server is stopped right after the last test that
needs it (in the background: SIGTERM at once, the wait in a thread), and restarted if
a later test asks for it again.  A run ended by SIGTERM stops them as Ctrl-C does; a
killed run takes them with it (``PR_SET_PDEATHSIG``).

Isolation.  Before each test that uses a kind, the server must be up and quiet (no
request running or waiting, per its own ``/metrics``): a test that left load behind
fails the next one's setup with a message saying so.  So a test on a shared server:

- ends its load before it returns (``Load.run`` with an ``until`` event, then join);
- closes its sessions and stops any profiling session it started;
- writes its captures under ``tmp_path`` (``snapshot_root=``, or ``cwd=`` for the CLI);
- counts what it sent, not the server's totals (counters are since the server start;
  the ``vllm+http://`` adapter's figures are since attach);
- never stops the server (ask for ``vllm_server_to_stop`` instead).

Announcements go to a private runtime directory of the session
(``RLTPERF_RUNTIME_DIR``, set for the test process and the servers alike), so no other
server on the machine and no earlier run is seen.  The servers share one folder of
caches for the session (``RLTPERF_TEST_VLLM_CACHE``, removed at its end;
``vllm_fixtures.cache_env``): a start after the first reuses vLLM's model inspection
(a second Ouro start answered ``/health`` 13 s sooner, by hand, when the servers still
compiled: ``vllm_fixtures.SERVER_ENV`` turns torch's compiles off).

Parallel runs (``pytest -n N --dist loadgroup``; the README's command runs ``-n 3``).
Every test that uses a kind, and every other test marked ``vllm`` (those start a server
of their own: the TP 2 and DP 2 modules, the plugin checks), is also marked
``xdist_group("vllm-servers")``, so pytest-xdist sends all of them, in the order above,
to one worker: that worker's pool is the only one, no server starts twice, at most two
are up at once, while the other workers run the rest of the suite, a module at a time
(each other test's group is its module, so a module-scoped engine starts once).  A
``vllm`` test using no kind that names a group of its own keeps it: the TP 2 and DP 2
modules (``multirank_servers.XDIST_GROUP``) run on one other worker, one after the
other, beside the shared servers (the group's setups alone were ~350 s of one worker).  Each worker has its own
announcement directory, so a test elsewhere never sees the servers of this group.  The
servers' start counts of every worker are summed in the final summary.

Adding a kind (a TP 2 or DP 2 server, another model) from any test module::

    from vllm_servers import server_kind
    tp2_server = server_kind("tp2_server", lambda root: serve(root, model, ["--tensor-parallel-size", "2"],
                             {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}), "what it serves")

(the start function takes a fresh scratch folder and returns a started ``Server``;
its tests are grouped after the kinds above).

Every test that uses a kind is marked ``vllm``.  A ``vllm``-marked test skips, with
the reason, where vLLM or rltperf's plugin entry point is not installed; under
``RLTPERF_REQUIRE_VLLM=1`` (``.ci/run`` sets it) such a skip is a failure instead.
Developers may point ``vllm_server`` at a server they keep running with
``RLTPERF_TEST_VLLM_SERVER=DIR/server.json`` (``python vllm_fixtures.py DIR``).
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import tiny_ouro
from vllm_fixtures import CACHE_ENV, Server, plugin_missing_reason, start_shared_llama, vllm_missing_reason

XDIST_GROUP = "vllm-servers"
"""The pytest-xdist group of every test that uses a kind: one worker runs them all."""
REQUIRE_ENV = "RLTPERF_REQUIRE_VLLM"
"""``1``: a ``vllm``-marked test that skips fails (CI installs vLLM: a skip there hides a gap)."""
QUIET_TIMEOUT_S = 60.0
OURO_THRESHOLD = 0.6

Start = Callable[[Path], Server]
KINDS: dict[str, Start] = {}
"""Fixture name -> start function, in group order."""
STOPPERS = {"vllm_server_to_stop": "vllm_server"}
"""Fixtures that hand a kind's server to a test that stops it."""


def server_kind(name: str, start: Start, doc: str) -> Any:
    """Register a kind of shared server and return its (module-scoped) fixture, named ``name``."""
    KINDS[name] = start

    def fixture(request: pytest.FixtureRequest) -> Server:
        return _pool(request.config).get(name)

    fixture.__doc__ = doc
    return pytest.fixture(scope="module", name=name)(fixture)


def _start_llama(root: Path) -> Server:
    reuse = os.environ.get("RLTPERF_TEST_VLLM_SERVER")
    if reuse:  # developers: a server left running by `python vllm_fixtures.py DIR` (not stopped here)
        return Server.from_file(Path(reuse))
    return start_shared_llama(root)


ONE_GPU_LAYOUT = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
"""The process layout of a one-GPU vLLM server: the API server and an engine core with
its worker inside it (vLLM's ``UniProcExecutor``).  vLLM on CPUs gives even one rank a
worker process of its own (``MultiprocExecutor``) unless V1 multiprocessing is off;
off, the API server still runs its engine core in a process of its own (``AsyncLLM``
always does), so this is exactly the GPU layout, which the tests would otherwise never
run.  One process fewer to start: the tiny Llama's start (``vllm_fixtures.py DIR``) took
33.6 and 32.7 CPU s to ``/health`` in this layout, 41.8 and 38.0 with its worker process
(the whole tree's CPU, run alternately, 2026-12-08)."""


def _start_ouro(root: Path) -> Server:
    # its engine core (the worker inside it: ONE_GPU_LAYOUT) on the second core: vLLM binds
    # a CPU worker to the first by default, and the replica test loads this server and
    # the Llama one at the same time
    cpus = sorted(os.sched_getaffinity(0))
    env = dict(ONE_GPU_LAYOUT)
    if len(cpus) > 1:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(cpus[1])
    return tiny_ouro.start_ouro_server(root, {"early_exit_threshold": OURO_THRESHOLD}, env)


ouro_server = server_kind("ouro_server", _start_ouro, "The shared tiny random Ouro server (q=0.6).")
vllm_server = server_kind("vllm_server", _start_llama, "The shared tiny random Llama server.")


@pytest.fixture
def vllm_server_to_stop(request: pytest.FixtureRequest) -> Server:
    """The shared tiny Llama server, for a test that stops it (it runs after every other
    test using ``vllm_server``; a later one would get a fresh server)."""
    pool = _pool(request.config)
    server = pool.get("vllm_server")
    pool.handed_over("vllm_server")
    return server


# --------------------------------------------------------------------------- the pool


@dataclass
class Pool:
    """The running servers of the session, by kind, and which test uses each last."""

    factory: pytest.TempPathFactory
    running: dict[str, Server] = field(default_factory=dict)
    last_user: dict[str, str] = field(default_factory=dict)
    started: dict[str, int] = field(default_factory=dict)
    stopping: list[threading.Thread] = field(default_factory=list)

    def get(self, kind: str) -> Server:
        """The running server of ``kind``, started now if it is not (skips without vLLM)."""
        why = vllm_missing_reason() or plugin_missing_reason()
        if why:
            pytest.skip(why)
        srv = self.running.get(kind)
        if srv is not None and srv.proc is not None and srv.proc.poll() is not None:
            del self.running[kind]
            raise RuntimeError(f"the shared {kind} exited ({srv.proc.returncode}):\n{srv.log_text()[-3000:]}")
        if srv is None:
            srv = KINDS[kind](self.factory.mktemp(kind))
            self.running[kind] = srv
            self.started[kind] = self.started.get(kind, 0) + 1
        return srv

    def handed_over(self, kind: str) -> None:
        """A test takes ``kind``'s server to stop it: forget it (the test stops it)."""
        self.running.pop(kind, None)

    def stop(self, kind: str) -> None:
        """Stop ``kind``'s server in the background (SIGTERM, SIGKILL after 30 s): the next
        tests need not wait the seconds a vLLM takes to shut down; ``stop_all`` joins."""
        srv = self.running.pop(kind, None)
        if srv is not None:
            srv.terminate()  # now; the waiting (and a SIGKILL if need be) in the background
            t = threading.Thread(target=srv.stop, name=f"stop-{kind}", daemon=True)
            t.start()
            self.stopping.append(t)

    def stop_all(self) -> None:
        """Stop every running server and wait for all of them (at most a minute each)."""
        for kind in list(self.running):
            self.stop(kind)
        for t in self.stopping:
            t.join(60)
        self.stopping.clear()

    def wait_quiet(self, kind: str) -> None:
        """Return once ``kind``'s server answers and runs no request; fail after a minute."""
        srv = self.running.get(kind)
        if srv is None:
            return
        deadline = time.monotonic() + QUIET_TIMEOUT_S
        seen = "no answer"
        while time.monotonic() < deadline:
            if srv.proc is not None and srv.proc.poll() is not None:
                return  # ``get`` reports it with the log
            try:
                with urllib.request.urlopen(srv.url + "/metrics", timeout=5) as r:
                    text = r.read().decode(errors="replace")
                busy: dict[str, float] = {}
                for name, value in _RUNNING.findall(text):  # summed over engines (DP ranks)
                    busy[name] = busy.get(name, 0.0) + float(value)
                seen = f"running {busy.get('running', '?')}, waiting {busy.get('waiting', '?')}"
                if len(busy) == 2 and not any(busy.values()):
                    return
            except (urllib.error.URLError, OSError) as exc:
                seen = f"{type(exc).__name__}: {exc}"
            time.sleep(0.2)
        raise AssertionError(
            f"the shared {kind} is not quiet {QUIET_TIMEOUT_S:g} s after the previous test ({seen}): "
            "a test left load running on it"
        )


_RUNNING = re.compile(r"^vllm:num_requests_(running|waiting)\{[^}]*\} (\S+)$", re.M)
_POOL = pytest.StashKey[Pool]()


def _pool(config: pytest.Config) -> Pool:
    if _POOL not in config.stash:
        config.stash[_POOL] = Pool(config._tmp_path_factory)  # type: ignore[attr-defined]
    return config.stash[_POOL]


def _kinds_of(item: pytest.Item) -> list[str]:
    names = getattr(item, "fixturenames", ())
    kinds = {k for k in KINDS if k in names} | {STOPPERS[s] for s in STOPPERS if s in names}
    return sorted(kinds, key=list(KINDS).index)


# --------------------------------------------------------------------------- hooks


_RUNTIME_DIR: list[str] = []
_RUNTIME_DIR_OURS = "RLTPERF_TEST_RUNTIME_DIR"
"""Set beside ``RLTPERF_RUNTIME_DIR`` when this plugin made it (an xdist worker makes its own)."""
_CACHE_DIR: list[str] = []
"""The session's shared server cache folder (``vllm_fixtures.CACHE_ENV``), where this process made it."""
_STARTS = "rltperf_vllm_server_starts"
"""The key of a worker's server start counts in the ``workeroutput`` it sends the controller."""


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker; a private announcement directory; stop servers on any exit."""
    config.addinivalue_line("markers", "vllm: needs vllm-cpu installed and starts a real vLLM server")
    config.addinivalue_line(
        "markers", "xdist_group(name): pytest-xdist runs the tests of a group on one worker"
    )
    if not config.pluginmanager.has_plugin("rltperf-vllm-marks"):
        config.pluginmanager.register(_Marks(), "rltperf-vllm-marks")
    if not os.environ.get("RLTPERF_RUNTIME_DIR") or (_RUNTIME_DIR_OURS in os.environ and _is_worker(config)):
        # announcements of this session's servers only (set before any server starts;
        # the servers inherit it), in a fresh private directory (mode 0700); an xdist
        # worker replaces the one it inherited from the controller with its own
        _RUNTIME_DIR.append(tempfile.mkdtemp(prefix="rltperf-test-runtime-"))
        os.environ["RLTPERF_RUNTIME_DIR"] = _RUNTIME_DIR[-1]
        os.environ[_RUNTIME_DIR_OURS] = _RUNTIME_DIR[-1]
    if not os.environ.get(CACHE_ENV):
        # one folder of caches for every server of the session, on every worker
        # (``vllm_fixtures.cache_env``); made by the first process, inherited by its workers
        _CACHE_DIR.append(tempfile.mkdtemp(prefix="rltperf-test-vllm-cache-"))
        os.environ[CACHE_ENV] = _CACHE_DIR[-1]
    atexit.register(_stop_all, config)  # an interrupted run leaves no server behind
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        # `timeout` and CI stop a run with SIGTERM: end it as Ctrl-C does (teardown,
        # unconfigure, atexit), not at once with the servers still running
        signal.signal(signal.SIGTERM, signal.default_int_handler)


def _is_worker(config: pytest.Config) -> bool:
    """Whether this process is a pytest-xdist worker."""
    return hasattr(config, "workerinput")


def _stop_all(config: pytest.Config) -> None:
    if _POOL in config.stash:
        config.stash[_POOL].stop_all()


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop every server; then remove the cache folder and the announcement directory
    this process made."""
    _stop_all(config)
    while _CACHE_DIR:  # (after the servers stopped: they wrote there)
        os.environ.pop(CACHE_ENV, None)
        shutil.rmtree(_CACHE_DIR.pop(), ignore_errors=True)
    while _RUNTIME_DIR:
        os.environ.pop("RLTPERF_RUNTIME_DIR", None)
        os.environ.pop(_RUNTIME_DIR_OURS, None)
        shutil.rmtree(_RUNTIME_DIR.pop(), ignore_errors=True)


class _Marks:
    """A plugin of one hook, registered by ``pytest_configure``: a second
    ``pytest_collection_modifyitems`` of this module, run before any other (pytest calls
    only functions named ``pytest_*`` as hooks, so it cannot be a second function here)."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Mark every test using a kind ``vllm``, and it and every other ``vllm`` test
        ``xdist_group(XDIST_GROUP)``; every other test ``xdist_group(its module)``: a
        module's fixtures (an engine, a TP 2 server) then start on one worker only, and
        no two workers run a vLLM server at once.  First: an xdist worker turns the
        group into the test's id in its own hook of this name."""
        for item in items:
            kinds = _kinds_of(item)
            if kinds or item.get_closest_marker("vllm") is not None:
                # a vllm test using no kind starts a server of its own (a plugin check's):
                # beside the group's, two servers would share the cores.  One that names
                # a group of its own keeps it (the TP 2 and DP 2 modules: one worker
                # runs them beside the shared servers' worker, multirank_servers.XDIST_GROUP)
                if kinds:
                    item.add_marker(pytest.mark.vllm)
                if kinds or item.get_closest_marker("xdist_group") is None:
                    item.add_marker(pytest.mark.xdist_group(XDIST_GROUP))
            elif item.get_closest_marker("xdist_group") is None:
                item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the tests using a kind last, grouped by kind (see above)."""
    order = list(KINDS)
    keyed = []
    for i, item in enumerate(items):
        kinds = _kinds_of(item)
        if kinds:
            stops = any(s in item.fixturenames for s in STOPPERS)
            key: tuple = (1, order.index(kinds[0]), order.index(kinds[-1]), stops, i)
        else:
            key = (0, i)
        keyed.append((key, item))
    items[:] = [item for _, item in sorted(keyed, key=lambda ki: ki[0])]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Note each kind's last user in the final selection and order."""
    pool = _pool(session.config)
    for item in session.items:  # the final selection and order
        for kind in _kinds_of(item):
            pool.last_user[kind] = item.nodeid


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a ``vllm`` test without vLLM; wait until its servers are quiet."""
    if item.get_closest_marker("vllm") is not None:
        why = vllm_missing_reason() or plugin_missing_reason()
        if why:
            pytest.skip(why)
        pool = _pool(item.config)
        for kind in _kinds_of(item):
            pool.wait_quiet(kind)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a kind's last user, stop its server."""
    yield
    pool = _pool(item.config)
    for kind, last in pool.last_user.items():
        if last == item.nodeid:
            pool.stop(kind)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under ``RLTPERF_REQUIRE_VLLM=1``, a skipped ``vllm`` test is a failure."""
    outcome = yield
    rep = outcome.get_result()
    required = os.environ.get(REQUIRE_ENV) == "1" and item.get_closest_marker("vllm") is not None
    if rep.skipped and required and not hasattr(rep, "wasxfail"):
        rep.outcome = "failed"
        rep.longrepr = f"{REQUIRE_ENV}=1 and this vLLM test skipped: {_reason(rep)}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """Under ``RLTPERF_REQUIRE_VLLM=1``, a module skipped whole is a collection error."""
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and os.environ.get(REQUIRE_ENV) == "1":
        rep.outcome = "failed"
        rep.longrepr = f"{REQUIRE_ENV}=1 and {collector.nodeid} skipped whole: {_reason(rep)}"


def _reason(rep: pytest.CollectReport | pytest.TestReport) -> str:
    reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
    return reason.removeprefix("Skipped: ")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """An xdist worker hands its server start counts to the controller (before its own
    hook of this name sends ``workeroutput``)."""
    pool = session.config.stash.get(_POOL, None)
    out = getattr(session.config, "workeroutput", None)
    if out is not None and pool is not None:
        out[_STARTS] = dict(pool.started)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's, called only where it runs
def pytest_testnodedown(node: Any, error: Any) -> None:
    """The controller adds a finished worker's server start counts to its own."""
    got = getattr(node, "workeroutput", {}).get(_STARTS)
    if got:
        pool = _pool(node.config)
        for kind, n in got.items():
            pool.started[kind] = pool.started.get(kind, 0) + n


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say how many times each kind of server was started."""
    pool = terminalreporter.config.stash.get(_POOL, None)
    if pool is not None and pool.started:
        starts = ", ".join(f"{k} x{n}" for k, n in pool.started.items())
        terminalreporter.write_line(f"shared vLLM servers started: {starts}")
