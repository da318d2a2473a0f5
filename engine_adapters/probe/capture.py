"""Bounded profiler captures inside the engine process.

A ``Capture`` request (from any subscriber) arms the controller.  At the next step
boundary the engine thread starts the profiler (``new_profiler``): one warm-up step, in
which it is only prepared, then ``N`` active steps, each in one ``ProfilerStep#k`` span.
The window runs as consecutive ``torch.profiler`` sessions of a few steps each
(``segments.SegmentedProfile``): stopping a session post-processes every event it
collected, in C++ with the GIL held, on the thread that started it (torch 2.13's
``_disable_profiler``; no torch call ends collection without it), so one session over
the whole window put all of that in the gap after its last step (issue 20 §1).  Each
boundary now stops a segment whose stop cost the previous one measured to be near
``segments.SEGMENT_BUDGET_MS`` (one step when a step alone costs more).  The
Python-side processing (``key_averages``, the trace export, the segments' merge) is not
on the step loop but in the export, which runs in its own thread, from a forked child
(``export.py``); the steps that overlap it are flagged ``FLAG_EXPORTING`` by the
publisher.  At its end the results are freed, one segment at a time
(``export.release_results``): a stopped ``torch.profiler.profile`` refers to itself, and
left to the garbage collector each capture's results stayed in the engine's memory.

A window whose engine stops stepping (an idle server between bursts) ends after
``idle_timeout_s`` without a step: a partial bundle (``complete: false``, the reason in
``meta.json``, the steps that ran) is written and the next request is accepted.  The
profiler itself can only be stopped on the thread that started it (torch keeps its state
thread-local: a stop from another thread finds "no active profiling session"), so the
engine's next step stops it, before anything else, and its trace is discarded.

Modes: ``ops`` = CPU (+ CUDA) activities, no shapes, memory or stacks; ``full`` =
``record_shapes``, ``profile_memory`` and ``with_stack`` all on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from time import perf_counter_ns as _clk
from time import thread_time_ns as _cpu
from typing import Any

from engine_adapters.definitions.bundle import sanitize_label
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
from engine_adapters.probe.job import (
    CaptureJob,
    ExportWindows,
    budget_problem,
    note_cost,
    request_refusal,
    snapshot_usage,
)
from engine_adapters.probe.ring import ObservedStep, StepRing, StepSlot
from engine_adapters.probe.segments import SegmentedProfile, close_range, open_range, release_results

log = logging.getLogger("rltperf.probe.capture")

__all__ = ["CaptureController", "CaptureJob", "new_profiler", "snapshot_usage", "warm_profiler"]

ARM_TIMEOUT_S = 60.0
"""An armed capture whose engine runs no step for this long fails."""
IDLE_TIMEOUT_S = 5.0
"""Default: a window whose engine runs no step for this long ends with a partial bundle."""
SNAPSHOT_BUDGET_BYTES = 10 << 30
"""Default disk budget of the snapshot root (bundles only); a capture beyond it is refused."""
SNAPSHOT_BUDGET_COUNT = 1000
"""Default most bundles in the snapshot root; a capture beyond it is refused."""


def activities() -> list[Any]:
    """The profiler's activities here: CPU, and CUDA when there is a GPU."""
    import torch
    from torch.profiler import ProfilerActivity

    acts = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(ProfilerActivity.CUDA)
    return acts


def new_profiler(steps: int, full: bool) -> Any:
    """A capture's profiler (not started): one warm-up step then ``steps`` active ones,
    in segments (``segments.SegmentedProfile``: no step boundary stops more than a few
    steps' events), one ``ProfilerStep#k`` span per captured step; full mode records
    shapes, memory and stacks.  Shared by every capture path (the probe's, vLLM's
    workers')."""
    from torch.profiler import profile

    acts = activities()

    def make() -> Any:
        return profile(activities=acts, record_shapes=full, profile_memory=full, with_stack=full)

    return SegmentedProfile(steps, make)


def warm_profiler() -> float:
    """Pay the profiler's first-use initialisation (~1-2 s on a small CPU) on this
    thread now; returns the seconds it took."""
    import torch.profiler

    t0 = time.perf_counter()
    with torch.profiler.profile(activities=activities()) as prof:
        pass
    release_results(prof)
    return time.perf_counter() - t0


class CaptureController:
    """Arms, runs and hands off captures; one at a time.

    The step observer of ``ring`` while a capture is armed or running (``StepObserver``):
    arming sets ``ring.observer``, so the engine's next ``Probe.step`` comes to
    ``begin_step``; the window's steps are ``ObservedStep``s that report each stage
    boundary (profiler ranges) and each end (``prof.step()``, progress).  Replies go out
    through ``post``; the stopped profiler's job goes to ``export`` in its own thread.

    Args:
        ring: the probe's step ring.
        snapshot_root: where bundles go (for the snapshot budget).
        post: queues a control record for every subscriber (any thread).
        export: writes a job's bundle and posts its outcome (export thread).
        is_closed: True once the probe is shutting down (captures are refused).
        export_windows: where running exports are noted (the reader flags their steps).
    """

    def __init__(
        self,
        ring: StepRing,
        *,
        snapshot_root: str,
        post: Callable[[Any], None],
        export: Callable[[CaptureJob], Any],
        is_closed: Callable[[], bool] = lambda: False,
        export_windows: ExportWindows | None = None,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        budget_bytes: int | None = SNAPSHOT_BUDGET_BYTES,
        budget_count: int | None = SNAPSHOT_BUDGET_COUNT,
    ) -> None:
        if idle_timeout_s <= 0:
            raise ValueError(f"capture idle timeout must be positive, not {idle_timeout_s}")
        self.ring = ring
        self.snapshot_root = snapshot_root
        self._post = post
        self._export_job = export
        self._is_closed = is_closed
        self.export_windows = export_windows if export_windows is not None else ExportWindows()
        self._step = ObservedStep(ring, self)
        self.idle_timeout_s = idle_timeout_s
        self.budget_bytes = budget_bytes
        self.budget_count = budget_count
        self.job: CaptureJob | None = None
        self._stale: CaptureJob | None = None  # stalled window whose profiler the engine thread must stop
        self.warmed = False
        self.warm_s: float | None = None
        self._lock = threading.Lock()
        self._range: Any = None  # open record_function of the current stage
        self._step_range: Any = None
        self._export_thread: threading.Thread | None = None
        self.torch_error: str | None = None
        try:
            import torch.profiler  # noqa: F401
        except Exception as exc:  # the probe still times steps without torch
            self.torch_error = f"torch.profiler is not available: {exc}"

    # -- profiler set-up -----------------------------------------------------------------

    def warm(self) -> None:
        """Pay the profiler's first-use initialisation (~1-2 s on a small CPU) now."""
        if self.torch_error or self.warmed:
            return
        self.warm_s = warm_profiler()
        self.warmed = True
        log.info("profiler warmed in %.2f s", self.warm_s)

    # -- requests (publisher thread) -----------------------------------------------------

    def request(self, cap: Capture, live: dict[str, Any]) -> Refused | None:
        """Arm a capture; returns a ``Refused`` to send back when it cannot be armed."""
        refused = request_refusal(
            cap, self.torch_error, self._is_closed(), self.snapshot_root, self.budget_bytes, self.budget_count
        )
        if refused is not None:
            return refused
        with self._lock:
            job = self.job
            if job is not None:
                return Refused(
                    reason=f"a capture is already running ({job.capture_id}: {job.state}); one at a time",
                    capture_id=cap.capture_id,
                )
            self.job = CaptureJob(
                capture_id=cap.capture_id,
                steps=cap.steps,
                mode=cap.mode,
                label=sanitize_label(cap.label),
                requested_ns=_clk(),
                cold=not self.warmed,
                live_at_trigger=live,
                trigger=cap.trigger,
            )
            self.ring.observer = self
        log.info("capture %s armed: %d steps, %s", cap.capture_id, cap.steps, cap.mode)
        # The acceptance: a client prints "armed" only after this (a refusal comes instead).
        self._post(CaptureProgress(capture_id=cap.capture_id, steps_done=0, steps=cap.steps))
        return None

    def _over_budget(self) -> str | None:
        return budget_problem(self.snapshot_root, self.budget_bytes, self.budget_count)

    def check_timeout(self) -> None:
        """Fail an armed capture whose engine has not stepped for ``ARM_TIMEOUT_S``; end a
        window whose engine has not stepped for ``idle_timeout_s`` (publisher thread)."""
        job = self.job
        if job is None:
            return
        if job.state in ("warmup", "capturing"):
            self._check_idle(job)
            return
        if job.state != "armed":
            return
        if (_clk() - job.requested_ns) / 1e9 > ARM_TIMEOUT_S:
            with self._lock:
                if self.job is job and job.state == "armed":
                    self.ring.observer = self if self._stale is not None else None
                    self.job = None
                    job.state = "failed"
            if job.state == "failed":
                self._post(
                    CaptureFailed(
                        capture_id=job.capture_id,
                        reason=f"the engine ran no step within {ARM_TIMEOUT_S:.0f} s of the request (idle engine?)",
                    )
                )

    def _check_idle(self, job: CaptureJob) -> None:
        """A window with no step for ``idle_timeout_s``: hand the profiler to the engine
        thread to stop (``_stale``), free the controller, write the partial bundle."""
        idle_s = (_clk() - job.last_step_ns) / 1e9
        with self._lock:
            # in_step and state change only under this lock: a step starting now either
            # sees the job still running (and we leave it) or sees it stalled.
            if self.job is not job or job.in_step or job.state not in ("warmup", "capturing"):
                return
            if idle_s <= self.idle_timeout_s:
                return
            job.partial = (
                f"the engine ran no step for {idle_s:.1f} s (idle timeout {self.idle_timeout_s:g} s) after "
                f"{len(job.step_ids)} of {job.steps} steps: partial window, no trace (the profiler is stopped "
                "on the engine thread at its next step and that trace discarded)"
            )
            job.state = "stalled"
            job.window_end_ns = job.last_step_ns
            self._stale = job
            self.job = None
            # ring.observer stays set: the next step comes through begin_step and stops it.
        log.warning("capture %s: %s", job.capture_id, job.partial)
        t = threading.Thread(target=self._export, args=(job,), name="rltperf-export-partial", daemon=True)
        self._export_thread = t
        t.start()

    # -- engine thread -------------------------------------------------------------------

    def _stop_stale(self, job: CaptureJob) -> None:
        """Stop a stalled window's profiler on this (the engine's) thread; drop its trace."""
        self.stage_ends()
        try:
            job.prof.stop()
        except Exception as exc:
            log.debug("stale profiler stop: %s", exc)
        release_results(job.prof)
        job.prof = None

    # -- the step observer (engine thread) -------------------------------------------------

    def begin_step(self, kind: str, batch: int, tokens: int) -> StepSlot:
        """``Probe.step()`` while a capture is armed or running."""
        ring = self.ring
        with self._lock:
            stale, self._stale = self._stale, None
            job = self.job
            if job is None:  # disarmed meanwhile (under the lock: a request arming now wins)
                ring.observer = None
            elif job.state in ("armed", "warmup", "capturing"):
                job.in_step = True
        if stale is not None:
            self._stop_stale(stale)
        if job is None:
            return ring.begin(kind, batch, tokens)
        if job.state == "armed":
            try:
                self._start_profiler(job)
            except Exception as exc:
                self._fail(job, f"the profiler failed to start: {type(exc).__name__}: {exc}")
                return ring.begin(kind, batch, tokens)
            flags = FLAG_PROFILED | FLAG_PROFILER_WARMUP
        else:
            flags = FLAG_PROFILED
        slot = ring.begin_observed(self._step, kind, batch, tokens, flags)
        job.slot_ids.append(slot.step_id)
        if job.state == "warmup":
            job.warmup_step = slot.step_id
        self._step_range = open_range(f"rltperf.step#{slot.step_id} {kind}")
        return slot

    def _start_profiler(self, job: CaptureJob) -> None:
        prof = new_profiler(job.steps, job.full)
        t0, c0 = _clk(), _cpu()
        prof.start()
        note_cost(job, "profiler_start", t0, c0)
        job.prof = prof
        job.state = "warmup"
        job.started_ns = job.last_step_ns = _clk()

    def stage_begins(self, name: str) -> None:
        """Open a ``stage:<name>`` profiler range (closing the previous one)."""
        self.stage_ends()
        self._range = open_range(f"stage:{name}")

    def stage_ends(self) -> None:
        """Close the open stage range, if any."""
        rf, self._range = self._range, None
        close_range(rf)

    def step_ended(self, step: StepSlot) -> None:
        """End of a step inside the capture: step the profiler, post progress."""
        job = self.job
        if job is None or job.prof is None:
            return
        try:
            self._after_step(job, step)
        finally:
            with self._lock:
                job.in_step = False
                job.last_step_ns = _clk()

    def _after_step(self, job: CaptureJob, slot: StepSlot) -> None:
        rf, self._step_range = self._step_range, None
        close_range(rf)
        # At a segment boundary this stops one segment and starts the next; after the last step, the window.
        t0, c0 = _clk(), _cpu()
        try:
            job.prof.step()
        except Exception as exc:
            self._finish_window(job)
            self._fail(job, f"the profiler failed during the window: {type(exc).__name__}: {exc}")
            return
        if job.state == "warmup":
            job.state = "capturing"
            job.first_step = slot.step_id + 1
            self._post(
                CaptureStarted(
                    capture_id=job.capture_id,
                    first_step=job.first_step,
                    steps=job.steps,
                    mode=job.mode,
                    cold=job.cold,
                )
            )
            return
        job.step_ids.append(slot.step_id)
        done = len(job.step_ids)
        if done < job.steps:
            self._post(CaptureProgress(capture_id=job.capture_id, steps_done=done, steps=job.steps))
            return
        self._finish_window(job)
        note_cost(job, "profiler_stop", t0, c0)
        job.window_end_ns = _clk()
        job.state = "exporting"
        job.export_start_ns = job.window_end_ns
        self.export_windows.begin(job.export_start_ns)
        self._post(CaptureProgress(capture_id=job.capture_id, steps_done=done, steps=job.steps))
        self._post(CaptureExporting(capture_id=job.capture_id, since_ns=job.export_start_ns))
        t = threading.Thread(target=self._export, args=(job,), name="rltperf-export", daemon=True)
        self._export_thread = t
        t.start()

    def _finish_window(self, job: CaptureJob) -> None:
        """Stop the profiler (engine thread); the steps after this one are plain again."""
        self.ring.observer = None
        self.stage_ends()
        try:
            job.prof.stop()
        except Exception as exc:  # already stopped by its last step, or broken
            log.debug("profiler stop: %s", exc)

    # -- export thread -------------------------------------------------------------------

    def _export(self, job: CaptureJob) -> None:
        try:
            self._export_job(job)
        except Exception as exc:  # write_bundle reports its own errors; this is a bug guard
            log.exception("capture export crashed")
            job.error = job.error or f"export crashed: {type(exc).__name__}: {exc}"
            self._post(CaptureFailed(capture_id=job.capture_id, reason=job.error))
        finally:
            if job.partial is None and job.prof is not None:  # the writer released it, unless it crashed
                release_results(job.prof)
                job.prof = None
            job.export_end_ns = _clk()
            if job.export_start_ns is not None:
                self.export_windows.end(job.export_start_ns, job.export_end_ns)
            with self._lock:
                if self.job is job:
                    self.job = None

    # -- helpers ---------------------------------------------------------------------------

    def _fail(self, job: CaptureJob, reason: str) -> None:
        log.warning("capture %s failed: %s", job.capture_id, reason)
        job.state = "failed"
        job.error = reason
        if job.prof is not None:  # stopped by _finish_window (or never started): nothing exports it
            release_results(job.prof)
            job.prof = None
        with self._lock:
            if self.job is job:
                self.job = None
                self.ring.observer = self if self._stale is not None else None
        self._post(CaptureFailed(capture_id=job.capture_id, reason=reason))

    def close(self, timeout: float = 10.0) -> None:
        """Engine stopping: end a window in progress, wait for a running export."""
        job = self.job
        if job is not None and job.state in ("warmup", "capturing"):
            self._finish_window(job)
            self._fail(job, f"the engine stopped after {len(job.step_ids)} of {job.steps} steps")
        elif job is not None and job.state == "armed":
            self._fail(job, "the engine stopped before the capture started")
        stale, self._stale = self._stale, None
        if stale is not None:  # close() runs on the engine's thread after its loop, normally
            self._stop_stale(stale)
        t = self._export_thread
        if t is not None and t.is_alive():
            t.join(timeout)
