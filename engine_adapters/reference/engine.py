"""The reference engine: scheduler + looped model + load generator, instrumented.

One engine step (``Engine.step``) is timed by the probe in stages:

``schedule``  (fault injection: ``--inject-stall``), admit arrivals, pick the work
``prepare``   build the flat batch, positions, KV slot maps, attention groups
``draft``     speculation: ``draft_len`` passes at ``draft_loops`` (one token each)
``forward``   the full-depth pass (``verify`` when it verifies drafts); per loop depth
              time and tokens go into ``loop_ns`` / ``loop_tokens``
``exit_check`` exit decisions between loop passes (interleaved with forward/verify)
``sample``    greedy argmax of the output tokens, copied to the host
``accept``    speculation: acceptance and rollback of rejected drafts
``update``    commit tokens, finish requests (``probe.request_done``), free KV

Every step record carries the ground truth the engine knows: analytic bytes read and
written and FLOPs (``analytic.StepCounter``), produced tokens and their exit-depth
histogram, per-depth timing, KV blocks used (per depth), queue lengths, speculation
counts, preemptions, and device busy time: on the CPU the time inside the compute
stages (draft, forward/verify with exit checks, sample); on CUDA a pair of events around
that region, taken from a preallocated pool and resolved by the probe's publisher
without synchronising the engine.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from time import perf_counter_ns as clk
from typing import Any

import numpy as np

from engine_adapters.reference.analytic import DTYPE_BYTES, StepCounter, param_count
from engine_adapters.reference.batch import RowSpec, StepBatch
from engine_adapters.reference.config import (
    ENGINE_NAME,
    EXIT_MARKS_MAX_LOOPS,
    KV_FIT_REQUESTS,
    EngineConfig,
    EngineError,
    EngineTotals,
    parse_stall,
)
from engine_adapters.reference.drafting import accept_drafts, draft_tokens, place_drafts
from engine_adapters.reference.exits import ExitPolicy, parse_exit, parse_exit_mode
from engine_adapters.reference.info import engine_info
from engine_adapters.reference.kvcache import KVCache, parse_kv_policy
from engine_adapters.reference.loadgen import LoadGenerator, WorkloadSpec, parse_workload
from engine_adapters.reference.presets import get_preset, with_loops
from engine_adapters.reference.scheduler import Scheduler, Sequence
from engine_adapters.reference.sizing import import_torch, plan_kv_pool
from engine_adapters.reference.spec import SpecConfig, parse_spec
from engine_adapters.reference.timing import EventPool, resolve_loop_events

__all__ = [
    "ENGINE_NAME",
    "EXIT_MARKS_MAX_LOOPS",
    "KV_FIT_REQUESTS",
    "Engine",
    "EngineConfig",
    "EngineError",
    "EngineTotals",
    "parse_stall",
]


class Engine:
    """The reference looped-transformer engine (see module docstring)."""

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        try:
            preset = get_preset(cfg.preset)
            model_cfg = cfg.model or preset.model
            if cfg.max_loops is not None:
                if cfg.max_loops < 1:
                    raise ValueError(f"--max-loops must be >= 1, not {cfg.max_loops}")
                model_cfg = with_loops(model_cfg, cfg.max_loops)
            self.exit_policy: ExitPolicy = parse_exit(cfg.exit, model_cfg.max_loops)
            self.exit_mode = parse_exit_mode(cfg.exit_mode)
            self.kv_policy = parse_kv_policy(cfg.kv_policy)
            self.spec: SpecConfig | None = parse_spec(cfg.spec, cfg.spec_accept, model_cfg.max_loops)
            self.stall = parse_stall(cfg.inject_stall)
            self.workload: WorkloadSpec = parse_workload(cfg.workload or preset.engine.workload)
        except ValueError as exc:
            raise EngineError(str(exc)) from None
        self.model_cfg = model_cfg
        dev = cfg.device
        if not (dev == "cpu" or dev == "cuda" or (dev.startswith("cuda:") and dev[5:].isdigit())):
            raise EngineError(f"--device must be cpu or cuda (or cuda:N), not {dev!r}")
        if dev == "cuda":
            dev = "cuda:0"
        self.device = dev
        self.is_cuda = dev.startswith("cuda")
        dtype = cfg.dtype or (preset.engine.dtype_cuda if self.is_cuda else preset.engine.dtype_cpu)
        if dtype not in DTYPE_BYTES:
            raise EngineError(f"--dtype must be one of {', '.join(DTYPE_BYTES)}, not {dtype!r}")
        self.dtype = dtype
        self.bpe = DTYPE_BYTES[dtype]
        if preset.engine.gpu_only and not self.is_cuda and not cfg.force and cfg.model is None:
            gb = param_count(model_cfg) * self.bpe / 1e9
            raise EngineError(
                f"preset {cfg.preset} has {param_count(model_cfg) / 1e9:.2f} B parameters ({gb:.1f} GB in {dtype}): "
                "it is meant for a GPU (--device cuda). On the CPU, `rltperf engine --preset "
                f"{cfg.preset} --analytic` prints its analytic counts; --force runs it anyway"
            )
        threads = cfg.threads or preset.engine.threads or (os.cpu_count() or 1)
        if threads < 1:
            raise EngineError(f"--threads must be >= 1, not {threads}")
        self.threads = threads
        plan = plan_kv_pool(cfg, preset, model_cfg, self.workload, self.spec, self.kv_policy, self.bpe)
        self.max_num_seqs = plan.max_num_seqs
        self.token_budget = plan.token_budget
        self.kv_raised: str | None = plan.raised
        """Why the default KV pool is larger than the preset's budget (None: it is not)."""
        bt, need, nblocks = plan.block_tokens, plan.need, plan.blocks
        torch = import_torch(dev)
        torch.set_num_threads(threads)
        self.max_len = need
        self.seed = cfg.seed
        self.model_desc = f"looped-{cfg.preset if cfg.model is None else model_cfg.name} (random weights)"

        from engine_adapters.reference.model import TORCH_DTYPES, LoopedLM

        self.tdtype = TORCH_DTYPES[dtype]
        self.model = LoopedLM(model_cfg, dtype, dev, seed=cfg.seed, max_positions=need + 1)
        self.kv = KVCache(model_cfg, self.kv_policy, nblocks, bt, self.tdtype, dev)
        self.sched = Scheduler(
            self.kv, self.max_num_seqs, self.token_budget, self.spec.draft_len if self.spec else 0
        )
        self.loadgen = LoadGenerator(self.workload, model_cfg.vocab, cfg.seed)
        self.counter = StepCounter(model_cfg, self.bpe)
        self.exit_rng = np.random.default_rng([cfg.seed, 3])
        self.accept_rng = np.random.default_rng([cfg.seed, 4])
        self.exit_marks = model_cfg.max_loops <= EXIT_MARKS_MAX_LOOPS
        self.probe: Any = None
        self.totals = EngineTotals(exit_hist=[0] * model_cfg.max_loops)
        self._step_no = 0
        self._events: EventPool | None = None
        self._loop_events: EventPool | None = None
        self._loop_pending: deque[tuple[list[tuple[Any, Any]], list[int]]] = deque()
        if self.is_cuda:
            self._events = EventPool(8192)
            self._loop_events = EventPool(8192)
        self.started = False
        self.finite_done = False
        self.stall_total_ns = 0
        self.stalls = 0
        self._t_start = 0
        self.warmed = False
        self.outputs: dict[str, list[int]] = {}
        if cfg.warmup:
            self.warmup()

    # -- description ---------------------------------------------------------------------------

    def exit_config(self) -> str:
        """Exit policy and mode, as in the engine info."""
        return f"{self.exit_policy.describe()} {self.exit_mode}"

    def engine_info(self, duration: float | None = None) -> dict[str, Any]:
        """``EngineInfo`` fields, with every test-contract field the engine knows (``info.py``)."""
        return engine_info(self, duration)

    # -- warm-up -------------------------------------------------------------------------------

    def warmup(self) -> None:
        """One untimed prefill chunk and one decode pass (allocator, kernels, caches)."""
        import torch

        from engine_adapters.reference.kvcache import SeqBlocks

        n = max(
            2, min(self.token_budget, 64, self.kv.num_blocks * self.kv.block_tokens - 2, self.max_len - 1)
        )
        sb = SeqBlocks(self.kv.block_tokens)
        need = sb.blocks_needed(n + 1)
        if need > self.kv.alloc.free:
            return
        sb.grow(self.kv.alloc.allocate(need))
        fixed = ExitPolicy("fixed")
        c = StepCounter(self.model_cfg, self.bpe)
        with torch.inference_mode():
            for start, toks in ((0, list(range(n))), (n, [1])):
                spec = RowSpec(None, toks, start, sb.slots, [len(toks) - 1])
                b = StepBatch([spec], self.model.rope_cos, self.model.rope_sin, self.model.device)
                res = self.model(b, self.kv, c, fixed, "select")
                res.logits.argmax(-1).tolist()
        self.kv.alloc.release(sb.clear())
        if self.is_cuda:
            torch.cuda.synchronize()
        self.warmed = True

    # -- the step ------------------------------------------------------------------------------

    def attach(self, probe: Any) -> None:
        """Use ``probe`` for step records (``engine_adapters.probe.Probe``)."""
        self.probe = probe

    def start(self) -> None:
        """Start the workload clock."""
        self._t_start = clk()
        self.loadgen.start(self._t_start)
        self.started = True

    def _stall_now(self) -> None:
        ms = self.stall[0] if self.stall else 0.0
        t0 = clk()
        end = t0 + int(ms * 1e6)
        # a busy host stall (like Python work: GC, tokenising, bookkeeping), not a sleep:
        # a sleeping process gets scheduling credit from the OS and would run the next
        # steps faster on a shared machine, hiding part of the stall
        while clk() < end:
            pass
        self.stall_total_ns += clk() - t0
        self.stalls += 1

    def _admit(self, now: int) -> None:
        for r in self.loadgen.poll(now):
            self.sched.add(r)

    def step(self) -> bool:
        """Run one engine step; False when there was nothing to do."""
        import torch

        if not self.started:
            self.start()
        self._admit(clk())
        if self.sched.idle:
            return False
        probe = self.probe
        guess = (
            "decode"
            if all(s.uncomputed == 1 for s in self.sched.running) and not self.sched.waiting
            else "mixed"
        )
        t0 = clk()
        with torch.inference_mode(), probe.step(guess) as st:
            if self.cfg.sync_every_stage and self.is_cuda:
                raw = st.mark

                def mark(name: str) -> None:
                    torch.cuda.synchronize()
                    raw(name)
            else:
                mark = st.mark
            self._step(st, mark)
        dt = clk() - t0
        self.totals.step_ns += dt
        self.totals.recent_step_ns.append(dt)
        return True

    def _step(self, st: Any, mark: Any) -> None:
        import torch

        cfg = self.model_cfg
        L = cfg.max_loops
        mark("schedule")
        self._step_no += 1
        if self.stall and self._step_no % self.stall[1] == 0:
            self._stall_now()
        self._admit(clk())
        so = self.sched.schedule()
        prefill_tokens = so.prefill_tokens
        for seq, why in so.failed:
            now = clk()
            self.totals.failed += 1
            self.probe.request_done(seq.req.req_id, seq.req.arrival_ns, now, None, seq.n_prompt, 0, "failed")
            print(f"request {seq.req.req_id} failed: it {why}", flush=True)
        items = so.items
        if not items:
            st.kind = "idle"
            used, total, per_depth = self.kv.usage()
            st.set(kv_used=used, kv_total=total, kv_per_depth=per_depth, waiting=len(self.sched.waiting),
                   running=len(self.sched.running), preempted=so.preempted, out_tokens=0)  # fmt: skip
            return
        n_pre = sum(1 for it in items if it.seq.uncomputed > 1)
        st.kind = "prefill" if n_pre == len(items) else ("decode" if n_pre == 0 else "mixed")
        drafting = [it for it in items if it.draft > 0]
        n_drafted = sum(it.draft for it in drafting)
        st.batch = len(items)
        st.tokens = so.tokens + n_drafted
        mark("prepare")
        self.counter.reset()
        counter = self.counter
        model = self.model
        policy = self.exit_policy
        specs: list[RowSpec] = []
        for it in items:
            seq = it.seq
            start = seq.num_computed
            if it.draft:
                toks = [seq.tokens[-1]] + [0] * it.draft  # drafts filled in on the device
                out_local = list(range(it.n))
            else:
                toks = seq.tokens[start : start + it.n]
                out_local = [it.n - 1] if it.produces else []
            specs.append(RowSpec(it, toks, start, seq.kv.slots, out_local))
        batch = StepBatch(specs, model.rope_cos, model.rope_sin, model.device)
        ev = self._events
        busy_events: list[tuple[Any, Any]] = []
        t_busy0 = clk()
        if ev is not None:
            e0 = ev()
            e0.record()
        dbuf = None
        if drafting:
            mark("draft")
            assert self.spec is not None  # rows draft only under --spec
            dbuf = draft_tokens(model, self.kv, self.spec.draft_loops, drafting, counter)
            place_drafts(batch, drafting, dbuf, model.device)
        stage = "verify" if drafting else "forward"
        mark(stage)
        oracle = None
        n_out = len(batch.out_flat)
        if policy.kind == "oracle":
            oracle = self.exit_rng.choice(len(policy.probs), size=n_out, p=policy.probs) + 1
        from engine_adapters.reference.model import PassHooks

        hooks = PassHooks(mark=mark, stage=stage, exit_marks=self.exit_marks,
                          events=self._loop_events)  # fmt: skip
        res = model(batch, self.kv, counter, policy, self.exit_mode, hooks=hooks, oracle_depths=oracle)
        mark("sample")
        next_tok = res.logits.argmax(dim=-1)
        if ev is not None:
            e1 = ev()
            e1.record()
            busy_events.append((e0, e1))
        if isinstance(res.exit_depth, torch.Tensor):
            both = torch.stack((next_tok, res.exit_depth.to(next_tok.dtype))) if n_out else None
            pair = both.tolist() if both is not None else [[], []]
            toks_out, depth_out = pair[0], pair[1]
        else:
            toks_out = next_tok.tolist()
            depth_out = res.exit_depth.tolist()
        drafts_host = dbuf.tolist() if dbuf is not None else None
        t_busy1 = clk()
        # -- accept / update
        exit_hist = [0] * L
        produced = 0
        accepted_total = 0
        now = clk()
        out_pos = 0  # walk outputs in batch order
        row_outputs: dict[int, tuple[list[int], list[int]]] = {}
        for sp in batch.specs:
            k = len(sp.out_local)
            row_outputs[id(sp.seq)] = (toks_out[out_pos : out_pos + k], depth_out[out_pos : out_pos + k])
            out_pos += k
        if drafting:
            mark("accept")
            produced, accepted_total = accept_drafts(
                drafting, row_outputs, drafts_host, self.spec, self.accept_rng, self.sched, exit_hist
            )
        mark("update")
        now = clk()
        finished: list[Sequence] = []
        for it in items:
            seq = it.seq
            if it.draft:
                pass  # committed in accept
            else:
                seq.num_computed += it.n
                if it.produces:
                    tk, dp = row_outputs[id(it)]
                    seq.tokens.append(int(tk[0]))
                    exit_hist[int(dp[0]) - 1] += 1
                    produced += 1
            if seq.n_out and seq.first_token_ns is None:
                seq.first_token_ns = now
            if seq.remaining_out <= 0:
                finished.append(seq)
        for seq in finished:
            self.sched.finish(seq)
            if self.cfg.keep_outputs:
                self.outputs[seq.req.req_id] = seq.tokens[seq.n_prompt :]
            self.probe.request_done(
                seq.req.req_id, seq.req.arrival_ns, now, seq.first_token_ns, seq.n_prompt, seq.n_out, "ok",
                seq.preemptions,
            )  # fmt: skip
            self.loadgen.finished(now)
        used, total, per_depth = self.kv.usage()
        facts: dict[str, Any] = {
            "prefill_tokens": prefill_tokens,
            "bytes_read": counter.bytes_read,
            "bytes_written": counter.bytes_written,
            "flops": counter.flops,
            "out_tokens": produced,
            "exit_hist": exit_hist,
            "kv_used": used,
            "kv_total": total,
            "kv_per_depth": per_depth,
            "waiting": len(self.sched.waiting),
            "running": len(self.sched.running),
            "preempted": so.preempted,
        }
        if drafting:
            facts["spec_drafts"] = len(drafting)
            facts["spec_drafted"] = n_drafted
            facts["spec_accepted"] = accepted_total
        if busy_events:
            facts["busy_events"] = busy_events
            self._loop_pending.append((hooks.loop_events, hooks.loop_tokens))
            lagged = resolve_loop_events(self._loop_pending)
            if lagged is not None:
                facts["loop_ns"], facts["loop_tokens"] = lagged
        else:
            facts["busy_ns"] = t_busy1 - t_busy0
            facts["loop_ns"] = hooks.loop_ns
            facts["loop_tokens"] = hooks.loop_tokens
        st.set(**facts)
        t = self.totals
        t.steps += 1
        t.out_tokens += produced
        t.finished += len(finished)
        t.preempted += so.preempted
        t.busy_ns += t_busy1 - t_busy0
        t.drafts += len(drafting)
        t.drafted += n_drafted
        t.accepted += accepted_total
        t.bytes += counter.bytes_read + counter.bytes_written
        for i, v in enumerate(exit_hist):
            t.exit_hist[i] += v

    # -- running -------------------------------------------------------------------------------

    @property
    def workload_done(self) -> bool:
        """A finite workload has released and finished every request."""
        return self.loadgen.exhausted and self.sched.idle

    def idle_wait(self, stop: threading.Event | None = None, max_s: float = 0.05) -> None:
        """Sleep until the next arrival (at most ``max_s``)."""
        nxt = self.loadgen.next_arrival_ns()
        if nxt is None:
            wait = max_s
        else:
            wait = min(max_s, max(0.0, (nxt - clk()) / 1e9))
        if wait > 0:
            if stop is not None:
                stop.wait(wait)
            else:
                time.sleep(wait)

    def run(self, duration: float | None = None, stop: threading.Event | None = None,
            max_steps: int | None = None, on_tick: Any = None, tick_s: float = 2.0,
            stop_when_done: bool = True) -> None:  # fmt: skip
        """Step until ``stop`` is set, ``duration`` passes, ``max_steps`` ran, or a
        finite workload is done (``stop_when_done``).  ``on_tick(engine)`` every ``tick_s``."""
        if not self.started:
            self.start()
        t_end = None if duration is None else time.monotonic() + duration
        next_tick = time.monotonic() + tick_s
        steps0 = self.totals.steps
        while not (stop is not None and stop.is_set()):
            now = time.monotonic()
            if t_end is not None and now >= t_end:
                break
            if max_steps is not None and self.totals.steps - steps0 >= max_steps:
                break
            if on_tick is not None and now >= next_tick:
                next_tick += tick_s
                on_tick(self)
            if not self.step():
                if self.workload_done:
                    self.finite_done = True
                    if stop_when_done:
                        break
                self.idle_wait(stop)
