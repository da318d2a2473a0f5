"""Bundle writer: one new folder per capture, written under a temp name then renamed.

Layout (see ``snapshots/README.md``)::

    <root>/<UTC time>_<engine>_<mode>_<N>steps[_<label>]/
        trace.json.gz   Chrome trace (opens in Perfetto / chrome://tracing)
        meta.json       engine info, capture settings and results, test contract
        ops.txt         operator table (full mode: grouped by input shape)
        steps.jsonl     the window's step records, with context before and after

Nothing is ever overwritten.  A failure keeps its error in ``meta.json`` of a bundle
that holds whatever was written before the failure; when even that cannot be written
(read-only or full disk), the capture fails with the reason.
"""

from __future__ import annotations

import errno
import gzip
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from engine_adapters.definitions.contract import build_contract
from engine_adapters.definitions.records import CaptureDone, CaptureFailed, to_builtins
from engine_adapters.probe.capture import CaptureJob, sanitize_label

if TYPE_CHECKING:
    from engine_adapters.probe.core import Probe

log = logging.getLogger("rltperf.probe.bundle")

BUNDLE_FORMAT = 1
"""Version of the bundle layout, in ``meta.json``."""
CONTEXT_STEPS = 32
"""Step records kept in ``steps.jsonl`` before the window."""
TRIGGER_CONTEXT_STEPS = 8
"""Of a triggered capture, steps kept before the offending one too (however long the
delay from it to the window was, within the publisher's history)."""
TOP_OPS_ROWS = 60


def _os_error_text(exc: OSError, what: str) -> str:
    if exc.errno == errno.ENOSPC:
        return f"disk full while writing {what} ({exc.filename or ''}): free space or capture fewer steps"
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"cannot write {what}: {exc.strerror} ({exc.filename or ''}); choose a writable snapshot root"
    return f"cannot write {what}: {exc}"


def _no_trace_errno(folder: str) -> int:
    """ENOSPC when the file system holding ``folder`` is (nearly) full, else EIO."""
    try:
        st = os.statvfs(folder)
        if st.f_bavail * st.f_frsize < 1 << 20:
            return errno.ENOSPC
    except OSError:
        pass
    return errno.EIO


def bundle_name(engine: str, mode: str, steps: int, label: str, when: float | None = None) -> str:
    """``<UTC time>_<engine>_<mode>_<N>steps[_<label>]``, safe for a folder name."""
    ts = datetime.fromtimestamp(when or time.time(), tz=timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    name = f"{ts}_{sanitize_label(engine) or 'engine'}_{mode}_{steps}steps"
    return f"{name}_{label}" if label else name


def _rename_unique(tmp: str, final: str) -> str:
    """Rename ``tmp`` to ``final`` or ``final-2``, ``-3``...; never replaces a bundle."""
    candidate = final
    for i in range(2, 1000):
        if not os.path.exists(candidate):
            try:
                os.rename(tmp, candidate)
                return candidate
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
        candidate = f"{final}-{i}"
    raise OSError(errno.EEXIST, "no free bundle name", final)


def seal_bundle(tmp: str, final: str, meta: dict[str, Any]) -> str:
    """Write ``meta.json`` into the temp folder and rename it to a new bundle name
    (never replacing one); returns the bundle path.  Raises ``OSError``."""
    with open(os.path.join(tmp, "meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2, default=str)
        f.write("\n")
    return _rename_unique(tmp, final)


def post_outcome(
    job: Any,
    path: str,
    post: Callable[[Any], None],
    *,
    steps_captured: int,
    trace_bytes: int,
    events: int,
    export_s: float,
    note: str | None = None,
) -> None:
    """After ``seal_bundle``: a job that met an error is failed (its bundle kept and named),
    otherwise saved; set its state and post ``CaptureFailed`` or ``CaptureDone``."""
    if job.error:
        job.state = "failed"
        post(CaptureFailed(capture_id=job.capture_id, reason=job.error, bundle=path))
        return
    job.state = "saved"
    post(
        CaptureDone(
            capture_id=job.capture_id,
            bundle=path,
            steps_requested=job.steps,
            steps_captured=steps_captured,
            trace_bytes=trace_bytes,
            events=events,
            export_s=round(export_s, 4),
            mode=job.mode,
            note=note,
        )
    )


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


def _export_forked(job: CaptureJob, tmp: str, sort: str) -> dict[str, Any] | None:
    """``_write_trace_files`` in a forked child, so the engine keeps its GIL.

    The child is a copy of the engine taken after the profiler stopped: it holds the
    profiler's results and needs nothing from the engine's other threads (the locks it
    touches are malloc's and logging's, both reset across fork; it never touches CUDA).
    It runs at a lower priority (nice +5: the engine first; +10 starved it to minutes of export on a loaded 2-core box), writes its result as JSON and leaves with ``os._exit``.
    None when fork fails or the child dies or hangs without a result: the caller then
    exports in-thread, which is correct, only slow for the engine.
    """
    result = os.path.join(tmp, ".export-result.json")
    try:
        pid = os.fork()
    except OSError as exc:
        log.warning("export fork failed (%s): exporting in-thread", exc)
        return None
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


def write_bundle(probe: Probe, job: CaptureJob, post: Callable[[Any], None]) -> str | None:
    """Export ``job`` (whose profiler has stopped) into a new bundle; post the result."""
    t0 = time.perf_counter()
    root = probe.snapshot_root
    info = probe.engine_info
    final = os.path.join(root, bundle_name(info.name, job.mode, job.steps, job.label))
    tmp = os.path.join(root, f".tmp-{job.capture_id}-{os.getpid()}")
    try:
        os.makedirs(root, exist_ok=True)
        os.mkdir(tmp)
    except OSError as exc:
        reason = _os_error_text(exc, f"the bundle under snapshot root {root}")
        job.error = reason
        job.state = "failed"
        post(CaptureFailed(capture_id=job.capture_id, reason=reason))
        return None

    res: dict[str, Any] | None
    if job.partial is not None:  # stalled window: its profiler is still on, on the engine thread
        res = {"files": {}, "trace_bytes": 0, "events": 0, "steps_found": len(job.step_ids), "error": None}
        res["where"] = None
    else:
        res = _export_forked(job, tmp, _sort_key()) if _fork_allowed() else None
    if res is None:  # no fork here, or the child died: the same work in this thread (stalls the engine)
        res = _write_trace_files(job, tmp, _sort_key())
        res["where"] = "thread"
    trace_bytes, events, steps_found = res["trace_bytes"], res["events"], res["steps_found"]
    files: dict[str, str] = dict(res["files"])
    if res["error"]:
        job.error = res["error"]
    job.export_where = res.get("where")

    export_s = time.perf_counter() - t0
    if not job.error and job.partial is None and steps_found != job.steps:
        job.error = f"the trace holds {steps_found} ProfilerStep spans, {job.steps} were requested"
    try:
        steps = _window_steps(probe, job)
        with open(os.path.join(tmp, "steps.jsonl"), "w", encoding="utf-8") as f:
            trig_id = job.trigger.step_id if job.trigger is not None else None
            for rec, tag in steps:
                d = to_builtins(rec)
                d["window"] = tag
                if trig_id is not None and rec.step_id == trig_id:
                    d["trigger_step"] = True  # the step that broke the rule
                f.write(json.dumps(d) + "\n")
        files["steps.jsonl"] = "step records of the window with context"
    except OSError as exc:
        job.error = job.error or _os_error_text(exc, "steps.jsonl")

    meta = _meta(probe, job, steps_found, trace_bytes, events, export_s, files)
    try:
        path = seal_bundle(tmp, final, meta)
    except OSError as exc:
        reason = job.error or _os_error_text(exc, "meta.json")
        shutil.rmtree(tmp, ignore_errors=True)
        job.state = "failed"
        post(CaptureFailed(capture_id=job.capture_id, reason=reason))
        return None

    post_outcome(
        job, path, post, steps_captured=steps_found, trace_bytes=trace_bytes, events=events, export_s=export_s,
        note=job.partial,
    )  # fmt: skip
    log.info("capture %s -> %s (%s)", job.capture_id, path, job.error or "ok")
    return path


def _window_steps(probe: Probe, job: CaptureJob) -> list[tuple[Any, str]]:
    """Step records from the publisher's history: context, warm-up, window, after."""
    last = job.step_ids[-1] if job.step_ids else -1
    pub = probe._publisher
    deadline = time.monotonic() + 2.0
    while pub.last_step_id < last and time.monotonic() < deadline:
        time.sleep(0.01)
    first = job.warmup_step if job.warmup_step is not None else (job.step_ids[0] if job.step_ids else 0)
    window = set(job.step_ids)
    lo = first - CONTEXT_STEPS
    trig = job.trigger
    if trig is not None and trig.step_id is not None:
        lo = min(lo, trig.step_id - TRIGGER_CONTEXT_STEPS)
    before = "before_trigger" if trig is not None else "before"
    out: list[tuple[Any, str]] = []
    for rec in pub.recent_steps():
        sid = rec.step_id
        if sid < lo:
            continue
        if sid in window:
            tag = "captured"
        elif sid == job.warmup_step:
            tag = "profiler_warmup"
        elif sid < first:
            tag = before
        else:
            tag = "after"
        out.append((rec, tag))
    return out


def _trigger_meta(job: CaptureJob) -> dict[str, Any] | None:
    """Why a triggered capture exists: the rule, the value that fired it, when, and the
    delay from the offending step to the window (steps and ms); None for a key press."""
    trig = job.trigger
    if trig is None:
        return None
    out: dict[str, Any] = to_builtins(trig)
    first = job.warmup_step if job.warmup_step is not None else (job.step_ids[0] if job.step_ids else None)
    if trig.step_id is not None and first is not None:
        out["delay_steps"] = first - trig.step_id
    if trig.ts_ns and job.started_ns:
        out["delay_ms"] = round((job.started_ns - trig.ts_ns) / 1e6, 3)
    return out


def _ceiling(info: Any) -> dict[str, Any] | None:
    """The device ceiling the monitor used (for the report's roofline), or None."""
    try:
        from engine_adapters.definitions.ceilings import ceiling_for

        c = ceiling_for(info.device, info.dtype, quick=False)
    except Exception:
        return None
    return to_builtins(c) if c is not None else None


def _meta(
    probe: Probe,
    job: CaptureJob,
    steps_found: int,
    trace_bytes: int,
    events: int,
    export_s: float,
    files: dict[str, str],
) -> dict[str, Any]:
    import torch

    from engine_adapters import __version__
    from engine_adapters.definitions.records import SCHEMA_VERSION

    info = probe.engine_info
    acts = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    return {
        "bundle_format": BUNDLE_FORMAT,
        "rltperf_version": __version__,
        "schema": SCHEMA_VERSION,
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "profiled": True,
        "note": "Timings in this bundle were taken with the profiler on: they are not a baseline.",
        "engine": to_builtins(info),
        "stage_names": probe.stage_names,
        "capture": {
            "capture_id": job.capture_id,
            "label": job.label or None,
            "mode": job.mode,
            "steps_requested": job.steps,
            "steps_captured": steps_found,
            "step_ids": list(job.step_ids),
            "profiler_warmup_step": job.warmup_step,
            "record_shapes": job.full,
            "profile_memory": job.full,
            "with_stack": job.full,
            "activities": acts,
            "device_trace": "cuda" in acts,
            "cold": job.cold,
            "export_s": round(export_s, 4),
            "export_in": job.export_where,
            "trace_bytes": trace_bytes,
            "events": events,
            "error": job.error,
            "complete": job.error is None and job.partial is None and steps_found == job.steps,
            "partial_reason": job.partial,
            "requested_ns": job.requested_ns,
            "window_start_ns": job.started_ns,
            "window_end_ns": job.window_end_ns,
        },
        "live_at_trigger": job.live_at_trigger,
        "trigger": _trigger_meta(job),
        "ceiling": _ceiling(info),
        "contract": build_contract(info),
        "files": files,
    }
