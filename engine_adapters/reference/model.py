"""The looped transformer: embedding, prelude, a shared block looped, coda, LM head.

Layers are pre-norm: RMSNorm, fused QKV projection, RoPE (rotate-half), grouped-query
attention over the paged KV cache (``torch.nn.functional.scaled_dot_product_attention``
on the gathered keys), output projection, RMSNorm, SwiGLU MLP.  After each pass of the
shared block an RMSNorm (shared by all passes) normalises the state, as Ouro does; with
``inject`` each pass first mixes the state with the prelude's output through an adapter
(Huginn).  Weights are random (normal, seeded), never trained: outputs are meaningless
and every number this engine produces is a capacity / performance figure only.

``forward()`` runs one pass over a ``StepBatch`` with an exit policy and mode, adds the
analytic bytes and FLOPs it incurs to a ``StepCounter``, and reports per-depth timing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter_ns as clk
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from engine_adapters.reference.analytic import StepCounter
from engine_adapters.reference.batch import StepBatch, View
from engine_adapters.reference.exits import ExitPolicy
from engine_adapters.reference.kvcache import KVCache
from engine_adapters.reference.presets import ModelConfig

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _w(
    shape: tuple[int, ...], std: float, gen: torch.Generator, dtype: torch.dtype, device: Any
) -> nn.Parameter:
    t = torch.empty(shape, dtype=torch.float32, device=device)
    t.normal_(0.0, std, generator=gen)
    return nn.Parameter(t.to(dtype), requires_grad=False)


def _ones(n: int, dtype: torch.dtype, device: Any) -> nn.Parameter:
    return nn.Parameter(torch.ones(n, dtype=dtype, device=device), requires_grad=False)


class Layer(nn.Module):
    """One pre-norm transformer layer (weights only; the model runs it)."""

    def __init__(
        self, cfg: ModelConfig, gen: torch.Generator, dtype: torch.dtype, device: Any, depth_scale: float
    ):
        super().__init__()
        h = cfg.hidden
        self.norm1 = _ones(h, dtype, device)
        # stored [in, out]: ``x @ w`` (small-batch matmuls on the CPU run faster this way)
        self.wqkv = _w((h, cfg.q_dim + 2 * cfg.kv_dim), 1 / math.sqrt(h), gen, dtype, device)
        self.wo = _w((cfg.q_dim, h), depth_scale / math.sqrt(cfg.q_dim), gen, dtype, device)
        self.norm2 = _ones(h, dtype, device)
        self.w_gu = _w((h, 2 * cfg.ffn), 1 / math.sqrt(h), gen, dtype, device)
        self.w_down = _w((cfg.ffn, h), depth_scale / math.sqrt(cfg.ffn), gen, dtype, device)


@dataclass
class PassHooks:
    """What the engine wants told during a pass (stage marks, per-depth timing)."""

    mark: Callable[[str], None] | None = None
    """``step.mark`` (or a syncing wrapper); None: no marks (warm-up)."""
    stage: str = "forward"
    """Stage name of the model's compute in this pass (``forward``, ``draft``, ``verify``)."""
    exit_marks: bool = True
    """Mark ``exit_check`` between loop passes (off for very deep loops: 64 marks/step)."""
    events: Callable[[], Any] | None = None
    """CUDA: returns a fresh timing event from the engine's pool; None on the CPU."""
    loop_ns: list[int] = field(default_factory=list)
    loop_tokens: list[int] = field(default_factory=list)
    loop_events: list[tuple[Any, Any]] = field(default_factory=list)


@dataclass
class PassResult:
    """Logits of the output tokens and where each exited."""

    logits: torch.Tensor
    """``[n_out, vocab]`` in ``StepBatch.out_flat`` order."""
    exit_depth: Any
    """Per output token, 1-based exit depth (tensor in select mode, numpy in compact)."""


class LoopedLM(nn.Module):
    """The reference looped transformer with random weights."""

    def __init__(self, cfg: ModelConfig, dtype: str = "float32", device: str = "cpu", seed: int = 0,
                 max_positions: int = 4096) -> None:  # fmt: skip
        super().__init__()
        self.cfg = cfg
        self.dtype_name = dtype
        tdtype = TORCH_DTYPES[dtype]
        self.tdtype = tdtype
        dev = torch.device(device)
        self.device = dev
        gen = torch.Generator(device=dev)
        gen.manual_seed(seed)
        h = cfg.hidden
        eff_layers = cfg.n_prelude + cfg.n_coda + cfg.n_shared * cfg.max_loops
        depth_scale = 1 / math.sqrt(2 * max(1, eff_layers))
        self.embed = _w((cfg.vocab, h), 1.0, gen, tdtype, dev)
        self.prelude = nn.ModuleList(
            [Layer(cfg, gen, tdtype, dev, depth_scale) for _ in range(cfg.n_prelude)]
        )
        self.shared = nn.ModuleList([Layer(cfg, gen, tdtype, dev, depth_scale) for _ in range(cfg.n_shared)])
        self.coda = nn.ModuleList([Layer(cfg, gen, tdtype, dev, depth_scale) for _ in range(cfg.n_coda)])
        # typed views of the registered layers
        self.prelude_layers: list[Layer] = list(self.prelude)  # type: ignore[arg-type]
        self.shared_layers: list[Layer] = list(self.shared)  # type: ignore[arg-type]
        self.coda_layers: list[Layer] = list(self.coda)  # type: ignore[arg-type]
        self.loop_norm = _ones(h, tdtype, dev)
        self.final_norm = _ones(h, tdtype, dev) if cfg.n_coda else None
        self.gate_w = _w((h, 1), 1 / math.sqrt(h), gen, tdtype, dev)
        self.gate_b = nn.Parameter(torch.zeros(1, dtype=tdtype, device=dev), requires_grad=False)
        self.inject_w = _w((2 * h, h), 1 / math.sqrt(2 * h), gen, tdtype, dev) if cfg.inject else None
        self.head_w = None if cfg.tie_embeddings else _w((h, cfg.vocab), 1 / math.sqrt(h), gen, tdtype, dev)
        self.set_max_positions(max_positions)

    def set_max_positions(self, n: int) -> None:
        """(Re)build the RoPE tables for positions ``0..n-1``."""
        d = self.cfg.head_dim
        inv = 1.0 / (
            self.cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=self.device) / d)
        )
        ang = torch.arange(n, dtype=torch.float32, device=self.device)[:, None] * inv[None, :]
        self.rope_cos = ang.cos().to(self.tdtype)
        self.rope_sin = ang.sin().to(self.tdtype)
        self.max_positions = n

    def param_count(self) -> int:
        """Parameters actually allocated (tied embeddings counted once)."""
        seen: set[int] = set()
        n = 0
        for p in self.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                n += p.numel()
        return n

    # -- building blocks -------------------------------------------------------------------

    def _layer(
        self, lw: Layer, x: torch.Tensor, view: View, pk: torch.Tensor, pv: torch.Tensor
    ) -> torch.Tensor:
        cfg = self.cfg
        T = x.shape[0]
        hq, hk, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        h = F.rms_norm(x, (cfg.hidden,), lw.norm1, cfg.norm_eps)
        qkv = h @ lw.wqkv
        qk = qkv[:, : (hq + hk) * d].view(T, hq + hk, d)
        half = d // 2
        c, s = view.cos, view.sin
        x1, x2 = qk[..., :half], qk[..., half:]
        qk = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
        q = qk[:, :hq]
        pk.index_copy_(1, view.slot_map, qk[:, hq:].transpose(0, 1))
        pv.index_copy_(1, view.slot_map, qkv[:, (hq + hk) * d :].view(T, hk, d).transpose(0, 1))
        outs = [self._attend(q, pk, pv, g) for g in view.groups]
        o = outs[0] if len(outs) == 1 else torch.cat(outs)
        x = x + o @ lw.wo
        h = F.rms_norm(x, (cfg.hidden,), lw.norm2, cfg.norm_eps)
        gate, up = (h @ lw.w_gu).chunk(2, dim=-1)
        return x + (F.silu(gate) * up) @ lw.w_down

    def _attend(self, q: torch.Tensor, pk: torch.Tensor, pv: torch.Tensor, g: Any) -> torch.Tensor:
        """Attention of one group's queries over keys/values gathered from the cache."""
        cfg = self.cfg
        hq, hk, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        B, n = g.B, g.n
        flat = g.kv_idx.reshape(-1)
        L = g.kv_idx.shape[1]
        kg = pk.index_select(1, flat).view(hk, B, L, d)  # contiguous gather, head-major
        vg = pv.index_select(1, flat).view(hk, B, L, d)
        qs = q[g.off : g.off + B * n]  # [B*n, hq, d]
        if self.device.type == "cuda":
            qg = qs.reshape(B, n, hq, d).transpose(1, 2)  # [B, hq, n, d]
            o = F.scaled_dot_product_attention(
                qg, kg.transpose(0, 1), vg.transpose(0, 1), attn_mask=g.mask, enable_gqa=hq != hk
            )
            return o.transpose(1, 2).reshape(B * n, hq * d)
        # CPU: the same maths in three batched matmuls over (kv head, row) without copying
        # the gathered keys; at these sizes it beats SDPA's CPU kernels.  Query heads
        # h*grp .. h*grp+grp-1 share KV head h (GQA).
        grp = hq // hk
        qg = qs.reshape(B, n, hk, grp, d).permute(2, 0, 3, 1, 4).reshape(hk, B, grp * n, d)
        s = torch.matmul(qg, kg.transpose(-1, -2)) * (1.0 / math.sqrt(d))  # [hk, B, grp*n, L]
        if g.mask is not None:
            m = g.mask[:, 0].unsqueeze(1)  # [B, 1, n, L]
            s = s.view(hk, B, grp, n, L).masked_fill(~m, float("-inf")).view(hk, B, grp * n, L)
        o = torch.matmul(torch.softmax(s, dim=-1), vg)  # [hk, B, grp*n, d]
        return o.view(hk, B, grp, n, d).permute(1, 3, 0, 2, 4).reshape(B * n, hq * d)

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        if self.head_w is None:
            return F.linear(x, self.embed)  # tied: the embedding matrix, [vocab, hidden]
        return x @ self.head_w

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (self.cfg.hidden,), w, self.cfg.norm_eps)

    # -- one pass ----------------------------------------------------------------------------

    def forward(
        self,
        b: StepBatch,
        kv: KVCache,
        counter: StepCounter,
        policy: ExitPolicy,
        mode: str = "select",
        loops: int | None = None,
        hooks: PassHooks | None = None,
        oracle_depths: np.ndarray | None = None,
    ) -> PassResult:
        """Run every token of ``b`` through the model; logits for its output tokens.

        ``loops`` caps the passes (drafting); ``oracle_depths`` gives each output token's
        exit depth for the oracle policy.
        """
        cfg = self.cfg
        L = min(cfg.max_loops, loops or cfg.max_loops)
        hooks = hooks or PassHooks()
        mark = hooks.mark
        stage = hooks.stage
        exit_marks = hooks.exit_marks and mark is not None
        ev = hooks.events
        full = b.full
        n_out = len(b.out_flat)

        x = F.embedding(b.input_ids, self.embed)
        counter.embed(b.T)
        for i, lw in enumerate(self.prelude_layers):
            pk, pv = kv.base_pool(i)
            x = self._layer(lw, x, full, pk, pv)
            counter.layer(b.T, full.keys)
        e = x
        h = x

        # exit bookkeeping
        kind = policy.kind
        fixed_depth = (policy.depth or L) if kind == "fixed" else L
        fixed_depth = min(fixed_depth, L)
        compact = mode == "compact"
        if kind == "oracle" and oracle_depths is not None:
            want = np.minimum(oracle_depths, L)
        elif kind == "fixed":
            want = np.full(n_out, fixed_depth, dtype=np.int64)
        else:
            want = None  # decided on the fly (gate / kl)
        view = full
        out_local = b.out_flat  # positions of the output tokens in the current view
        out_alive = np.arange(n_out)  # output tokens whose row is still in the view
        stash = torch.empty((n_out, cfg.hidden), dtype=h.dtype, device=h.device)
        # select mode keeps decisions on the device (no sync); compact needs them on the host
        decided_np = np.zeros(n_out, dtype=np.int64)
        decided_t = torch.zeros(n_out, dtype=torch.long, device=h.device)
        want_t = torch.from_numpy(want).to(h.device) if (want is not None and not compact) else None
        surv = torch.ones(n_out, dtype=torch.float32, device=h.device) if kind == "gate" else None
        prev_logp: torch.Tensor | None = None
        h_full: torch.Tensor | None = None  # compact: final states of rows that left early
        e_view = e

        for d in range(1, L + 1):
            if view.T == 0:  # compact: every row has left
                hooks.loop_ns.append(0)
                hooks.loop_tokens.append(0)
                continue
            t0 = clk()
            if ev is not None:
                e0 = ev()
                e0.record()
            if self.inject_w is not None:
                h = torch.cat((h, e_view), dim=-1) @ self.inject_w
                counter.inject(view.T)
            for i, lw in enumerate(self.shared_layers):
                pk, pv = kv.loop_pool(d, i)
                h = self._layer(lw, h, view, pk, pv)
                counter.layer(view.T, view.keys)
            h = self._norm(h, self.loop_norm)
            counter.norm(view.T)
            if ev is not None:
                e1 = ev()
                e1.record()
                hooks.loop_events.append((e0, e1))
            hooks.loop_ns.append(clk() - t0)
            hooks.loop_tokens.append(view.T)
            if n_out == 0:
                continue
            need_check = kind in ("gate", "kl") or d == L or (want is not None and (want == d).any())
            if not need_check:
                continue
            if exit_marks:
                mark("exit_check")  # type: ignore[misc]
            # ---- exit check on the output tokens still in the view
            loc_t = torch.from_numpy(out_local).to(h.device) if out_local is not b.out_flat else b.out_flat_t
            h_out = h.index_select(0, loc_t)
            if not compact:
                if kind == "gate":
                    lam = torch.sigmoid((h_out @ self.gate_w + self.gate_b).squeeze(-1).float())
                    counter.gate(len(out_local))
                    assert surv is not None
                    surv = surv * (1.0 - lam)
                    newly = ((1.0 - surv) >= policy.threshold) & (decided_t == 0)
                    if d == L:
                        newly = decided_t == 0
                elif kind == "kl":
                    logp = F.log_softmax(self._head(h_out).float(), dim=-1)
                    counter.head(len(out_local))
                    if prev_logp is None:
                        newly = torch.zeros_like(decided_t, dtype=torch.bool)
                    else:
                        klv = (logp.exp() * (logp - prev_logp)).sum(-1)
                        newly = (klv < policy.threshold) & (decided_t == 0)
                    if d == L:
                        newly = decided_t == 0
                    prev_logp = logp
                else:
                    assert want_t is not None
                    newly = want_t == d
                stash = torch.where(newly.unsqueeze(1), h_out, stash)
                decided_t = torch.where(newly, torch.full_like(decided_t, d), decided_t)
            else:
                alive = out_alive
                und = decided_np[alive] == 0
                if kind == "gate":
                    lam = torch.sigmoid((h_out @ self.gate_w + self.gate_b).squeeze(-1).float())
                    counter.gate(len(alive))
                    assert surv is not None
                    s_alive = surv[torch.from_numpy(alive).to(h.device)] * (1.0 - lam)
                    surv[torch.from_numpy(alive).to(h.device)] = s_alive
                    hit = ((1.0 - s_alive) >= policy.threshold).cpu().numpy()
                elif kind == "kl":
                    logp = F.log_softmax(self._head(h_out).float(), dim=-1)
                    counter.head(len(alive))
                    if prev_logp is None:
                        hit = np.zeros(len(alive), dtype=bool)
                    else:
                        pl = prev_logp.index_select(0, torch.from_numpy(alive).to(h.device))
                        hit = ((logp.exp() * (logp - pl)).sum(-1) < policy.threshold).cpu().numpy()
                    if prev_logp is None:
                        prev_logp = torch.empty((n_out, logp.shape[1]), dtype=logp.dtype, device=logp.device)
                    prev_logp[torch.from_numpy(alive).to(h.device)] = logp
                else:
                    assert want is not None
                    hit = want[alive] == d
                if d == L:
                    hit = np.ones(len(alive), dtype=bool)
                newly_np = hit & und
                if newly_np.any():
                    sel = np.nonzero(newly_np)[0]
                    stash[torch.from_numpy(alive[sel]).to(h.device)] = h_out[
                        torch.from_numpy(sel).to(h.device)
                    ]
                    decided_np[alive[sel]] = d
                if d < L:
                    # rows whose tokens are all outputs and all decided leave the batch
                    row_done = b.row_all_out.copy()
                    undecided_rows = b.out_row[decided_np == 0]
                    row_done[undecided_rows] = False
                    in_view = np.zeros(b.R, dtype=bool)
                    in_view[view.rows] = True
                    leaving = in_view & row_done
                    if leaving.any():
                        h_full, h, view, e_view = self._compact(
                            b, view, h, e, h_full, leaving, kv, d, L, counter
                        )
                        alive_mask = ~row_done[b.out_row]
                        out_alive = np.nonzero(alive_mask)[0]
                        out_local = b.local_index(view, b.out_flat[out_alive])
            if exit_marks and d < L:
                mark(stage)  # type: ignore[misc]

        # ---- states for the coda / head
        if compact and h_full is not None:
            assert view.tok_idx is not None
            h_full.index_copy_(0, view.tok_idx, h)
            h = h_full
        if n_out:
            h = h.index_copy(0, b.out_flat_t, stash)
        if exit_marks and n_out:
            mark(stage)  # type: ignore[misc]
        for i, lw in enumerate(self.coda_layers):
            pk, pv = kv.base_pool(cfg.n_prelude + i)
            h = self._layer(lw, h, full, pk, pv)
            counter.layer(b.T, full.keys)
        if n_out == 0:
            return PassResult(torch.empty((0, cfg.vocab), device=h.device), np.zeros(0, dtype=np.int64))
        h_o = h.index_select(0, b.out_flat_t)
        if self.final_norm is not None:
            h_o = self._norm(h_o, self.final_norm)
            counter.norm(n_out)
        logits = self._head(h_o)
        counter.head(n_out)
        return PassResult(logits, decided_np if compact else decided_t)

    def _compact(self, b: StepBatch, view: View, h: torch.Tensor, e: torch.Tensor, h_full: torch.Tensor | None,
                 leaving: np.ndarray, kv: KVCache, d: int, L: int, counter: StepCounter,
                 ) -> tuple[torch.Tensor, torch.Tensor, View, torch.Tensor]:  # fmt: skip
        """Drop the ``leaving`` rows from the view after depth ``d``."""
        if h_full is None:
            h_full = torch.empty((b.T, h.shape[1]), dtype=h.dtype, device=h.device)
        lv_rows = view.rows[leaving[view.rows]]
        lv_tok = b.row_tokens(lv_rows)
        lv_local = b.local_index(view, lv_tok)
        lv_tok_t = torch.from_numpy(lv_tok).to(h.device)
        h_full.index_copy_(0, lv_tok_t, h.index_select(0, torch.from_numpy(lv_local).to(h.device)))
        # tokens that skip depths d+1..L still need KV there (per-depth policy): copy it
        slots = b.slot_map.index_select(0, lv_tok_t)
        caches = kv.copy_to_deeper(slots, d, L)
        if caches:
            counter.kv_copy(len(lv_tok), caches)
        keep_rows = view.rows[~leaving[view.rows]]
        new_view = b.view(keep_rows)
        keep_local = b.local_index(view, b.row_tokens(new_view.rows))
        kl_t = torch.from_numpy(keep_local).to(h.device)
        h = h.index_select(0, kl_t)
        e_view = e.index_select(0, new_view.tok_idx) if new_view.tok_idx is not None else e
        return h_full, h, new_view, e_view
