"""What the reference engine says about itself: the ``EngineInfo`` fields of its Hello,
with every test-contract field it knows (``Engine.engine_info``)."""

from __future__ import annotations

import os
import socket
from typing import Any, Protocol

from engine_adapters import __version__
from engine_adapters.definitions.contract import code_state
from engine_adapters.reference.analytic import model_shape
from engine_adapters.reference.config import ENGINE_NAME, EngineConfig
from engine_adapters.reference.kvcache import KVCache
from engine_adapters.reference.loadgen import LoadGenerator, WorkloadSpec
from engine_adapters.reference.presets import ModelConfig
from engine_adapters.reference.spec import SpecConfig


class DescribedEngine(Protocol):
    """What ``engine_info`` reads of an engine (``engine.Engine`` has all of it): the
    engine passes itself in, and this module never imports the engine."""

    cfg: EngineConfig
    model_cfg: ModelConfig
    model_desc: str
    workload: WorkloadSpec
    loadgen: LoadGenerator
    kv: KVCache
    kv_policy: str
    kv_raised: str | None
    spec: SpecConfig | None
    stall: tuple[float, int] | None
    device: str
    is_cuda: bool
    dtype: str
    threads: int
    seed: int
    token_budget: int
    max_num_seqs: int

    def exit_config(self) -> str:
        """Exit policy and mode, as in the engine info."""
        ...


def engine_info(engine: DescribedEngine, duration: float | None = None) -> dict[str, Any]:
    """``EngineInfo`` fields of ``engine``, with every test-contract field the engine knows."""
    import torch

    w = engine.workload
    c = engine.model_cfg
    contract: dict[str, Any] = dict(engine.loadgen.contract())
    if duration and not w.finite:
        contract["total_requests_or_duration"] = f"{duration:g} s (--duration), open-ended workload"
    stall = (
        "off"
        if not engine.stall
        else f"{engine.stall[0]:g} ms host stall in the schedule stage every {engine.stall[1]} steps"
    )
    # the commit of the code that runs, wherever the engine was started from
    contract.update(code_state(os.path.dirname(os.path.abspath(__file__))))
    contract.update(
        {
            "tokenizer": f"none: synthetic token IDs uniform over the vocabulary of {c.vocab}",
            "attention_backend": (
                f"torch scaled_dot_product_attention ({'CUDA' if engine.is_cuda else 'CPU'} dispatch) over "
                "keys/values gathered from a paged cache; GQA via enable_gqa"
            ),
            "chunked_prefill": f"on: prompt chunks cut to the {engine.token_budget}-token step budget",
            "prefix_caching": "off",
            "async_scheduling": "off: schedule, forward, sample and update run in order on one thread",
            "cuda_graphs": "off: eager PyTorch" if engine.is_cuda else "n/a on the CPU (eager PyTorch)",
            "sampling": "greedy (argmax), temperature 0, ignore EOS",
            "seeds": f"weights {engine.seed} (torch.Generator), workload/exits/acceptance {engine.seed} (numpy PCG64)",
            "warmup": "one untimed prefill chunk and one decode pass before the workload starts; no step flagged",
            "repetitions": "1 (one run; repeat the command for more)",
            "timeouts": "none: every request runs to its fixed output length",
            "failure_handling": (
                "a request that can never fit in the KV cache is reported failed (counted, never dropped); "
                "KV pressure preempts the latest admitted request, recomputed later"
            ),
            "spec_config": engine.spec.describe() if engine.spec else "off",
            "loop_config": c.describe(),
            "exit_config": f"{engine.exit_config()}; kv_policy={engine.kv_policy}",
            "kv_capacity": engine.kv.describe() + (f"; {engine.kv_raised}" if engine.kv_raised else ""),
            "kv_policy": engine.kv_policy,
            "fault_injection": f"inject_stall={stall}; sync_every_stage={'on' if engine.cfg.sync_every_stage else 'off'}",
            "inject_stall": stall,
            "sync_every_stage": bool(engine.cfg.sync_every_stage),
            "sync_every_stage_effect": (
                "a device synchronise at every stage boundary"
                if engine.is_cuda
                else "none on the CPU (nothing runs asynchronously)"
            )
            if engine.cfg.sync_every_stage
            else "off",
            "threads": engine.threads,
            "random_weights": True,
        }
    )
    dev = engine.device
    if engine.is_cuda:
        dev = f"{dev} ({torch.cuda.get_device_name(torch.device(dev))})"
    return {
        "name": ENGINE_NAME,
        "version": __version__,
        "model": engine.model_desc,
        "model_shape": model_shape(c),
        "dtype": engine.dtype,
        "quantization": "none",
        "device": engine.device,
        "max_loops": c.max_loops,
        "loop_config": c.describe(),
        "exit_config": engine.exit_config(),
        "kv_policy": engine.kv_policy,
        "spec_config": engine.spec.describe() if engine.spec else None,
        "kv_capacity_blocks": engine.kv.total_blocks,
        "kv_block_tokens": engine.kv.block_tokens,
        "max_requests": engine.max_num_seqs,
        "token_budget": engine.token_budget,
        "workload": f"{w.describe()}; seed {engine.seed}; tokens sha256 {engine.loadgen.tokens_sha256[:16]}…",
        "random_weights": True,
        "host": socket.gethostname(),
        "contract": contract | {"device_detail": dev},
    }
