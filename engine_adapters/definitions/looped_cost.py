"""Bytes and FLOPs of one step of a looped decoder, from its shape: defined once here.

A looped model (Ouro: ``total_ut_steps`` passes over all ``num_hidden_layers`` layers)
moves and computes, per engine step (conventions of docs/ARCHITECTURE.md, "Units and
conventions", the same as the reference engine's ``analytic``):

- **per pass actually run** (the looped share): every layer's weights read once; per
  layer, the KV of every key a query attends to read once and the new tokens' keys and
  values written once (one KV cache per pass and layer); the norm after the pass; the
  exit gate when it is evaluated; the matmul and attention FLOPs of the tokens;
- **once per step**: the embedding rows looked up; the LM head's weight once and its
  FLOPs for the rows that need logits (its input and logits are activations, left out).

A multiply-add is 2 FLOPs.  ``step_cost`` is the in-engine figure (rltperf's vLLM
plugin, per step, from the scheduler's batch); ``head_*`` and ``loop_corrected`` are the
once-per-step share and the correction that the vLLM HTTP adapter applies to vLLM's own
estimator, which counts the layers once (``monitor/vllm/metrics.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

DTYPE_BYTES = {"float32": 4, "fp32": 4, "float": 4, "bfloat16": 2, "float16": 2, "fp16": 2, "half": 2, "bf16": 2,
               "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1}  # fmt: skip
"""Bytes per element by dtype name."""

MFU_CAVEAT = "vLLM's byte/FLOP estimator counts num_hidden_layers once, not once a loop"
"""Why a looped model's estimates need correcting (``monitor/vllm/metrics.py`` ends each
note about it with this).  A note that carries it says its conclusion first (corrected or
not, by what), so a row cut to the screen's width keeps the part that tells the reader
something; ``server_window`` shows such a note beside MBU."""


@dataclass(frozen=True)
class LoopedShape:
    """What the cost needs of a model's config (HF names in ``from_config``)."""

    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    passes: int = 1
    """Passes over the layer stack per token (Ouro ``total_ut_steps``)."""
    bytes_per_elem: int = 2
    norms_per_layer: int = 4
    """RMSNorm weight vectors per layer (Ouro's sandwich norm: 4; Llama: 2)."""
    gate: bool = True
    """An exit gate (hidden -> 1, with bias) after each pass."""

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def layer_params(self) -> int:
        """Parameters of one layer: QKV, O, SwiGLU, norms."""
        h = self.hidden
        return (
            h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h + 3 * h * self.ffn + self.norms_per_layer * h
        )

    @classmethod
    def from_config(cls, cfg: Any, dtype: str | None = None) -> LoopedShape | None:
        """From a HF config object or ``config.json`` dict; None without the sizes."""

        def get(k: str, default: Any = None) -> Any:
            return cfg.get(k, default) if isinstance(cfg, dict) else getattr(cfg, k, default)

        h, ffn, layers, heads, vocab = (get(k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                         "num_attention_heads", "vocab_size"))  # fmt: skip
        if not all(isinstance(v, int) and v > 0 for v in (h, ffn, layers, heads, vocab)):
            return None
        kv = get("num_key_value_heads") or heads
        hd = get("head_dim") or h // heads
        name = str(dtype or get("torch_dtype") or get("dtype") or "bfloat16").removeprefix("torch.")
        passes = get("total_ut_steps") or 1
        return cls(hidden=h, ffn=ffn, layers=layers, heads=heads, kv_heads=int(kv), head_dim=int(hd), vocab=vocab,
                   passes=int(passes), bytes_per_elem=DTYPE_BYTES.get(name, 2),
                   norms_per_layer=4 if get("model_type") == "ouro" else 2,
                   gate=get("model_type") == "ouro")  # fmt: skip


@dataclass
class StepCost:
    """One step's analytic traffic and work, split into the looped and once-per-step shares."""

    bytes_read: int = 0
    bytes_written: int = 0
    flops: float = 0.0
    looped_read: int = 0
    """Of ``bytes_read``: the per-pass share (weights of the stack, KV read, norm, gate)."""
    kv_read: int = 0
    kv_written: int = 0


def keys_attended(seqs: Iterable[tuple[int, int]]) -> int:
    """Sum over the new tokens of the keys each attends to (causal): ``q·c + q(q+1)/2`` per sequence
    of ``q`` new tokens after ``c`` cached ones."""
    return sum(q * c + q * (q + 1) // 2 for q, c in seqs)


def step_cost(shape: LoopedShape, seqs: list[tuple[int, int]], out_rows: int, passes: int | None = None,
              gate_passes: int | None = None) -> StepCost:  # fmt: skip
    """Bytes and FLOPs of one step: ``seqs`` = (new tokens, cached tokens before the step) per
    sequence, ``out_rows`` rows needing logits, ``passes`` run (default ``shape.passes``),
    the gate evaluated on ``gate_passes`` of them (default ``passes - 1`` when the model has
    one: the last pass needs no decision)."""
    b = shape.bytes_per_elem
    k = shape.passes if passes is None else passes
    g = (max(0, k - 1) if shape.gate else 0) if gate_passes is None else gate_passes
    n = sum(q for q, _ in seqs)
    keys = keys_attended(seqs)
    h = shape.hidden
    c = StepCost()
    kv_r = k * shape.layers * keys * 2 * shape.kv_dim * b
    kv_w = k * shape.layers * n * 2 * shape.kv_dim * b
    looped = k * (shape.layers * shape.layer_params() + h) * b + kv_r + g * (h + 1) * b
    c.looped_read = looped
    c.kv_read, c.kv_written = kv_r, kv_w
    c.bytes_read = looped + n * h * b + shape.vocab * h * b  # embedding rows, LM head weight once
    c.bytes_written = kv_w
    lin = 2.0 * n * (h * (shape.q_dim + 2 * shape.kv_dim) + shape.q_dim * h + 3 * h * shape.ffn)
    att = 4.0 * shape.q_dim * keys
    c.flops = (
        k * shape.layers * (lin + att)
        + k * 4.0 * n * h
        + g * 2.0 * n * h
        + head_flops(h, shape.vocab, out_rows)
    )
    return c


def head_flops(hidden: int, vocab: int, rows: float) -> float:
    """FLOPs of the LM head for ``rows`` logits rows."""
    return 2.0 * rows * hidden * vocab


def head_read_bytes(
    hidden: int, vocab: int, bytes_per_elem: float, steps: float = 1.0, rows: float = 0.0
) -> float:
    """Bytes the LM head reads: its weight once per step (plus ``rows`` input rows, when counted)."""
    return (steps * hidden * vocab + rows * hidden) * bytes_per_elem


def head_write_bytes(vocab: int, bytes_per_elem: float, rows: float) -> float:
    """Bytes of ``rows`` logits rows (counted by vLLM's estimator, not by ``step_cost``)."""
    return rows * vocab * bytes_per_elem


def loop_corrected(value: float, once_share: float, passes: float) -> float:
    """A figure that counted the layer stack once, corrected to ``passes`` passes:
    ``k·(X − H) + H = k·X − (k − 1)·H`` with ``H`` the once-per-step share (capped at ``X``)."""
    return passes * value - (passes - 1.0) * min(max(0.0, once_share), value)
