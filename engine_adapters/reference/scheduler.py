"""Continuous batching: admission, chunked prefill, KV blocks, preemption by recompute.

Each step the scheduler (vLLM v1's unified policy, simplified) walks the running
sequences in admission order: a decoding sequence asks for one token (or 1 + G with
speculation), a sequence still in prefill asks for the rest of its prompt, cut to the
step's token budget (chunked prefill).  If the KV pool cannot cover a sequence's new
tokens, the most recently admitted running sequence is preempted: its blocks are freed
and it goes back to the head of the queue, to be recomputed (its prompt and the tokens
generated so far are prefilled again).  Then waiting requests are admitted first come,
first served while there is room: ``max_num_seqs``, budget, and blocks for the whole
remaining prompt above a 1 % watermark (the first chunk is allocated now, the rest as it
is prefilled).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine_adapters.reference.kvcache import KVCache, SeqBlocks
from engine_adapters.reference.loadgen import Request


@dataclass
class Sequence:
    """A request inside the engine."""

    req: Request
    tokens: list[int]
    """Prompt followed by the tokens generated so far."""
    n_prompt: int
    kv: SeqBlocks
    num_computed: int = 0
    """Positions whose KV is in the cache."""
    first_token_ns: int | None = None
    preemptions: int = 0
    order: int = 0
    """Admission order (FCFS; preemption victims are the latest admitted)."""

    @property
    def n_out(self) -> int:
        """Tokens generated so far."""
        return len(self.tokens) - self.n_prompt

    @property
    def remaining_out(self) -> int:
        """Tokens still to generate."""
        return self.req.max_tokens - self.n_out

    @property
    def uncomputed(self) -> int:
        """Tokens to feed before the next output: 1 when decoding, more in prefill."""
        return len(self.tokens) - self.num_computed


@dataclass
class Scheduled:
    """One sequence's work in a step."""

    seq: Sequence
    n: int
    """Tokens fed through the full-depth pass (prompt chunk, 1, or 1 + drafts)."""
    draft: int = 0
    """Tokens to draft before verification (speculation)."""
    produces: bool = False
    """The pass reaches the end of the sequence: an output is sampled (set at scheduling)."""

    def __post_init__(self) -> None:
        self.produces = self.seq.num_computed + (self.n - self.draft) == len(self.seq.tokens)


@dataclass
class SchedulerOutput:
    """What one step runs."""

    items: list[Scheduled] = field(default_factory=list)
    preempted: int = 0
    failed: list[tuple[Sequence, str]] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        """Tokens fed through the full-depth pass."""
        return sum(s.n for s in self.items)

    @property
    def prefill_tokens(self) -> int:
        """Of ``tokens``, prompt (or recompute) tokens."""
        return sum(s.n for s in self.items if s.seq.uncomputed > 1)


class Scheduler:
    """FCFS continuous batching over a ``KVCache``'s blocks."""

    def __init__(self, kv: KVCache, max_num_seqs: int, token_budget: int, draft_len: int = 0) -> None:
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.token_budget = token_budget
        self.draft_len = draft_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._order = 0

    def add(self, req: Request) -> Sequence:
        """Queue a new request."""
        seq = Sequence(req, list(req.prompt), len(req.prompt), SeqBlocks(self.kv.block_tokens))
        self.waiting.append(seq)
        return seq

    @property
    def idle(self) -> bool:
        """Nothing running and nothing waiting."""
        return not self.running and not self.waiting

    def _preempt(self, seq: Sequence) -> None:
        self.kv.alloc.release(seq.kv.clear())
        seq.num_computed = 0
        seq.preemptions += 1
        self.running.remove(seq)
        self.waiting.appendleft(seq)

    def _reserve(self, seq: Sequence, upto: int) -> bool:
        need = seq.kv.blocks_needed(upto)
        if need > self.kv.alloc.free:
            return False
        seq.kv.grow(self.kv.alloc.allocate(need))
        return True

    def schedule(self) -> SchedulerOutput:
        """Pick this step's work (allocating KV blocks for it)."""
        out = SchedulerOutput()
        budget = self.token_budget
        capacity_tokens = self.kv.num_blocks * self.kv.block_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            unc = seq.uncomputed
            draft = 0
            if unc == 1:
                draft = max(0, min(self.draft_len, seq.remaining_out - 1, budget - 1))
                n = 1 + draft
            else:
                n = min(unc, budget)
            upto = seq.num_computed + n
            ok = self._reserve(seq, upto)
            while not ok:
                victim = self.running[-1]
                self._preempt(victim)
                out.preempted += 1
                if victim is seq:
                    break
                ok = self._reserve(seq, upto)
            if not ok:
                break  # seq itself was preempted; everything after it too
            out.items.append(Scheduled(seq, n, draft))
            budget -= n
            i += 1
        if out.preempted:
            return out  # no admissions in a step that had to preempt
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            total = seq.n_prompt + seq.req.max_tokens
            if total > capacity_tokens:
                self.waiting.popleft()
                out.failed.append(
                    (seq, f"needs {total} tokens of KV but the cache holds {capacity_tokens} in all")
                )
                continue
            # Admit only when the whole remaining prompt would fit now, above a watermark
            # (vLLM v0's can_allocate): admitting on the first chunk alone lets a long
            # prompt in beside long-running ones, to be preempted and recomputed again
            # and again as they all grow.
            watermark = max(1, self.kv.num_blocks // 100)
            if seq.kv.blocks_needed(len(seq.tokens)) + watermark > self.kv.alloc.free and self.running:
                break
            n = min(seq.uncomputed, budget)
            if not self._reserve(seq, seq.num_computed + n):
                break
            self.waiting.popleft()
            self._order += 1
            seq.order = self._order
            self.running.append(seq)
            draft = 0
            out.items.append(Scheduled(seq, n, draft))
            budget -= n
        return out

    def finish(self, seq: Sequence) -> None:
        """A sequence is done: free its blocks."""
        self.kv.alloc.release(seq.kv.clear())
        self.running.remove(seq)

    def rollback(self, seq: Sequence) -> None:
        """Free blocks beyond the sequence's computed positions (rejected drafts)."""
        gone = seq.kv.shrink_to(max(seq.num_computed + 1, 1))
        if gone:
            self.kv.alloc.release(gone)
