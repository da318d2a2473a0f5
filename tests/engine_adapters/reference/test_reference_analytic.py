"""Analytic counts: parameters and bytes per decode step, against public figures and a hand count."""

from __future__ import annotations

import pytest

from engine_adapters.reference.analytic import decode_step, layer_params, param_count
from engine_adapters.reference.engine import EngineConfig
from engine_adapters.reference.presets import PRESETS, ModelConfig

SMALL = ModelConfig(
    name="small", vocab=100, hidden=16, ffn=40, n_heads=4, n_kv_heads=2, head_dim=4,
    n_prelude=1, n_shared=2, n_coda=1, max_loops=3,
)  # fmt: skip


def test_ouro_shape_params_and_decode_bytes() -> None:
    cfg = PRESETS["ouro-1.4b-shape"].model
    # Ouro-1.4B: hidden 2048, ffn 5632, 24 layers, 16 heads, 16 KV heads of 128, vocab 49152, untied
    assert (cfg.hidden, cfg.ffn, cfg.n_shared, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.vocab) == (
        2048, 5632, 24, 16, 16, 128, 49152,
    )  # fmt: skip
    assert cfg.n_prelude == cfg.n_coda == 0 and cfg.max_loops == 4 and not cfg.tie_embeddings
    n = param_count(cfg)
    assert round(n / 1e9, 3) == 1.435, n
    one = decode_step(cfg, "bfloat16", batch=1, context=0)
    # ~10.07 GB of weights per decode step in bf16: the 24 layers are re-read on each of the 4 loops
    assert one["weight_bytes"] == pytest.approx(10.07e9, rel=5e-4)
    three = decode_step(cfg, "bfloat16", batch=1, context=0, loops=3)
    assert one["weight_bytes"] - three["weight_bytes"] == 24 * layer_params(cfg) * 2 + cfg.hidden * 2
    # a float32 step reads twice the bytes of a bf16 one
    assert decode_step(cfg, "float32")["weight_bytes"] == pytest.approx(2 * one["weight_bytes"])


def test_small_config_hand_count() -> None:
    h, v = 16, 100
    # one layer: 2 RMSNorm (16 each) + QKV 16x(16+8+8) + O 16x16 + SwiGLU 3x16x40
    layer = 2 * 16 + 16 * (16 + 8 + 8) + 16 * 16 + 3 * 16 * 40
    assert layer == 2720 == layer_params(SMALL)
    # embedding + untied head + 4 layers + loop norm + final norm (there is a coda) + gate (16 + bias)
    total = v * h + v * h + 4 * layer + 16 + 16 + 17
    assert total == 14129 == param_count(SMALL)
    from engine_adapters.reference.model import LoopedLM

    assert LoopedLM(SMALL, "float32", "cpu").param_count() == total  # the tensors really allocated

    # one decode step, batch 1, 5 tokens already cached (the new one makes 6 keys), float32
    ctx = 5
    keys = ctx + 1
    weights = (h + layer + 3 * (2 * layer + h) + layer + h + v * h) * 4  # embedding row .. head
    kv_dim = 2 * 4
    layer_apps = 1 + 3 * 2 + 1
    kv_read = layer_apps * keys * 2 * kv_dim * 4
    kv_written = layer_apps * 1 * 2 * kv_dim * 4
    got = decode_step(SMALL, "float32", batch=1, context=ctx)
    assert got["weight_bytes"] == weights
    assert got["kv_read"] == kv_read
    assert got["bytes_read"] == weights + kv_read
    assert got["bytes_written"] == kv_written
    lin = 2 * (16 * 32 + 16 * 16 + 3 * 16 * 40)  # per token per layer application
    flops = layer_apps * (lin + 4 * 16 * keys) + 3 * 4 * 16 + 4 * 16 + 2 * v * h
    assert got["flops"] == flops


def test_engine_step_counts_match_formula(run_reference) -> None:
    """The bytes a real decode step records equal the closed formula for its batch and context."""
    run = run_reference(
        EngineConfig(
            model=SMALL, workload="closed:1,in=7,out=6", kv_blocks=16, kv_block_tokens=4, max_num_seqs=1
        ),
        steps=6,
    )
    steps = run.steps
    assert steps[0].kind == "prefill" and steps[0].prefill_tokens == 7
    decodes = [s for s in steps if s.kind == "decode"]
    assert len(decodes) == 5
    for i, s in enumerate(decodes):
        ctx = 7 + i  # tokens cached before this step's token
        want = decode_step(SMALL, "float32", batch=1, context=ctx)
        assert s.bytes_read == want["bytes_read"]
        assert s.bytes_written == want["bytes_written"]
        assert s.flops == pytest.approx(want["flops"])
        assert s.out_tokens == 1 and s.exit_hist == [0, 0, 1]
        assert s.loop_tokens == [1, 1, 1]


def test_huginn_shape_is_about_3_5b() -> None:
    cfg = PRESETS["huginn-shape"].model
    assert (cfg.n_prelude, cfg.n_shared, cfg.n_coda, cfg.max_loops) == (2, 4, 2, 32)
    assert 3.4e9 < param_count(cfg) < 3.7e9
