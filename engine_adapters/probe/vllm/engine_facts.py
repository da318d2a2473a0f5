"""What the vLLM plugin reads from vLLM's engine core: its description (``engine_info``,
the Hello's fields: model, dtype, device, limits, loop count, contract, identity), its
KV blocks, its data-parallel rank (``dp_index``) and its probe's address (``probe_listen``).

Part of ``hooks.py``'s dependence on vLLM's internals (the supported versions are
``hooks.SUPPORTED``); called inside the engine-core process, by the tap and by
``announce.py``.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from engine_adapters.definitions.ranks import worker_tags


def dp_index(pc: Any, engine_index: int | None = None) -> int:
    """The data-parallel rank of the engine core (or worker) whose ``parallel_config`` is ``pc``.

    vLLM 0.32 runs each data-parallel rank of a dense model as an independent engine:
    ``run_engine_core`` calls ``parallel_config.reconfigure_for_independent_dp_rank()``,
    which sets ``data_parallel_size`` to 1 and ``data_parallel_rank`` to 0 in every
    engine, and keeps the real rank in ``data_parallel_index`` (only MoE models get a
    ``DPEngineCoreProc`` with ``data_parallel_rank`` left in place).  So the index is
    read first; the engine core's ``engine_index`` (its DP rank too) and
    ``data_parallel_rank`` are fallbacks for layouts without it."""
    for v in (
        getattr(pc, "data_parallel_index", None),
        engine_index,
        getattr(pc, "data_parallel_rank", None),
    ):
        if isinstance(v, int) and v >= 0:
            return v
    return 0


def probe_listen(host: str, port: int, dp: int) -> tuple[str, int]:
    """Where the probe of data-parallel rank ``dp`` listens: the base port + ``dp``
    (port 0, any free port, stays 0)."""
    return host, (port + dp if port else 0)


def identity(core: Any) -> dict[str, Any]:
    """The engine core's place in the server: DP rank, TP/PP sizes, its workers, host."""
    pc = core.vllm_config.parallel_config
    tp, pp = int(pc.tensor_parallel_size), int(pc.pipeline_parallel_size)
    return {
        "dp_rank": dp_index(pc, getattr(core, "engine_index", None)),
        "tp_size": tp,
        "pp_size": pp,
        "ranks": worker_tags(tp, pp),
        "host": socket.gethostname(),
    }


def worker_pids(core: Any) -> dict[str, int]:
    """The engine core's worker processes by worker name (``tp0``...), where the executor
    shows them (vLLM's multiprocessing executor); empty otherwise."""
    pc = core.vllm_config.parallel_config
    tags = worker_tags(int(pc.tensor_parallel_size), int(pc.pipeline_parallel_size))
    out: dict[str, int] = {}
    for w in getattr(core.model_executor, "workers", None) or ():
        rank, proc = getattr(w, "rank", None), getattr(w, "proc", None)
        pid = getattr(proc, "pid", None)
        if isinstance(rank, int) and 0 <= rank < len(tags) and isinstance(pid, int):
            out[tags[rank]] = pid
    return out


def loop_count(hf: Any) -> int | None:
    for key in ("total_ut_steps", "num_loops", "loop_count", "n_loops"):
        v = getattr(hf, key, None)
        if isinstance(v, int) and v >= 1:
            return v
    return None


def engine_info(core: Any, loops: int | None) -> dict[str, Any]:
    """``EngineInfo`` fields from the engine core's ``vllm_config`` (vLLM 0.32 layout)."""
    import vllm

    cfg = core.vllm_config
    mc, sc, cc, pc = cfg.model_config, cfg.scheduler_config, cfg.cache_config, cfg.parallel_config
    hf = getattr(mc, "hf_text_config", None) or mc.hf_config
    shape = {
        k: getattr(hf, a)
        for k, a in (("hidden", "hidden_size"), ("ffn", "intermediate_size"), ("layers", "num_hidden_layers"),
                     ("heads", "num_attention_heads"), ("kv_heads", "num_key_value_heads"), ("head_dim", "head_dim"),
                     ("vocab", "vocab_size"))
        if isinstance(getattr(hf, a, None), int)
    }  # fmt: skip
    arch = getattr(mc.hf_config, "architectures", None)
    if arch:
        shape["architectures"] = list(arch)
    try:
        from vllm.platforms import current_platform

        device_type = str(current_platform.device_type)
        device_name = str(current_platform.get_device_name())
    except Exception:
        device_type, device_name = "?", "?"
    try:
        import torch

        torch_v = str(torch.__version__)
    except Exception:
        torch_v = "?"
    blocks = kv_blocks(core.scheduler)[1]
    spec = cfg.speculative_config
    att = getattr(getattr(cfg, "attention_config", None), "backend", None)
    comp = getattr(cfg, "compilation_config", None)
    cudagraph = getattr(comp, "cudagraph_mode", None)
    ident = identity(core)
    tp, pp, dp = pc.tensor_parallel_size, pc.pipeline_parallel_size, pc.data_parallel_size
    contract: dict[str, Any] = {
        "tokenizer": mc.tokenizer,
        "attention_backend": str(att)
        if att is not None
        else "auto (vLLM picks per layer at start; see its log)",
        "chunked_prefill": "on" if sc.enable_chunked_prefill else "off",
        "prefix_caching": "on" if cc.enable_prefix_caching else "off",
        "async_scheduling": "on" if sc.async_scheduling else "off",
        "cuda_graphs": f"{cudagraph} (enforce_eager={mc.enforce_eager})",
        # a dense model's DP engines each run as DP=1 (see dp_index): the size is not known here
        "device_mapping": f"TP={tp} PP={pp}, DP rank {ident['dp_rank']}"
        + (f" of {dp}" if dp > 1 else "")
        + f", executor {type(core.model_executor).__name__}",
        "framework": f"vLLM {vllm.__version__}, torch {torch_v}",
        "spec_config": str(spec) if spec is not None else "off",
        "max_model_len": mc.max_model_len,
        "seeds": f"engine seed {mc.seed} (per-request seeds are set by clients)",
    }
    random = random_weights(cfg)
    if random:
        contract["random_weights"] = random
    if device_type == "cpu":
        contract["devices"] = f"CPU ({device_name})"
        contract["interconnect"] = "none (CPU)"
    return {
        "name": "vllm",
        "version": str(vllm.__version__),
        "model": str(mc.model),
        "model_shape": shape,
        "dtype": str(mc.dtype).replace("torch.", ""),
        "quantization": str(mc.quantization) if mc.quantization else "none",
        "device": device_type,
        "max_loops": loops if loops and loops > 1 else None,
        "loop_config": (
            f"looped: {loops} passes over the layers (config)" if loops and loops > 1 else "not looped"
        ),
        "kv_policy": ("per_depth" if "OuroForCausalLM" in shape.get("architectures", ()) else None)
        if loops and loops > 1
        else "shared",
        "spec_config": str(spec) if spec is not None else None,
        "kv_capacity_blocks": blocks,
        "kv_block_tokens": cc.block_size,
        "max_requests": sc.max_num_seqs,
        "token_budget": sc.max_num_batched_tokens,
        "workload": "requests from the server's clients (not known to the engine)",
        "random_weights": True if random else None,
        "contract": contract,
        **ident,
    }


def random_weights(cfg: Any) -> str | None:
    """Why the weights are known to be random, or None (vLLM cannot tell trained weights
    from others): ``--load-format dummy``, or a ``RANDOM_WEIGHTS`` file in the model
    directory (rltperf's test models write one)."""
    if str(getattr(getattr(cfg, "load_config", None), "load_format", "")) == "dummy":
        return "yes: --load-format dummy (performance studies only)"
    model = str(getattr(cfg.model_config, "model", ""))
    if model and os.path.isfile(os.path.join(model, "RANDOM_WEIGHTS")):
        return f"yes: {os.path.join(model, 'RANDOM_WEIGHTS')} (performance studies only)"
    return None


def kv_blocks(sched: Any) -> tuple[int | None, int | None]:
    """(used, total) KV blocks of the scheduler's block pool, or (None, None)."""
    try:
        pool = sched.kv_cache_manager.block_pool
        total = int(pool.num_gpu_blocks)
        return total - int(pool.get_num_free_blocks()), total
    except Exception:
        return None, None


# --------------------------------------------------------------------------- the tap
