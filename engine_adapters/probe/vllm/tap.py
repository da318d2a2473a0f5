"""The tap: the engine core's hooks (``hooks.py`` installs them) and the probe they feed.

``Tap.install`` wraps the engine core's instance methods (``step_fn``, the scheduler's
``schedule`` / ``update_from_output``, the executor's ``execute_model`` /
``sample_tokens``, ``add_request`` / ``abort_requests``, ``profile``); ``Tap._finish``
turns each engine step into a step record and the request hooks into request records.
What each hook point is, and the promise that nothing here breaks vLLM, are
``hooks.py``'s docstring.  The executor's ``execute_model`` also counts the steps the
engine core dispatches to its workers, for the workers' captures (``core_capture.py``).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from time import perf_counter_ns as _clk
from typing import Any

from engine_adapters.definitions.records import FLAG_PROFILED
from engine_adapters.probe.vllm import faults
from engine_adapters.probe.vllm.engine_facts import kv_blocks

log = logging.getLogger("vllm.rltperf")  # under vLLM's logger: appears in the server log

MAX_TRACKED_REQUESTS = 200_000
"""Requests tracked for request records; beyond this the oldest are forgotten."""


@dataclass
class _Req:
    arrival_ns: int
    prompt: int
    first_ns: int | None = None
    out: int = 0


_STATUS = {"STOP": "ok", "LENGTH": "ok", "REPETITION": "ok", "ABORT": "aborted", "ERROR": "failed"}


class Tap:
    """The hooks on one engine core and the probe they feed."""

    def __init__(self, core: Any, probe: Any, loop_factor: float) -> None:
        self.core = core
        self.probe = probe
        self.loop_factor = loop_factor
        self.slot: Any = None
        self.scheduled: Any = None
        self.completed: Any = None
        self.outputs: Any = None
        self.profiling = False
        self.broken = False
        self.reqs: OrderedDict[str, _Req] = OrderedDict()
        self.steps = 0
        self.loops: Any = None  # loops.LoopFacts for a looped model whose structure is known
        self.faults: faults.Faults | None = None  # injected faults (tests only)
        self.captures: Any = None  # core_capture.WorkerCaptures: counts dispatched steps
        from vllm.v1.utils import compute_iteration_details

        self._details = compute_iteration_details

    def _disable(self, where: str, exc: BaseException) -> None:
        if not self.broken:
            self.broken = True
            self.slot = None
            why = f"{where} failed ({type(exc).__name__}: {exc})"
            log.warning("rltperf plugin: %s; the plugin stops recording, vLLM runs on", why)
            # subscribers learn why the stream ends; never on the engine's thread (close joins)
            threading.Thread(target=self._close_quietly, args=(f"rltperf plugin stopped recording: {why}",),
                             name="rltperf-disable", daemon=True).start()  # fmt: skip

    def _close_quietly(self, reason: str) -> None:
        try:
            self.probe.close(reason, timeout=2.0)
        except Exception:
            pass

    def _mark(self, name: str) -> None:
        st = self.slot
        if st is not None:
            try:
                st.mark(name)
                # checked after the mark: the check's stat() lets other threads take the
                # GIL, and that time belongs to the stage, not to the gap before it
                if self.faults is not None:
                    self.faults.check("probe_mark")
            except Exception as exc:
                self._disable(f"marking stage {name}", exc)

    def _wrap_future(self, fut: Any) -> Any:
        orig = getattr(fut, "result", None)
        if orig is None:
            return fut
        tap = self

        def result(*a: Any, **k: Any) -> Any:
            tap._mark("wait_model")
            return orig(*a, **k)

        try:
            fut.result = result
        except Exception:
            pass
        return fut

    def install(self) -> None:
        """Wrap the engine core's instance methods (see the module docstring)."""
        core = self.core
        sched = core.scheduler
        ex = core.model_executor
        tap = self
        orig_step = core.step_fn
        orig_schedule = sched.schedule
        orig_update = sched.update_from_output
        orig_exec = ex.execute_model
        orig_sample = ex.sample_tokens
        orig_add = core.add_request
        orig_abort = core.abort_requests
        orig_profile = core.profile

        @functools.wraps(orig_step)
        def step_fn() -> Any:
            if tap.broken:
                return orig_step()
            try:
                if tap.faults is not None:
                    tap.faults.check("probe_step")
                st = tap.probe.step()
            except Exception as exc:
                tap._disable("starting a step record (probe.step)", exc)
                return orig_step()
            tap.slot, tap.scheduled, tap.completed, tap.outputs = st, None, None, None
            tap._mark("schedule")
            if tap.broken:
                return orig_step()
            try:
                return orig_step()
            finally:
                tap.slot = None
                caps = tap.captures
                if caps is not None:
                    caps.step_over()  # a long step is not a quiet engine
                if not tap.broken and (tap.scheduled is not None or tap.completed is not None):
                    try:
                        tap._finish(st)
                    except Exception as exc:
                        tap._disable("recording a step", exc)
                # else: nothing scheduled or completed; the slot is reused by the next step

        @functools.wraps(orig_schedule)
        def schedule(*a: Any, **k: Any) -> Any:
            out = orig_schedule(*a, **k)
            if tap.slot is not None:
                tap.scheduled = out
            return out

        @functools.wraps(orig_exec)
        def execute_model(*a: Any, **k: Any) -> Any:
            tap._mark("execute_model")
            caps = tap.captures
            if caps is not None:  # counted even when recording broke: the workers count every step
                try:
                    st = tap.slot
                    caps.dispatch(st.step_id if st is not None else -1)
                except Exception as exc:
                    tap.captures = None
                    log.warning("rltperf plugin: worker captures stopped (%s: %s); vLLM runs on",
                                type(exc).__name__, exc)  # fmt: skip
            return tap._wrap_future(orig_exec(*a, **k))

        @functools.wraps(orig_sample)
        def sample_tokens(*a: Any, **k: Any) -> Any:
            tap._mark("sample")
            return tap._wrap_future(orig_sample(*a, **k))

        @functools.wraps(orig_update)
        def update_from_output(scheduler_output: Any, model_output: Any, *a: Any, **k: Any) -> Any:
            tap._mark("update")
            outs = orig_update(scheduler_output, model_output, *a, **k)
            if not tap.broken:
                try:
                    if tap.slot is not None:
                        tap.completed, tap.outputs = scheduler_output, outs
                    tap._requests(outs)
                except Exception as exc:
                    tap._disable("reading the step's outputs", exc)
            return outs

        @functools.wraps(orig_add)
        def add_request(request: Any, *a: Any, **k: Any) -> Any:
            if not tap.broken:
                try:
                    tap._arrived(request)
                except Exception as exc:
                    tap._disable("noting a request", exc)
            return orig_add(request, *a, **k)

        @functools.wraps(orig_abort)
        def abort_requests(request_ids: Any, *a: Any, **k: Any) -> Any:
            out = orig_abort(request_ids, *a, **k)
            if not tap.broken:
                try:
                    now = _clk()
                    for rid in request_ids if not isinstance(request_ids, str) else (request_ids,):
                        tap._done(rid, now, "aborted")
                except Exception as exc:
                    tap._disable("noting an abort", exc)
            return out

        @functools.wraps(orig_profile)  # keeps the signature: vLLM inspects utility methods' parameters
        def profile(is_start: bool = True, *a: Any, **k: Any) -> Any:
            out = orig_profile(is_start, *a, **k)
            tap.profiling = bool(is_start)
            return out

        core.step_fn = step_fn
        sched.schedule = schedule
        sched.update_from_output = update_from_output
        ex.execute_model = execute_model
        ex.sample_tokens = sample_tokens
        core.add_request = add_request
        core.abort_requests = abort_requests
        core.profile = profile

    # -- requests ----------------------------------------------------------------------------

    def _arrived(self, request: Any) -> None:
        now = _clk()
        arrival = getattr(request, "arrival_time", None)
        arrival_ns = now
        if isinstance(arrival, (int, float)) and arrival > 0:
            arrival_ns = now - max(0, int((time.time() - arrival) * 1e9))
        self.reqs[str(request.request_id)] = _Req(
            arrival_ns=arrival_ns, prompt=int(request.num_prompt_tokens or 0)
        )
        if len(self.reqs) > MAX_TRACKED_REQUESTS:
            self.reqs.popitem(last=False)

    def _done(self, rid: str, now: int, status: str) -> None:
        r = self.reqs.pop(rid, None)
        if r is None:
            return
        self.probe.request_done(rid, r.arrival_ns, now, r.first_ns, r.prompt, r.out, status)

    def _requests(self, outs: Any) -> None:
        if not outs:
            return
        now = _clk()
        for eco in outs.values():
            for o in eco.outputs:
                r = self.reqs.get(o.request_id)
                if r is None:
                    continue
                n = len(o.new_token_ids)
                if n:
                    if r.first_ns is None:
                        r.first_ns = now
                    r.out += n
                if o.finish_reason is not None:
                    self._done(o.request_id, now, _STATUS.get(o.finish_reason.name, "failed"))

    # -- step records ------------------------------------------------------------------------

    def _finish(self, st: Any) -> None:
        so = self.completed
        sched = self.core.scheduler
        facts: dict[str, Any] = {}
        if so is not None and so.total_num_scheduled_tokens > 0:
            d = self._details(so)
            st.batch = len(so.num_scheduled_tokens)
            st.tokens = int(so.total_num_scheduled_tokens)
            facts["prefill_tokens"] = int(d.num_ctx_tokens)
            if d.num_generation_requests == 0:
                st.kind = "prefill"
            elif d.num_ctx_requests == 0:
                st.kind = "decode"
            else:
                st.kind = "mixed"
        else:
            st.kind, st.batch, st.tokens = "idle", 0, 0
        stats = None
        out_tokens = 0
        if self.outputs:
            for eco in self.outputs.values():
                if eco.scheduler_stats is not None:
                    stats = eco.scheduler_stats
                for o in eco.outputs:
                    out_tokens += len(o.new_token_ids)
        facts["out_tokens"] = out_tokens
        if stats is not None:
            facts["running"] = stats.num_running_reqs
            facts["waiting"] = stats.num_waiting_reqs + getattr(stats, "num_skipped_waiting_reqs", 0)
            sd = stats.spec_decoding_stats
            if sd is not None:
                facts["spec_drafts"] = int(sd.num_drafts)
                facts["spec_drafted"] = int(sd.num_draft_tokens)
                facts["spec_accepted"] = int(sd.num_accepted_tokens)
            ps = stats.perf_stats
            if ps is not None:
                f = self.loop_factor
                facts["bytes_read"] = int(ps.num_read_bytes_per_gpu * f)
                facts["bytes_written"] = int(ps.num_write_bytes_per_gpu * f)
                facts["flops"] = float(ps.num_flops_per_gpu * f)
        else:
            running, waiting = sched.get_request_counts()
            facts["running"], facts["waiting"] = running, waiting
        used, total = kv_blocks(sched)
        if total is not None:
            facts["kv_used"], facts["kv_total"] = used, total
        pre = getattr(self.scheduled, "preempted_req_ids", None) if self.scheduled is not None else None
        if pre:
            facts["preempted"] = len(pre)
        if self.loops is not None:
            facts.update(self.loops.facts(so, used, st.batch))
        if self.profiling:
            facts["flags"] = FLAG_PROFILED
        caps = self.captures
        if caps is not None and caps.job is not None:
            fl = caps.flags(st.step_id)
            if fl:
                facts["flags"] = facts.get("flags", 0) | fl
        st.set(**facts)
        st.finish()
        self.steps += 1

    def close(self, reason: str) -> None:
        """Stop the probe (engine core shutting down)."""
        self.broken = True
        if self.loops is not None:
            self.loops.close()
        try:
            self.probe.close(reason, timeout=2.0)
        except Exception:
            pass
