"""``OuroForCausalLM`` for vLLM 0.32: a looped decoder, written for this project.

Structure (facts from ByteDance's public Ouro modeling/config files): token embedding;
a stack of ``num_hidden_layers`` decoder layers (sandwich RMSNorm around attention and
around the SwiGLU MLP, RoPE, grouped-query attention without bias) that runs
``total_ut_steps`` times per token; after every pass the final RMSNorm, whose output both
feeds the next pass and scores the early-exit gate (``early_exit_gate``, hidden -> 1);
the LM head on each token's selected hidden state.

**Implemented:**

- KV per (pass, layer): one vLLM ``Attention`` layer — so one KV cache — per pass and
  layer, ``total_ut_steps * num_hidden_layers`` in all (``model.loop_attn.{t*L+i}``), all
  sharing the physical layer's weights; one block table addresses them all, so every
  pass keeps its keys and values for every token.
- Early exit, **select** form: every pass runs for every token; pass t gives
  ``lambda_t = sigmoid(gate(h_t))``, the exit probability ``lambda_t * prod_{j<t}(1 -
  lambda_j)`` (the last pass takes the rest), and a token's output is ``h_t`` of the first
  pass whose cumulative exit probability reaches ``early_exit_threshold`` q (None or >= 1:
  the last pass, and the gate is not evaluated).  q is set with ``--hf-overrides
  '{"early_exit_threshold": 0.5}'``.

**Not implemented:** compact/physical early exit (dropping exited tokens from later
passes; the KV of skipped passes would need a copy or shared-KV policy), Ouro's
"last available"/"final exit shared" KV policies, sliding-window layers, pipeline
parallelism, LoRA, quantised checkpoints beyond what vLLM's linear layers load.

Not compiled (no ``support_torch_compile``): the forward runs eagerly so each pass is
its own ``loop[t]`` profiler range and can be timed.  Per-pass timing, tokens per pass,
the exit histogram of the output rows and the time in tensor-parallel all-reduces go,
per worker, to that worker's ``loopring`` through ``recorder.LoopRecorder`` when the
rltperf probe is enabled (``RLTPERF_PROBE``; off with ``RLTPERF_LOOP_TIMING=0``); every
recorder call is guarded, so a failure stops recording, never the forward.  The
all-reduces of ``o_proj`` and ``down_proj`` are the model's own call
(``reduce_results=False`` and ``recorder.CollectiveTimer``: the same sum, timed).  On
CUDA the pass boundaries are CUDA events resolved a few forwards later (never a
synchronisation); while a CUDA graph is being captured nothing is recorded, so under
CUDA graphs per-pass timing and exits are n/a (serve with ``--enforce-eager`` to see them).  The exit
histogram counts, per forward, each request's last scheduled token (the row that gets
logits): a chunk of a long prompt split by chunked prefill, which produces no token, is
counted too.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from time import perf_counter_ns as _clk
from typing import Any

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import (
    get_pp_group,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
)
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.utils import maybe_prefix

from engine_adapters.probe.vllm.ouro import loopring
from engine_adapters.probe.vllm.ouro.recorder import CollectiveTimer, LoopRecorder

_STACKED = (
    (".qkv_proj", ".q_proj", "q"),
    (".qkv_proj", ".k_proj", "k"),
    (".qkv_proj", ".v_proj", "v"),
    (".gate_up_proj", ".gate_proj", 0),
    (".gate_up_proj", ".up_proj", 1),
)


def exit_threshold(config: Any) -> float | None:
    """The gate threshold q in force, None when every token runs to the last pass."""
    q = getattr(config, "early_exit_threshold", None)
    if q is None or int(getattr(config, "total_ut_steps", 1) or 1) <= 1:
        return None
    q = float(q)
    return q if q < 1.0 else None


class OuroAttention(nn.Module):
    """QKV/O projections and RoPE of one physical layer; the attention op is per pass."""

    def __init__(self, config: Any, quant_config: Any, prefix: str, comm: CollectiveTimer) -> None:
        super().__init__()
        self.comm = comm
        tp = get_tensor_model_parallel_world_size()
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        self.num_heads = heads // tp
        self.num_kv_heads = max(1, kv_heads // tp)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scaling = self.head_dim**-0.5
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, self.head_dim, heads, kv_heads, bias=False, quant_config=quant_config,
            prefix=f"{prefix}.qkv_proj",
        )  # fmt: skip
        # the all-reduce is ours (``comm``), so each rank's wait in it can be timed
        self.o_proj = RowParallelLinear(
            heads * self.head_dim, config.hidden_size, bias=False, quant_config=quant_config,
            prefix=f"{prefix}.o_proj", reduce_results=False,
        )  # fmt: skip
        self.rotary_emb = get_rope(
            self.head_dim, max_position=config.max_position_embeddings, is_neox_style=True,
            rope_parameters=getattr(config, "rope_parameters", None),
        )  # fmt: skip

    def forward(self, positions: torch.Tensor, x: torch.Tensor, attn: Attention) -> torch.Tensor:
        qkv, _ = self.qkv_proj(x)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        out, _ = self.o_proj(attn(q, k, v))
        return self.comm(out)


class OuroMLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: Any, quant_config: Any, prefix: str, comm: CollectiveTimer) -> None:
        super().__init__()
        self.comm = comm
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"Ouro: hidden_act {config.hidden_act!r} is not supported (silu only)")
        self.gate_up_proj = MergedColumnParallelLinear(
            config.hidden_size, [config.intermediate_size] * 2, bias=False, quant_config=quant_config,
            prefix=f"{prefix}.gate_up_proj",
        )  # fmt: skip
        self.down_proj = RowParallelLinear(
            config.intermediate_size, config.hidden_size, bias=False, quant_config=quant_config,
            prefix=f"{prefix}.down_proj", reduce_results=False,
        )  # fmt: skip
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gu, _ = self.gate_up_proj(x)
        out, _ = self.down_proj(self.act_fn(gu))
        return self.comm(out)


class OuroDecoderLayer(nn.Module):
    """One physical layer: sandwich norms around attention and around the MLP."""

    def __init__(self, config: Any, quant_config: Any, prefix: str, comm: CollectiveTimer) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = OuroAttention(config, quant_config, f"{prefix}.self_attn", comm)
        self.mlp = OuroMLP(config, quant_config, f"{prefix}.mlp", comm)
        self.input_layernorm = RMSNorm(h, eps=eps)
        self.input_layernorm_2 = RMSNorm(h, eps=eps)
        self.post_attention_layernorm = RMSNorm(h, eps=eps)
        self.post_attention_layernorm_2 = RMSNorm(h, eps=eps)

    def forward(self, positions: torch.Tensor, h: torch.Tensor, attn: Attention) -> torch.Tensor:
        a = self.self_attn(positions, self.input_layernorm(h), attn)
        h = h + self.input_layernorm_2(a)
        m = self.mlp(self.post_attention_layernorm(h))
        return h + self.post_attention_layernorm_2(m)


def _query_start_loc() -> Any:
    """The batch's ``query_start_loc`` (requests' token offsets) from the forward context, or None."""
    try:
        from vllm.forward_context import get_forward_context, is_forward_context_available

        if not is_forward_context_available():
            return None
        md: Any = get_forward_context().attn_metadata
        if isinstance(md, list):
            md = md[0] if md else None
        if isinstance(md, dict):
            md = next(iter(md.values()), None)
        qsl = getattr(md, "query_start_loc", None)
        return qsl if qsl is not None and qsl.numel() >= 2 else None
    except Exception:
        return None


def _make_recorder(passes: int, vllm_config: VllmConfig, comm: CollectiveTimer) -> LoopRecorder | None:
    """This worker's recorder, writing its own ring (``loopring.rank_path``), or None when
    the probe is off, timing is off, or the ring cannot be created (said in the log)."""
    if not os.environ.get("RLTPERF_PROBE") or os.environ.get(loopring.ENV_TIMING, "1") == "0":
        return None
    base = os.environ.get(loopring.ENV_RING)
    if not base:
        return None
    from engine_adapters.definitions.ranks import rank_name, worker_tag
    from engine_adapters.probe.vllm import faults
    from engine_adapters.probe.vllm.engine_facts import dp_index

    pc = vllm_config.parallel_config
    tp, pp = get_tensor_model_parallel_rank(), get_pp_group().rank_in_group
    dp = dp_index(pc)
    rank = rank_name(dp, worker_tag(tp, pp, pc.pipeline_parallel_size))
    path = loopring.rank_path(base, dp, pp, tp)
    try:
        writer = loopring.RingWriter(path)
    except OSError as exc:  # e.g. a full /dev/shm: no recording, vLLM serves on
        logging.getLogger("vllm.rltperf").warning(
            "rltperf: no Ouro loop recording on %s: cannot create its ring %s (%s)", rank, path, exc
        )
        return None
    device = torch.device(vllm_config.device_config.device or "cpu")
    return LoopRecorder(writer, passes, device, rank=rank, comm=comm, faults=faults.for_rank(rank),
                        slow_ms=faults.slow_ms(rank))  # fmt: skip


class OuroModel(nn.Module):
    """Embedding, the looped layer stack with its per-pass attention layers, norm, gate."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        cache_config, quant_config = vllm_config.cache_config, vllm_config.quant_config
        self.config = config
        self.passes = int(getattr(config, "total_ut_steps", 1) or 1)
        self.threshold = exit_threshold(config)
        n_layers = config.num_hidden_layers
        tp_size = get_tensor_model_parallel_world_size()
        self.comm = CollectiveTimer(tensor_model_parallel_all_reduce if tp_size > 1 else None)
        self.embed_tokens = VocabParallelEmbedding(
            config.vocab_size, config.hidden_size, quant_config=quant_config, prefix=f"{prefix}.embed_tokens"
        )
        self.layers = nn.ModuleList(
            [
                OuroDecoderLayer(config, quant_config, f"{prefix}.layers.{i}", self.comm)
                for i in range(n_layers)
            ]
        )
        a: Any = self.layers[0].self_attn
        # one Attention (one KV cache) per (pass, layer); the name holds one integer t*L+i
        self.loop_attn = nn.ModuleList(
            [
                self._attention(a, cache_config, quant_config, f"{prefix}.loop_attn.{k}")
                for k in range(self.passes * n_layers)
            ]
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.early_exit_gate = nn.Linear(config.hidden_size, 1, bias=True)
        # created now, before the engine core's tap opens the ring
        self.recorder = _make_recorder(self.passes, vllm_config, self.comm)

    @staticmethod
    def _attention(a: OuroAttention, cache_config: Any, quant_config: Any, prefix: str) -> Attention:
        return Attention(
            a.num_heads, a.head_dim, a.scaling, num_kv_heads=a.num_kv_heads, cache_config=cache_config,
            quant_config=quant_config, prefix=prefix,
        )  # fmt: skip

    def forward(
        self, input_ids: torch.Tensor | None, positions: torch.Tensor, intermediate_tensors: Any = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        h = inputs_embeds if inputs_embeds is not None else self.embed_tokens(input_ids)
        rec = self.recorder
        if rec is not None:
            rec.begin(int(h.shape[0]))
        T, L, q = self.passes, len(self.layers), float(self.threshold or 1.0)
        prof = torch.autograd._profiler_enabled()
        depth: torch.Tensor | None = None
        if self.threshold is not None:
            n = h.shape[0]
            remaining = torch.ones(n, dtype=torch.float32, device=h.device)
            cdf = torch.zeros_like(remaining)
            depth = torch.zeros(n, dtype=torch.long, device=h.device)
            selected = torch.zeros_like(h)
        for t in range(T):
            rf = torch.profiler.record_function(f"loop[{t}]") if prof else None
            if rf is not None:
                rf.__enter__()
            for i, layer in enumerate(self.layers):
                h = layer(positions, h, self.loop_attn[t * L + i])
            h = self.norm(h)
            if depth is not None:
                if t < T - 1:
                    lam = torch.sigmoid(self.early_exit_gate(h).squeeze(-1).float())
                    cdf = cdf + lam * remaining
                    remaining = remaining * (1.0 - lam)
                    newly = (cdf >= q) & (depth == 0)
                else:
                    newly = depth == 0
                selected = torch.where(newly.unsqueeze(-1), h, selected)
                depth = torch.where(newly, t + 1, depth)
            if rf is not None:
                rf.__exit__(None, None, None)
            if rec is not None:
                rec.mark(t)
        if rec is not None:
            rec.end(depth, _query_start_loc())  # guarded inside: a failure stops recording only
        return selected if depth is not None else h


class OuroForCausalLM(nn.Module):
    """vLLM's entry class for ``architectures: ["OuroForCausalLM"]``."""

    packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.model = OuroModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.lm_head = ParallelLMHead(
            config.vocab_size, config.hidden_size, quant_config=vllm_config.quant_config,
            prefix=maybe_prefix(prefix, "lm_head"),
        )  # fmt: skip
        if getattr(config, "tie_word_embeddings", False):
            self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(config.vocab_size)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(
        self, input_ids: torch.Tensor | None, positions: torch.Tensor, intermediate_tensors: Any = None,
        inputs_embeds: torch.Tensor | None = None, **kwargs: Any,
    ) -> torch.Tensor:  # fmt: skip
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        rec = self.model.recorder
        if rec is None or rec.cuda or rec.dead:
            return self.logits_processor(self.lm_head, hidden_states)
        t0 = _clk()
        logits = self.logits_processor(self.lm_head, hidden_states)
        rec.add_logits(_clk() - t0)  # guarded inside
        return logits

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load HF Ouro names: q/k/v into ``qkv_proj``, gate/up into ``gate_up_proj``."""
        params = dict(self.named_parameters())
        tied = getattr(self.config, "tie_word_embeddings", False)
        loaded: set[str] = set()
        for name, w in weights:
            if "rotary_emb.inv_freq" in name or (tied and name.startswith("lm_head.")):
                continue
            for packed, part, shard in _STACKED:
                if part in name:
                    target = name.replace(part, packed)
                    p = params.get(target)
                    if p is not None:
                        p.weight_loader(p, w, shard)  # type: ignore[attr-defined]
                        loaded.add(target)
                    break
            else:
                p = params.get(name)
                if p is None:
                    continue
                getattr(p, "weight_loader", default_weight_loader)(p, w)
                loaded.add(name)
        return loaded
