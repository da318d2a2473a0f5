"""Where a vLLM server's announcement lives, and how a live one is told from a stale one.

Shared by the writer inside vLLM (``engine_adapters.probe.vllm.announce``, whose
docstring describes the announcement) and the reader in the monitor
(``engine_adapters.monitor.vllm.announced``).  Standard library only; the listening
ports and process start times come from Linux ``/proc``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import struct

ENV_RUNTIME_DIR = "RLTPERF_RUNTIME_DIR"
"""Replaces the runtime directory (its ``vllm/`` subfolder holds the announcements)."""
FORMAT = 1
"""Version of the announcement's JSON layout."""


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


def make_private(path: str) -> bool:
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
