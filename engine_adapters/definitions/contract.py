"""The reproducible test contract written into every bundle's ``meta.json``.

The field list is the seed's §2 ("Fix a reproducible test contract"): every field is
present in every bundle, with a value or the string ``"unknown: <why>"``.  What the probe
can find by itself (git state of the engine's code: see ``code_state``, Python/torch/CUDA and
driver versions, CPU and GPUs) it fills in; the rest comes from ``EngineInfo``.
"""

from __future__ import annotations

import hashlib
import os
import platform
import socket
import subprocess
import sys
from functools import lru_cache
from typing import Any

from engine_adapters.definitions.records import EngineInfo

CONTRACT_FIELDS: tuple[str, ...] = (
    "commit",
    "diff_sha256",
    "model",
    "tokenizer",
    "dtype",
    "quantization",
    "devices",
    "interconnect",
    "device_mapping",
    "driver",
    "runtime",
    "framework",
    "attention_backend",
    "kv_capacity",
    "max_requests",
    "token_budget",
    "chunked_prefill",
    "prefix_caching",
    "async_scheduling",
    "cuda_graphs",
    "loop_config",
    "exit_config",
    "spec_config",
    "sampling",
    "dataset",
    "prompt_template",
    "output_length_policy",
    "seeds",
    "concurrency",
    "arrival_model",
    "total_requests_or_duration",
    "warmup",
    "repetitions",
    "timeouts",
    "failure_handling",
    "random_weights",
)
"""Every field of the test contract, in the seed's order."""

UNKNOWN_PREFIX = "unknown: "


def unknown(why: str) -> str:
    """The value of a contract field nobody could fill, with the reason."""
    return UNKNOWN_PREFIX + why


def is_unknown(value: Any) -> bool:
    """True for a value made by ``unknown()``."""
    return isinstance(value, str) and value.startswith(UNKNOWN_PREFIX)


def _run(cmd: list[str], cwd: str) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.decode("utf-8", "replace")


@lru_cache(maxsize=8)
def git_state(cwd: str) -> dict[str, str]:
    """``commit`` and ``diff_sha256`` of the git checkout holding ``cwd``."""
    head = _run(["git", "rev-parse", "HEAD"], cwd)
    if head is None:
        why = "not a git checkout" if _run(["git", "--version"], cwd) else "git not installed"
        return {"commit": unknown(f"{why} ({cwd})"), "diff_sha256": unknown(why)}
    diff = _run(["git", "diff", "HEAD", "--binary"], cwd) or ""
    untracked = _run(["git", "ls-files", "--others", "--exclude-standard"], cwd) or ""
    h = hashlib.sha256(diff.encode())
    if untracked.strip():
        h.update(b"\0untracked\0" + untracked.encode())
    return {
        "commit": head.strip(),
        "diff_sha256": h.hexdigest() if (diff or untracked.strip()) else "clean",
    }


def _main_script_dir() -> str | None:
    """Folder of the script that started this process (``python my_engine.py``, ``-m pkg``).

    None for installed code (a console script or a package under ``sys.prefix``, e.g. a
    virtual environment that happens to sit inside some checkout): not the engine's code.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path:
        return None
    path = os.path.abspath(path)
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        if path.startswith(os.path.abspath(prefix) + os.sep):
            return None
    return os.path.dirname(path)


def code_state(code_dir: str | None = None, cwd: str | None = None) -> dict[str, str]:
    """``commit``, ``diff_sha256`` and ``commit_source`` of the code that runs the engine.

    The engine's code is not where it was started from: ``rltperf engine`` run in
    ``/tmp`` is still the reference engine's checkout.  Candidates, first git checkout
    wins: ``code_dir`` (the engine's own code, e.g. the ``code_dir`` an engine passes in
    its ``EngineInfo.contract``), the folder of the script that started the process, the
    working directory.  ``commit_source`` names where the commit was read; when none is
    a checkout, ``commit`` says every place looked at.
    """
    tried: list[tuple[str, str]] = []
    if code_dir:
        tried.append((os.path.abspath(code_dir), "the engine's code"))
    main_dir = _main_script_dir()
    if main_dir:
        tried.append((main_dir, "the script that started the engine process"))
    tried.append((os.path.abspath(cwd or os.getcwd()), "the engine's working directory"))
    seen: set[str] = set()
    last: dict[str, str] = {}
    for path, what in tried:
        if path in seen:
            continue
        seen.add(path)
        st = git_state(path)
        if not is_unknown(st["commit"]):
            return {**st, "commit_source": f"git checkout holding {path} ({what})"}
        last = st
    places = ", ".join(p for p, _ in tried if p in seen)
    why = last.get("diff_sha256", unknown("not a git checkout"))[len(UNKNOWN_PREFIX) :]
    return {
        "commit": unknown(f"{why}: looked in {places}"),
        "diff_sha256": unknown(why),
        "commit_source": "none found",
    }


@lru_cache(maxsize=1)
def cpu_model() -> str:
    """CPU model name and logical core count.

    From ``/proc/cpuinfo``, else the machine type: never ``platform.processor()``, which on
    Linux forks ``uname -p`` (a fork of a vLLM worker holding gigabytes, from the probe; on
    cores a loaded server saturates the monitor's connect waited seconds on it) to learn
    what ``platform.machine()`` already says."""
    name = platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{name} ({os.cpu_count()} logical cores)"


def platform_text() -> str:
    """``platform.platform()``'s text (``Linux-6.1.0-x86_64-with-glibc2.36``) without its
    fork: unpacking ``platform.uname()`` reads ``processor``, which forks ``uname -p``."""
    u = os.uname()
    lib, ver = platform.libc_ver()
    tail = f"-with-{lib}{ver}" if lib else ""
    return f"{u.sysname}-{u.release}-{u.machine}{tail}".replace(" ", "_")


@lru_cache(maxsize=1)
def environment() -> dict[str, Any]:
    """Facts the probe finds itself: versions, devices, driver (cached; ~50 ms)."""
    env: dict[str, Any] = {
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform_text(),
        "cpu": cpu_model(),
    }
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda_runtime"] = torch.version.cuda
        if torch.cuda.is_available():
            env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception as exc:  # torch missing or broken: say so, don't fail
        env["torch"] = None
        env["torch_error"] = str(exc)
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            drv = pynvml.nvmlSystemGetDriverVersion()
            env["driver"] = drv.decode() if isinstance(drv, bytes) else str(drv)
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:
        env["driver"] = None
        env["driver_error"] = type(exc).__name__
    return env


def build_contract(info: EngineInfo, cwd: str | None = None) -> dict[str, Any]:
    """Every contract field for a bundle: discovered, from ``info``, or ``unknown: why``."""
    env = environment()
    c: dict[str, Any] = {}
    if not info.contract.get("commit"):  # an engine that read its own commit wins
        c.update(code_state(info.contract.get("code_dir"), cwd))
    c["model"] = info.model
    c["dtype"] = info.dtype
    c["quantization"] = info.quantization
    gpus = env.get("gpus")
    c["devices"] = ", ".join(gpus) if gpus else f"CPU: {env['cpu']}"
    c["driver"] = (
        f"NVIDIA {env['driver']}" if env.get("driver") else unknown("no NVIDIA driver on this host (CPU run)")
    )
    c["runtime"] = (
        f"CUDA {env['cuda_runtime']}" if env.get("cuda_runtime") else f"CPU (torch {env.get('torch')})"
    )
    c["framework"] = f"torch {env.get('torch')}, Python {env['python']}"
    if not gpus:
        c["interconnect"] = "none (single CPU device)"
        c["device_mapping"] = f"single process on {info.device or 'cpu'}"
    c["loop_config"] = info.loop_config
    exit_cfg = info.exit_config
    if exit_cfg and info.kv_policy:
        exit_cfg = f"{exit_cfg}; kv_policy={info.kv_policy}"
    c["exit_config"] = exit_cfg
    c["spec_config"] = info.spec_config if info.spec_config is not None else None
    if info.kv_capacity_blocks is not None:
        per = f" x {info.kv_block_tokens} tokens" if info.kv_block_tokens else ""
        c["kv_capacity"] = f"{info.kv_capacity_blocks} blocks{per}"
    c["max_requests"] = info.max_requests
    c["token_budget"] = info.token_budget
    c["random_weights"] = info.random_weights
    if info.workload:
        c.setdefault("dataset", info.workload)
    # The engine's own contract entries win over what the probe guessed.
    for k, v in info.contract.items():
        if v is not None:
            c[k] = v
    out: dict[str, Any] = {}
    for field in CONTRACT_FIELDS:
        v = c.get(field)
        out[field] = v if v is not None and v != "" else unknown("the engine did not report it")
    # Keep any extra fields the engine gave (e.g. workload hashes) after the standard ones.
    for k, v in c.items():
        if k not in out and v is not None:
            out[k] = v
    out["profiled"] = True
    return out
