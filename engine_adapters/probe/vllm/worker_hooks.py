"""The plugin's hooks in vLLM's workers: the capture controller of each worker.

Part of the plugin's dependence on vLLM's internals (``hooks.SUPPORTED``): in vLLM 0.32
every worker process (and the engine core itself with the single-process executor)
runs its model through ``vllm.v1.worker.worker_base.WorkerWrapperBase``: the executor
calls its ``execute_model(scheduler_output)``, then, when that returned None (the
sampling is deferred), ``sample_tokens(grammar_output)`` (which the wrapper passes on
to its worker through ``__getattr__``; defined here so it can be wrapped).  The class
attributes are patched, once per process, by ``install`` (``plugin.register``, when
``RLTPERF_PROBE`` is set); in processes that never run a worker they are never called.

- ``init_device`` (the worker's ranks are known after it): creates this worker's
  control block (``capture_block.block_path`` with its DP / PP / TP ranks) and warms
  the profiler on the worker's thread (about a second, once, at start-up).
- ``execute_model``: ``WorkerCapture.begin`` before, ``end`` after when it returned the
  step's output; ``sample_tokens``: ``end`` after.

Every call into the controller is guarded: an error there turns the controller off for
good (one warning) and vLLM's call goes on unchanged.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from engine_adapters.probe.vllm import capture_block as cb
from engine_adapters.probe.vllm import faults

log = logging.getLogger("vllm.rltperf")

_installed = False


def install() -> bool:
    """Patch ``WorkerWrapperBase`` in this process (idempotent); False when it cannot."""
    global _installed
    if _installed:
        return True
    try:
        from vllm.v1.worker.worker_base import WorkerWrapperBase
    except Exception as exc:
        log.warning(
            "rltperf plugin: no worker hooks (%s: %s); captures will be refused", type(exc).__name__, exc
        )
        return False
    cls: Any = WorkerWrapperBase
    orig_init = cls.__dict__.get("init_device")
    orig_exec = cls.__dict__.get("execute_model")
    if orig_init is None or orig_exec is None:
        log.warning(
            "rltperf plugin: this vLLM's WorkerWrapperBase lacks init_device/execute_model; no captures"
        )
        return False
    orig_sample = cls.__dict__.get("sample_tokens")

    @functools.wraps(orig_init)
    def init_device(self: Any, *a: Any, **k: Any) -> Any:
        out = orig_init(self, *a, **k)
        try:
            self._rltperf_capture = _controller(self)
        except Exception as exc:
            self._rltperf_capture = None
            log.warning("rltperf plugin: this worker runs no captures (%s: %s)", type(exc).__name__, exc)
        return out

    @functools.wraps(orig_exec)
    def execute_model(self: Any, scheduler_output: Any, *a: Any, **k: Any) -> Any:
        ctl = getattr(self, "_rltperf_capture", None)
        if ctl is not None:
            _guard(self, ctl.begin)
        out = orig_exec(self, scheduler_output, *a, **k)
        if ctl is not None and out is not None and self._rltperf_capture is not None:
            _guard(self, ctl.end)
        return out

    def sample_tokens(self: Any, *a: Any, **k: Any) -> Any:
        out = orig_sample(self, *a, **k) if orig_sample is not None else self.worker.sample_tokens(*a, **k)
        ctl = getattr(self, "_rltperf_capture", None)
        if ctl is not None:
            _guard(self, ctl.end)
        return out

    sample_tokens.__doc__ = "Sample the step's tokens (rltperf: the step's end for a capture)."
    cls._rltperf_capture = None  # found on the class, never through the wrapper's __getattr__
    cls.init_device = init_device
    cls.execute_model = execute_model
    cls.sample_tokens = sample_tokens
    _installed = True
    return True


def _guard(wrapper: Any, fn: Any) -> None:
    try:
        fn()
    except Exception as exc:
        wrapper._rltperf_capture = None
        log.warning("rltperf plugin: the worker's capture controller stopped (%s: %s); vLLM serves on",
                    type(exc).__name__, exc)  # fmt: skip


def _controller(wrapper: Any) -> Any:
    """This worker's ``WorkerCapture`` (its block created, its profiler warmed), or None
    when no base path is set (the probe is off)."""
    base = os.environ.get(cb.ENV_CTL)
    if not base:
        return None
    from vllm.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_rank

    from engine_adapters.definitions.ranks import rank_name, worker_tag
    from engine_adapters.probe.vllm.engine_facts import dp_index
    from engine_adapters.probe.vllm.worker_capture import WorkerCapture, warm

    pc = wrapper.vllm_config.parallel_config
    tp, pp = get_tensor_model_parallel_rank(), get_pp_group().rank_in_group
    dp = dp_index(pc)
    rank = rank_name(dp, worker_tag(tp, pp, pc.pipeline_parallel_size))
    block = cb.ControlBlock.create(cb.block_path(base, dp, pp, tp))
    warm(rank)
    return WorkerCapture(block, rank, faults.for_rank(rank))
