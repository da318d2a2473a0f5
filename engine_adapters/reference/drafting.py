"""Speculative decoding inside one reference-engine step (``Engine._step``): draft tokens
at ``draft_loops``, place them into the step's batch behind each drafting row's first
token, and accept them (greedy comparison, or the oracle acceptance rate)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from engine_adapters.reference.analytic import StepCounter
from engine_adapters.reference.batch import RowSpec, StepBatch
from engine_adapters.reference.exits import ExitPolicy
from engine_adapters.reference.scheduler import Scheduled, Scheduler
from engine_adapters.reference.spec import SpecConfig

if TYPE_CHECKING:
    from engine_adapters.reference.kvcache import KVCache
    from engine_adapters.reference.model import LoopedLM


def draft_tokens(
    model: LoopedLM, kv: KVCache, draft_loops: int, drafting: list[Scheduled], counter: StepCounter
) -> Any:
    """Draft tokens for each drafting row at ``draft_loops`` passes of ``model`` (its KV in
    ``kv``); ``[rows, max_draft]`` tensor."""
    import torch

    gmax = max(it.draft for it in drafting)
    dbuf = torch.zeros((len(drafting), gmax), dtype=torch.long, device=model.device)
    fixed = ExitPolicy("fixed")
    prev: Any = None
    prev_rows: list[int] = []
    for j in range(gmax):
        rows = [k for k, it in enumerate(drafting) if it.draft > j]
        specs = []
        for k in rows:
            seq = drafting[k].seq
            specs.append(RowSpec(drafting[k], [seq.tokens[-1]] if j == 0 else [0], seq.num_computed + j,
                                 seq.kv.slots, [0]))  # fmt: skip
        b = StepBatch(specs, model.rope_cos, model.rope_sin, model.device)
        if j > 0:
            keep = [prev_rows.index(k) for k in rows]
            b.input_ids = prev.index_select(0, torch.tensor(keep, device=model.device))
        res = model(b, kv, counter, fixed, "select", loops=draft_loops)
        prev = res.logits.argmax(dim=-1)
        prev_rows = rows
        dbuf[torch.tensor(rows, device=model.device), j] = prev
    return dbuf


def place_drafts(batch: StepBatch, drafting: list[Scheduled], dbuf: Any, dev: Any) -> None:
    """Write the drafted tokens (``dbuf``, ``[rows, max_draft]``) after each drafting
    row's first token in ``batch.input_ids`` (on device ``dev``)."""
    import torch

    dst: list[int] = []
    src: list[int] = []
    index_of = {id(it): k for k, it in enumerate(drafting)}
    gmax = max(it.draft for it in drafting)
    for r, sp in enumerate(batch.specs):
        k = index_of.get(id(sp.seq))
        if k is None:
            continue
        off = int(batch.row_off[r])
        for j in range(sp.seq.draft):
            dst.append(off + 1 + j)
            src.append(k * gmax + j)
    batch.input_ids.index_copy_(
        0,
        torch.tensor(dst, device=dev),
        dbuf.reshape(-1).index_select(0, torch.tensor(src, device=dev)),
    )


def accept_drafts(
    drafting: list[Scheduled],
    row_outputs: dict[int, tuple[list[int], list[int]]],
    drafts_host: list[list[int]] | None,
    spec: SpecConfig | None,
    accept_rng: np.random.Generator,
    sched: Scheduler,
    exit_hist: list[int],
) -> tuple[int, int]:
    """Accept each drafting row's drafts up to the first mismatch with the verified
    tokens (or at the oracle rate), commit them and the verified token, roll back the
    rest; counts committed tokens' exit depths into ``exit_hist``.  Returns
    ``(tokens produced, drafts accepted)``."""
    produced = 0
    accepted_total = 0
    for k, it in enumerate(drafting):
        seq = it.seq
        ver, dep = row_outputs[id(it)]
        drafted = drafts_host[k][: it.draft] if drafts_host is not None else []
        if spec and spec.accept == "oracle":
            a = 0
            while a < it.draft and accept_rng.random() < spec.alpha:
                a += 1
        else:
            a = 0
            while a < it.draft and drafted[a] == ver[a]:
                a += 1
        commit = [*drafted[:a], ver[a]]
        for j in range(a + 1):
            exit_hist[int(dep[j]) - 1] += 1
        seq.tokens.extend(commit)
        seq.num_computed += 1 + a
        sched.rollback(seq)
        produced += len(commit)
        accepted_total += a
    return produced, accepted_total
