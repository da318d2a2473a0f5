"""Captures of a vLLM server, from the engine core's probe: the workers profile, the
engine core decides when and writes the bundle.

The engine core's probe serves ``Capture`` requests like any probe (same checks: id,
mode, N, the snapshot budget, one at a time), but the model runs in vLLM's workers, so
the profiler is theirs (``worker_capture.py``), driven through one control block per
worker (``capture_block.py``):

1. ``request`` (publisher thread) accepts and arms; the bundle's temp folder is made.
2. ``dispatch`` (engine thread, in the tap's ``execute_model`` wrapper) counts the
   steps the engine core dispatches to its workers; the first dispatch after arming
   writes the command into every worker's block, *before* that step is sent: start at
   this step (the profiler's warm-up step), N steps.  Every worker counts the same
   ``execute_model`` calls, so every rank starts, and stops, at the same steps.
3. A thread of this controller follows the workers' status words (every 10 ms):
   ``CaptureStarted`` when every rank is past its warm-up step, progress, exporting;
   when every rank has exported, the probe's ``BundleWriter`` seals one bundle with
   each rank's trace, the engine core's meta and ``steps.jsonl`` (the engine core's
   step records, captured steps flagged).  A rank's failure fails the capture with its
   reason (the others are cancelled).
4. Idle: when the engine core runs no step for ``idle_timeout_s`` while armed or in
   the window (none in flight, none dispatched: a long step is not idle), the capture ends as a partial bundle (its steps so far, no trace) and
   the workers are told to cancel (each drops its window at its next step).

The one cost on the engine thread outside a capture is ``dispatch``'s counter.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from time import perf_counter_ns as _clk
from typing import Any

from engine_adapters.definitions.bundle import (
    sanitize_label,
    temp_bundle_dir,
)
from engine_adapters.definitions.records import (
    FLAG_PROFILED,
    FLAG_PROFILER_WARMUP,
    Capture,
    CaptureExporting,
    CaptureFailed,
    CaptureProgress,
    CaptureStarted,
    Refused,
)
from engine_adapters.probe.job import CaptureJob, ExportWindows, request_refusal
from engine_adapters.probe.vllm import capture_block as cb

log = logging.getLogger("vllm.rltperf")

VIA = "rltperf in vLLM's workers: each worker's own torch.profiler (no --profiler-config, no restart)"
"""``meta.json`` ``capture.via`` and the path a capture took, in words."""
POLL_S = 0.01
LATE_STEPS = 64
"""Steps dispatched after the window's end by which every worker must have stopped."""
EXPORT_WAIT_S = 330.0
"""Longest wait for the workers' exports (theirs give up after ``export.EXPORT_CHILD_TIMEOUT_S``)."""


class WorkerCaptures:
    """The engine core's side of worker captures (``CaptureService`` of the publisher).

    Args:
        blocks: rank -> its mapped control block, or the reason there is none.
        snapshot_root, post, writer, is_closed, export_windows, idle_timeout_s,
        budget_bytes, budget_count: as the probe's ``CaptureController``'s.
    """

    def __init__(
        self,
        blocks: dict[str, cb.ControlBlock | str],
        *,
        snapshot_root: str,
        post: Callable[[Any], None],
        writer: Any,
        is_closed: Callable[[], bool],
        export_windows: ExportWindows,
        idle_timeout_s: float,
        budget_bytes: int | None,
        budget_count: int | None,
    ) -> None:
        self.blocks = {r: b for r, b in blocks.items() if isinstance(b, cb.ControlBlock)}
        self.ranks = list(blocks)
        missing = {r: b for r, b in blocks.items() if isinstance(b, str)}
        self.torch_error: str | None = (
            "captures need every worker's capture control block: "
            + "; ".join(f"{r}: {why}" for r, why in missing.items())
            if missing
            else None
        )
        self.snapshot_root = snapshot_root
        self._post = post
        self._writer = writer
        self._is_closed = is_closed
        self.export_windows = export_windows
        self.idle_timeout_s = idle_timeout_s
        self.budget_bytes = budget_bytes
        self.budget_count = budget_count
        self.seq = 0
        """Steps dispatched to the workers since the tap was installed (engine thread)."""
        self.last_dispatch_ns = _clk()
        self.in_flight = False
        """A dispatched step has not ended yet (engine thread)."""
        self.pending: CaptureJob | None = None
        """Armed, waiting for the next dispatch (engine thread takes it)."""
        self.job: CaptureJob | None = None
        self.start_seq = 0
        self.gens: dict[str, int] = {}
        self.step_of: dict[int, int] = {}
        """Dispatch seq -> the engine core's step id, inside a window."""
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # -- requests (publisher thread) -----------------------------------------------------------

    def request(self, cap: Capture, live: dict[str, Any]) -> Refused | None:
        """Arm a capture; a ``Refused`` when it cannot be."""
        refused = request_refusal(
            cap, self.torch_error, self._is_closed(), self.snapshot_root, self.budget_bytes, self.budget_count
        )
        if refused is not None:
            return refused
        with self._lock:
            if self.job is not None:
                j = self.job
                return Refused(reason=f"a capture is already running ({j.capture_id}: {j.state}); one at a time",
                               capture_id=cap.capture_id)  # fmt: skip
            job = CaptureJob(
                capture_id=cap.capture_id, steps=cap.steps, mode=cap.mode, label=sanitize_label(cap.label),
                requested_ns=_clk(), live_at_trigger=live, trigger=cap.trigger, via=VIA, ranks={},
                expected_ranks=list(self.ranks),
            )  # fmt: skip
            tmp = temp_bundle_dir(self.snapshot_root, job.capture_id)
            try:
                os.makedirs(self.snapshot_root, exist_ok=True)
                os.mkdir(tmp)
            except OSError as exc:
                from engine_adapters.definitions.bundle import os_error_text

                return Refused(reason=os_error_text(exc, f"the bundle under {self.snapshot_root}"),
                               capture_id=cap.capture_id)  # fmt: skip
            job.last_step_ns = _clk()
            self.job = job
            self.pending = job
        log.info("rltperf: worker capture %s armed: %d steps, %s, ranks %s", job.capture_id, job.steps, job.mode,
                 ", ".join(self.ranks))  # fmt: skip
        self._post(CaptureProgress(capture_id=job.capture_id, steps_done=0, steps=job.steps))
        t = threading.Thread(target=self._follow, args=(job, tmp), name="rltperf-worker-capture", daemon=True)
        self._thread = t
        t.start()
        return None

    def check_timeout(self) -> None:
        """Timeouts are the following thread's (``_follow``)."""

    # -- engine thread --------------------------------------------------------------------------

    def dispatch(self, step_id: int) -> None:
        """The engine core is about to send a step (``execute_model``) to its workers."""
        self.seq += 1
        self.in_flight = True
        self.last_dispatch_ns = _clk()
        job = self.pending
        if job is not None:
            self.pending = None
            self.start_seq = self.seq
            self.step_of = {}
            out = temp_bundle_dir(self.snapshot_root, job.capture_id)
            self.gens = {r: b.command(cb.OP_START, self.seq, job.steps, job.full, job.capture_id, out)
                         for r, b in self.blocks.items()}  # fmt: skip
            job.state = "warmup"
            job.started_ns = self.last_dispatch_ns
        if self.job is not None and self.start_seq and self.seq <= self.start_seq + (self.job.steps):
            self.step_of[self.seq] = step_id
            for b in self.blocks.values():
                b.note_step(self.seq, step_id)

    def step_over(self) -> None:
        """The engine core's step ended (the workers' step with it): from now on, no new
        dispatch for ``idle_timeout_s`` is a quiet engine (a long step is not)."""
        self.in_flight = False
        self.last_dispatch_ns = _clk()

    def flags(self, step_id: int) -> int:
        """``FLAG_PROFILED`` (+ warm-up) for a step the workers profiled (engine thread)."""
        job = self.job
        if job is None or not self.step_of:
            return 0
        if step_id == self.step_of.get(self.start_seq):
            return FLAG_PROFILED | FLAG_PROFILER_WARMUP
        return FLAG_PROFILED if step_id in self.step_of.values() else 0

    # -- following the workers (own thread) ------------------------------------------------------

    def _statuses(self) -> dict[str, cb.Status]:
        return {r: b.status() for r, b in self.blocks.items()}

    def _follow(self, job: CaptureJob, tmp: str) -> None:
        try:
            self._follow_window(job, tmp)
        except Exception as exc:  # a bug here: the capture fails, vLLM serves on
            log.exception("rltperf: worker capture %s crashed", job.capture_id)
            self._end(job, tmp, f"the capture crashed in the engine core: {type(exc).__name__}: {exc}")

    def _follow_window(self, job: CaptureJob, tmp: str) -> None:
        posted_start = exporting = False
        done_seen = 0
        seen_seq = self.seq
        while True:
            time.sleep(POLL_S)
            if self._is_closed():
                return self._end(job, tmp, "the engine stopped during the capture", cancel=True)
            if self.seq != seen_seq or self.in_flight:
                seen_seq = self.seq
                job.last_step_ns = _clk() if self.in_flight else max(job.last_step_ns, self.last_dispatch_ns)
            if job.state in ("armed", "warmup", "capturing"):
                idle_s = (_clk() - job.last_step_ns) / 1e9
                if idle_s > self.idle_timeout_s:
                    return self._partial(job, tmp, idle_s)
            if job.state == "armed":
                continue
            got = self._statuses()
            sts = [s for r, s in got.items() if s.gen == self.gens.get(r)]
            late = self.seq - (self.start_seq + job.steps)
            if late > LATE_STEPS and not all(s.state >= cb.EXPORTING for s in sts):
                slow = [
                    f"{r} ({s.state_name if s.gen == self.gens.get(r) else 'no answer'})"
                    for r, s in got.items()
                ]
                return self._end(job, tmp, f"{late} steps after the window's end not every worker had stopped: "
                                 f"{', '.join(slow)} (its capture controller is off? see the worker's log)",
                                 cancel=True)  # fmt: skip
            if len(sts) < len(self.blocks):
                continue  # a worker has not seen the command yet
            failed = [
                (r, s) for r, s in zip(self.blocks, sts, strict=True) if s.state in (cb.FAILED, cb.CANCELLED)
            ]
            if failed:
                r, s = failed[0]
                return self._end(job, tmp, f"{r}: {s.error or s.state_name}", cancel=True)
            if not posted_start and all(s.state >= cb.CAPTURING for s in sts):
                posted_start = True
                job.state = "capturing"
                job.warmup_step = self.step_of.get(self.start_seq)
                job.first_step = self.step_of.get(self.start_seq + 1)
                self._post(CaptureStarted(capture_id=job.capture_id, first_step=job.first_step or 0,
                                          steps=job.steps, mode=job.mode, cold=False))  # fmt: skip
            done = min(s.steps_done for s in sts)
            if posted_start and done > done_seen and done < job.steps:
                done_seen = done
                self._post(CaptureProgress(capture_id=job.capture_id, steps_done=done, steps=job.steps))
            if not exporting and all(s.state >= cb.EXPORTING for s in sts):
                exporting = True
                job.state = "exporting"
                job.window_end_ns = max(s.window_end_ns for s in sts)
                job.export_start_ns = min(s.export_start_ns for s in sts)
                job.step_ids = [self.step_of[q] for q in range(self.start_seq + 1, self.start_seq + job.steps + 1)
                                if q in self.step_of]  # fmt: skip
                self.export_windows.begin(job.export_start_ns)
                self._post(CaptureProgress(capture_id=job.capture_id, steps_done=job.steps, steps=job.steps))
                self._post(CaptureExporting(capture_id=job.capture_id, since_ns=job.export_start_ns))
            if exporting and all(s.state == cb.DONE for s in sts):
                return self._seal(job, tmp, dict(zip(self.blocks, sts, strict=True)))
            if exporting and (_clk() - (job.export_start_ns or 0)) / 1e9 > EXPORT_WAIT_S:
                return self._end(job, tmp, f"the workers' exports did not end within {EXPORT_WAIT_S:.0f} s")

    def _seal(self, job: CaptureJob, tmp: str, sts: dict[str, cb.Status]) -> None:
        job.ranks = {
            r: {"steps_found": s.steps_found, "events": s.events, "trace_bytes": s.trace_bytes,
                "export_in": s.export_in, "costs": s.costs, "error": s.error,
                "first_seq": s.first_seq, "last_seq": s.last_seq}
            for r, s in sts.items()
        }  # fmt: skip
        firsts = {s.first_seq for s in sts.values()}
        if len(firsts) > 1 or firsts != {self.start_seq + 1}:
            job.error = f"the ranks did not capture the same steps: first steps {sorted(firsts)}, expected {self.start_seq + 1}"
        job.export_end_ns = max(s.export_end_ns for s in sts.values())
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            self._writer.write(job)
            log.info("rltperf: worker capture %s: bundle written in %.1f ms (%.1f ms CPU of the engine core)",
                     job.capture_id, (time.perf_counter() - t0) * 1e3, (time.thread_time() - c0) * 1e3)  # fmt: skip
        finally:
            self.export_windows.end(job.export_start_ns or 0, job.export_end_ns)
            self._release(job)

    def _partial(self, job: CaptureJob, tmp: str, idle_s: float) -> None:
        self._cancel()
        step_of = dict(self.step_of)
        done = len([q for q in step_of if q > self.start_seq]) if job.started_ns else 0
        job.partial = (
            f"the engine ran no step for {idle_s:.1f} s (idle timeout {self.idle_timeout_s:g} s) after {done} of "
            f"{job.steps} steps: partial window, no trace (each worker drops its profiler at its next step)"
        )
        job.step_ids = [step_of[q] for q in sorted(step_of) if q > self.start_seq]
        job.warmup_step = step_of.get(self.start_seq)
        job.window_end_ns = job.last_step_ns
        job.ranks = None  # no trace: the writer's partial path
        log.warning("rltperf: worker capture %s: %s", job.capture_id, job.partial)
        try:
            self._writer.write(job)
        finally:
            self._release(job)

    def _end(self, job: CaptureJob, tmp: str, reason: str, cancel: bool = False) -> None:
        if cancel:
            self._cancel()
        job.state = "failed"
        job.error = reason
        log.warning("rltperf: worker capture %s failed: %s; vLLM serves on", job.capture_id, reason)
        shutil.rmtree(tmp, ignore_errors=True)
        self._release(job)
        self._post(CaptureFailed(capture_id=job.capture_id, reason=reason))

    def _cancel(self) -> None:
        with self._lock:
            self.pending = None
        for r, b in self.blocks.items():
            self.gens[r] = b.command(cb.OP_CANCEL, 0, 0, False, "", "")

    def _release(self, job: CaptureJob) -> None:
        with self._lock:
            if self.job is job:
                self.job = None
                self.pending = None
                self.step_of = {}
                self.start_seq = 0

    def close(self, timeout: float = 10.0) -> None:
        """The engine core stops: end a capture in progress (its thread sees ``is_closed``)."""
        t = self._thread
        if t is not None and t.is_alive():
            t.join(timeout)
        for b in self.blocks.values():
            b.close()


def open_blocks(base: str | None, dp: int, tp_size: int, pp_size: int) -> dict[str, cb.ControlBlock | str]:
    """Map the control blocks of this engine core's workers (rank -> block, or why not),
    and remove their names: the mappings stay valid, nothing is left in ``/dev/shm``."""
    from engine_adapters.definitions.ranks import rank_name, worker_tag

    out: dict[str, cb.ControlBlock | str] = {}
    for p in range(max(1, pp_size)):
        for t in range(max(1, tp_size)):
            rank = rank_name(dp, worker_tag(t, p, pp_size))
            if not base:
                out[rank] = f"{cb.ENV_CTL} is not set"
                continue
            path = cb.block_path(base, dp, p, t)
            try:
                out[rank] = cb.ControlBlock.open(path)
            except OSError as exc:
                out[rank] = f"no control block at {path} ({exc}); see the worker's log"
                continue
            try:
                os.unlink(path)
            except OSError:
                pass
    return out
