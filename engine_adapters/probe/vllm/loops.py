"""The plugin's per-step loop facts for a looped model served by vLLM (Ouro, ``ouro/``).

Filled into each step record by ``hooks.Tap._finish`` (in the engine core):

- ``loop_ns`` / ``loop_tokens`` / ``exit_hist`` and ``busy_ns``: from the records the
  model wrote into the loop rings (``ouro/loopring.py``, one per worker) since the last
  step (on the CPU the step's own forward; on CUDA the forwards whose events
  completed).  ``busy_ns`` is the model's forward plus its LM head (``compute_logits``):
  the device's busy time on a CPU server, so idle is a number.
- **Several workers** (tensor / pipeline parallel): the engine core reads every worker's
  ring.  Exits and tokens are counted once, from one worker (TP rank 0 of the last
  stage: TP ranks compute the same exits); ``loop_ns`` and ``busy_ns`` are the slowest worker's
  (the step waits for it); ``rank_busy_ns``, ``rank_wait_ns`` (time in all-reduces) and
  ``rank_loop_ns`` keep each worker's own, indexed like ``EngineInfo.ranks``.  A
  worker's record that lands after the step closed counts in the next step.
- ``kv_per_depth``: counted from vLLM's KV cache configuration (``kv_caches``): a depth
  holds the step's ``kv_used`` blocks when its attention layers have caches addressed
  by the one block table, 0 when it has no cache; None (unknown) when the layers are
  split over several block tables.
- ``bytes_read`` / ``bytes_written`` / ``flops``: ``definitions.looped_cost.step_cost``
  of the batch the step completed (new and cached tokens per request from the
  scheduler's output), with the passes the model ran — instead of vLLM's estimator, which
  counts the layer stack once.

Only for a model whose structure is known here (``architectures: OuroForCausalLM``);
other models keep vLLM's estimates.  Torch-free.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from engine_adapters.definitions.looped_cost import LoopedShape, step_cost
from engine_adapters.definitions.ranks import worker_tags
from engine_adapters.probe.vllm.engine_facts import dp_index
from engine_adapters.probe.vllm.ouro import ARCH
from engine_adapters.probe.vllm.ouro.loopring import ENV_RING, LoopRecord, RingReader, rank_path


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
    """Loop ring readers (one per worker) and cost shape of one engine core's model."""

    def __init__(self, core: Any, loops: int | None) -> None:
        mc = core.vllm_config.model_config
        pc = core.vllm_config.parallel_config
        hf = getattr(mc, "hf_text_config", None) or mc.hf_config
        archs = list(getattr(mc.hf_config, "architectures", None) or [])
        self.known = ARCH in archs
        self.passes = int(loops or 1)
        q = getattr(hf, "early_exit_threshold", None)
        self.gate_on = self.passes > 1 and q is not None and float(q) < 1.0
        self.shape = LoopedShape.from_config(hf, dtype=str(mc.dtype)) if self.known else None
        tp, pp = int(pc.tensor_parallel_size), int(pc.pipeline_parallel_size)
        self.ranks = worker_tags(tp, pp)
        self.exit_rank = (pp - 1) * tp
        """The worker whose exits and tokens count (TP rank 0 of the last stage)."""
        dp = dp_index(pc, getattr(core, "engine_index", None))
        base = os.environ.get(ENV_RING)
        self.readers: list[RingReader] = []
        if base and self.known:
            self.readers = [RingReader(rank_path(base, dp, p, t)) for p in range(pp) for t in range(tp)]
            for r in self.readers:
                r.open()  # the model was built and warmed up before the engine core's loop
        self.kv_caches = kv_caches(getattr(core.scheduler, "kv_cache_config", None), hf, self.passes)
        """KV caches per depth, counted from vLLM's KV cache configuration (None: unknown)."""

    def facts(self, so: Any, kv_used: int | None, out_rows: int) -> dict[str, Any]:
        """The loop facts of the step that completed ``so`` (None: nothing completed)."""
        f: dict[str, Any] = {}
        if self.readers:
            # every record since the last step: on the CPU the forward(s) of this step; on
            # CUDA forwards whose events completed, a few steps late (as the reference
            # engine's loop events: the windows average them)
            per = [_sum_records(r.read_new()) for r in self.readers]
            have = [p for p in per if p is not None]
            if have:
                d = max(len(p.loop_ns) for p in have)
                f["busy_ns"] = max(p.busy for p in have)
                f["loop_ns"] = [
                    max(p.loop_ns[i] if i < len(p.loop_ns) else 0 for p in have) for i in range(d)
                ]
                ex = per[self.exit_rank] if self.exit_rank < len(per) else None
                if ex is not None:  # a late record counts with the next step: never twice
                    f["loop_tokens"], f["exit_hist"] = ex.loop_tokens, ex.exit_hist
                if len(self.readers) > 1:
                    f["rank_busy_ns"] = [p.busy if p else None for p in per]
                    f["rank_wait_ns"] = [p.wait if p else None for p in per]
                    f["rank_loop_ns"] = [p.loop_ns if p else [] for p in per]
        if self.kv_caches is not None and kv_used is not None:
            f["kv_per_depth"] = [kv_used if n else 0 for n in self.kv_caches]
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
        """Remove the ring files (the engine core is stopping)."""
        for r in self.readers:
            r.close()


@dataclass
class _Sums:
    busy: int
    wait: int | None
    loop_ns: list[int]
    loop_tokens: list[int]
    exit_hist: list[int]


def _sum_records(recs: list[LoopRecord]) -> _Sums | None:
    """One worker's records of a step, summed (None: it sent none)."""
    if not recs:
        return None
    d = max(r.passes for r in recs)
    loop_ns, loop_tok, hist = [0] * d, [0] * d, [0] * d
    busy = 0
    wait: int | None = 0
    for r in recs:
        busy += r.end_ns - r.start_ns + r.logits_ns
        wait = None if wait is None or r.wait_ns is None else wait + r.wait_ns
        for i in range(r.passes):
            loop_ns[i] += r.loop_ns[i]
            loop_tok[i] += r.loop_tokens[i]
            hist[i] += r.exit_hist[i]
    return _Sums(busy, wait, loop_ns, loop_tok, hist)


_LOOP_ATTN = re.compile(r"loop_attn\.(\d+)$")


def kv_caches(kv_cache_config: Any, hf: Any, passes: int) -> list[int] | None:
    """The attention layers with a KV cache, per loop depth of the Ouro model
    (``model.loop_attn.{t*L+i}``: pass t, layer i), counted in the cache allocations of
    vLLM's ``KVCacheConfig`` (``kv_cache_tensors``: which layers each backing tensor
    holds); None when it cannot tell (no config, or the layers split over several block
    tables, so one ``kv_used`` does not describe them)."""
    layers = getattr(hf, "num_hidden_layers", None)
    if kv_cache_config is None or not isinstance(layers, int) or layers < 1:
        return None
    groups = [
        g
        for g in getattr(kv_cache_config, "kv_cache_groups", None) or []
        if not getattr(g, "is_eagle_group", False)
    ]
    if len(groups) != 1:
        return None
    names: set[str] = set()
    for t in getattr(kv_cache_config, "kv_cache_tensors", None) or []:
        # vLLM 0.32 names a tensor's layers ``layers`` (earlier versions ``shared_by``)
        names.update(str(n) for n in (getattr(t, "layers", None) or getattr(t, "shared_by", None) or []))
    out = [0] * passes
    for name in names:
        m = _LOOP_ATTN.search(name)
        if m and 0 <= int(m.group(1)) // layers < passes:
            out[int(m.group(1)) // layers] += 1
    return out if any(out) else None
