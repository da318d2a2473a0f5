"""The reference engine's configuration (everything ``rltperf engine`` can set), its
errors, and the counters it keeps (``engine_adapters.reference.engine``)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine_adapters.reference.presets import ModelConfig

ENGINE_NAME = "rltperf-reference"
KV_FIT_REQUESTS = 2
"""The default KV pool holds at least this many requests of the workload."""
EXIT_MARKS_MAX_LOOPS = 24
"""Deeper loops put exit checks inside ``forward`` (the probe keeps 64 marks per step)."""


class EngineError(Exception):
    """A configuration the engine cannot run; the message says what to change."""


def parse_stall(text: str | None) -> tuple[float, int] | None:
    """``MS@EVERY`` -> (milliseconds, every N steps)."""
    if not text:
        return None
    ms, at, every = text.partition("@")
    try:
        if not at:
            raise ValueError
        v, n = float(ms), int(every)
    except ValueError:
        raise ValueError(
            f"--inject-stall takes MS@EVERY (e.g. 20@10: a 20 ms host stall every 10 steps), not {text!r}"
        ) from None
    if v <= 0 or n <= 0:
        raise ValueError(f"--inject-stall {text}: both MS and EVERY must be positive")
    return v, n


@dataclass
class EngineConfig:
    """Everything ``rltperf engine`` can set (None: the preset's default)."""

    preset: str = "tiny"
    device: str = "cpu"
    dtype: str | None = None
    workload: str | None = None
    exit: str = "fixed"
    exit_mode: str = "select"
    kv_policy: str = "per_depth"
    spec: str | None = None
    spec_accept: str | None = None
    inject_stall: str | None = None
    sync_every_stage: bool = False
    seed: int = 0
    threads: int | None = None
    max_num_seqs: int | None = None
    token_budget: int | None = None
    kv_blocks: int | None = None
    """Block ids per depth pool (overrides the preset's KV memory budget)."""
    kv_block_tokens: int | None = None
    max_loops: int | None = None
    model: ModelConfig | None = None
    """A custom shape instead of the preset's (tests)."""
    force: bool = False
    """Run a GPU-only preset on the CPU anyway."""
    warmup: bool = True
    keep_outputs: bool = False
    """Keep each finished request's generated token IDs in ``Engine.outputs`` (tests)."""


@dataclass
class EngineTotals:
    """Counters for the status line and the final summary."""

    steps: int = 0
    out_tokens: int = 0
    finished: int = 0
    failed: int = 0
    preempted: int = 0
    step_ns: int = 0
    busy_ns: int = 0
    drafts: int = 0
    drafted: int = 0
    accepted: int = 0
    bytes: int = 0
    """Analytic bytes read + written."""
    exit_hist: list[int] = field(default_factory=list)
    recent_step_ns: deque[int] = field(default_factory=lambda: deque(maxlen=512))
    """Durations of the latest steps (for the status line)."""
