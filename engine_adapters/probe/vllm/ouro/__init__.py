"""Ouro (ByteDance's looped LM, HF ``model_type: ouro``) as an out-of-tree vLLM model.

- ``config.py``: ``OuroConfig`` (transformers), registered with ``AutoConfig`` so vLLM
  reads an Ouro ``config.json`` without the checkpoint's remote code.
- ``model.py``: ``OuroForCausalLM`` for vLLM 0.32 (torch, vllm).
- ``loopring.py``: the per-forward record (time per loop pass, exit histogram) the
  model writes into a small shared-memory ring and the plugin's tap reads (numpy only).

``plugin.register`` registers the architecture as the lazy string
``"engine_adapters.probe.vllm.ouro.model:OuroForCausalLM"``, so importing this package
imports neither torch nor vllm.
"""

MODEL_CLASS = "engine_adapters.probe.vllm.ouro.model:OuroForCausalLM"
"""The lazy ``module:Class`` string given to vLLM's ``ModelRegistry``."""
ARCH = "OuroForCausalLM"
"""Architecture name in an Ouro ``config.json``."""
MODEL_TYPE = "ouro"
"""HF ``model_type`` of an Ouro ``config.json``."""
