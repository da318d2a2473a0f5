"""What the vLLM plugin reads from vLLM's engine core: its description (``engine_info``,
the Hello's fields: model, dtype, device, limits, loop count, contract) and its KV blocks.

Part of ``hooks.py``'s dependence on vLLM's internals (the supported versions are
``hooks.SUPPORTED``); called inside the engine-core process, by the tap and by
``announce.py``.
"""

from __future__ import annotations

import os
from typing import Any


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
        "device_mapping": f"TP={tp} PP={pp} DP={dp}, executor {type(core.model_executor).__name__}",
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
