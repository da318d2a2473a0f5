"""Build a tiny random Llama model with its own BPE tokenizer, no downloads (≈ 8 s).

The weights are random: anything measured with this model is a performance study only
(the bundles and the adapter's metadata say ``random_weights`` where they can).

Run as a script to build one for manual experiments::

    python tests/engine_adapters/vllm/tiny_model.py /tmp/tiny-llama
"""

from __future__ import annotations

import glob
import os
import sys
import sysconfig
from pathlib import Path

VOCAB = 1024
HIDDEN = 128
LAYERS = 2
HEADS = 4
KV_HEADS = 2
FFN = 256
MAX_POS = 1024

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _training_text(limit_files: int = 60) -> list[str]:
    """Standard-library sources as local training text for the BPE."""
    stdlib = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(stdlib, "*.py")))[:limit_files]
    out = []
    for f in files:
        try:
            out.append(Path(f).read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
    return out


def build(dest: str | os.PathLike[str], seed: int = 0) -> Path:
    """Write tokenizer + random ``LlamaForCausalLM`` into ``dest``; returns the path."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_text(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(dest)

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=MAX_POS,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(dest, safe_serialization=True)
    (dest / "RANDOM_WEIGHTS").write_text("random weights: performance studies only\n")
    return dest


if __name__ == "__main__":
    print(build(sys.argv[1] if len(sys.argv) > 1 else "tiny-llama"))
