"""rltperf's vLLM plugin: the ``vllm.general_plugins`` entry point ``rltperf``.

vLLM calls ``register()`` in every one of its processes whenever rltperf is installed in
the server's environment, so it does nothing — and imports nothing — unless the server
was started with ``RLTPERF_PROBE=HOST:PORT``.  Then, inside vLLM's engine-core process,
an rltperf probe listens on that address and emits one step record per engine step
(stages schedule / execute_model / wait_model / sample / update, batch composition,
queue, KV, speculative stats) and the request records::

    RLTPERF_PROBE=127.0.0.1:7788 vllm serve MODEL ...
    rltperf attach tcp://127.0.0.1:7788

``RLTPERF_ANNOUNCE=1`` alone only writes the server's announcement for monitors on this
host (``announce.py``: profiler directory, dtype, device).  ``RLTPERF_TOKEN`` is required for a non-loopback address; ``RLTPERF_LOOP_COUNT`` corrects
vLLM's byte/FLOP estimates for a looped model.  ``VLLM_PLUGINS`` can exclude the plugin.
What depends on vLLM's internals (and the supported version range) is in ``hooks.py``.
"""

from __future__ import annotations

import os

ENV = "RLTPERF_PROBE"
"""Environment variable that enables the plugin: the probe's ``HOST:PORT``."""

_registered = False


def register() -> None:
    """vLLM's plugin hook: inert unless ``RLTPERF_PROBE`` is set (see the module docstring)."""
    global _registered
    listen = os.environ.get(ENV, "").strip()
    if listen or os.environ.get("RLTPERF_ANNOUNCE"):  # the server's announcement to monitors (announce.py)
        from engine_adapters.probe.vllm import announce

        announce.maybe_enable()
    if not listen or _registered:
        return
    _registered = True
    from engine_adapters.probe.vllm import hooks

    hooks.enable(listen)
