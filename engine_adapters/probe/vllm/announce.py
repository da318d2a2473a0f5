"""The plugin's announcement: what a vLLM server on this host tells a monitor about itself.

vLLM 0.32 does not say over HTTP where its profiler writes (``/server_info`` exists
only with ``VLLM_SERVER_DEV_MODE``), nor its dtype or device.  So, when the rltperf
plugin is installed in the server's environment (``RLTPERF_ANNOUNCE=0`` turns it off;
no ``RLTPERF_PROBE`` is needed), vLLM's engine-core process
writes one small JSON file when its busy loop starts and removes it when the loop ends
(and at exit)::

    $XDG_RUNTIME_DIR/rltperf/vllm/<api pid>-<engine pid>.json    (else /tmp/rltperf-<uid>/vllm/)

A data-parallel server runs one engine core per DP rank, and each writes its own file:
together they list every rank of the server (``dp_rank``, ``tp_size``, ``pp_size``,
``workers``: each worker's pid by name, ``probe``: that engine's probe address, the base
port + its DP rank).

The directories are the user's own, mode 0700 (a directory that is not is ignored, so
no other user can plant or read an announcement); ``RLTPERF_RUNTIME_DIR`` replaces
both.  The file holds (``FORMAT`` 1): both processes' pids and start times (a reused
pid is not the same process), the TCP addresses the API server listens on (the
engine core's parent holds the listening socket: read from ``/proc``, so Linux only;
often empty, as vLLM listens only after its engine started, so a reader looks at the
API server's sockets itself; a thread looks again a few times, with backoff
(``LISTEN_BACKOFF_S``), then stops and says why),
the profiler config (``--profiler-config``: ``torch_profiler_dir`` and what is
recorded), the engine's ``EngineInfo`` fields (dtype, device, quantization...; those
of ``engine_facts.engine_info``), the probe address, and the vLLM and rltperf versions.

The monitor side (``engine_adapters.monitor.vllm.announced``) picks the announcement of
the server it attaches to by port, after checking both processes are alive, so a file
left by a killed server is ignored; a writer also deletes such files.

The hook point is the one ``hooks.py`` uses: ``EngineCoreProc.run_busy_loop`` (class
attribute), which runs once, in the engine-core process, after ``EngineCore.__init__``.
Where announcements live and how a live one is told from a stale one is
``engine_adapters.definitions.announcement`` (shared with the monitor).  Importing this
module imports nothing beyond the standard library and that module.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import socket
import threading
import time
from typing import Any

from engine_adapters.definitions.announcement import (
    FORMAT,
    alive,
    make_private,
    runtime_dirs,
    start_time,
    tcp_listeners,
)

ENV_ANNOUNCE = "RLTPERF_ANNOUNCE"
"""``1``: announce even without ``RLTPERF_PROBE``; ``0``: never announce."""
PROFILER_FIELDS = (
    "profiler",
    "torch_profiler_dir",
    "torch_profiler_with_stack",
    "torch_profiler_record_shapes",
    "torch_profiler_with_memory",
    "torch_profiler_with_flops",
    "torch_profiler_use_gzip",
    "ignore_frontend",
    "delay_iterations",
    "max_iterations",
)
"""The fields of vLLM 0.32's ``ProfilerConfig`` that the announcement carries."""

LISTEN_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
"""The waits between the engine core's looks for its API server's port (about a minute
in all), after which it stops looking and says so (readers then look it up themselves)."""

log = logging.getLogger("vllm.rltperf")
_patched: set[type] = set()


# --------------------------------------------------------------------------- writing


def enabled() -> bool:
    """Whether this process should announce (see the module docstring)."""
    return os.environ.get(ENV_ANNOUNCE, "").strip() != "0"


def maybe_enable() -> bool:
    """Called by ``plugin.register()`` in every vLLM process: returns at once unless
    enabled; then wraps ``run_busy_loop`` of vLLM's engine-core classes (once)."""
    if not enabled():
        return False
    try:
        from vllm.v1.engine import core as core_mod
    except Exception as exc:
        log.warning("rltperf plugin: no announcement (vllm.v1.engine.core: %s)", exc)
        return False
    for name in ("EngineCoreProc", "DPEngineCoreProc"):
        cls = getattr(core_mod, name, None)
        if cls is None or "run_busy_loop" not in cls.__dict__ or cls in _patched:
            continue
        _patch(cls)
        _patched.add(cls)
    return True


def _patch(cls: type) -> None:
    orig = cls.__dict__["run_busy_loop"]

    def run_busy_loop(self: Any) -> Any:
        path = None
        if getattr(self, "_rltperf_announced", False):  # a subclass's loop calling its parent's
            return orig(self)
        done = threading.Event()
        try:
            self._rltperf_announced = True
            doc = describe(self)
            path = announce(doc)
            if path is not None and not doc["listen"]:
                threading.Thread(target=_add_listen, args=(path, doc, done), name="rltperf-announce",
                                 daemon=True).start()  # fmt: skip
        except Exception as exc:
            log.warning("rltperf plugin: could not write its announcement (%s: %s); vLLM runs on",
                        type(exc).__name__, exc)  # fmt: skip
        try:
            return orig(self)
        finally:
            done.set()
            if path is not None:
                withdraw(path)

    run_busy_loop.__doc__ = orig.__doc__
    run_busy_loop.__wrapped__ = orig  # type: ignore[attr-defined]
    run_busy_loop.rltperf_announce = True  # type: ignore[attr-defined]
    cls.run_busy_loop = run_busy_loop  # type: ignore[attr-defined]


def describe(core: Any) -> dict[str, Any]:
    """The announcement of the engine core ``core`` (vLLM 0.32's ``vllm_config`` layout)."""
    from engine_adapters import __version__

    cfg = core.vllm_config
    pc = getattr(cfg, "profiler_config", None)
    profiler = None
    if pc is not None and getattr(pc, "profiler", None):
        profiler = {k: getattr(pc, k, None) for k in PROFILER_FIELDS}
        profiler["profiler"] = str(pc.profiler)
    engine: dict[str, Any] | None
    engine_error = None
    try:
        from engine_adapters.probe.vllm import engine_facts

        mc = cfg.model_config
        loops = engine_facts.loop_count(
            getattr(mc, "hf_text_config", None) or mc.hf_config
        ) or engine_facts.loop_count(mc.hf_config)
        engine = engine_facts.engine_info(core, loops)
    except Exception as exc:  # the announcement still carries the profiler
        engine, engine_error = None, f"{type(exc).__name__}: {exc}"
    served = getattr(cfg.model_config, "served_model_name", None)
    ident: dict[str, Any] = {}
    probe = os.environ.get("RLTPERF_PROBE", "").strip() or None
    try:
        from engine_adapters.probe.vllm import engine_facts

        ident = engine_facts.identity(core)
        ident["workers"] = engine_facts.worker_pids(core)
        if probe:
            from engine_adapters.definitions.wire import parse_hostport

            host, port = engine_facts.probe_listen(*parse_hostport(probe), ident["dp_rank"])
            probe = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    except Exception as exc:  # the announcement still says the rest
        ident = {"identity_error": f"{type(exc).__name__}: {exc}"}
    api_pid = os.getppid()
    me = os.getpid()
    try:
        import vllm

        version = str(vllm.__version__)
    except Exception:
        version = None
    return {
        "format": FORMAT,
        "written_unix_s": round(time.time(), 3),
        "rltperf_version": __version__,
        "vllm_version": version,
        "hostname": socket.gethostname(),
        "api_pid": api_pid,
        "api_start": start_time(api_pid),
        "engine_pid": me,
        "engine_start": start_time(me),
        "listen": [list(a) for a in tcp_listeners(api_pid)],
        "served_model_name": served if isinstance(served, str) else (list(served) if served else None),
        "profiler": profiler,
        "probe": probe,
        "engine": engine,
        "engine_error": engine_error,
        **ident,
    }


def _add_listen(
    path: str, doc: dict[str, Any], done: threading.Event, backoff: tuple[float, ...] = LISTEN_BACKOFF_S
) -> bool:
    """Rewrite the announcement with the API server's port once it listens (vLLM listens
    only after its engine started), so that readers need not look it up themselves.
    Looks once after each wait of ``backoff``, then stops and says why; True when the
    port was added."""
    for wait in backoff:
        if done.wait(wait):
            return False
        listen = tcp_listeners(int(doc["api_pid"]))
        if listen:
            if not done.is_set() and os.path.exists(path):
                _write(path, dict(doc, listen=[list(a) for a in listen]))
            return True
    log.info(
        "rltperf plugin: the API server (pid %s) did not listen within %.0f s; the announcement %s goes "
        "without its port (monitors look it up themselves)",
        doc.get("api_pid"), sum(backoff), path,
    )  # fmt: skip
    return False


def prune(directory: str) -> int:
    """Delete announcements in ``directory`` whose processes are gone; how many."""
    n = 0
    try:
        names = [x for x in os.listdir(directory) if x.endswith(".json")]
    except OSError:
        return 0
    for name in names:
        path = os.path.join(directory, name)
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
            live = alive(int(d["engine_pid"]), d.get("engine_start")) and alive(
                int(d["api_pid"]), d.get("api_start")
            )
        except (OSError, ValueError, KeyError, TypeError):
            live = False
        if not live:
            with contextlib.suppress(OSError):
                os.unlink(path)
                n += 1
    return n


def announce(doc: dict[str, Any]) -> str | None:
    """Write ``doc`` into the first usable runtime directory (atomically, mode 0600) and
    remove it at exit; the path, or None when no directory is usable."""
    for directory in runtime_dirs():
        if not make_private(directory):
            continue
        prune(directory)
        path = os.path.join(directory, f"{doc['api_pid']}-{doc['engine_pid']}.json")
        _write(path, doc)
        atexit.register(withdraw, path)
        log.info("rltperf plugin: announced this server in %s", path)
        return path
    log.warning("rltperf plugin: no private runtime directory among %s; no announcement", runtime_dirs())
    return None


def _write(path: str, doc: dict[str, Any]) -> None:
    """Write ``doc`` to ``path`` atomically, readable by this user only."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, default=str)
    os.replace(tmp, path)


def withdraw(path: str) -> None:
    """Remove an announcement (a second call is harmless)."""
    with contextlib.suppress(OSError):
        os.unlink(path)
