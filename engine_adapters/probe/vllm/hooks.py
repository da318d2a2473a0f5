"""Everything in rltperf's vLLM plugin that depends on vLLM's internals.

Supported: **vLLM >= 0.32, < 0.33** (``SUPPORTED``), checked when the plugin is enabled;
outside the range the plugin logs a warning and stays inert (``RLTPERF_VLLM_FORCE=1``
tries anyway).  The hook points, all in ``vllm/v1/engine/core.py`` of 0.32:

- ``EngineCoreProc.run_busy_loop`` (class attribute; also ``DPEngineCoreProc``'s): runs
  once, in the engine-core process, after ``EngineCore.__init__``.  Its wrapper starts
  the probe there and wraps the *instance's* methods below; other processes only see the
  patched class attribute, never called there.
- ``self.step_fn`` (``step`` or ``step_with_batch_queue`` with async scheduling): one
  engine step = one call.  The step opens with stage ``schedule``; the component calls
  mark the next boundaries: ``model_executor.execute_model`` → ``execute_model``
  (dispatch to the workers), the ``result()`` of the futures it and ``sample_tokens``
  return → ``wait_model`` (blocked on the workers: the model time the engine thread does
  not overlap), ``model_executor.sample_tokens`` → ``sample``,
  ``scheduler.update_from_output`` → ``update`` (until the step returns).  Marks are
  contiguous, so the stages sum to the step's wall time.
- The record describes the batch *completed* in the step (the ``scheduler_output``
  given to ``update_from_output``); with async scheduling that batch was scheduled one
  step earlier, and a step that completed none (the first launch of a burst) is ``idle``.
  Calls that neither schedule nor complete anything are not steps and are not recorded.
- ``add_request`` / ``abort_requests`` / the outputs of ``update_from_output``: request
  records (arrival is the front end's wall-clock ``arrival_time`` mapped onto this host's
  monotonic clock; first token and finish are when the engine core produced them).
- ``profile``: vLLM's profiler on/off; steps in between carry ``FLAG_PROFILED``.

Nothing here may break vLLM: every call of the probe's (``probe.step()``, a stage's
``mark``, the step's facts) is guarded; the first error disables the plugin (one
warning naming the call and the error; the probe says goodbye to its subscribers with
that reason) and vLLM's own calls and exceptions pass through unchanged.
(``faults.py`` makes the guarded calls raise, for the tests.)

**Data parallelism.**  Each data-parallel engine core runs its own probe, on the port of
``RLTPERF_PROBE`` + its DP rank (``engine_facts.dp_index``: vLLM 0.32 runs a dense
model's DP ranks as independent engines whose ``data_parallel_rank`` reads 0; the rank
is in ``data_parallel_index``).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from time import perf_counter_ns as _clk
from typing import Any

from engine_adapters.definitions.records import FLAG_PROFILED
from engine_adapters.probe.vllm import faults
from engine_adapters.probe.vllm.engine_facts import dp_index, engine_info, kv_blocks, loop_count, probe_listen

SUPPORTED = ((0, 32), (0, 33))
"""vLLM versions the hooks are written for: ``>= 0.32, < 0.33``."""
STAGES = ("schedule", "execute_model", "wait_model", "sample", "update")
"""Stage names of a vLLM step, in order of their first appearance."""
MAX_TRACKED_REQUESTS = 200_000
"""Requests tracked for request records; beyond this the oldest are forgotten."""
CAPTURE_REFUSAL = (
    "captures through the rltperf vLLM plugin are not supported: vLLM runs the model in its worker "
    "processes, which this probe cannot profile; capture with vllm+http://HOST:PORT (vLLM's own profiler, "
    "server started with --profiler-config) instead"
)

log = logging.getLogger("vllm.rltperf")  # under vLLM's logger: appears in the server log

_enabled_lock = threading.Lock()
_patched: set[type] = set()


def _version_tuple(v: str) -> tuple[int, int] | None:
    m = re.match(r"^(\d+)\.(\d+)", v)
    return (int(m.group(1)), int(m.group(2))) if m else None


def version_supported(v: str) -> bool:
    """Whether vLLM version ``v`` is in ``SUPPORTED``."""
    t = _version_tuple(v)
    return t is not None and SUPPORTED[0] <= t < SUPPORTED[1]


def enable(listen: str) -> bool:
    """Install the hooks for a probe on ``listen`` (called by ``plugin.register``).

    Returns False (after one warning) when this vLLM is outside the supported range or
    its classes lack the hook points.
    """
    from engine_adapters.definitions.wire import parse_hostport

    try:
        parse_hostport(listen)
    except ValueError as exc:
        log.warning(
            "rltperf plugin: RLTPERF_PROBE=%r is not HOST:PORT (%s); the plugin stays inert", listen, exc
        )
        return False
    try:
        import vllm

        version = str(getattr(vllm, "__version__", "?"))
    except Exception as exc:
        log.warning("rltperf plugin: cannot import vllm (%s); inert", exc)
        return False
    lo, hi = SUPPORTED
    if not version_supported(version):
        if os.environ.get("RLTPERF_VLLM_FORCE") != "1":
            log.warning(
                "rltperf plugin: vLLM %s is outside the supported range >=%d.%d,<%d.%d; the plugin stays inert "
                "(RLTPERF_VLLM_FORCE=1 tries anyway)",
                version, *lo, *hi,
            )  # fmt: skip
            return False
        log.warning("rltperf plugin: vLLM %s is outside >=%d.%d,<%d.%d; forced on", version, *lo, *hi)
    try:
        from vllm.v1.engine import core as core_mod
    except Exception as exc:
        log.warning("rltperf plugin: vllm.v1.engine.core cannot be imported (%s); inert", exc)
        return False
    classes = [getattr(core_mod, n, None) for n in ("EngineCoreProc", "DPEngineCoreProc")]
    with _enabled_lock:
        for cls in classes:
            if cls is None or "run_busy_loop" not in cls.__dict__ or cls in _patched:
                continue
            _patch_busy_loop(cls, listen)
            _patched.add(cls)
    return True


def _patch_busy_loop(cls: type, listen: str) -> None:
    orig = cls.__dict__["run_busy_loop"]

    def run_busy_loop(self: Any) -> Any:
        tap = None
        try:
            tap = attach(self, listen)
        except Exception as exc:
            log.warning("rltperf plugin: could not attach to the engine core (%s: %s); vLLM runs on without it",
                        type(exc).__name__, exc)  # fmt: skip
        try:
            return orig(self)
        finally:
            if tap is not None:
                tap.close("vLLM engine core stopped")

    run_busy_loop.__doc__ = orig.__doc__
    run_busy_loop.__wrapped__ = orig  # type: ignore[attr-defined]
    run_busy_loop.rltperf_hook = True  # type: ignore[attr-defined]  # marks the patch (tests, idempotence)
    cls.run_busy_loop = run_busy_loop  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- engine info


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
                if self.faults is not None:
                    self.faults.check("probe_mark")
                st.mark(name)
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


def attach(core: Any, listen: str) -> Tap | None:
    """Start a probe in this engine core and install the hooks; None when not possible."""
    from engine_adapters.definitions.wire import parse_hostport
    from engine_adapters.probe import Probe

    pc = core.vllm_config.parallel_config
    dp = dp_index(pc, getattr(core, "engine_index", None))
    host, port = probe_listen(*parse_hostport(listen), dp)  # one probe per data-parallel engine
    hf = getattr(core.vllm_config.model_config, "hf_config", None)
    loops = None
    env_loops = os.environ.get("RLTPERF_LOOP_COUNT")
    if env_loops and env_loops.isdigit() and int(env_loops) >= 1:
        loops = int(env_loops)
    elif hf is not None:
        loops = loop_count(
            getattr(core.vllm_config.model_config, "hf_text_config", None) or hf
        ) or loop_count(hf)
    info = engine_info(core, loops)
    from engine_adapters.probe.vllm.loops import loop_config

    info["loop_config"] = loop_config(core, loops) or info["loop_config"]
    from engine_adapters.probe.vllm.loops import LoopFacts

    lf: LoopFacts | None = LoopFacts(core, loops)
    if lf is not None and lf.known:
        if lf.kv_caches is not None:
            info["contract"]["kv_caches_per_depth"] = lf.kv_caches  # counted from vLLM's KV cache config
    else:
        lf = None
    addr = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    probe = Probe(
        addr,
        info,
        stages=STAGES,
        warm_profiler=False,
        sample_devices=True,
        snapshot_root=os.environ.get("RLTPERF_SNAPSHOTS", "snapshots"),
        # Captures need the worker processes' profiler: refuse them here with the reason
        # (the Hello then does not advertise "capture").
        captures=CAPTURE_REFUSAL,
    )
    tap = Tap(core, probe, float(loops or 1))
    tap.faults = faults.for_rank(f"dp{dp}")
    tap.loops = lf
    tap.install()
    log.info(
        "rltperf plugin: probe listening on tcp://%s in the engine core of DP rank %d (pid %d); attach with "
        "`rltperf attach tcp://%s`",
        probe.address, dp, os.getpid(), probe.address,
    )  # fmt: skip
    print(
        f"rltperf: probe listening on tcp://{probe.address} (vLLM engine core, DP rank {dp}, pid {os.getpid()})",
        flush=True,
    )
    return tap
