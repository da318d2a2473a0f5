"""A stopped profiler's files: the operator table and the Chrome trace.

The export thread saves each segment's trace (``SegmentedProfile.save_parts``: Kineto's
C++ writer, the GIL held one segment at a time, each segment freed as soon as it is on
disk), then a child process started from a file of the standard library only
(``export_child.py``: no torch, no fork of the engine) merges the parts, counts the
steps and builds the operator table; in this thread when no process can be started
(``RLTPERF_EXPORT_FORK=0``, or the child fails).  A fork of the engine was the child
before: copying the engine's page tables held the GIL for 15-30 ms of a step.

``meta.json`` and ``steps.jsonl`` are the bundle writer's (``engine_adapters.probe.bundle``).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
import time
from typing import Any

from engine_adapters.definitions.bundle import os_error_text as _os_error_text
from engine_adapters.probe.export_child import SCRIPT as CHILD_SCRIPT
from engine_adapters.probe.export_child import export as child_export
from engine_adapters.probe.job import CaptureJob, note_cost
from engine_adapters.probe.segments import RELEASE_PAUSE_S

log = logging.getLogger("rltperf.probe.bundle")


def _no_trace_errno(folder: str) -> int:
    """ENOSPC when the file system holding ``folder`` is (nearly) full, else EIO."""
    try:
        st = os.statvfs(folder)
        if st.f_bavail * st.f_frsize < 1 << 20:
            return errno.ENOSPC
    except OSError:
        pass
    return errno.EIO


EXPORT_CHILD_TIMEOUT_S = 300.0
"""An export child running longer than this is killed and the export redone in-thread."""


def _child_allowed() -> bool:
    """Export in a child process unless ``RLTPERF_EXPORT_FORK=0`` (the name from when the
    child was a fork)."""
    return os.environ.get("RLTPERF_EXPORT_FORK", "1") != "0"


def _no_trace_error(tmp: str) -> str:
    exc = OSError(_no_trace_errno(tmp), "the profiler wrote no trace file", tmp)
    return _os_error_text(exc, "the trace")


def _export_spawned(job: CaptureJob, tmp: str, parts: list[str]) -> dict[str, Any] | None:
    """``export_child`` in a process of its own (nice +5); None when it cannot start, or
    ends or hangs without a result (the caller then runs it in this thread)."""
    result = os.path.join(tmp, ".export-result.json")
    cmd = [sys.executable, CHILD_SCRIPT, tmp, result, "--capture-id", job.capture_id,
           "--mode", job.mode, "--steps", str(job.steps), *parts]  # fmt: skip
    t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    try:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, close_fds=True
        )
    except OSError as exc:
        log.warning("export process could not start (%s): exporting in-thread", exc)
        return None
    note_cost(job, "spawn", t0, c0)
    try:
        _out, err = proc.communicate(timeout=EXPORT_CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        log.warning("export process hung for %.0f s: killed, exporting in-thread", EXPORT_CHILD_TIMEOUT_S)
        return None
    try:
        with open(result, encoding="utf-8") as f:
            got: dict[str, Any] = json.load(f)
        os.unlink(result)
    except (OSError, ValueError):
        for leftover in (result, result + ".part"):  # never sealed into the bundle
            try:
                os.unlink(leftover)
            except OSError:
                pass
        tail = (err or b"").decode("utf-8", "replace").strip().splitlines()[-1:]
        log.warning("export process ended without a result (exit %s%s): exporting in-thread",
                    proc.returncode, f": {tail[0]}" if tail else "")  # fmt: skip
        return None
    got["where"] = "child"
    return got


def export_trace_files(job: CaptureJob, tmp: str) -> dict[str, Any]:
    """``ops.txt`` and ``trace.json.gz`` of ``job``'s stopped profiler into ``tmp``.

    Each segment's trace is saved and its results freed here (the export thread); the
    merge, the step count and the operator table run in a child process when allowed
    and it works, else in this thread.  Returns ``files``, ``trace_bytes``, ``events``,
    ``steps_found``, ``error`` and ``where`` (``child`` or ``thread``)."""
    t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    expected = len(job.prof.segments)
    try:
        parts = job.prof.save_parts(tmp, RELEASE_PAUSE_S)
    except OSError as exc:
        return {"files": {}, "trace_bytes": 0, "events": 0, "steps_found": 0, "where": "thread",
                "error": _os_error_text(exc, "the trace")}  # fmt: skip
    finally:
        note_cost(job, "save", t0, c0)
    if not parts or len(parts) < expected:  # Kineto reports a failed write on its own log only
        for part in parts:
            os.unlink(part)
        return {"files": {}, "trace_bytes": 0, "events": 0, "steps_found": 0, "where": "thread",
                "error": _no_trace_error(tmp)}  # fmt: skip
    res = _export_spawned(job, tmp, parts) if _child_allowed() else None
    if res is None:
        res = child_export(tmp, [p for p in parts if os.path.exists(p)], job.capture_id, job.mode, job.steps)
        res["where"] = "thread"
    if res.get("errno") is not None:  # the child's OSError: its errno, as this process words it
        res["error"] = _os_error_text(OSError(res["errno"], os.strerror(res["errno"])), "the trace")
    res.pop("errno", None)
    return res
