"""KV cache: a paged pool of blocks, per loop depth or shared across depths.

Storage is paged like vLLM's: each layer cache is one tensor of ``num_blocks x
block_tokens`` token slots (``[kv_heads, slots, head_dim]``, head-major so that a gather
comes out ready for batched matmuls); a sequence owns a list of
block ids and its token ``i`` lives in slot ``block[i // bt] * bt + i % bt``.  A block id
is allocated for a sequence in every layer cache at once:

- ``per_depth`` (Ouro): the shared block's layers keep one cache per loop depth, so a
  block id holds ``block_tokens`` tokens at each of ``max_loops`` depths.  Blocks in use
  and the capacity are reported per depth (``kv_per_depth`` has ``max_loops`` entries).
- ``shared`` (Huginn-style, a ring of one): one cache per layer, overwritten by each
  loop pass, so a token's entry holds the KV of the last depth it ran.  ``kv_per_depth``
  has a single entry: every depth reads the same cache.

For the same memory budget ``shared`` therefore holds about ``max_loops`` times more
tokens.  Prelude and coda layers (not looped) have one cache each under either policy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine_adapters.reference.analytic import kv_bytes_per_token_layer, kv_layer_caches
from engine_adapters.reference.presets import ModelConfig

KV_POLICIES = ("per_depth", "shared")


def parse_kv_policy(text: str) -> str:
    """Validate ``--kv-policy``."""
    if text not in KV_POLICIES:
        raise ValueError(f"unknown KV policy {text!r}; use per_depth or shared")
    return text


def blocks_for_memory(cfg: ModelConfig, policy: str, block_tokens: int, mem_bytes: int, bpe: int) -> int:
    """Block ids that fit in ``mem_bytes`` of KV memory under ``policy``."""
    per_block = block_tokens * kv_layer_caches(cfg, policy) * kv_bytes_per_token_layer(cfg, bpe)
    return max(1, mem_bytes // per_block)


class BlockAllocator:
    """Free list of block ids."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def free(self) -> int:
        """Block ids free."""
        return len(self._free)

    @property
    def used(self) -> int:
        """Block ids in use."""
        return self.num_blocks - len(self._free)

    def allocate(self, n: int) -> list[int]:
        """``n`` block ids (caller checked ``free``)."""
        out = self._free[-n:] if n else []
        del self._free[len(self._free) - n :]
        return out[::-1]

    def release(self, blocks: list[int]) -> None:
        """Give block ids back."""
        self._free.extend(reversed(blocks))


class SeqBlocks:
    """A sequence's block table and the slot of each of its token positions."""

    __slots__ = ("block_tokens", "blocks", "slots")

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self.blocks: list[int] = []
        self.slots = np.zeros(0, dtype=np.int64)

    @property
    def capacity(self) -> int:
        """Token positions covered by the blocks held."""
        return len(self.blocks) * self.block_tokens

    def blocks_needed(self, tokens: int) -> int:
        """More block ids needed to cover ``tokens`` positions."""
        need = -(-tokens // self.block_tokens) - len(self.blocks)
        return max(0, need)

    def grow(self, new_blocks: list[int]) -> None:
        """Append block ids."""
        if not new_blocks:
            return
        bt = self.block_tokens
        add = (np.asarray(new_blocks, dtype=np.int64)[:, None] * bt + np.arange(bt, dtype=np.int64)).reshape(
            -1
        )
        self.blocks.extend(new_blocks)
        self.slots = np.concatenate((self.slots, add))

    def shrink_to(self, tokens: int) -> list[int]:
        """Keep blocks covering ``tokens`` positions; return the ids let go (rollback)."""
        keep = -(-tokens // self.block_tokens)
        gone = self.blocks[keep:]
        if gone:
            del self.blocks[keep:]
            self.slots = self.slots[: keep * self.block_tokens]
        return gone

    def clear(self) -> list[int]:
        """Drop every block (preemption, finish); return the ids."""
        gone = self.blocks
        self.blocks = []
        self.slots = np.zeros(0, dtype=np.int64)
        return gone


class KVCache:
    """The layer caches of a model under a KV policy, with their block allocator."""

    def __init__(
        self, cfg: ModelConfig, policy: str, num_blocks: int, block_tokens: int, dtype: Any, device: Any
    ) -> None:
        import torch

        self.cfg = cfg
        self.policy = policy
        self.block_tokens = block_tokens
        self.num_blocks = num_blocks
        self.depth_pools = cfg.max_loops if policy == "per_depth" else 1
        slots = num_blocks * block_tokens
        shape_l = (self.depth_pools, cfg.n_shared, cfg.n_kv_heads, slots, cfg.head_dim)
        self.loop_k = torch.zeros(shape_l, dtype=dtype, device=device)
        self.loop_v = torch.zeros(shape_l, dtype=dtype, device=device)
        n_base = cfg.n_prelude + cfg.n_coda
        shape_b = (max(1, n_base), cfg.n_kv_heads, slots, cfg.head_dim)
        self.base_k = torch.zeros(shape_b, dtype=dtype, device=device)
        self.base_v = torch.zeros(shape_b, dtype=dtype, device=device)
        self.alloc = BlockAllocator(num_blocks)
        self.bytes = sum(
            t.numel() * t.element_size() for t in (self.loop_k, self.loop_v, self.base_k, self.base_v)
        )

    def loop_pool(self, depth: int, layer: int) -> tuple[Any, Any]:
        """K and V of shared-block layer ``layer`` at loop depth ``depth`` (1-based)."""
        d = depth - 1 if self.policy == "per_depth" else 0
        return self.loop_k[d, layer], self.loop_v[d, layer]

    def base_pool(self, index: int) -> tuple[Any, Any]:
        """K and V of prelude layer ``index`` (coda layers follow the prelude ones)."""
        return self.base_k[index], self.base_v[index]

    def copy_to_deeper(self, slots: Any, from_depth: int, up_to: int) -> int:
        """Per-depth policy: copy the shared layers' KV of ``slots`` from ``from_depth``
        into depths ``from_depth+1 .. up_to`` (tokens that left the batch early still
        need KV at the depths they skipped).  Returns the layer caches written."""
        if self.policy != "per_depth" or from_depth >= up_to:
            return 0
        d0 = from_depth - 1
        for t in (self.loop_k, self.loop_v):
            src = t[d0, :, :, slots]  # [n_shared, Hk, n, D]
            t[d0 + 1 : up_to, :, :, slots] = src.unsqueeze(0)
        return (up_to - from_depth) * self.cfg.n_shared

    # -- accounting -------------------------------------------------------------------------

    @property
    def total_blocks(self) -> int:
        """Capacity in blocks, all depth pools together (``EngineInfo.kv_capacity_blocks``)."""
        return self.num_blocks * self.depth_pools

    def usage(self) -> tuple[int, int, list[int]]:
        """(blocks used, blocks total, blocks used per depth pool)."""
        used = self.alloc.used
        return used * self.depth_pools, self.total_blocks, [used] * self.depth_pools

    def describe(self) -> str:
        """Capacity for the engine info and the contract."""
        per = "per loop depth" if self.policy == "per_depth" else "shared by all loop depths"
        return (
            f"{self.num_blocks} blocks x {self.block_tokens} tokens {per} ({self.depth_pools} pool"
            f"{'s' if self.depth_pools > 1 else ''}, {self.total_blocks} blocks in all, "
            f"{self.num_blocks * self.block_tokens} tokens, {self.bytes / 2**20:.1f} MiB)"
        )
