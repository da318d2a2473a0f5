"""``OuroConfig``: the HF configuration of Ouro, written for this project.

Ouro (ByteDance Seed, "Scaling Latent Reasoning via Looped Language Models") is a
Qwen/Llama-style decoder (RMSNorm, RoPE, SwiGLU, no attention bias) whose whole stack of
``num_hidden_layers`` layers runs ``total_ut_steps`` times per token; each layer has a
"sandwich" norm (``input_layernorm`` / ``input_layernorm_2`` around attention,
``post_attention_layernorm`` / ``post_attention_layernorm_2`` around the MLP), the final
norm is applied after every pass and its output feeds the next pass, and a linear
early-exit gate (``early_exit_gate``: hidden -> 1, with bias) scores every pass.
``early_exit_threshold`` q is the cumulative exit probability at which a token stops
(1.0: always full depth).

The fields are those of transformers' ``Qwen2Config`` plus ``total_ut_steps`` and
``early_exit_threshold``; unknown keys of a real checkpoint's ``config.json`` (``auto_map``,
``chunk_size`` …) are kept as attributes and ignored.  Importing this module imports
transformers (never torch-heavy vllm).
"""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import Qwen2Config


@strict
class OuroConfig(Qwen2Config):
    """Ouro's configuration: ``Qwen2Config`` + ``total_ut_steps`` + ``early_exit_threshold``."""

    model_type = "ouro"

    num_key_value_heads: int | None = None
    total_ut_steps: int = 4
    """Passes over the whole layer stack per token."""
    early_exit_threshold: float | None = 1.0
    """Cumulative exit probability q at which a token exits (None or >= 1: full depth)."""


def register_auto_config() -> None:
    """Make ``AutoConfig`` map ``model_type: ouro`` to ``OuroConfig`` (idempotent)."""
    from transformers import AutoConfig

    AutoConfig.register("ouro", OuroConfig, exist_ok=True)
