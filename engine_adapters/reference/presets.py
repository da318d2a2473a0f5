"""Model shapes and engine settings of the reference engine's presets.

A preset is a ``ModelConfig`` (the looped transformer's shape) plus ``EngineDefaults``
(scheduler limits, KV budget, default workload).  Two presets carry real public shapes
with random weights:

- ``ouro-1.4b-shape``: Ouro-1.4B (arXiv 2510.25741) -- 24 layers all looped 4 times
  (``total_ut_steps``), hidden 2048, ffn 5632, 16 heads / 16 KV heads of 128, vocab
  49152, untied embeddings, an exit gate; 1.435 B parameters.
- ``huginn-shape``: Huginn-0125 (arXiv 2502.05171) -- prelude 2 / recurrent core 4 /
  coda 2, hidden 5280, ffn 17920, 55 heads of 96 (MHA), vocab 65536, tied embeddings,
  input injection (an adapter over [state, embedding]) and mean recurrence 32.

Both are meant for GPUs; on the CPU they serve analytic counts (``--analytic``).  The
small presets drive the CPU: ``tiny`` (a few ms per decode step on one core; the demo)
and ``membound`` (1.1 GB of float32 weights, far larger than any CPU cache, so decode is bound
by memory bandwidth).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a looped transformer: prelude, shared block looped, coda, LM head."""

    name: str
    vocab: int
    hidden: int
    ffn: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_prelude: int
    n_shared: int
    n_coda: int
    max_loops: int
    tie_embeddings: bool = False
    inject: bool = False
    """Huginn-style input injection: each loop starts with ``adapter([h, e])``."""
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6

    @property
    def n_layers(self) -> int:
        """Distinct transformer layers (prelude + shared block + coda)."""
        return self.n_prelude + self.n_shared + self.n_coda

    @property
    def q_dim(self) -> int:
        """Width of the query projection (heads x head_dim)."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of each of the key and value projections."""
        return self.n_kv_heads * self.head_dim

    def describe(self) -> str:
        """One line: prelude / shared block x loops / coda."""
        inj = ", input injection" if self.inject else ""
        return (
            f"prelude {self.n_prelude} + shared block {self.n_shared} x {self.max_loops} loops "
            f"(RMSNorm between loops{inj}) + coda {self.n_coda}; hidden {self.hidden}, ffn {self.ffn}, "
            f"{self.n_heads} heads / {self.n_kv_heads} KV heads of {self.head_dim}, vocab {self.vocab}, "
            f"{'tied' if self.tie_embeddings else 'untied'} embeddings"
        )


@dataclass(frozen=True)
class EngineDefaults:
    """Scheduler and runtime defaults of a preset (each can be overridden on the CLI)."""

    max_num_seqs: int = 16
    token_budget: int = 256
    kv_block_tokens: int = 16
    kv_mem_bytes: int = 64 << 20
    """KV memory budget; the block count follows from it and the KV policy."""
    workload: str = "steady-bursts"
    threads: int | None = None
    """Intra-op threads (None: all cores)."""
    gpu_only: bool = False
    """Too large to run on a CPU here: ``--analytic`` only, unless forced."""
    dtype_cpu: str = "float32"
    dtype_cuda: str = "bfloat16"
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Preset:
    """A named model shape with its engine defaults."""

    model: ModelConfig
    engine: EngineDefaults
    summary: str


PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        ModelConfig(
            name="tiny",
            vocab=512,
            hidden=128,
            ffn=384,
            n_heads=4,
            n_kv_heads=2,
            head_dim=32,
            n_prelude=1,
            n_shared=2,
            n_coda=1,
            max_loops=4,
        ),
        EngineDefaults(
            max_num_seqs=16,
            token_budget=256,
            kv_block_tokens=16,
            kv_mem_bytes=14 << 20,
            workload="steady-bursts",
            threads=1,
        ),
        "demo model: a few ms per decode step on one CPU core",
    ),
    "membound": Preset(
        ModelConfig(
            name="membound",
            vocab=8192,
            hidden=2048,
            ffn=8192,
            n_heads=16,
            n_kv_heads=4,
            head_dim=128,
            n_prelude=1,
            n_shared=2,
            n_coda=1,
            max_loops=4,
        ),
        EngineDefaults(
            max_num_seqs=4,
            token_budget=512,
            kv_block_tokens=16,
            kv_mem_bytes=256 << 20,
            workload="closed:1,in=64,out=256",
            threads=1,  # per-core bandwidth; OpenMP barriers stall on shared machines
        ),
        "CPU decode bound by memory bandwidth: 1.1 GB of float32 weights, far above the caches",
    ),
    "ouro-1.4b-shape": Preset(
        ModelConfig(
            name="ouro-1.4b-shape",
            vocab=49152,
            hidden=2048,
            ffn=5632,
            n_heads=16,
            n_kv_heads=16,
            head_dim=128,
            n_prelude=0,
            n_shared=24,
            n_coda=0,
            max_loops=4,
        ),
        EngineDefaults(
            max_num_seqs=64,
            token_budget=2048,
            kv_block_tokens=16,
            kv_mem_bytes=32 << 30,
            workload="poisson:4,in=1024,out=64",
            gpu_only=True,
        ),
        "Ouro-1.4B's shape (random weights): 24 layers looped 4 times, 1.435 B parameters",
    ),
    "huginn-shape": Preset(
        ModelConfig(
            name="huginn-shape",
            vocab=65536,
            hidden=5280,
            ffn=17920,
            n_heads=55,
            n_kv_heads=55,
            head_dim=96,
            n_prelude=2,
            n_shared=4,
            n_coda=2,
            max_loops=32,
            tie_embeddings=True,
            inject=True,
        ),
        EngineDefaults(
            max_num_seqs=32,
            token_budget=2048,
            kv_block_tokens=16,
            kv_mem_bytes=48 << 30,
            workload="poisson:1,in=1024,out=64",
            gpu_only=True,
        ),
        "Huginn-0125's shape (random weights): prelude 2 / core 4 x 32 / coda 2, 3.5 B parameters",
    ),
}
"""Presets by name."""


def get_preset(name: str) -> Preset:
    """The preset called ``name`` (``ValueError`` naming the choices otherwise)."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}") from None


def with_loops(cfg: ModelConfig, max_loops: int) -> ModelConfig:
    """A copy of ``cfg`` with another loop count."""
    return replace(cfg, max_loops=max_loops)
