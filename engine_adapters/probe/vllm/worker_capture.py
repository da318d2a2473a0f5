"""rltperf's capture inside one vLLM worker: ``torch.profiler`` over exactly N of its
steps, started and stopped on the worker's own thread, exported off it.

The worker's hooks (``worker_hooks.py``) call ``begin`` when an ``execute_model`` call
arrives and ``end`` when the step it began is over (its ``sample_tokens`` returned, or
``execute_model`` returned the step's output itself).  ``seq`` counts the worker's
``execute_model`` calls; the engine core counts the ones it dispatches the same way
(``core_capture.py``), so a step is named by the same number on both sides and on
every tensor-parallel rank.

A command in the worker's control block (``capture_block.py``) says: start at step
``start_seq``, N steps, ops or full.  At the start of step ``start_seq`` the worker
starts the probe's profiler (``capture.new_profiler``: one warm-up step, then N active
ones in segments of a few steps, so no step boundary stops more than a few steps' events
(``segments.py``): the trace holds one ``ProfilerStep#k`` span per captured step); each captured
step also gets a ``rltperf.step#<id>`` range, the engine core's step id (noted in the
block at its dispatch), as the probe's steps do.  At the end of step
``start_seq + N`` the profiler's last segment stops, on this thread (with the segment
boundaries, the one piece of capture work on the step path), and the export runs in a thread of its own: each segment's trace saved
and freed, then a child process (not a fork of the worker) for the merge and the
operator table (``export.export_trace_files``, the probe's own code).  The files go into
``<out_dir>/.rank-<rank>/``; the engine core seals them into its bundle.

The command's generation is the one word read per ``begin`` when no capture runs.
A cancel (the engine core's idle timeout) stops a running profiler at the next step
and discards its trace (torch's profiler state belongs to the thread that started it).
Nothing here raises into vLLM: every failure is the capture's, written into the block
with its reason (state ``FAILED``), and the step goes on.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from time import perf_counter_ns as _clk
from time import thread_time_ns as _cpu
from typing import Any

from engine_adapters.probe.vllm import capture_block as cb
from engine_adapters.probe.vllm.faults import Faults

log = logging.getLogger("vllm.rltperf")


class WorkerCapture:
    """The capture controller of one worker (its thread calls ``begin`` / ``end``).

    Args:
        block: this worker's control block (created by it).
        rank: the worker's name (``dp0-tp1``): its folder in the bundle.
        faults: injected faults (tests only; sites ``capture_start``, ``capture_stop``).
    """

    def __init__(
        self,
        block: cb.ControlBlock,
        rank: str,
        faults: Faults | None = None,
    ) -> None:
        self.block = block
        self.rank = rank
        self.faults = faults
        self.seq = 0
        self.gen_seen = block.command_gen()
        self.cmd: cb.Command | None = None
        self.state = cb.IDLE
        self.prof: Any = None
        self.in_step = False
        self._range: Any = None
        self.export_thread: threading.Thread | None = None

    # -- the step path -----------------------------------------------------------------------

    def begin(self) -> None:
        """An ``execute_model`` call arrived: count it; start or cancel a window."""
        self.seq += 1
        self.in_step = True
        g = self.block.command_gen()  # the one read per forward
        if g != self.gen_seen:
            self.gen_seen = g
            self._command()
        if self.state == cb.ARMED and self.cmd is not None and self.seq >= self.cmd.start_seq:
            self._start()
        elif self.state == cb.CAPTURING:
            self._open_range()

    def end(self) -> None:
        """The step ``begin`` opened is over (its output is ready)."""
        if not self.in_step:
            return
        self.in_step = False
        if self.state in (cb.WARMUP, cb.CAPTURING) and self.prof is not None:
            self._step_done()

    # -- commands --------------------------------------------------------------------------------

    def _command(self) -> None:
        cmd = self.block.read_command()
        if cmd.op == cb.OP_CANCEL:
            if self.cmd is not None and self.state in (cb.ARMED, cb.WARMUP, cb.CAPTURING):
                self._discard("cancelled by the engine core (idle timeout)", cb.CANCELLED)
            return
        if cmd.op != cb.OP_START:
            return
        if self.state == cb.EXPORTING:
            # answers the new command only: the running export keeps its own (older) generation
            self.block.begin_status(cmd.gen, self.seq)
            self.block.set_state(cb.FAILED, f"{self.rank} is still exporting capture "
                                 f"{self.cmd.capture_id if self.cmd else '?'}")  # fmt: skip
            return
        if self.state in (cb.ARMED, cb.WARMUP, cb.CAPTURING):
            # the engine core gave up on that window (its cancel overwritten by this command)
            self._close_range()
            prof, self.prof = self.prof, None
            if prof is not None:
                self._drop(prof)
        self.cmd = cmd
        self.block.begin_status(cmd.gen, self.seq)
        if self.seq > cmd.start_seq:
            self._fail(
                f"{self.rank} saw the command at its step {self.seq}, after the start step {cmd.start_seq}: "
                "its step count and the engine core's disagree"
            )
            return
        self.state = cb.ARMED

    def _start(self) -> None:
        cmd = self.cmd
        assert cmd is not None
        try:
            if self.faults is not None:
                self.faults.check("capture_start")
            from engine_adapters.probe.capture import new_profiler

            prof = new_profiler(cmd.steps, cmd.full)
            t0, c0 = _clk(), _cpu()
            prof.start()
            self._cost("profiler_start", t0, c0)
        except Exception as exc:
            self._fail(f"the profiler failed to start on {self.rank}: {type(exc).__name__}: {exc}")
            return
        self.prof = prof
        self.state = cb.WARMUP
        self.block.put(window_start_ns=_clk())
        self.block.set_state(cb.WARMUP)

    def _open_range(self) -> None:
        from engine_adapters.probe.segments import open_range

        sid = self.block.step_id(self.seq)  # the engine core's id of this step: the report matches it
        self._range = open_range(
            f"rltperf.step#{sid}" if sid is not None else f"rltperf.worker_step#{self.seq}"
        )

    def _close_range(self) -> None:
        from engine_adapters.probe.segments import close_range

        rf, self._range = self._range, None
        close_range(rf)

    def _step_done(self) -> None:
        cmd = self.cmd
        assert cmd is not None
        self._close_range()
        t0, c0 = _clk(), _cpu()
        try:
            if self.faults is not None:
                self.faults.check("capture_stop")
            self.prof.step()  # ends a segment at its boundaries; after the last step, the window
        except Exception as exc:
            self._discard(
                f"the profiler failed during the window on {self.rank}: {type(exc).__name__}: {exc}"
            )
            return
        b = self.block
        if self.state == cb.WARMUP:
            self.state = cb.CAPTURING
            b.put(first_seq=self.seq + 1)
            b.set_state(cb.CAPTURING)
            return
        done = self.seq - cmd.start_seq
        b.put(steps_done=done, last_seq=self.seq)
        if done < cmd.steps:
            return
        try:
            self.prof.stop()  # normally stopped by its last step already: a no-op then
        except Exception as exc:
            log.debug("worker profiler stop: %s", exc)
        self._cost("profiler_stop", t0, c0)
        now = _clk()
        b.put(window_end_ns=now, export_start_ns=now)
        self.state = cb.EXPORTING
        b.set_state(cb.EXPORTING)
        prof, self.prof = self.prof, None
        t = threading.Thread(target=self._export, args=(cmd, prof), name="rltperf-worker-export", daemon=True)
        self.export_thread = t
        t.start()

    # -- export (its own thread) -------------------------------------------------------------

    def _export(self, cmd: cb.Command, prof: Any) -> None:
        from engine_adapters.probe.export import export_trace_files
        from engine_adapters.probe.job import CaptureJob
        from engine_adapters.probe.segments import RELEASE_PAUSE_S, release_results

        b = self.block
        job = CaptureJob(capture_id=cmd.capture_id, steps=cmd.steps, mode="full" if cmd.full else "ops",
                         label="", requested_ns=0, prof=prof)  # fmt: skip
        err: str | None = None
        try:
            out = os.path.join(cmd.out_dir, f".rank-{self.rank}")
            os.makedirs(out, exist_ok=True)
            res = export_trace_files(job, out)
            err = res.get("error")
            b.put(trace_bytes=res.get("trace_bytes") or 0, events=res.get("events") or 0,
                  steps_found=res.get("steps_found") or 0,
                  export_in=cb.EXPORT_IN.index(res.get("where")) if res.get("where") in cb.EXPORT_IN else 0)  # fmt: skip
        except Exception as exc:
            err = f"export failed on {self.rank}: {type(exc).__name__}: {exc}"
        finally:
            t1, c1 = _clk(), _cpu()
            release_results(prof, RELEASE_PAUSE_S)
            job.prof = None
            self._cost("release", t1, c1)
            for name in ("save_ms", "save_cpu_ms"):
                if name in job.costs:
                    b.set_cost(name, job.costs[name])
            b.put(export_end_ns=_clk())
            self.state = cb.FAILED if err else cb.DONE
            b.set_state(self.state, err)

    # -- failures ----------------------------------------------------------------------------------

    def _cost(self, name: str, t0: int, c0: int) -> None:
        self.block.set_cost(f"{name}_ms", (_clk() - t0) / 1e6)
        self.block.set_cost(f"{name}_cpu_ms", (_cpu() - c0) / 1e6)

    def _fail(self, reason: str) -> None:
        log.warning("rltperf: capture failed on %s: %s; vLLM serves on", self.rank, reason)
        self.state = cb.FAILED
        self.block.set_state(cb.FAILED, reason)

    def _discard(self, reason: str, state: int = cb.FAILED) -> None:
        """End a window now, on this thread, and drop its trace."""
        self._close_range()
        prof, self.prof = self.prof, None
        if prof is not None:
            self._drop(prof)
        self.block.put(window_end_ns=_clk())
        if state == cb.FAILED:
            self._fail(reason)
        else:
            self.state = state
            self.block.set_state(state, reason)

    @staticmethod
    def _drop(prof: Any) -> None:
        """Stop a profiler on this thread and free its results unexported."""
        try:
            prof.stop()
        except Exception:
            pass
        from engine_adapters.probe.segments import release_results

        release_results(prof)

    def close(self, timeout: float = 5.0) -> None:
        """The worker stops: wait for a running export."""
        t = self.export_thread
        if t is not None and t.is_alive():
            t.join(timeout)


def warm(rank: str) -> float | None:
    """Pay the profiler's first use on this (the worker's) thread at start-up, and the
    imports a capture needs, so the first capture's start does not stall a step; None
    when it failed."""
    try:
        # everything a capture imports, imported now: never on a step (or under the GIL of its export)
        import engine_adapters.probe.export  # noqa: F401
        from engine_adapters.probe.capture import warm_profiler
        from engine_adapters.probe.job import CaptureJob  # noqa: F401

        s = warm_profiler()
        log.info("rltperf: worker %s profiler warmed in %.2f s", rank, s)
        return s
    except Exception as exc:
        log.warning("rltperf: worker %s profiler warm-up failed (%s: %s)", rank, type(exc).__name__, exc)
        return None


def wait_state(block: cb.ControlBlock, gen: int, states: tuple[int, ...], timeout: float) -> cb.Status:
    """Poll ``block`` until the status of command ``gen`` is in ``states`` (tests, tools)."""
    deadline = time.monotonic() + timeout
    while True:
        st = block.status()
        if (st.gen == gen and st.state in states) or time.monotonic() > deadline:
            return st
        time.sleep(0.01)
