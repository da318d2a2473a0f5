"""The plugin's announcement: what a vLLM server on this host tells a monitor about itself.

vLLM 0.32 does not say over HTTP where its profiler writes (``/server_info`` exists
only with ``VLLM_SERVER_DEV_MODE``), nor its dtype or device.  So, when the rltperf
plugin is enabled (``RLTPERF_PROBE`` set, or ``RLTPERF_ANNOUNCE=1`` for the
announcement alone; ``RLTPERF_ANNOUNCE=0`` turns it off), vLLM's engine-core process
writes one small JSON file when its busy loop starts and removes it when the loop ends
(and at exit)::

    $XDG_RUNTIME_DIR/rltperf/vllm/<api pid>-<engine pid>.json    (else /tmp/rltperf-<uid>/vllm/)

The directories are the user's own, mode 0700 (a directory that is not is ignored, so
no other user can plant or read an announcement); ``RLTPERF_RUNTIME_DIR`` replaces
both.  The file holds (``FORMAT`` 1): both processes' pids and start times (a reused
pid is not the same process), the TCP addresses the API server listens on (the
engine core's parent holds the listening socket: read from ``/proc``, so Linux only;
often empty, as vLLM listens only after its engine started, so a reader looks at the
API server's sockets itself),
the profiler config (``--profiler-config``: ``torch_profiler_dir`` and what is
recorded), the engine's ``EngineInfo`` fields (dtype, device, quantization...; those
of ``hooks.engine_info``), the probe address, and the vLLM and rltperf versions.

The monitor side (``engine_adapters.monitor.vllm.announced``) picks the announcement of
the server it attaches to by port, after checking both processes are alive, so a file
left by a killed server is ignored; a writer also deletes such files.

The hook point is the one ``hooks.py`` uses: ``EngineCoreProc.run_busy_loop`` (class
attribute), which runs once, in the engine-core process, after ``EngineCore.__init__``.
Importing this module imports nothing beyond the standard library.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import socket
import stat
import struct
import time
from typing import Any

ENV_ANNOUNCE = "RLTPERF_ANNOUNCE"
"""``1``: announce even without ``RLTPERF_PROBE``; ``0``: never announce."""
ENV_RUNTIME_DIR = "RLTPERF_RUNTIME_DIR"
"""Replaces the runtime directory (its ``vllm/`` subfolder holds the announcements)."""
FORMAT = 1
"""Version of the announcement's JSON layout."""
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

log = logging.getLogger("vllm.rltperf")
_patched: set[type] = set()


# --------------------------------------------------------------------------- where


def runtime_dirs() -> list[str]:
    """The announcement directories, in the order a writer tries them.

    ``$RLTPERF_RUNTIME_DIR/vllm`` alone when that is set; else
    ``$XDG_RUNTIME_DIR/rltperf/vllm`` (when set) and ``/tmp/rltperf-<uid>/vllm``: a
    reader looks in both, since a server started outside a login session has no
    ``XDG_RUNTIME_DIR`` while the monitor's shell has one."""
    if not hasattr(os, "getuid"):
        return []
    explicit = os.environ.get(ENV_RUNTIME_DIR, "").strip()
    if explicit:
        return [os.path.join(os.path.abspath(explicit), "vllm")]
    out = []
    xdg = os.environ.get("XDG_RUNTIME_DIR", "").strip()
    if xdg and os.path.isabs(xdg):
        out.append(os.path.join(xdg, "rltperf", "vllm"))
    out.append(os.path.join("/tmp", f"rltperf-{os.getuid()}", "vllm"))
    return out


def private_dir(path: str) -> bool:
    """True when ``path`` is a real directory (no symlink) owned by this user and closed
    to everyone else (mode 0700 or stricter)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def _make_private(path: str) -> bool:
    """Create ``path`` and its rltperf parent with mode 0700; True when it is private."""
    parent = os.path.dirname(path)
    for p in (parent, path):
        try:
            os.mkdir(p, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return False
        if not private_dir(p):
            return False
    return True


# --------------------------------------------------------------------------- processes


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22),
    or None where ``/proc`` cannot tell."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            text = f.read()
        return int(text[text.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def alive(pid: int, started: int | None) -> bool:
    """Whether process ``pid`` runs and is the one that started at ``started`` (when known)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: not ours, and not the one announced
    except OSError:
        return False
    now = start_time(pid)
    return started is None or now is None or now == started


def _addr(hex_addr: str) -> str:
    """An address of ``/proc/net/tcp{,6}`` (32-bit words in host byte order) as text."""
    words = [int(hex_addr[i : i + 8], 16) for i in range(0, len(hex_addr), 8)]
    raw = b"".join(struct.pack("=I", w) for w in words)
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)


def tcp_listeners(pid: int) -> list[tuple[str, int]]:
    """The (address, port) pairs process ``pid`` listens on over TCP (Linux ``/proc``;
    empty where it cannot be read).  A socket bound but not yet listening is not listed
    by the kernel: vLLM binds its port before it starts the engine and listens only once
    the app is built, so an announcement may be written before its port shows here."""
    inodes = set()
    fd_dir = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return []
    for name in names:
        try:
            target = os.readlink(os.path.join(fd_dir, name))
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) < 10 or parts[3] != "0A" or parts[9] not in inodes:  # 0A: LISTEN
                continue
            host, _, port = parts[1].partition(":")
            with contextlib.suppress(ValueError, OSError):
                out.append((_addr(host), int(port, 16)))
    return sorted(set(out))


# --------------------------------------------------------------------------- writing


def enabled() -> bool:
    """Whether this process should announce (see the module docstring)."""
    flag = os.environ.get(ENV_ANNOUNCE, "").strip()
    if flag in ("0", "1"):
        return flag == "1"
    return bool(os.environ.get("RLTPERF_PROBE", "").strip())


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
        try:
            path = announce(describe(self))
        except Exception as exc:
            log.warning("rltperf plugin: could not write its announcement (%s: %s); vLLM runs on",
                        type(exc).__name__, exc)  # fmt: skip
        try:
            return orig(self)
        finally:
            if path is not None:
                withdraw(path)

    run_busy_loop.__doc__ = orig.__doc__
    run_busy_loop.__wrapped__ = orig  # type: ignore[attr-defined]
    run_busy_loop.rltperf_announce = True  # type: ignore[attr-defined]
    cls.run_busy_loop = run_busy_loop  # type: ignore[attr-defined]


def _loop_count(hf: Any) -> int | None:
    for key in ("total_ut_steps", "num_loops", "loop_count", "n_loops"):
        v = getattr(hf, key, None)
        if isinstance(v, int) and v >= 1:
            return v
    return None


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
        from engine_adapters.probe.vllm import hooks

        mc = cfg.model_config
        loops = _loop_count(getattr(mc, "hf_text_config", None) or mc.hf_config)
        engine = hooks.engine_info(core, loops)
    except Exception as exc:  # the announcement still carries the profiler
        engine, engine_error = None, f"{type(exc).__name__}: {exc}"
    served = getattr(cfg.model_config, "served_model_name", None)
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
        "probe": os.environ.get("RLTPERF_PROBE", "").strip() or None,
        "engine": engine,
        "engine_error": engine_error,
    }


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
        if not _make_private(directory):
            continue
        prune(directory)
        path = os.path.join(directory, f"{doc['api_pid']}-{doc['engine_pid']}.json")
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, default=str)
        os.replace(tmp, path)
        atexit.register(withdraw, path)
        log.info("rltperf plugin: announced this server in %s", path)
        return path
    log.warning("rltperf plugin: no private runtime directory among %s; no announcement", runtime_dirs())
    return None


def withdraw(path: str) -> None:
    """Remove an announcement (a second call is harmless)."""
    with contextlib.suppress(OSError):
        os.unlink(path)
