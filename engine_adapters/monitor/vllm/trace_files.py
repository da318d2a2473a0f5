"""The trace files vLLM's profiler writes, as the ``vllm+http://`` capture reads them:
what a worker trace shows was recorded (``trace_facts``, ``mode_note``) and which files
in the profiler directory belong to a capture (by prefix, worker vs front end, rank).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

STEP_ANNOTATION = re.compile(r"^execute_(?:\d+_)?context_\d+\(")
"""vLLM's per-step annotation in worker traces (plain and ``detailed_trace_annotation``)."""


@dataclass
class TraceFacts:
    """What a worker trace shows the profiler did."""

    events: int = 0
    annotations: list[dict[str, Any]] = field(default_factory=list)
    record_shapes: bool = False
    with_stack: bool = False
    profile_memory: bool = False
    with_flops: bool = False
    device_activities: list[str] = field(default_factory=list)
    vllm_version: str | None = None


def trace_facts(path: str) -> TraceFacts:
    """Read a (gzipped) Chrome trace: events, step annotations, what was recorded."""
    opener: Callable[..., Any] = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = json.load(f)
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    facts = TraceFacts(events=len(events))
    device = set()
    for e in events:
        if not isinstance(e, dict):
            continue
        cat = e.get("cat")
        name = str(e.get("name", ""))
        if cat == "user_annotation" and e.get("ph") == "X" and STEP_ANNOTATION.match(name):
            facts.annotations.append(
                {"name": name, "ts_us": e.get("ts"), "dur_ms": round(e.get("dur", 0) / 1e3, 4)}
            )
        elif cat == "python_function":
            facts.with_stack = True
        elif name == "[memory]":
            facts.profile_memory = True
        elif cat in ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"):
            device.add(str(cat))
        args = e.get("args")
        if isinstance(args, dict) and not facts.record_shapes and args.get("Input Dims"):
            facts.record_shapes = True
        if isinstance(args, dict) and not facts.with_flops and "flops" in args:
            facts.with_flops = True
    facts.annotations.sort(key=lambda a: a.get("ts_us") or 0)
    facts.device_activities = sorted(device)
    if isinstance(data, dict):
        v = data.get("vllm_version")
        facts.vllm_version = str(v) if v is not None else None
    return facts


def mode_note(requested: str, facts: TraceFacts) -> str | None:
    """A sentence when the server's fixed profiler settings differ from the requested mode."""
    did = {"record_shapes": facts.record_shapes, "profile_memory": facts.profile_memory,
           "with_stack": facts.with_stack}  # fmt: skip
    want = requested == "full"
    wrong = [k for k, v in did.items() if v != want]
    if not wrong:
        return None
    on = ", ".join(k for k, v in did.items() if v) or "none"
    cfg = {"record_shapes": "torch_profiler_record_shapes", "profile_memory": "torch_profiler_with_memory",
           "with_stack": "torch_profiler_with_stack"}  # fmt: skip
    fix = ", ".join(f'"{cfg[k]}": {"true" if want else "false"}' for k in wrong)
    return (
        f"requested {requested} mode, but the vLLM server's --profiler-config fixes what is recorded "
        f"(this trace has: {on}); restart the server with {fix} in --profiler-config to get {requested} mode"
    )


def list_prefixed(directory: str, prefix: str) -> dict[str, int]:
    """Files in ``directory`` starting with ``prefix + '_'`` and their sizes."""
    out: dict[str, int] = {}
    try:
        with os.scandir(directory) as it:
            for ent in it:
                if ent.name.startswith(prefix + "_") and ent.is_file():
                    try:
                        out[ent.name] = ent.stat().st_size
                    except OSError:
                        pass
    except OSError:
        pass
    return out


def is_trace(name: str) -> bool:
    return name.endswith(".pt.trace.json.gz") or name.endswith(".pt.trace.json")


def is_frontend(name: str) -> bool:
    return ".async_llm." in name


_RANK = re.compile(r"rank(\d+)")
_PARTS = re.compile(r"_dp(\d+)_pp(\d+)_tp(\d+)")
_PID = re.compile(rb'"pid"\s*:\s*(\d+)')


def rank_of(name: str) -> int:
    m = _RANK.search(name)
    return int(m.group(1)) if m else 0


def trace_pid(path: str, head: int = 1 << 20) -> int | None:
    """The process id most events of a trace carry (the worker that wrote it), read from
    its first ``head`` bytes; None when none is found or the file cannot be read."""
    opener: Callable[..., Any] = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read(head)
    except (OSError, EOFError):
        return None
    counts: dict[int, int] = {}
    for m in _PID.finditer(data):
        pid = int(m.group(1))
        counts[pid] = counts.get(pid, 0) + 1
    return max(counts, key=lambda p: counts[p]) if counts else None


def trace_rank(name: str, pid: int | None, pids: dict[int, str]) -> str:
    """The rank of a worker trace: its worker's, by pid, when the server's announcements
    list it (``dp1-tp0``); else from vLLM's file name (``dp<D>_pp<P>_tp<T>``; a data-parallel
    engine of a dense model calls itself dp0, so the pid is what tells its DP rank apart),
    else ``rank<r>``."""
    if pid is not None and pid in pids:
        return pids[pid]
    m = _PARTS.search(name)
    if m:
        dp, pp, tp = (int(g) for g in m.groups())
        return f"dp{dp}-" + (f"pp{pp}-tp{tp}" if pp else f"tp{tp}")
    return f"rank{rank_of(name)}"


def engine_of(rank: str) -> str:
    """The data-parallel engine of a rank name (``dp1-tp0`` -> ``dp1``; ``rank3`` -> ``dp0``)."""
    return rank.split("-", 1)[0] if rank.startswith("dp") else "dp0"


def copy_gz(src: str, dst: str) -> None:
    """Copy a trace, gzipping it when the server wrote it uncompressed."""
    if src.endswith(".gz"):
        shutil.copyfile(src, dst)
    else:
        with open(src, "rb") as fi, gzip.open(dst, "wb", compresslevel=3) as fo:
            shutil.copyfileobj(fi, fo, 1 << 20)


def read_facts(path: str) -> TraceFacts:
    """Trace facts, retried briefly: the copy may have caught a trace still being written."""
    err: Exception | None = None
    for _ in range(3):
        try:
            return trace_facts(path)
        except (OSError, EOFError, ValueError) as exc:
            err = exc
            time.sleep(0.5)
    raise ValueError(f"{type(err).__name__}: {err}")
