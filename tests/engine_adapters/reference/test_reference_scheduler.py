"""Continuous batching, chunked prefill, preemption by recompute, and the load generator."""

from __future__ import annotations

import numpy as np

from engine_adapters.reference.engine import Engine, EngineConfig
from engine_adapters.reference.kvcache import KVCache
from engine_adapters.reference.loadgen import LoadGenerator, Request, parse_workload
from engine_adapters.reference.presets import PRESETS
from engine_adapters.reference.scheduler import Scheduler


def test_chunked_prefill_respects_the_token_budget(run_reference) -> None:
    run = run_reference(
        EngineConfig(workload="closed:2,in=300,out=8,n=4", token_budget=64, max_num_seqs=2, kv_blocks=200),
        seconds=60,  # ends when the finite workload is done
    )
    assert run.engine.workload_done
    steps = run.steps
    assert all(s.tokens <= 64 and s.prefill_tokens <= s.tokens for s in steps)
    assert sum(s.prefill_tokens for s in steps) == 4 * 300
    # prefill chunks ride along with decodes in mixed steps
    assert any(s.kind == "mixed" for s in steps) and steps[0].kind == "prefill"
    reqs = run.requests
    assert len(reqs) == 4 and all(r.status == "ok" and r.output_tokens == 8 for r in reqs)
    # a 300-token prompt at 64 tokens per step takes at least 5 steps before its first token
    step_ns = np.median([s.end_ns - s.start_ns for s in steps])
    assert all((r.first_token_ns or 0) - r.arrival_ns > 4 * 0.3 * step_ns for r in reqs)


def test_preemption_recomputes_and_changes_nothing(run_reference) -> None:
    # short prompts, long outputs: admitted easily, they outgrow the cache as they decode
    wl = "closed:8,in=20,out=100,n=12"
    tight = run_reference(EngineConfig(workload=wl, kv_blocks=28, keep_outputs=True), seconds=120)
    roomy = Engine(EngineConfig(workload=wl, kv_blocks=400, keep_outputs=True))
    roomy_run = run_reference(EngineConfig(), seconds=120, engine=roomy)
    steps = tight.steps
    preempted = sum(s.preempted for s in steps)
    reqs = tight.requests
    assert len(reqs) == 12 and all(r.status == "ok" and r.output_tokens == 100 for r in reqs)
    assert preempted > 0 and sum(r.preemptions for r in reqs) == preempted
    assert all(s.kv_used is not None and s.kv_total is not None and s.kv_used <= s.kv_total for s in steps)
    # requests wait while fewer than max_num_seqs run: the KV cache limits concurrency
    assert any((s.waiting or 0) > 0 and (s.running or 0) < 8 for s in steps)
    # recomputing a preempted request reproduces exactly the tokens it would have produced
    assert tight.engine.outputs == roomy_run.engine.outputs
    assert sum(s.preempted for s in roomy_run.steps) == 0


def test_scheduler_fails_a_request_that_can_never_fit() -> None:
    cfg = PRESETS["tiny"].model
    kv = KVCache(cfg, "per_depth", num_blocks=4, block_tokens=16, dtype=None, device="cpu")  # type: ignore[arg-type]
    sched = Scheduler(kv, max_num_seqs=4, token_budget=64)
    sched.add(Request("big", list(range(60)), 10))
    sched.add(Request("ok", list(range(20)), 10))
    out = sched.schedule()
    assert [s.req.req_id for s, _ in out.failed] == ["big"]
    assert "needs 70 tokens" in out.failed[0][1]
    assert [it.seq.req.req_id for it in out.items] == ["ok"]


def test_load_generator_is_deterministic() -> None:
    a = LoadGenerator(parse_workload("poisson:50,in=16,out=4"), vocab=512, seed=3)
    b = LoadGenerator(parse_workload("poisson:50,in=16,out=4"), vocab=512, seed=3)
    c = LoadGenerator(parse_workload("poisson:50,in=16,out=4"), vocab=512, seed=4)
    assert a.tokens_sha256 == b.tokens_sha256 != c.tokens_sha256
    for g in (a, b, c):
        g.start(0)
    ra, rb = a.poll(int(20e9)), b.poll(int(20e9))
    assert [(r.arrival_ns, r.prompt) for r in ra] == [(r.arrival_ns, r.prompt) for r in rb]
    assert 850 < len(ra) < 1150  # 50 req/s for 20 s
    assert all(len(r.prompt) == 16 and r.max_tokens == 4 for r in ra)
    contract = a.contract()
    assert (
        contract["workload_tokens_sha256"] == a.tokens_sha256
        and "Poisson 50 req/s" in contract["arrival_model"]
    )


def test_named_workloads_and_arrival_models() -> None:
    single = parse_workload("single-128")
    assert (single.prompt_len, single.output_len, single.total) == (128, 64, 1)
    burst = LoadGenerator(parse_workload("burst16-1024"), vocab=100)
    burst.start(0)
    got = burst.poll(0)
    assert (
        len(got) == 16 and all(len(r.prompt) == 1024 and r.arrival_ns == 0 for r in got) and burst.exhausted
    )
    rate = LoadGenerator(parse_workload("rate-4096:2"), vocab=100)
    rate.start(0)
    times = [r.arrival_ns for r in rate.poll(int(100e9))]
    assert len(times) == 16 and np.allclose(np.diff(times), 0.5e9)
    closed = LoadGenerator(parse_workload("closed:3,n=5"), vocab=100)
    closed.start(0)
    assert len(closed.poll(0)) == 3 and closed.poll(10) == []
    closed.finished(100)
    nxt = closed.poll(100)
    assert len(nxt) == 1 and nxt[0].arrival_ns == 100
    sb = LoadGenerator(parse_workload("steady-bursts:2,burst=10,every=5"), vocab=100)
    sb.start(0)
    first = sb.poll(int(4.9e9))
    with_burst = sb.poll(int(5.0e9))
    assert len(first) < 30 and len(with_burst) >= 10  # the burst lands at t=5 s
