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

import logging
import os
import re
import threading
from typing import Any

from engine_adapters.probe.vllm import faults
from engine_adapters.probe.vllm.engine_facts import dp_index, engine_info, loop_count, probe_listen
from engine_adapters.probe.vllm.tap import Tap

SUPPORTED = ((0, 32), (0, 33))
"""vLLM versions the hooks are written for: ``>= 0.32, < 0.33``."""
STAGES = ("schedule", "execute_model", "wait_model", "sample", "update")
"""Stage names of a vLLM step, in order of their first appearance."""

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
    from engine_adapters.probe.vllm import capture_block
    from engine_adapters.probe.vllm.core_capture import WorkerCaptures, open_blocks

    # captures run in the workers (their own profiler), driven through their control blocks
    blocks = open_blocks(os.environ.get(capture_block.ENV_CTL), dp, int(pc.tensor_parallel_size),
                         int(pc.pipeline_parallel_size))  # fmt: skip
    probe = Probe(
        addr,
        info,
        stages=STAGES,
        warm_profiler=False,
        sample_devices=True,
        snapshot_root=os.environ.get("RLTPERF_SNAPSHOTS", "snapshots"),
        captures=lambda **deps: WorkerCaptures(blocks, **deps),
    )
    tap = Tap(core, probe, float(loops or 1))
    tap.captures = probe.captures if isinstance(probe.captures, WorkerCaptures) else None
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
