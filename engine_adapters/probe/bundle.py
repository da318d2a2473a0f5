"""Bundle writer: one new folder per capture, written under a temp name then renamed.

Layout (see ``snapshots/README.md``)::

    <root>/<UTC time>_<engine>_<mode>_<N>steps[_<label>]/
        trace.json.gz   Chrome trace (opens in Perfetto / chrome://tracing)
        meta.json       engine info, capture settings and results, test contract
        ops.txt         operator table (full mode: grouped by input shape)
        steps.jsonl     the window's step records, with context before and after

The format (name, sealing, ``meta.json`` as ``BundleMeta``) is
``engine_adapters.definitions.bundle``'s; the trace files are ``export.py``'s.  Nothing
is ever overwritten.  A failure keeps its error in ``meta.json`` of a bundle that holds
whatever was written before the failure; when even that cannot be written (read-only or
full disk), the capture fails with the reason.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from typing import Any, Protocol

from msgspec import UNSET

from engine_adapters.definitions.bundle import (
    BundleMeta,
    CaptureMeta,
    bundle_name,
    new_meta,
    post_outcome,
    seal_bundle,
    temp_bundle_dir,
)
from engine_adapters.definitions.bundle import os_error_text as _os_error_text
from engine_adapters.definitions.contract import build_contract
from engine_adapters.definitions.energy import readings_by_device
from engine_adapters.definitions.figures import EXCLUDED_FLAGS
from engine_adapters.definitions.ranks import ranks_held
from engine_adapters.definitions.records import CaptureFailed, EngineInfo, StepRecord, to_builtins
from engine_adapters.probe.export import export_trace_files
from engine_adapters.probe.job import CaptureJob, note_cost
from engine_adapters.probe.segments import RELEASE_PAUSE_S, release_results

log = logging.getLogger("rltperf.probe.bundle")

CONTEXT_STEPS = 32
"""Step records kept in ``steps.jsonl`` before the window."""
ENERGY_BASE_S = 30.0
"""Seconds of unprofiled steps before a window whose energy ``meta.json`` keeps (the
counter is read once a second: the 32 context steps are far too short for it)."""
WINDOW_READ_WAIT_S = 2.0
"""How long the bundle waits for the reader to read the window's last step."""
TRIGGER_CONTEXT_STEPS = 8
"""Of a triggered capture, steps kept before the offending one too (however long the
delay from it to the window was, within the publisher's history)."""


class StepHistory(Protocol):
    """The recent step records (the ring reader's history)."""

    last_step_id: int

    energy_na: str | None

    def recent_steps(self) -> list[StepRecord]: ...

    def recent_energy(self) -> list[Any]: ...


class BundleWriter:
    """Writes captures' bundles into ``snapshot_root`` (the export thread's work).

    Args:
        snapshot_root: folder the bundles go into.
        engine_info: the engine's ``EngineInfo`` (bundle name, ``meta.json``, contract).
        stage_names: the stage names now (``meta.json``).
        history: recent step records (``steps.jsonl``).
        post: queues ``CaptureDone`` / ``CaptureFailed`` for the subscribers.
    """

    def __init__(
        self,
        snapshot_root: str,
        engine_info: EngineInfo,
        stage_names: Callable[[], list[str]],
        history: StepHistory,
        post: Callable[[Any], None],
    ) -> None:
        self.snapshot_root = snapshot_root
        self.engine_info = engine_info
        self.stage_names = stage_names
        self.history = history
        self.post = post

    def write(self, job: CaptureJob) -> str | None:
        """Export ``job`` (whose profiler has stopped) into a new bundle; post the result."""
        post = self.post
        t0 = time.perf_counter()
        root = self.snapshot_root
        info = self.engine_info
        final = os.path.join(root, bundle_name(info.name, job.mode, job.steps, job.label))
        tmp = temp_bundle_dir(root, job.capture_id)
        try:
            os.makedirs(root, exist_ok=True)
            if job.expected_ranks is None or not os.path.isdir(tmp):  # worker captures made it at the request
                os.mkdir(tmp)
        except OSError as exc:
            reason = _os_error_text(exc, f"the bundle under snapshot root {root}")
            job.error = reason
            job.state = "failed"
            post(CaptureFailed(capture_id=job.capture_id, reason=reason))
            return None

        # The window's step records (and the unprofiled ones before it) are taken now, before
        # the export: the reader's history holds only its last HISTORY steps, and a fast
        # engine runs more than that during an export on a loaded machine.
        early = _history_at_window_end(self.history, job)
        res: dict[str, Any]
        held: dict[str, str] = {}
        if job.ranks is not None and job.partial is None:  # vLLM's workers exported their own traces
            res = gather_ranks(job, tmp, held)
        elif job.partial is not None:  # stalled window: its profiler is still on, on the engine thread
            res = {
                "files": {},
                "trace_bytes": 0,
                "events": 0,
                "steps_found": len(job.step_ids),
                "error": None,
            }
            res["where"] = None
        else:
            res = export_trace_files(job, tmp)
            # The child is done with the results: free them now, inside the export window
            # (the steps this slows are flagged), not at some later garbage collection.
            t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
            release_results(job.prof, RELEASE_PAUSE_S)
            job.prof = None
            note_cost(job, "release", t1, c1)
        trace_bytes, events, steps_found = res["trace_bytes"], res["events"], res["steps_found"]
        files: dict[str, str] = dict(res["files"])
        if res["error"]:
            job.error = res["error"]
        job.export_where = res.get("where")

        export_s = time.perf_counter() - t0
        if job.ranks is not None and job.export_start_ns and job.export_end_ns:  # the workers' exports
            export_s = (job.export_end_ns - job.export_start_ns) / 1e9
        if not job.error and job.partial is None and steps_found != job.steps:
            job.error = f"the trace holds {steps_found} ProfilerStep spans, {job.steps} were requested"
        records = _with_later(early, self.history.recent_steps())
        steps: list[tuple[Any, str]] = []
        try:
            steps = _window_steps(records, job)
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

        meta = self._meta(job, steps_found, trace_bytes, events, export_s, files, records)
        meta.capture.steps_note = _missing_steps_note(job, [r for r, _ in steps]) or UNSET
        if job.via is not None:
            meta.capture.via = job.via
        if job.expected_ranks is not None:
            meta.capture.ranks = ranks_held(job.expected_ranks, held)
        for leftover in glob.glob(os.path.join(tmp, ".rank-*")):  # what a rank left (a failed export)
            shutil.rmtree(leftover, ignore_errors=True)
        try:
            path = seal_bundle(tmp, final, meta)
        except OSError as exc:
            reason = job.error or _os_error_text(exc, "meta.json")
            shutil.rmtree(tmp, ignore_errors=True)
            job.state = "failed"
            post(CaptureFailed(capture_id=job.capture_id, reason=reason))
            return None

        post_outcome(
            job, path, post, steps_captured=steps_found, trace_bytes=trace_bytes, events=events,
            export_s=export_s, note=job.partial, via=worker_via(job, held),
        )  # fmt: skip
        log.info("capture %s -> %s (%s)", job.capture_id, path, job.error or "ok")
        return path

    def _meta(
        self,
        job: CaptureJob,
        steps_found: int,
        trace_bytes: int,
        events: int,
        export_s: float,
        files: dict[str, str],
        records: list[StepRecord],
    ) -> BundleMeta:
        import torch

        info = self.engine_info
        acts = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        capture = CaptureMeta(
            capture_id=job.capture_id,
            label=job.label or None,
            mode=job.mode,
            steps_requested=job.steps,
            steps_captured=steps_found,
            step_ids=list(job.step_ids),
            profiler_warmup_step=job.warmup_step,
            record_shapes=job.full,
            profile_memory=job.full,
            with_stack=job.full,
            activities=acts,
            device_trace="cuda" in acts,
            cold=job.cold,
            export_s=round(export_s, 4),
            export_in=job.export_where,
            trace_bytes=trace_bytes,
            events=events,
            error=job.error,
            complete=job.error is None and job.partial is None and steps_found == job.steps,
            partial_reason=job.partial,
            requested_ns=job.requested_ns,
            window_start_ns=job.started_ns,
            window_end_ns=job.window_end_ns,
            engine_cost=dict(job.costs),
        )
        return new_meta(
            note="Timings in this bundle were taken with the profiler on: they are not a baseline.",
            engine=info,
            stage_names=self.stage_names(),
            capture=capture,
            live_at_trigger=job.live_at_trigger,
            trigger=_trigger_meta(job, records),
            ceiling=_ceiling(info),
            contract=build_contract(info),
            files=files,
            energy=_energy_meta(records, self.history, job),
        )


def _energy_meta(records: list[StepRecord], history: StepHistory, job: CaptureJob) -> dict[str, Any]:
    """``meta.json`` ``energy``: the unprofiled steps before the window (of ``records``, the
    reader's history at the window's end, at most ``ENERGY_BASE_S``; profiled, warm-up and
    exporting steps left out as the live window leaves them) and the device energy
    counter's readings over them, so the report gives their power and joules per token by
    the window's definition; or why there are none."""
    first = job.warmup_step if job.warmup_step is not None else (job.step_ids[0] if job.step_ids else None)
    steps = [r for r in records if first is None or r.step_id < first]
    samples = history.recent_energy()
    sources = {s.energy_source for s in samples[-4:] if s.energy_source}
    out: dict[str, Any] = {"readings": {}, "source": sorted(sources)[0] if len(sources) == 1 else None,
                           "base": None, "reason": None}  # fmt: skip
    if steps:
        hi = steps[-1].end_ns
        steps = [r for r in steps if r.start_ns >= hi - int(ENERGY_BASE_S * 1e9)]
        lo = steps[0].start_ns
        excluded: list[list[int]] = []
        for r in steps:
            if r.flags & EXCLUDED_FLAGS:
                if excluded and r.start_ns <= excluded[-1][1]:
                    excluded[-1][1] = max(excluded[-1][1], r.end_ns)
                else:
                    excluded.append([r.start_ns, r.end_ns])
        kept = [r for r in steps if not r.flags & EXCLUDED_FLAGS]
        out["base"] = {"start_ns": lo, "end_ns": hi, "excluded": excluded,
                       "steps": len(kept), "out_tokens": sum(r.out_tokens for r in kept)}  # fmt: skip
        for dev, rows in readings_by_device(samples).items():
            i0 = max(0, next((i for i, (t, _) in enumerate(rows) if t >= lo), len(rows)) - 1)
            i1 = next((i for i, (t, _) in enumerate(rows) if t > hi), len(rows) - 1)
            out["readings"][dev] = [list(r) for r in rows[i0 : i1 + 1]]
    if not out["readings"]:
        out["reason"] = history.energy_na or "no energy counter readings were taken"
    return out


def worker_via(job: CaptureJob, held: dict[str, str]) -> str | None:
    """The path a worker capture took, in words, with the ranks whose traces it holds
    (``CaptureDone.via``); None for the probe's own capture."""
    if job.expected_ranks is None:
        return None
    n = len(job.expected_ranks)
    ranks = f" ({', '.join(sorted(held))})" if n > 1 else ""
    return f"rltperf in vLLM's workers, traces of {len(held)}/{n} ranks{ranks}"


def gather_ranks(job: CaptureJob, tmp: str, held: dict[str, str]) -> dict[str, Any]:
    """Move each rank's files from ``tmp/.rank-<rank>/`` into the bundle: the first rank's
    as ``trace.json.gz`` and ``ops.txt``, the others' as ``trace_<rank>.json.gz`` and
    ``ops_<rank>.txt`` (``held``: rank -> its trace file).  Returns the export result
    the writer expects: ``steps_found`` is the first rank's, and a rank whose count
    differs is an error (the ranks must hold the same steps); bytes and events are summed."""
    ranks = job.ranks or {}
    files: dict[str, str] = {}
    out: dict[str, Any] = {"files": files, "trace_bytes": 0, "events": 0, "steps_found": 0, "error": None,
                           "where": None}  # fmt: skip
    first = True
    for rank in sorted(ranks):
        r = ranks[rank]
        src = os.path.join(tmp, f".rank-{rank}")
        trace, ops = ("trace.json.gz", "ops.txt") if first else (f"trace_{rank}.json.gz", f"ops_{rank}.txt")
        try:
            if os.path.exists(os.path.join(src, "trace.json.gz")):
                os.rename(os.path.join(src, "trace.json.gz"), os.path.join(tmp, trace))
                held[rank] = trace
                files[trace] = (
                    f"worker trace of rank {rank} (its model steps; the engine core's own scheduling is not in it)"
                )
            if os.path.exists(os.path.join(src, "ops.txt")):
                os.rename(os.path.join(src, "ops.txt"), os.path.join(tmp, ops))
                files[ops] = f"operator table of rank {rank}"
        except OSError as exc:
            out["error"] = out["error"] or _os_error_text(exc, f"rank {rank}'s trace")
        if r.get("error"):
            out["error"] = out["error"] or f"{rank}: {r['error']}"
        found = int(r.get("steps_found") or 0)
        if first:
            out["steps_found"] = found
            out["where"] = r.get("export_in")
        elif found != out["steps_found"] and not out["error"]:
            out["error"] = (
                f"rank {rank}'s trace holds {found} ProfilerStep spans, the first rank's {out['steps_found']}"
            )
        out["trace_bytes"] += int(r.get("trace_bytes") or 0)
        out["events"] += int(r.get("events") or 0)
        for name, ms in (r.get("costs") or {}).items():
            job.costs[f"{rank}.{name}"] = ms
        first = False
    return out


def _history_at_window_end(history: StepHistory, job: CaptureJob) -> list[StepRecord]:
    """The reader's history once it holds the window's last step (the publisher reads the
    ring every few ms; at most ``WINDOW_READ_WAIT_S`` is waited for it)."""
    last = job.step_ids[-1] if job.step_ids else -1
    deadline = time.monotonic() + WINDOW_READ_WAIT_S
    while history.last_step_id < last and time.monotonic() < deadline:
        time.sleep(0.01)
    return history.recent_steps()


def _with_later(early: list[StepRecord], now: list[StepRecord]) -> list[StepRecord]:
    """``early`` and then the records of ``now`` that came after its last one."""
    last = early[-1].step_id if early else -1
    return early + [r for r in now if r.step_id > last]


def _missing_steps_note(job: CaptureJob, rows: list[StepRecord]) -> str | None:
    """Why ``steps.jsonl`` lacks some of the window's step records, or None when it has them all."""
    have = {r.step_id for r in rows}
    missing = [sid for sid in job.step_ids if sid not in have]
    if not missing:
        return None
    return (
        f"steps.jsonl lacks {len(missing)} of the window's {len(job.step_ids)} step records "
        f"(first {missing[0]}): the probe's reader had not read them {WINDOW_READ_WAIT_S:g} s after "
        "the window, or fell a whole ring behind (stats: ring_dropped)"
    )


def _window_steps(records: list[StepRecord], job: CaptureJob) -> list[tuple[Any, str]]:
    """``records`` (the reader's history) tagged: context, warm-up, window, after."""
    first = job.warmup_step if job.warmup_step is not None else (job.step_ids[0] if job.step_ids else 0)
    window = set(job.step_ids)
    lo = first - CONTEXT_STEPS
    trig = job.trigger
    if trig is not None and trig.step_id is not None:
        lo = min(lo, trig.step_id - TRIGGER_CONTEXT_STEPS)
    before = "before_trigger" if trig is not None else "before"
    out: list[tuple[Any, str]] = []
    for rec in records:
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


def _trigger_meta(job: CaptureJob, records: list[StepRecord]) -> dict[str, Any] | None:
    """Why a triggered capture exists: the rule, the value that fired it, when, and the
    delay from the offending step to the first *captured* step (the profiler's warm-up
    step comes before it and is not captured): ``delay_steps`` between their ids,
    ``delay_ms`` from the trigger's time (the offending step's end) to the captured
    step's start, both on the probe's clock as in ``steps.jsonl``.  None for a key press.
    """
    trig = job.trigger
    if trig is None:
        return None
    out: dict[str, Any] = to_builtins(trig)
    first = job.step_ids[0] if job.step_ids else None
    if trig.step_id is not None and first is not None:
        out["delay_steps"] = first - trig.step_id
    start = next((r.start_ns for r in records if r.step_id == first), None)
    if trig.ts_ns and start is not None:
        out["delay_ms"] = round((start - trig.ts_ns) / 1e6, 3)
    return out


def _ceiling(info: Any) -> dict[str, Any] | None:
    """The device ceiling the monitor used (for the report's roofline), or None."""
    try:
        from engine_adapters.definitions.ceilings import ceiling_for

        c = ceiling_for(info.device, info.dtype, quick=False)
    except Exception:
        return None
    return to_builtins(c) if c is not None else None
