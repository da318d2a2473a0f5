"""A stopped profiler's files: the operator table and the Chrome trace, exported from a
forked child so the engine keeps its GIL (``export_trace_files``), else in this thread.

``meta.json`` and ``steps.jsonl`` are the bundle writer's (``engine_adapters.probe.bundle``).
"""

from __future__ import annotations

import errno
import gzip
import json
import logging
import os
import shutil
import threading
import time
import weakref
from typing import Any

from engine_adapters.definitions.bundle import os_error_text as _os_error_text
from engine_adapters.probe.job import CaptureJob, note_cost

log = logging.getLogger("rltperf.probe.bundle")

TOP_OPS_ROWS = 60


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
"""A forked export child running longer than this is killed and the export redone in-thread."""


def _fork_allowed() -> bool:
    """Export from a forked child unless ``RLTPERF_EXPORT_FORK=0`` (or no ``os.fork``)."""
    return hasattr(os, "fork") and os.environ.get("RLTPERF_EXPORT_FORK", "1") != "0"


def _sort_key() -> str:
    """Column the operator table is sorted by; decided in the parent (a forked child
    must not touch CUDA)."""
    import torch

    return "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"


def _write_trace_files(job: CaptureJob, tmp: str, sort: str) -> dict[str, Any]:
    """``ops.txt`` and ``trace.json.gz`` into ``tmp`` from the stopped profiler.

    Returns ``files``, ``trace_bytes``, ``events``, ``steps_found`` and ``error`` (a
    sentence, or None).  All of this holds the GIL for seconds (``key_averages`` is
    Python over every event; ``save`` and ``json.load`` are C that never release it),
    hence it normally runs in a forked child (``_export_forked``).
    """
    out: dict[str, Any] = {"files": {}, "trace_bytes": 0, "events": 0, "steps_found": 0, "error": None}
    try:
        try:
            table = _ops_table(job, sort)
        except Exception as exc:
            table = f"# operator table could not be built: {type(exc).__name__}: {exc}\n"
        with open(os.path.join(tmp, "ops.txt"), "w", encoding="utf-8") as f:
            f.write(table)
        out["files"]["ops.txt"] = "operator table"
        raw = os.path.join(tmp, "trace.json")
        job.prof.export_chrome_trace(raw)
        if not os.path.exists(raw):
            # Kineto reports a failed write on its own log and returns normally.
            raise OSError(_no_trace_errno(tmp), "the profiler wrote no trace file", raw)
        out["events"], out["steps_found"] = _count_trace(raw)
        with (
            open(raw, "rb") as src,
            gzip.open(os.path.join(tmp, "trace.json.gz"), "wb", compresslevel=3) as dst,
        ):
            shutil.copyfileobj(src, dst, 1 << 20)
        os.unlink(raw)
        out["trace_bytes"] = os.path.getsize(os.path.join(tmp, "trace.json.gz"))
        out["files"]["trace.json.gz"] = "Chrome trace (Perfetto)"
    except OSError as exc:
        out["error"] = _os_error_text(exc, "the trace")
    except Exception as exc:
        out["error"] = f"trace export failed: {type(exc).__name__}: {exc}"
    for leftover in ("trace.json", "trace.json.tmp"):  # a failed export leaves partial files
        try:
            os.unlink(os.path.join(tmp, leftover))
        except OSError:
            pass
    return out


MADV_DONTFORK, MADV_DOFORK = 10, 11
"""Linux ``madvise`` advice: leave a range out of a fork's child (and take it back)."""


def _madvise(ranges: list[tuple[int, int]], advice: int) -> int:
    """``madvise(advice)`` over each (address, length) range; returns how many took it."""
    global _libc
    if not ranges:
        return 0
    if _libc is None:
        try:
            import ctypes

            lib = ctypes.PyDLL(None, use_errno=True)  # keeps the GIL: a syscall of microseconds
            lib.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
            _libc = lib
        except (OSError, AttributeError):
            return 0
    return sum(1 for a, n in ranges if _libc.madvise(a, n, advice) == 0)


_libc: Any = None


def page_ranges(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The whole pages inside each (address, bytes) span (a span's partial first and last
    pages may hold other data, so they stay), merged; spans under 1 MiB are left out."""
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
    out: list[tuple[int, int]] = []
    for addr, nbytes in sorted(spans):
        a = (addr + page - 1) // page * page
        b = (addr + nbytes) // page * page
        if b - a < 1 << 20:
            continue
        if out and a <= out[-1][0] + out[-1][1]:
            s0, n0 = out[-1]
            out[-1] = (s0, max(s0 + n0, b) - s0)
        else:
            out.append((a, b - a))
    return out


def _export_forked(
    job: CaptureJob, tmp: str, sort: str, dontfork: list[tuple[int, int]] | None = None
) -> dict[str, Any] | None:
    """``_write_trace_files`` in a forked child, so the engine keeps its GIL.

    The child is a copy of the engine taken after the profiler stopped: it holds the
    profiler's results and needs nothing from the engine's other threads (the locks it
    touches are malloc's and logging's, both reset across fork; it never touches CUDA).
    It runs at a lower priority (nice +5: the engine first; +10 starved it to minutes of export on a loaded 2-core box), writes its result as JSON and leaves with ``os._exit``.
    ``dontfork``: page ranges the child never reads (tensor storage: a CPU server's KV
    cache and weights), left out of it with ``MADV_DONTFORK`` for the fork's duration:
    the fork copies the page tables of what it takes, with the GIL held, and a vLLM CPU
    worker's 1 GiB KV cache made that ~40 ms of its step.  The child's exit tears that copy
    down again: it runs at ``SCHED_IDLE`` by then, and the parent does not wait for it
    (a vLLM CPU worker's exiting child held a core for ~50 ms, and the engine core,
    on a loaded 2-core machine, did not step meanwhile).
    None when fork fails or the child dies or hangs without a result: the caller then
    exports in-thread, which is correct, only slow for the engine.
    """
    result = os.path.join(tmp, ".export-result.json")
    left_out = _madvise(dontfork or [], MADV_DONTFORK)
    t0, c0 = time.perf_counter_ns(), time.thread_time_ns()  # from here the GIL is held: the engine waits
    try:
        pid = os.fork()  # holds the GIL while the kernel copies the page tables: timed
    except OSError as exc:
        _madvise(dontfork or [], MADV_DOFORK)
        log.warning("export fork failed (%s): exporting in-thread", exc)
        return None
    if pid != 0:
        if left_out:
            _madvise(dontfork or [], MADV_DOFORK)
        note_cost(job, "fork", t0, c0)
    if pid == 0:  # child: no logging, no exceptions out, no atexit
        code = 3
        try:
            try:
                os.nice(5)
            except OSError:
                pass
            res = _write_trace_files(job, tmp, sort)
            with open(result + ".part", "w", encoding="utf-8") as f:
                json.dump(res, f)
            os.rename(result + ".part", result)
            code = 0
            try:  # its exit tears down a copy of the engine's page tables: only on an idle CPU
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            except (AttributeError, OSError):
                pass
        except BaseException:
            pass
        finally:
            os._exit(code)
    deadline = time.monotonic() + EXPORT_CHILD_TIMEOUT_S
    status = 0
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if os.path.exists(result):  # done: its exit is reaped in the background
            threading.Thread(target=_reap, args=(pid,), name="rltperf-export-reap", daemon=True).start()
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            log.warning("export child hung for %.0f s: killed, exporting in-thread", EXPORT_CHILD_TIMEOUT_S)
            return None
        time.sleep(0.02)
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
        log.warning("export child ended without a result (status %d): exporting in-thread", status)
        return None
    got["where"] = "child"
    return got


def _reap(pid: int) -> None:
    """Wait for an export child that has written its result and is exiting."""
    try:
        os.waitpid(pid, 0)
    except OSError:
        pass


def _count_trace(path: str) -> tuple[int, int]:
    """(events, ProfilerStep spans) of an uncompressed Chrome trace."""
    with open(path, "rb") as f:
        data = json.load(f)
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    steps = sum(
        1
        for e in events
        if isinstance(e, dict) and e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
    )
    return len(events), steps


def _ops_table(job: CaptureJob, sort: str) -> str:
    """Operator table.  Built *before* the Chrome export: on torch 2.13, key_averages()
    after export_chrome_trace() with profile_memory+with_stack raised UnicodeDecodeError."""
    ka = job.prof.key_averages(group_by_input_shape=job.full)
    header = (
        f"# rltperf capture {job.capture_id}: {job.mode} mode, {job.steps} steps "
        f"(profiled timings: not a baseline)\n"
        f"# sorted by {sort}; {'grouped by input shape' if job.full else 'no shapes recorded'}\n\n"
    )
    return header + ka.table(sort_by=sort, row_limit=TOP_OPS_ROWS, max_name_column_width=60)


RELEASE_PAUSE_S = 0.002
"""An export thread's pause between freeing two segments' results (``release_results``)."""


def release_results(prof: Any, pause_s: float = 0.0) -> bool:
    """Free a stopped profiler's results now (any thread); True when they are gone.

    Freeing holds the GIL: ~15 ms per step of a full-mode window here (every event's
    shapes and stacks).  A segmented window (``segments.SegmentedProfile``) is freed one
    segment at a time, sleeping ``pause_s`` between two (an export thread passes
    ``RELEASE_PAUSE_S``) so the engine thread takes the GIL back in between.

    ``torch.profiler.profile`` refers to itself (its ``action_map`` holds its own bound
    methods), so dropping the last reference to it frees nothing: its results (every
    event and the Kineto trace, held by ``prof.profiler``) wait for a full pass of the
    cyclic garbage collector, which a long-running engine makes rarely.  Each capture
    left ~16 MB of the reference engine's RSS behind (issue 20 §2), and the pass that
    finally came would free them all at once, on whatever thread it ran.  Cutting
    ``prof.profiler`` frees them here; clearing ``action_map`` frees the rest.
    """
    if prof is None:
        return True
    from engine_adapters.probe.segments import SegmentedProfile

    if isinstance(prof, SegmentedProfile):  # each of its sessions, through this function
        prof.release(pause_s)
        return True
    inner = getattr(prof, "profiler", None)
    if inner is None:
        return True
    try:
        gone = weakref.ref(inner)
    except TypeError:
        gone = None
    del inner
    try:
        prof.profiler = None
        prof.action_map = {}
    except Exception as exc:  # a torch whose profile refuses the assignment
        log.warning("profiler results not released (%s): left to the garbage collector", exc)
        return False
    if gone is not None and gone() is not None:
        log.warning("profiler results still referenced after release: left to the garbage collector")
        return False
    return True


def export_trace_files(
    job: CaptureJob, tmp: str, dontfork: list[tuple[int, int]] | None = None
) -> dict[str, Any]:
    """``ops.txt`` and ``trace.json.gz`` of ``job``'s stopped profiler into ``tmp``: from
    a forked child when allowed and it works, else in this thread.  Returns ``files``,
    ``trace_bytes``, ``events``, ``steps_found``, ``error`` and ``where`` (``child`` or
    ``thread``).  ``dontfork``: page ranges the child is not to have (``_export_forked``)."""
    res = _export_forked(job, tmp, _sort_key(), dontfork) if _fork_allowed() else None
    if res is None:  # no fork here, or the child died: the same work in this thread (stalls the engine)
        res = _write_trace_files(job, tmp, _sort_key())
        res["where"] = "thread"
    return res
