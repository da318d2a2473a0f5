"""The monitor's side of the plugin's announcement (written by ``engine_adapters.probe.vllm.announce``).

``find(host, port)`` returns the announcement of the vLLM server listening on
``host:port`` on this host (``find_all``: every engine's, one per data-parallel rank): both of its processes alive (pid and start time), the API
server listening on that port at an address ``host`` reaches.  A file left by a
server that is gone (a process of it dead, or its pid reused: start times differ) is
removed when it is read: the engine core removes its own at exit, but vLLM's shutdown
SIGKILLs the engine core right after its SIGTERM ("force killing remaining processes",
timeout 0 s), often before that.  A server on another port, or a target on another
host, gives None and a sentence why.  ``merge`` fills an ``EngineInfo`` learnt over HTTP with what the
engine announced (dtype, device, quantization, limits, contract fields).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import socket
from dataclasses import dataclass
from typing import Any

import msgspec

from engine_adapters.definitions.announcement import FORMAT, alive, private_dir, runtime_dirs, tcp_listeners
from engine_adapters.definitions.contract import is_unknown
from engine_adapters.definitions.records import EngineInfo

ENABLE_HINT = "install rltperf in the server's environment (its vLLM plugin announces the server; RLTPERF_ANNOUNCE=0 turns that off)"
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


@dataclass
class Announcement:
    """One live server's announcement."""

    path: str
    data: dict[str, Any]

    @property
    def api_pid(self) -> int:
        return int(self.data["api_pid"])

    @property
    def engine_pid(self) -> int:
        return int(self.data["engine_pid"])

    @property
    def profiler(self) -> dict[str, Any] | None:
        """The server's profiler config (None: started without ``--profiler-config``)."""
        p = self.data.get("profiler")
        return p if isinstance(p, dict) else None

    @property
    def profiler_dir(self) -> str | None:
        """``torch_profiler_dir`` of the server's ``--profiler-config`` (absolute, or a URI)."""
        p = self.profiler
        d = p.get("torch_profiler_dir") if p else None
        return str(d) if d else None

    @property
    def engine(self) -> dict[str, Any]:
        e = self.data.get("engine")
        return e if isinstance(e, dict) else {}

    @property
    def dp_rank(self) -> int:
        """The data-parallel rank of the engine that wrote it (0 when not said)."""
        v = self.data.get("dp_rank")
        return v if isinstance(v, int) else 0

    @property
    def probe(self) -> str | None:
        """``HOST:PORT`` of this engine's rltperf probe (``RLTPERF_PROBE``), or None."""
        p = self.data.get("probe")
        return str(p) if p else None

    def identity(self) -> dict[str, Any]:
        """``EngineInfo`` identity fields this engine announced (DP rank, TP/PP size, ranks, host)."""
        out: dict[str, Any] = {}
        for k in ("dp_rank", "tp_size", "pp_size", "ranks"):
            if self.data.get(k) is not None:
                out[k] = self.data[k]
        return out

    def source(self) -> str:
        return f"announced by the rltperf plugin in vLLM (API server pid {self.api_pid}, {self.path})"


def _read(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        return None
    try:
        int(d["api_pid"]), int(d["engine_pid"])
    except (KeyError, TypeError, ValueError):
        return None
    return d


def _ips(host: str) -> set[str]:
    """The IP addresses ``host`` names (loopback names without a resolver)."""
    h = host.strip("[]")
    if h.lower() in _LOOPBACK_NAMES:
        return {"127.0.0.1", "::1"}
    try:
        return {str(ipaddress.ip_address(h))}
    except ValueError:
        pass
    try:
        return {str(ai[4][0]) for ai in socket.getaddrinfo(h, None, proto=socket.IPPROTO_TCP)}
    except OSError:
        return set()


def _local(ip: str) -> bool:
    """Whether ``ip`` belongs to this host (loopback, or an address a socket can bind)."""
    try:
        a = ipaddress.ip_address(ip)
    except ValueError:
        return False
    if a.is_loopback or a.is_unspecified:
        return True
    fam = socket.AF_INET6 if a.version == 6 else socket.AF_INET
    with contextlib.suppress(OSError), socket.socket(fam, socket.SOCK_STREAM) as s:
        s.bind((ip, 0))
        return True
    return False


def _reaches(listen_addr: str, ips: set[str]) -> bool:
    """Whether a socket listening on ``listen_addr`` is reached through one of ``ips``."""
    try:
        la = ipaddress.ip_address(listen_addr)
    except ValueError:
        return False
    for ip in ips:
        a = ipaddress.ip_address(ip)
        if la.is_unspecified and (la.version == a.version or la.version == 6):
            return True  # 0.0.0.0 takes every IPv4 address of the host; :: usually both families
        if la == a or (la.is_loopback and a.is_loopback):
            return True
    return False


def find(host: str, port: int) -> tuple[Announcement | None, str]:
    """The live announcement of the server at ``host:port`` on this host (its DP rank 0
    engine's when it has several), and why none."""
    anns, why = find_all(host, port)
    return (anns[0] if anns else None), why


def find_all(host: str, port: int) -> tuple[list[Announcement], str]:
    """Every live engine's announcement of the server at ``host:port`` on this host, by
    DP rank (one per data-parallel engine), and why none."""
    dirs = [d for d in runtime_dirs() if private_dir(d)]
    if not dirs:
        return [], f"no rltperf runtime directory on this host ({' or '.join(runtime_dirs()) or 'none'})"
    ips = _ips(host)
    local = {ip for ip in ips if _local(ip)}
    if not local:
        return [], f"{host} is not this host: announcements are only seen on the server's own host"
    found: list[tuple[float, Announcement]] = []
    stale = 0
    for d in dirs:
        try:
            names = sorted(n for n in os.listdir(d) if n.endswith(".json"))
        except OSError:
            continue
        for name in names:
            path = os.path.join(d, name)
            data = _read(path)
            if data is None:
                continue
            api = int(data["api_pid"])
            if not (
                alive(api, data.get("api_start")) and alive(int(data["engine_pid"]), data.get("engine_start"))
            ):
                stale += 1
                with contextlib.suppress(OSError):
                    os.unlink(path)  # a server that is gone: nobody will read it again
                continue
            listen = [(str(a), int(p)) for a, p in data.get("listen") or []]
            if not any(p == port for _, p in listen):  # written before the port was bound: look now
                listen = tcp_listeners(api)
            if not any(p == port and _reaches(a, local) for a, p in listen):
                continue
            with contextlib.suppress(OSError):
                found.append((os.path.getmtime(path), Announcement(path, data)))
    if found:
        # the newest server on that port (a restart leaves no live older one), all its engines
        api = max(found, key=lambda t: t[0])[1].api_pid
        same = [a for _, a in found if a.api_pid == api]
        return sorted(same, key=lambda a: (a.dp_rank, a.engine_pid)), ""
    why = f"no live rltperf announcement for port {port} in {' or '.join(dirs)}"
    if stale:
        why += f" ({stale} left by a server that is gone, removed)"
    return [], why + f": {ENABLE_HINT}"


def merge(
    info: EngineInfo, ann: Announcement, identity: bool = True, others: list[Announcement] | None = None
) -> EngineInfo:
    """``info`` (from HTTP) with what the engine announced filled in: its dtype, device,
    quantization, limits and pid, and every contract field HTTP left unknown; with
    ``identity``, also its place in the server (DP rank, TP/PP size, workers).  Its probe
    and those of ``others`` (the other engines a summed target covers) become ``probes``."""
    e = ann.engine
    fields: dict[str, Any] = {}
    probes = [f"tcp://{a.probe}" for a in [ann, *(others or [])] if a.probe]
    fields["probes"] = probes or None
    for k in ("dtype", "quantization", "device", "max_requests", "token_budget", "spec_config",
              "kv_block_tokens", "kv_capacity_blocks", "max_loops", "loop_config", "kv_policy", "random_weights"):  # fmt: skip
        if getattr(info, k) is None and e.get(k) is not None:
            fields[k] = e[k]
    fields["pid"] = ann.engine_pid
    fields["host"] = ann.data.get("hostname") or info.host
    if identity:
        fields.update({k: v for k, v in ann.identity().items() if getattr(info, k) is None})
    contract = dict(info.contract)
    announced = dict(e.get("contract") or {})
    if e.get("dtype"):
        announced.setdefault("dtype", e["dtype"])
    if e.get("quantization"):
        announced.setdefault("quantization", e["quantization"])
    if e.get("device") and "devices" not in announced:
        announced["devices"] = e["device"]
    for k, v in announced.items():
        cur = contract.get(k)
        if v is not None and (cur is None or is_unknown(cur)):
            contract[k] = v
    if is_unknown(contract.get("loop_config")) and e.get("loop_config"):
        contract["loop_config"] = f"{e['loop_config']} (announced by the engine)"
    prof = ann.profiler
    contract["profiler_config"] = (
        {k: v for k, v in prof.items() if v is not None} if prof else "off (no --profiler-config)"
    )
    contract["announced_by"] = ann.source()
    return msgspec.structs.replace(info, contract=contract, **fields)
