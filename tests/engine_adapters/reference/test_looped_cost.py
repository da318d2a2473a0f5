"""``definitions.looped_cost`` against the reference engine's own analytic counts, and its shares.

With Llama-style layers (2 norms) and no gate, one decode step of the looped stack must
cost exactly what the reference engine's ``analytic.decode_step`` counts for the same
shape (a prelude/coda-free preset): bytes read and written and FLOPs, for 1 and 4 passes.
"""

from __future__ import annotations

import dataclasses

import pytest

from engine_adapters.definitions.looped_cost import LoopedShape, keys_attended, loop_corrected, step_cost
from engine_adapters.reference.analytic import decode_step
from engine_adapters.reference.presets import get_preset


@pytest.mark.parametrize("loops", [1, 4])
def test_decode_step_equals_the_reference_engines_count(loops: int) -> None:
    cfg = dataclasses.replace(get_preset("ouro-1.4b-shape").model, n_prelude=0, n_coda=0, max_loops=loops)
    ref = decode_step(cfg, dtype="bfloat16", batch=3, context=100, loops=loops)
    shape = LoopedShape(hidden=cfg.hidden, ffn=cfg.ffn, layers=cfg.n_shared, heads=cfg.n_heads, kv_heads=cfg.n_kv_heads,
                        head_dim=cfg.head_dim, vocab=cfg.vocab, passes=loops, bytes_per_elem=2, norms_per_layer=2,
                        gate=False)  # fmt: skip
    got = step_cost(shape, [(1, 100)] * 3, out_rows=3)
    assert got.bytes_read == ref["bytes_read"]
    assert got.bytes_written == ref["bytes_written"]
    assert got.flops == pytest.approx(ref["flops"], rel=1e-12)
    assert got.kv_read == ref["kv_read"]


def test_shares_scale_with_passes_and_prefill_keys_are_causal() -> None:
    shape = LoopedShape.from_config(
        {"model_type": "ouro", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "total_ut_steps": 4,
         "torch_dtype": "float32"}
    )  # fmt: skip
    assert (
        shape is not None and shape.passes == 4 and shape.bytes_per_elem == 4 and shape.norms_per_layer == 4
    )
    assert keys_attended([(3, 0)]) == 1 + 2 + 3 and keys_attended([(1, 9), (2, 5)]) == 10 + 6 + 7
    one = step_cost(shape, [(5, 20)], out_rows=1, passes=1)
    four = step_cost(shape, [(5, 20)], out_rows=1, passes=4)
    once = one.bytes_read - one.looped_read  # embedding rows + LM head weight: not repeated
    assert four.bytes_read - four.looped_read == once
    assert four.looped_read == 4 * one.looped_read + 3 * (64 + 1) * 4  # + the gate on passes 1..3
    assert four.bytes_written == 4 * one.bytes_written
    # the HTTP correction of a figure that counted the stack once gives the same total
    assert loop_corrected(one.bytes_read, once, 4) == four.bytes_read - 3 * (64 + 1) * 4
