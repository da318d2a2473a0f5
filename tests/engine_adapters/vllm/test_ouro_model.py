"""Ouro in vLLM (rltperf's out-of-tree model) against a plain PyTorch reference.

The shared tiny Ouro server (``ouro_server``: RANDOM WEIGHTS written by ``tiny_ouro``,
``rope_theta`` 1e6 as in the real model, total_ut_steps 4, early_exit_threshold 0.6 so
that exits vary; rltperf's plugin and probe in it, as a monitored server runs) is asked
for three prompts of different lengths in one request (submitted together: one batch)
and returns the full-vocabulary logprobs of every prompt position and of every step of
a 16-token greedy decode.  ``tiny_ouro.reference_logits`` (an independent looped
decoder: plain matmuls, explicit RoPE and causal softmax, no cache) gives the same from
the same tensors and tokens.

The decode steps are where vLLM's KV caches matter (one per pass and layer: a pass
reading another pass's cache, or a wrong position in it, changes every later step);
the prefill alone would not see them.  (Until the shared server, an offline ``LLM``
served four checkpoints, total_ut_steps 1, 2, 4 and 4 with exits, for prefill only: its
first start cost ≈ 35 s of its own.  The four passes with exits covers them: every pass
and every layer runs for every token in select form.)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import tiny_ouro
from vllm_fixtures import Server
from vllm_servers import OURO_THRESHOLD

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PASSES = 4
TOL = 5e-4 * PASSES
"""Max |logprob difference| allowed: float32 through vLLM's CPU kernels (paged attention
in decode) vs plain matmuls grows with depth: at most 5e-5 seen with one pass, 1.2e-3
with four (every position of 3 prompts, 16 decode steps).  A wrong RoPE base (1e4 for
1e6) gives 10-30; a pass reading another pass's KV cache is of that order too."""


def _max_err(got: Any, want: Any) -> float:
    """The largest absolute difference of two tensors."""
    return float((got - want).abs().max())


def test_served_prefill_and_batched_decode_match_the_plain_reference(ouro_server: Server) -> None:
    import torch
    from safetensors.torch import load_file

    seqs = tiny_ouro.served_decode_logprobs(ouro_server.url, ouro_server.model_dir)
    steps, q = PASSES, OURO_THRESHOLD
    w = load_file(str(ouro_server.model_dir / "model.safetensors"))
    assert len(seqs) == len(tiny_ouro.PROMPTS) >= 2
    assert len({len(s["ids"]) for s in seqs}) == len(seqs)  # different lengths in one batch
    checked_choices = 0
    depths: set[int] = set()
    for i, s in enumerate(seqs):
        ids, gen = s["ids"], s["generated"]
        assert len(gen) == tiny_ouro.DECODE_TOKENS == len(s["decode_logprobs"])
        # the reference reads the whole sequence at once (no cache), fed vLLM's own tokens
        logits, depth = tiny_ouro.reference_logits(w, ids + gen[:-1], steps, q)
        want = logits.log_softmax(-1)
        depths.update(depth)
        n = len(ids)
        prefill = torch.tensor(s["prompt_logprobs"])
        assert prefill.shape == want[: n - 1].shape
        err = _max_err(prefill, want[: n - 1])
        assert err < TOL, f"prompt {i}: prefill max |logprob difference| {err:.3g}"
        decode = torch.tensor(s["decode_logprobs"])
        for t in range(len(gen)):
            err = _max_err(decode[t], want[n - 1 + t])
            assert err < TOL, f"prompt {i}, decode step {t}: max |logprob difference| {err:.3g}"
            top2 = want[n - 1 + t].topk(2).values
            if float(top2[0] - top2[1]) > 2 * TOL:  # a clear winner: greedy must have taken it
                assert gen[t] == int(want[n - 1 + t].argmax()), (i, t)
                checked_choices += 1
    assert checked_choices >= len(seqs) * tiny_ouro.DECODE_TOKENS // 2
    assert len(depths) > 1, f"the gate threshold should make exits vary; depths {sorted(depths)}"
    # the same weights at full depth give different logits: selection really happened
    s = seqs[0]
    full, _ = tiny_ouro.reference_logits(w, s["ids"] + s["generated"][:-1], steps, None)
    n = len(s["ids"])
    assert _max_err(full.log_softmax(-1)[n - 1 :], torch.tensor(s["decode_logprobs"])) > 50 * TOL
