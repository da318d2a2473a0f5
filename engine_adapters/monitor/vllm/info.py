"""What a vLLM server says about itself over HTTP, as ``EngineInfo`` and contract fields.

Sources: ``GET /version``, ``GET /v1/models`` (model id, root path, max_model_len), the
labels of ``vllm:cache_config_info`` on ``/metrics``, and — when the model's root is a
directory readable on this host (a local server) — its ``config.json`` for the shape and
a loop count.  Every contract field HTTP cannot reveal says ``"unknown: <why>"``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from engine_adapters.definitions.contract import CONTRACT_FIELDS, unknown
from engine_adapters.definitions.records import Ceiling, EngineInfo

LOOP_KEYS = ("total_ut_steps", "num_loops", "loop_count", "n_loops")
"""``config.json`` keys that give a looped model's passes over its layers (Ouro: total_ut_steps)."""

_NOT_OVER_HTTP = "vLLM does not expose it over HTTP (use the rltperf vLLM plugin for the engine's own config)"
_CLIENT_SIDE = "set by the clients driving the server, not visible to the server's metrics"


def read_model_config(root: str | None) -> dict[str, Any] | None:
    """The model's ``config.json`` when ``root`` is a local directory holding one."""
    if not root or not os.path.isdir(root):
        return None
    try:
        with open(os.path.join(root, "config.json"), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def loop_count_from(config: dict[str, Any] | None) -> int | None:
    """A looped model's loop count from its config (1 for an ordinary model; None unknown)."""
    if config is None:
        return None
    for key in LOOP_KEYS:
        v = config.get(key)
        if isinstance(v, int) and v >= 1:
            return v
    text = config.get("text_config")
    if isinstance(text, dict):
        return loop_count_from(text)
    return 1


def model_shape(config: dict[str, Any] | None) -> dict[str, Any]:
    """Shape facts from a Hugging Face config (hidden, ffn, layers, heads...)."""
    if not config:
        return {}
    if isinstance(config.get("text_config"), dict) and "hidden_size" not in config:
        config = config["text_config"]
    keys = {
        "hidden": "hidden_size",
        "ffn": "intermediate_size",
        "layers": "num_hidden_layers",
        "heads": "num_attention_heads",
        "kv_heads": "num_key_value_heads",
        "head_dim": "head_dim",
        "vocab": "vocab_size",
    }
    shape = {k: config[v] for k, v in keys.items() if config.get(v) is not None}
    if "architectures" in config:
        shape["architectures"] = config["architectures"]
    return shape


def _bool_label(v: str | None) -> str | None:
    if v is None or v == "None":
        return None
    return {"True": "on", "False": "off"}.get(v, v)


def _int_label(v: str | None) -> int | None:
    try:
        return int(v) if v not in (None, "None") else None
    except ValueError:
        return None


def build_info(
    base_url: str,
    version: str | None,
    models: list[dict[str, Any]],
    cache_info: dict[str, str] | None,
    loop_count: int | None,
    config: dict[str, Any] | None,
    local: bool,
    loop_source: str = "config.json",
) -> EngineInfo:
    """``EngineInfo`` of a vLLM server, contract fields included (unknown ones explained)."""
    m = models[0] if models else {}
    model = m.get("id")
    root = m.get("root")
    ci = cache_info or {}
    block = _int_label(ci.get("block_size"))
    blocks = _int_label(ci.get("num_gpu_blocks"))
    loops = loop_count
    contract: dict[str, Any] = {}
    no_ci = "the server exports no vllm:cache_config_info"
    contract["commit"] = unknown(
        f"vLLM {version or '?'} over HTTP does not report its source commit or the model's revision"
    )
    contract["diff_sha256"] = unknown("the server's working tree is not visible over HTTP")
    contract["model"] = f"{model} (root {root})" if root and root != model else model
    contract["tokenizer"] = unknown(_NOT_OVER_HTTP)
    contract["dtype"] = unknown(_NOT_OVER_HTTP)
    kv_dtype = ci.get("cache_dtype")
    if kv_dtype:
        contract["dtype"] = unknown(f"weights: {_NOT_OVER_HTTP}; KV cache dtype {kv_dtype}")
    contract["quantization"] = unknown(_NOT_OVER_HTTP)
    for f in ("devices", "interconnect", "device_mapping", "driver", "runtime", "attention_backend",
              "cuda_graphs", "async_scheduling", "chunked_prefill", "token_budget", "max_requests",
              "spec_config", "exit_config"):  # fmt: skip
        contract[f] = unknown(_NOT_OVER_HTTP)
    contract["framework"] = f"vLLM {version}" if version else unknown("GET /version did not answer")
    if blocks is not None and block is not None:
        contract["kv_capacity"] = f"{blocks} blocks x {block} tokens ({blocks * block} tokens)"
    elif ci.get("kv_cache_size_tokens"):
        contract["kv_capacity"] = f"{ci['kv_cache_size_tokens']} tokens"
    else:
        contract["kv_capacity"] = unknown(no_ci)
    pc = _bool_label(ci.get("enable_prefix_caching"))
    contract["prefix_caching"] = pc if pc is not None else unknown(no_ci)
    if loops is not None:
        contract["loop_config"] = (
            f"looped: {loops} passes over the layers ({loop_source})"
            if loops > 1
            else f"not looped ({loop_source})"
        )
    else:
        contract["loop_config"] = unknown(
            "the model's config.json is not readable on this host; pass --loop-count if the model is looped"
        )
    for f in ("sampling", "dataset", "prompt_template", "output_length_policy", "seeds", "concurrency",
              "arrival_model", "total_requests_or_duration", "warmup", "repetitions", "timeouts",
              "failure_handling"):  # fmt: skip
        contract[f] = unknown(_CLIENT_SIDE)
    contract["random_weights"] = unknown("a vLLM server does not know whether its weights are trained")
    contract["max_model_len"] = m.get("max_model_len")
    contract["server"] = base_url
    contract["server_local"] = local
    for k in list(contract):
        if k not in CONTRACT_FIELDS and contract[k] is None:
            del contract[k]
    return EngineInfo(
        name="vllm",
        version=version,
        model=model,
        model_shape=model_shape(config),
        kv_policy="shared" if loops == 1 else None,
        max_loops=loops if loops and loops > 1 else None,
        kv_capacity_blocks=blocks,
        kv_block_tokens=block,
        contract=contract,
    )


def local_ceiling() -> Ceiling | None:
    """Peak figures of this host's device for a server on this host: a cached calibration
    (``rltperf calibrate``) or the spec table; never a measurement in the monitor (no
    torch import here).  The first NVIDIA GPU is assumed when NVML sees one."""
    try:
        from engine_adapters.definitions.ceilings import (
            _from_calibration,
            cache_key,
            ceiling_for,
            load_calibrations,
            spec_ceiling,
        )

        name = None
        try:
            import pynvml

            pynvml.nvmlInit()
            try:
                if pynvml.nvmlDeviceGetCount() > 0:
                    n = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
                    name = n.decode() if isinstance(n, bytes) else str(n)
            finally:
                pynvml.nvmlShutdown()
        except Exception:
            name = None
        if name is None:
            return ceiling_for("cpu", quick=False)
        cal = load_calibrations().get(cache_key(name))
        return _from_calibration(name, cal, None) if cal else spec_ceiling(name)
    except Exception:
        return None
