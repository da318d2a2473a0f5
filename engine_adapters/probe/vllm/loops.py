"""The plugin's per-step loop facts for a looped model served by vLLM (Ouro, ``ouro/``).

Filled into each step record by ``hooks.Tap._finish`` (in the engine core):

- ``loop_ns`` / ``loop_tokens`` / ``exit_hist`` and ``busy_ns``: from the records the
  model wrote into the loop ring (``ouro/loopring.py``) since the last step (on the CPU
  the step's own forward; on CUDA the forwards whose events completed).  ``busy_ns`` is the model's forward plus its LM head
  (``compute_logits``): the device's busy time on a CPU server, so idle is a number.
- ``kv_per_depth``: every pass keeps KV for every token (one cache per pass and layer,
  one block table), so each depth holds the step's ``kv_used`` blocks.
- ``bytes_read`` / ``bytes_written`` / ``flops``: ``definitions.looped_cost.step_cost``
  of the batch the step completed (new and cached tokens per request from the
  scheduler's output), with the passes the model ran — instead of vLLM's estimator, which
  counts the layer stack once.

Only for a model whose structure is known here (``architectures: OuroForCausalLM``);
other models keep vLLM's estimates.  Torch-free.
"""

from __future__ import annotations

import os
from typing import Any

from engine_adapters.definitions.looped_cost import LoopedShape, step_cost
from engine_adapters.probe.vllm.ouro import ARCH
from engine_adapters.probe.vllm.ouro.loopring import ENV_RING, RingReader


def _requests(so: Any) -> list[tuple[int, int]]:
    """(new tokens, cached tokens before the step) of each request in ``so``."""
    n = so.num_scheduled_tokens
    ctx: dict[str, int] = {}
    for r in so.scheduled_new_reqs or ():
        ctx[r.req_id] = int(r.num_computed_tokens)
    cached = so.scheduled_cached_reqs
    if cached is not None:
        for rid, c in zip(cached.req_ids, cached.num_computed_tokens, strict=False):
            ctx[rid] = int(c)
    return [(int(q), ctx.get(rid, 0)) for rid, q in n.items()]


def loop_config(core: Any, loops: int | None) -> str | None:
    """The Hello's ``loop_config`` for Ouro (passes, exit threshold, exit form); None otherwise."""
    mc = core.vllm_config.model_config
    if ARCH not in list(getattr(mc.hf_config, "architectures", None) or []):
        return None
    hf = getattr(mc, "hf_text_config", None) or mc.hf_config
    q = getattr(hf, "early_exit_threshold", None)
    gate = (
        f"exit gate q={q:g}"
        if q is not None and float(q) < 1.0 and (loops or 1) > 1
        else "no early exit (q=1)"
    )
    return f"Ouro: {loops or 1} passes over the layers (total_ut_steps), {gate}, select form (all passes run)"


class LoopFacts:
    """Loop ring reader and cost shape of one engine core's model."""

    def __init__(self, core: Any, loops: int | None) -> None:
        mc = core.vllm_config.model_config
        hf = getattr(mc, "hf_text_config", None) or mc.hf_config
        archs = list(getattr(mc.hf_config, "architectures", None) or [])
        self.known = ARCH in archs
        self.passes = int(loops or 1)
        q = getattr(hf, "early_exit_threshold", None)
        self.gate_on = self.passes > 1 and q is not None and float(q) < 1.0
        self.shape = LoopedShape.from_config(hf, dtype=str(mc.dtype)) if self.known else None
        path = os.environ.get(ENV_RING)
        self.reader = RingReader(path) if path and self.known else None
        if self.reader is not None:
            self.reader.open()  # the model was built and warmed up before the engine core's loop

    def facts(self, so: Any, kv_used: int | None, out_rows: int) -> dict[str, Any]:
        """The loop facts of the step that completed ``so`` (None: nothing completed)."""
        f: dict[str, Any] = {}
        if self.reader is not None:
            # every record since the last step: on the CPU the forward(s) of this step; on
            # CUDA forwards whose events completed, a few steps late (as the reference
            # engine's loop events: the windows average them)
            recs = self.reader.read_new()
            if recs:
                d = max(r.passes for r in recs)
                loop_ns, loop_tok, hist = [0] * d, [0] * d, [0] * d
                busy = 0
                for r in recs:
                    busy += r.end_ns - r.start_ns + r.logits_ns
                    for i in range(r.passes):
                        loop_ns[i] += r.loop_ns[i]
                        loop_tok[i] += r.loop_tokens[i]
                        hist[i] += r.exit_hist[i]
                f.update(busy_ns=busy, loop_ns=loop_ns, loop_tokens=loop_tok, exit_hist=hist)
        if self.known and kv_used is not None:
            f["kv_per_depth"] = [kv_used] * self.passes
        if self.shape is not None and so is not None and so.total_num_scheduled_tokens > 0:
            c = step_cost(
                self.shape,
                _requests(so),
                out_rows,
                passes=self.passes,
                gate_passes=self.passes - 1 if self.gate_on else 0,
            )
            f.update(bytes_read=int(c.bytes_read), bytes_written=int(c.bytes_written), flops=float(c.flops))
        return f

    def close(self) -> None:
        """Remove the ring file (the engine core is stopping)."""
        if self.reader is not None:
            self.reader.close()
