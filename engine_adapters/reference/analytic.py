"""Analytic counts of the reference model: parameters, bytes and FLOPs.

The engine adds these up as it runs a step (``StepCounter``), so every step record
carries the ground truth of what that step had to move and compute.  Conventions
(docs/ARCHITECTURE.md, "Units and conventions"): a looped block's weights are read once per loop pass actually run; the
embedding reads only the rows it looks up; KV read is every cached key and value a query
attends to, once per layer application (the ideal of a fused kernel: the reference
engine's own gather copies it once more); KV written is every new key and value.
A multiply-add is 2 FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine_adapters.reference.presets import ModelConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes per element of the dtypes the engine runs in."""


def layer_params(cfg: ModelConfig) -> int:
    """Parameters of one transformer layer (two RMSNorms, fused QKV, O, SwiGLU)."""
    h = cfg.hidden
    attn = h * (cfg.q_dim + 2 * cfg.kv_dim) + cfg.q_dim * h
    mlp = 3 * h * cfg.ffn
    return attn + mlp + 2 * h


def gate_params(cfg: ModelConfig) -> int:
    """Parameters of the exit gate (Ouro: a linear map to one logit, with bias)."""
    return cfg.hidden + 1


def inject_params(cfg: ModelConfig) -> int:
    """Parameters of the Huginn input-injection adapter (``[h, e] -> h``), 0 without it."""
    return 2 * cfg.hidden * cfg.hidden if cfg.inject else 0


def param_count(cfg: ModelConfig) -> int:
    """All parameters: embedding, layers, norms, exit gate, adapter and LM head."""
    emb = cfg.vocab * cfg.hidden
    head = 0 if cfg.tie_embeddings else cfg.vocab * cfg.hidden
    norms = cfg.hidden  # the norm after each loop pass
    if cfg.n_coda:
        norms += cfg.hidden  # final norm after the coda
    return emb + head + cfg.n_layers * layer_params(cfg) + norms + gate_params(cfg) + inject_params(cfg)


def kv_bytes_per_token_layer(cfg: ModelConfig, bpe: int) -> int:
    """Bytes of one token's key and value in one layer cache."""
    return 2 * cfg.kv_dim * bpe


def kv_layer_caches(cfg: ModelConfig, kv_policy: str) -> int:
    """Layer caches a token occupies: per depth for each shared layer, or one per layer."""
    looped = cfg.n_shared * (cfg.max_loops if kv_policy == "per_depth" else 1)
    return cfg.n_prelude + cfg.n_coda + looped


def model_shape(cfg: ModelConfig) -> dict[str, Any]:
    """Shape facts for ``EngineInfo.model_shape`` (the parameter count included)."""
    return {
        "hidden": cfg.hidden,
        "ffn": cfg.ffn,
        "layers": cfg.n_layers,
        "prelude": cfg.n_prelude,
        "shared": cfg.n_shared,
        "coda": cfg.n_coda,
        "max_loops": cfg.max_loops,
        "heads": cfg.n_heads,
        "kv_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "vocab": cfg.vocab,
        "tied_embeddings": cfg.tie_embeddings,
        "input_injection": cfg.inject,
        "params": param_count(cfg),
    }


def layer_linear_flops(cfg: ModelConfig, tokens: int) -> float:
    """FLOPs of a layer's matrix multiplies for ``tokens`` tokens."""
    h = cfg.hidden
    return 2.0 * tokens * (h * (cfg.q_dim + 2 * cfg.kv_dim) + cfg.q_dim * h + 3 * h * cfg.ffn)


def attention_flops(cfg: ModelConfig, keys_attended: int) -> float:
    """FLOPs of QK^T and PV given the sum over queries of keys each attends to."""
    return 4.0 * cfg.q_dim * keys_attended


@dataclass
class StepCounter:
    """Running totals of one step's analytic bytes and FLOPs."""

    cfg: ModelConfig
    bpe: int
    bytes_read: int = 0
    bytes_written: int = 0
    flops: float = 0.0

    def reset(self) -> None:
        """Start a new step."""
        self.bytes_read = 0
        self.bytes_written = 0
        self.flops = 0.0

    def embed(self, tokens: int) -> None:
        """Embedding lookup of ``tokens`` rows (rows read, activations not counted)."""
        self.bytes_read += tokens * self.cfg.hidden * self.bpe

    def layer(self, tokens: int, keys_attended: int) -> None:
        """One layer application: weights once, KV read for the keys, KV written."""
        cfg = self.cfg
        self.bytes_read += layer_params(cfg) * self.bpe + keys_attended * 2 * cfg.kv_dim * self.bpe
        self.bytes_written += tokens * kv_bytes_per_token_layer(cfg, self.bpe)
        self.flops += layer_linear_flops(cfg, tokens) + attention_flops(cfg, keys_attended)

    def norm(self, tokens: int) -> None:
        """An RMSNorm's weight vector (the loop norm or the final norm)."""
        self.bytes_read += self.cfg.hidden * self.bpe
        self.flops += 4.0 * tokens * self.cfg.hidden

    def inject(self, tokens: int) -> None:
        """The input-injection adapter for ``tokens`` tokens (Huginn)."""
        n = inject_params(self.cfg)
        self.bytes_read += n * self.bpe
        self.flops += 2.0 * tokens * n

    def gate(self, tokens: int) -> None:
        """The exit gate for ``tokens`` tokens."""
        self.bytes_read += gate_params(self.cfg) * self.bpe
        self.flops += 2.0 * tokens * self.cfg.hidden

    def head(self, tokens: int) -> None:
        """The LM head for ``tokens`` tokens (weights once)."""
        n = self.cfg.vocab * self.cfg.hidden
        self.bytes_read += n * self.bpe
        self.flops += 2.0 * tokens * n

    def kv_copy(self, tokens: int, layer_caches: int) -> None:
        """Copy ``tokens`` tokens' KV into ``layer_caches`` deeper caches (read once each)."""
        b = tokens * layer_caches * kv_bytes_per_token_layer(self.cfg, self.bpe)
        self.bytes_read += b
        self.bytes_written += b


def decode_step(
    cfg: ModelConfig, dtype: str = "bfloat16", batch: int = 1, context: int = 0, loops: int | None = None
) -> dict[str, float]:
    """Bytes and FLOPs of one plain decode step: ``batch`` sequences with ``context``
    cached tokens each, every token running ``loops`` passes (default ``max_loops``),
    fixed exits, no gate or KL evaluation.

    Returns ``params``, ``weight_bytes`` (weights read), ``kv_read``, ``kv_written``,
    ``bytes_read``, ``bytes_written`` and ``flops``.
    """
    loops = cfg.max_loops if loops is None else loops
    bpe = DTYPE_BYTES[dtype]
    c = StepCounter(cfg, bpe)
    keys = batch * (context + 1)
    c.embed(batch)
    for _ in range(cfg.n_prelude):
        c.layer(batch, keys)
    for _ in range(loops):
        if cfg.inject:
            c.inject(batch)
        for _ in range(cfg.n_shared):
            c.layer(batch, keys)
        c.norm(batch)
    for _ in range(cfg.n_coda):
        c.layer(batch, keys)
    if cfg.n_coda:
        c.norm(batch)
    c.head(batch)
    layer_apps = cfg.n_prelude + cfg.n_coda + loops * cfg.n_shared
    kv_read = layer_apps * keys * 2 * cfg.kv_dim * bpe
    return {
        "params": float(param_count(cfg)),
        "weight_bytes": float(c.bytes_read - kv_read),
        "kv_read": float(kv_read),
        "kv_written": float(c.bytes_written),
        "bytes_read": float(c.bytes_read),
        "bytes_written": float(c.bytes_written),
        "flops": c.flops,
    }
