"""A tiny Ouro checkpoint (RANDOM WEIGHTS) and a plain PyTorch reference of it, no downloads.

``build(dest, total_ut_steps=…)`` writes a byte-level BPE tokenizer, an Ouro
``config.json`` (``model_type: ouro``, ``architectures: ["OuroForCausalLM"]``, an
``auto_map`` like the real checkpoints' — whose Python is *not* written, so serving works
only through rltperf's registered model) and, unless ``weights=False``, random weights in
HF Ouro names (``model.safetensors``).  ``--load-format dummy`` serves the directory
without weights; vLLM's dummy weights (uniform ±1e-3) make every gate output ≈ 0.5, so
exits cannot vary with them — the exit tests use the written random weights, whose gate
is scaled to spread exits over the depths.

``reference_logits`` is an independent, straightforward looped decoder over the same
tensors (plain matmuls, explicit RoPE and causal softmax, no cache: every position
recomputed from the tokens): ``test_ouro_model`` compares a served model's prefill and
every step of a batched greedy decode (vLLM's KV caches, one per pass and layer)
against it (``served_decode_logprobs``).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

HIDDEN = 128
LAYERS = 2
HEADS = 4
KV_HEADS = 2
FFN = 256
VOCAB = 512
MAX_POS = 1024
ROPE_THETA = 1_000_000.0
"""As in ByteDance/Ouro-1.4B's config (the library default, 1e4, would hide a wrong base)."""
EPS = 1e-6


def build_tokenizer(dest: Path) -> Any:
    """Byte-level BPE trained on standard-library text (as ``tiny_model``), saved in ``dest``."""
    sys.path.insert(0, str(Path(__file__).parent))
    import tiny_model
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )  # fmt: skip
    tok.train_from_iterator(tiny_model._training_text(20), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.chat_template = tiny_model.CHAT_TEMPLATE
    fast.save_pretrained(dest)
    return fast


def config_dict(
    vocab: int, total_ut_steps: int, threshold: float, bos: int, eos: int, pad: int
) -> dict[str, Any]:
    """An Ouro ``config.json`` of the tiny shape (keys as in ByteDance/Ouro-1.4B's)."""
    return {
        "architectures": ["OuroForCausalLM"],
        "auto_map": {
            "AutoConfig": "configuration_ouro.OuroConfig",
            "AutoModelForCausalLM": "modeling_ouro.OuroForCausalLM",
        },
        "model_type": "ouro",
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": FFN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POS,
        "rms_norm_eps": EPS,
        "rope_theta": ROPE_THETA,
        "tie_word_embeddings": False,
        "total_ut_steps": total_ut_steps,
        "early_exit_threshold": threshold,
        "use_sliding_window": False,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "torch_dtype": "float32",
    }


def random_weights(vocab: int, seed: int = 0, gate_scale: float = 4.0) -> dict[str, Any]:
    """Random float32 tensors in HF Ouro names; norms near 1, the gate scaled so exits vary."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def r(*shape: int, scale: float = 0.08) -> Any:
        return torch.randn(*shape, generator=g) * scale

    d = HIDDEN // HEADS
    w: dict[str, Any] = {"model.embed_tokens.weight": r(vocab, HIDDEN, scale=1.0)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = r(HEADS * d, HIDDEN, scale=0.2)
        w[p + "self_attn.k_proj.weight"] = r(KV_HEADS * d, HIDDEN, scale=0.2)
        w[p + "self_attn.v_proj.weight"] = r(KV_HEADS * d, HIDDEN)
        w[p + "self_attn.o_proj.weight"] = r(HIDDEN, HEADS * d)
        w[p + "mlp.gate_proj.weight"] = r(FFN, HIDDEN)
        w[p + "mlp.up_proj.weight"] = r(FFN, HIDDEN)
        w[p + "mlp.down_proj.weight"] = r(HIDDEN, FFN)
        for n in (
            "input_layernorm",
            "input_layernorm_2",
            "post_attention_layernorm",
            "post_attention_layernorm_2",
        ):
            w[p + n + ".weight"] = 1.0 + r(HIDDEN, scale=0.1)
    w["model.norm.weight"] = 1.0 + r(HIDDEN, scale=0.1)
    w["model.early_exit_gate.weight"] = r(1, HIDDEN, scale=gate_scale / math.sqrt(HIDDEN))
    w["model.early_exit_gate.bias"] = torch.zeros(1)
    w["lm_head.weight"] = r(vocab, HIDDEN, scale=0.5)
    return w


def build(
    dest: str | os.PathLike[str], total_ut_steps: int = 4, threshold: float = 1.0, weights: bool = True,
    seed: int = 0,
) -> Path:  # fmt: skip
    """Write the tiny Ouro checkpoint into ``dest`` (see the module docstring)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    fast = build_tokenizer(dest)
    vocab = len(fast)
    cfg = config_dict(
        vocab, total_ut_steps, threshold, fast.bos_token_id, fast.eos_token_id, fast.pad_token_id
    )
    (dest / "config.json").write_text(json.dumps(cfg, indent=1))
    if weights:
        from safetensors.torch import save_file

        save_file(random_weights(vocab, seed), str(dest / "model.safetensors"))
    (dest / "RANDOM_WEIGHTS").write_text("random weights: performance studies only\n")
    return dest


def reference_logits(w: dict[str, Any], ids: list[int], total_ut_steps: int, threshold: float | None) -> Any:
    """Logits of every position of ``ids`` (one sequence, no cache) and each one's exit depth."""
    import torch

    n = len(ids)
    d = HIDDEN // HEADS
    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    pos = torch.arange(n, dtype=torch.float32)
    inv = 1.0 / (ROPE_THETA ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = pos[:, None] * inv[None, :]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()

    def rope(t: Any) -> Any:  # (n, heads, d), rotate-half convention
        half = d // 2
        rot = torch.cat([-t[..., half:], t[..., :half]], -1)
        return t * cos[:, None, :] + rot * sin[:, None, :]

    def rms(t: Any, name: str) -> Any:
        return w[name] * (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + EPS))

    mask = torch.full((n, n), float("-inf")).triu(1)
    states = []
    for _ in range(total_ut_steps):
        for i in range(LAYERS):
            p = f"model.layers.{i}."
            hn = rms(x, p + "input_layernorm.weight")
            q = rope((hn @ w[p + "self_attn.q_proj.weight"].T).view(n, HEADS, d))
            k = rope((hn @ w[p + "self_attn.k_proj.weight"].T).view(n, KV_HEADS, d))
            v = (hn @ w[p + "self_attn.v_proj.weight"].T).view(n, KV_HEADS, d)
            k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
            v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
            scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d) + mask
            att = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, HEADS * d)
            x = x + rms(att @ w[p + "self_attn.o_proj.weight"].T, p + "input_layernorm_2.weight")
            m = rms(x, p + "post_attention_layernorm.weight")
            m = torch.nn.functional.silu(m @ w[p + "mlp.gate_proj.weight"].T) * (
                m @ w[p + "mlp.up_proj.weight"].T
            )
            x = x + rms(m @ w[p + "mlp.down_proj.weight"].T, p + "post_attention_layernorm_2.weight")
        x = rms(x, "model.norm.weight")
        states.append(x)
    depth = [total_ut_steps] * n
    out = states[-1].clone()
    if threshold is not None and threshold < 1.0 and total_ut_steps > 1:
        for j in range(n):
            cum, left = 0.0, 1.0
            for t in range(total_ut_steps - 1):
                lam = float(
                    torch.sigmoid(
                        states[t][j] @ w["model.early_exit_gate.weight"][0]
                        + w["model.early_exit_gate.bias"][0]
                    )
                )
                cum += lam * left
                left *= 1.0 - lam
                if cum >= threshold:
                    depth[j] = t + 1
                    out[j] = states[t][j]
                    break
    return out @ w["lm_head.weight"].T, depth


PROMPTS = (
    "def f(x): return x * 3 + 1  # a looped model",
    "import os\nprint(os.getcwd())",
    "class Loop:\n    def step(self, x):\n        return",
)
"""Three prompts of different lengths, decoded together in one batch."""
DECODE_TOKENS = 16


def served_decode_logprobs(url: str, model_dir: Path, timeout: float = 120.0) -> list[dict[str, Any]]:
    """Ask a vLLM server that serves ``model_dir`` (as ``tiny``, with ``--max-logprobs`` at
    least the vocabulary) for a greedy decode of ``DECODE_TOKENS`` tokens of ``PROMPTS``,
    all three in one request, so submitted together and scheduled as one batch.

    Per prompt: its token ids, the generated ids, the full-vocabulary prompt logprobs
    (position j predicts token j+1) and the full-vocabulary logprobs of every decode step
    (step t chose generated[t])."""
    import urllib.request

    from transformers import PreTrainedTokenizerFast

    # (not AutoTokenizer: the config's auto_map names remote code, and it would ask on stdin)
    tok = PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    vocab = len(tok)
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    body = json.dumps({
        "model": "tiny", "prompt": prompts, "max_tokens": DECODE_TOKENS, "temperature": 0, "ignore_eos": True,
        "logprobs": vocab, "prompt_logprobs": vocab, "return_tokens_as_token_ids": True, "return_token_ids": True,
    }).encode()  # fmt: skip
    req = urllib.request.Request(
        url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        choices = sorted(json.loads(r.read())["choices"], key=lambda c: c["index"])

    def dense(row: dict[Any, Any]) -> list[float]:
        out = [0.0] * vocab
        for key, lp in row.items():
            tid = int(str(key).removeprefix("token_id:"))
            out[tid] = lp["logprob"] if isinstance(lp, dict) else lp
        assert len(row) >= vocab, f"only {len(row)} of {vocab} logprobs: --max-logprobs too low"
        return out

    seqs = []
    for ids, c in zip(prompts, choices, strict=True):
        seqs.append({
            "ids": ids,
            "generated": list(c["token_ids"]),
            "prompt_logprobs": [dense(row) for row in (c.get("prompt_logprobs") or [])[1:]],
            "decode_logprobs": [dense(row) for row in c["logprobs"]["top_logprobs"]],
        })  # fmt: skip
    return seqs


def start_ouro_server(root: Path, hf_overrides: dict[str, Any] | None = None, extra_env: dict[str, str] | None = None,
                      weights: bool = True) -> Any:  # fmt: skip
    """Build the tiny Ouro (``total_ut_steps`` 4) under ``root`` and serve it as
    ``vllm_fixtures.serve`` serves the tiny Llama (same flags and environment, the
    rltperf probe on), plus ``--max-logprobs`` of the whole vocabulary (for
    ``served_decode_logprobs``), ``--hf-overrides`` and, without weights, ``--load-format dummy``."""
    sys.path.insert(0, str(Path(__file__).parent))
    from vllm_fixtures import serve

    model = build(root / "model", total_ut_steps=4, weights=weights)
    args = ["--max-logprobs", str(VOCAB * 2)]
    if hf_overrides:
        args += ["--hf-overrides", json.dumps(hf_overrides)]
    if not weights:
        args += ["--load-format", "dummy"]
    return serve(root, model, args, extra_env)


if __name__ == "__main__":
    print(build(sys.argv[1] if len(sys.argv) > 1 else "tiny-ouro"))
