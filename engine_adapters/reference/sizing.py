"""How big the reference engine is, decided from its configuration before any tensor
exists: the batch limits and the KV pool (``plan_kv_pool``), and torch with the device
checked (``import_torch``).  Every problem is an ``EngineError`` that says what to change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine_adapters.reference.config import KV_FIT_REQUESTS, EngineConfig, EngineError
from engine_adapters.reference.kvcache import blocks_for_memory
from engine_adapters.reference.loadgen import WorkloadSpec
from engine_adapters.reference.presets import ModelConfig, Preset
from engine_adapters.reference.spec import SpecConfig


@dataclass(frozen=True)
class KVPlan:
    """The batch limits and the KV pool of one engine."""

    max_num_seqs: int
    """Requests running at once."""
    token_budget: int
    """Tokens in one step."""
    block_tokens: int
    """Tokens per KV block."""
    need: int
    """Tokens of KV one request needs (prompt, output, drafts)."""
    blocks: int
    """KV blocks in the pool."""
    raised: str | None
    """Why the default pool is larger than the preset's budget (None: it is not)."""


def plan_kv_pool(
    cfg: EngineConfig,
    preset: Preset,
    model_cfg: ModelConfig,
    workload: WorkloadSpec,
    spec: SpecConfig | None,
    kv_policy: str,
    bpe: int,
) -> KVPlan:
    """Batch limits and the KV pool for ``cfg`` over ``preset`` (flags first, then the
    preset's defaults)."""
    max_num_seqs = cfg.max_num_seqs or preset.engine.max_num_seqs
    token_budget = cfg.token_budget or preset.engine.token_budget
    bt = cfg.kv_block_tokens or preset.engine.kv_block_tokens
    if max_num_seqs < 1 or token_budget < 1 or bt < 1:
        raise EngineError("--max-num-seqs, --token-budget and --kv-block-tokens must be >= 1")
    if spec and token_budget < spec.draft_len + 1:
        raise EngineError(f"--token-budget must be at least draft_len + 1 = {spec.draft_len + 1}")
    if cfg.kv_blocks is not None and cfg.kv_blocks < 1:
        raise EngineError(f"--kv-blocks must be >= 1, not {cfg.kv_blocks}")
    w = workload
    need = w.prompt_len + w.output_len + (spec.draft_len if spec else 0)
    raised: str | None = None
    if cfg.kv_blocks is not None:
        nblocks = cfg.kv_blocks
    else:
        nblocks = blocks_for_memory(model_cfg, kv_policy, bt, preset.engine.kv_mem_bytes, bpe)
        # The budget keeps the demo's bursts under KV pressure; a workload with longer
        # requests (rate-4096: 4160 tokens) still runs without flags: the default pool
        # grows to hold KV_FIT_REQUESTS of its requests (one running, one admitted).
        fit = KV_FIT_REQUESTS * -(-need // bt)
        if nblocks < fit:
            raised = (
                f"raised from the preset's {preset.engine.kv_mem_bytes / 2**20:.0f} MiB budget "
                f"({nblocks} blocks) to hold {KV_FIT_REQUESTS} requests of {need} tokens"
            )
            nblocks = fit
    if need > nblocks * bt:
        raise EngineError(
            f"workload {w.text!r} needs {need} tokens of KV per request but the {kv_policy} cache holds "
            f"{nblocks * bt} ({nblocks} blocks x {bt}); raise --kv-blocks (to at least {-(-need // bt)}) "
            "or use --kv-policy shared"
        )
    return KVPlan(max_num_seqs, token_budget, bt, need, nblocks, raised)


def import_torch(dev: str) -> Any:
    """torch, imported only now (bad flags are reported without paying for it), and
    the CUDA device ``dev`` (``cpu`` or ``cuda:N``) checked."""
    try:
        import torch
    except ImportError:
        raise EngineError("PyTorch is not installed: pip install torch") from None
    if dev.startswith("cuda"):
        if not torch.cuda.is_available():
            raise EngineError(
                "--device cuda: this torch build or machine has no CUDA device "
                f"(torch {torch.__version__}, cuda {torch.version.cuda}); use --device cpu"
            )
        if int(dev[5:]) >= torch.cuda.device_count():
            raise EngineError(f"--device {dev}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return torch
