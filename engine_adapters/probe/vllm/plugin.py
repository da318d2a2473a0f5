"""rltperf's vLLM plugin: the ``vllm.general_plugins`` entry point ``rltperf``.

vLLM calls ``register()`` in every one of its processes whenever rltperf is installed in
the server's environment.  It always registers the looped model Ouro (``ouro/``): the
config class for ``model_type: ouro`` with transformers' ``AutoConfig`` and the
architecture ``OuroForCausalLM`` with vLLM's ``ModelRegistry`` as the lazy string
``engine_adapters.probe.vllm.ouro.model:OuroForCausalLM`` (vLLM 0.32 lists that name as
"removed in 0.26"; a registered model takes precedence, so no ``--trust-remote-code``
and none of the checkpoint's Python is needed).  That costs a dictionary entry and the
import of the small config module (transformers is already loaded in every vLLM
process); the model's module (torch, vllm layers) is imported only when vLLM builds it.

Everything else is inert unless the server was started with
``RLTPERF_PROBE=HOST:PORT``.  Then, inside vLLM's engine-core process,
an rltperf probe listens on that address and emits one step record per engine step
(stages schedule / execute_model / wait_model / sample / update, batch composition,
queue, KV, speculative stats) and the request records::

    RLTPERF_PROBE=127.0.0.1:7788 vllm serve MODEL ...
    rltperf attach tcp://127.0.0.1:7788

Without ``RLTPERF_PROBE`` the plugin still writes the server's announcement for
monitors on this host (``announce.py``: profiler directory, dtype, device, pids; one
small file, removed when the server stops); ``RLTPERF_ANNOUNCE=0`` turns that off.  ``RLTPERF_TOKEN`` is required
for a non-loopback address; ``RLTPERF_LOOP_COUNT`` corrects vLLM's byte/FLOP estimates
for a looped model.  For Ouro the step records also carry per-loop time, tokens per
pass, exits, KV per depth, busy time and bytes/FLOPs from the model's structure
(``loops.py``): each worker of the model writes one record per forward into its own
ring file, ``RLTPERF_LOOP_RING`` (set here, inherited by the engine cores and their
workers) with its ranks in the name, and the engine core reads its workers' rings;
``RLTPERF_LOOP_TIMING=0`` turns that recording off.  With ``--data-parallel-size`` each
engine core runs its own probe on the port + its DP rank.  Captures (``c`` / ``f``,
``rltperf capture``) run in the workers, each with its own ``torch.profiler``, driven
by the engine core's probe through a small control block per worker
(``core_capture.py``, ``worker_capture.py``, ``worker_hooks.py``): no
``--profiler-config``, no restart.  ``VLLM_PLUGINS`` can exclude
the plugin.  For tests only: ``RLTPERF_INJECT_FAULTS`` and ``RLTPERF_INJECT_SLOW``
(``faults.py``).
What depends on vLLM's internals (and the supported version range) is in ``hooks.py``.
"""

from __future__ import annotations

import os

ENV = "RLTPERF_PROBE"
"""Environment variable that enables the plugin: the probe's ``HOST:PORT``."""

_registered = False
_models_registered = False


def register_models() -> None:
    """Register Ouro's config class and model with transformers and vLLM (idempotent)."""
    global _models_registered
    if _models_registered:
        return
    _models_registered = True
    from engine_adapters.probe.vllm.ouro import ARCH, MODEL_CLASS
    from engine_adapters.probe.vllm.ouro.config import register_auto_config

    register_auto_config()
    from vllm import ModelRegistry

    if ARCH not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCH, MODEL_CLASS)


def register() -> None:
    """vLLM's plugin hook: registers Ouro; the probe is inert unless ``RLTPERF_PROBE`` is set."""
    global _registered
    try:
        register_models()
    except Exception as exc:  # never break vLLM's start for a model it may not serve
        import logging

        logging.getLogger("vllm.rltperf").warning("rltperf plugin: Ouro not registered (%s: %s)",
                                                  type(exc).__name__, exc)  # fmt: skip
    listen = os.environ.get(ENV, "").strip()
    if os.environ.get("RLTPERF_ANNOUNCE", "").strip() != "0":  # the server's announcement (announce.py)
        from engine_adapters.probe.vllm import announce

        announce.maybe_enable()
    if not listen or _registered:
        return
    _registered = True
    from engine_adapters.probe.vllm import capture_block
    from engine_adapters.probe.vllm.ouro import loopring

    # the model (in vLLM's worker) writes its per-loop records here; the tap reads them
    os.environ.setdefault(loopring.ENV_RING, loopring.default_path())
    # each worker's capture control block (worker_hooks.py) goes here; the tap drives it
    os.environ.setdefault(capture_block.ENV_CTL, capture_block.default_base())
    from engine_adapters.probe.vllm import hooks

    if hooks.enable(listen):
        from engine_adapters.probe.vllm import worker_hooks

        worker_hooks.install()
