"""Ouro in vLLM (rltperf's out-of-tree model) against a plain PyTorch reference.

One subprocess serves four tiny Ouro checkpoints (RANDOM WEIGHTS, written by
``tiny_ouro``, ``rope_theta`` 1e6 as in the real model) in turn with vLLM's offline
``LLM`` — registered by rltperf's plugin, no remote code.  For three prompts of
different lengths submitted together (one batch) it returns the full-vocabulary
logprobs of every prompt position and of every step of a 16-token greedy decode.
``tiny_ouro.reference_logits`` (an independent looped decoder: plain matmuls, explicit
RoPE and causal softmax, no cache) gives the same from the same tensors and tokens.

The decode steps are where vLLM's KV caches matter (one per pass and layer: a pass
reading another pass's cache, or a wrong position in it, changes every later step);
the prefill alone would not see them.  Equal within float32 tolerance for
total_ut_steps 1, 2 and 4, and for 4 with a gate threshold at which exits vary (the
select form of early exit).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import tiny_ouro
from vllm_fixtures import ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

CASES = [(1, 1.0), (2, 1.0), (4, 1.0), (4, 0.6)]
"""(total_ut_steps, early_exit_threshold).  The first ``LLM`` costs ≈ 35 s, each next one ≈ 5 s."""
TOL_PER_PASS = 5e-4
"""Max |logprob difference| allowed per pass: float32 through vLLM's CPU kernels (paged
attention in decode) vs plain matmuls grows with depth: at most 5e-5 seen with one pass,
1.2e-3 with four (every position of 3 prompts, 16 decode steps).  A wrong RoPE base
(1e4 for 1e6) gives 10-30; a pass reading another pass's KV cache is of that order too."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, float], tuple[Path, list[dict]]]:
    root = tmp_path_factory.mktemp("ouro-model")
    dirs = {c: tiny_ouro.build(root / f"t{c[0]}-q{c[1]}", total_ut_steps=c[0], threshold=c[1]) for c in CASES}
    out = root / "logprobs.json"
    tmp = root / "tmp"
    tmp.mkdir()
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1",
               VLLM_CPU_KVCACHE_SPACE="1", VLLM_CACHE_ROOT=str(tmp / "cache"), TMPDIR=str(tmp),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))  # fmt: skip
    env.pop("RLTPERF_PROBE", None)
    script = str(Path(__file__).parent / "tiny_ouro.py")
    p = subprocess.run([sys.executable, script, "logprobs", str(out), *map(str, dirs.values())],
                       env=env, cwd=str(root), capture_output=True, text=True, timeout=500)  # fmt: skip
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    got = json.loads(out.read_text())
    return {c: (d, got[str(d)]) for c, d in dirs.items()}


def _max_err(got: Any, want: Any) -> float:
    return float((got - want).abs().max())


@pytest.mark.parametrize("case", CASES, ids=[f"T{t}-q{q}" for t, q in CASES])
def test_vllm_prefill_and_batched_decode_match_the_plain_reference(
    served: dict, case: tuple[int, float]
) -> None:
    import torch
    from safetensors.torch import load_file

    d, seqs = served[case]
    steps, q = case
    tol = TOL_PER_PASS * steps
    w = load_file(str(d / "model.safetensors"))
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
        assert err < tol, f"prompt {i}: prefill max |logprob difference| {err:.3g} (T={steps}, q={q})"
        decode = torch.tensor(s["decode_logprobs"])
        for t in range(len(gen)):
            err = _max_err(decode[t], want[n - 1 + t])
            assert err < tol, (
                f"prompt {i}, decode step {t}: max |logprob difference| {err:.3g} (T={steps}, q={q})"
            )
            top2 = want[n - 1 + t].topk(2).values
            if float(top2[0] - top2[1]) > 2 * tol:  # a clear winner: greedy must have taken it
                assert gen[t] == int(want[n - 1 + t].argmax()), (i, t)
                checked_choices += 1
    assert checked_choices >= len(seqs) * len(seqs[0]["generated"]) // 2
    if q < 1.0:
        assert len(depths) > 1, f"the gate threshold should make exits vary; depths {sorted(depths)}"
        # the same weights at full depth give different logits: selection really happened
        s = seqs[0]
        full, _ = tiny_ouro.reference_logits(w, s["ids"] + s["generated"][:-1], steps, None)
        n = len(s["ids"])
        assert _max_err(full.log_softmax(-1)[n - 1 :], torch.tensor(s["decode_logprobs"])) > 50 * tol
