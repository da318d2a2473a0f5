"""The column-wise step ingest of the aggregator gives exactly what the original
per-record loop gave (kept below as the reference), on streams with unknown fields,
ragged lists, dropped ids and engine restarts."""

from __future__ import annotations

import math
import random
import types

import numpy as np

from engine_adapters.definitions.records import DeviceSample, RequestRecord, StepRecord
from rltperf_tui.live.aggregator import _KIND_CODE, MAX_DEPTH, MAX_STAGES, TargetStats


def reference_add_steps(self: TargetStats, steps: list[StepRecord]) -> None:
    """The original per-record ingest (the specification the column-wise one must match)."""
    n = len(steps)
    ns = len(self.stage_names) or MAX_STAGES
    ns = min(ns, MAX_STAGES)
    stage_rows = np.zeros((n, MAX_STAGES), dtype=np.int64)
    exit_rows = np.zeros((n, MAX_DEPTH), dtype=np.int32)
    loop_rows = np.zeros((n, MAX_DEPTH), dtype=np.int64)
    ltok_rows = np.zeros((n, MAX_DEPTH), dtype=np.int32)
    ids = [0] * n
    start = [0] * n
    end = [0] * n
    kind = [0] * n
    batch = [0] * n
    tokens = [0] * n
    prefill = [0] * n
    out_tok = [0] * n
    busy = [math.nan] * n
    nbytes = [math.nan] * n
    flops = [math.nan] * n
    flags = [0] * n
    kv_used = [math.nan] * n
    kv_total = [math.nan] * n
    waiting = [math.nan] * n
    running = [math.nan] * n
    drafts = [0] * n
    drafted = [0] * n
    accepted = [0] * n
    preempted = [0] * n
    kc = _KIND_CODE
    prev = self.last_step_id
    gaps = 0
    for i, s in enumerate(steps):
        sid = s.step_id
        if prev is not None and sid > prev + 1:
            gaps += sid - prev - 1
        prev = sid
        ids[i] = sid
        start[i] = s.start_ns
        end[i] = s.end_ns
        kind[i] = kc.get(s.kind, 0)
        batch[i] = s.batch
        tokens[i] = s.tokens
        prefill[i] = s.prefill_tokens
        out_tok[i] = s.out_tokens
        if s.busy_ns is not None:
            busy[i] = s.busy_ns
        br = s.bytes_read
        bw = s.bytes_written
        if br is not None or bw is not None:
            nbytes[i] = (br or 0) + (bw or 0)
        if s.flops is not None:
            flops[i] = s.flops
        flags[i] = s.flags
        if s.kv_used is not None:
            kv_used[i] = s.kv_used
        if s.kv_total is not None:
            kv_total[i] = s.kv_total
        if s.waiting is not None:
            waiting[i] = s.waiting
        if s.running is not None:
            running[i] = s.running
        drafts[i] = s.spec_drafts
        drafted[i] = s.spec_drafted
        accepted[i] = s.spec_accepted
        preempted[i] = s.preempted
        st = s.stage_ns
        if st:
            m = min(len(st), MAX_STAGES)
            stage_rows[i, :m] = st[:m]
        eh = s.exit_hist
        if eh:
            m = min(len(eh), MAX_DEPTH)
            exit_rows[i, :m] = eh[:m]
        ln = s.loop_ns
        if ln:
            m = min(len(ln), MAX_DEPTH)
            loop_rows[i, :m] = ln[:m]
        lt = s.loop_tokens
        if lt:
            m = min(len(lt), MAX_DEPTH)
            ltok_rows[i, :m] = lt[:m]
    self.id_gaps += gaps
    self.last_step_id = prev
    self.last_step = steps[-1]
    self.last_end_ns = end[-1]
    self.now_ns = max(self.now_ns, end[-1])
    self.vouched_ns = max(self.vouched_ns, end[-1])
    rep = self.reported
    self.reported = (
        rep[0] or any(v == v for v in busy),  # NaN: not reported
        rep[1] or any(s.bytes_read is not None or s.bytes_written is not None for s in steps),
        rep[2] or any(v == v for v in flops),
    )
    self._seen(start[0])
    if self.in_step_since_ns and end[-1] >= self.in_step_since_ns:
        self.in_step_since_ns = 0
    self.steps.append(
        {
            "step_id": ids, "start": start, "end": end, "kind": kind, "batch": batch,
            "tokens": tokens, "prefill": prefill, "out_tokens": out_tok, "busy": busy,
            "bytes": nbytes, "flops": flops, "flags": flags, "kv_used": kv_used,
            "kv_total": kv_total, "waiting": waiting, "running": running, "drafts": drafts,
            "drafted": drafted, "accepted": accepted, "preempted": preempted,
            "stages": stage_rows, "exit": exit_rows, "loop_ns": loop_rows, "loop_tokens": ltok_rows,
        },
        n,
    )  # fmt: skip


def _stream(seed: int, n: int, plain: bool = False) -> list[object]:
    """``plain``: every step a decode step, no optional field reported but (even seeds)
    the bytes read (the fast paths of a batch of one kind, of a field no step has, and of
    bytes read without bytes written)."""
    rng = random.Random(seed)
    out: list[object] = []
    sid = 100
    t = 10**9
    for i in range(n):
        if rng.random() < 0.05:
            sid += rng.randint(2, 5)  # dropped records
        elif rng.random() < 0.01:
            sid = rng.randint(0, 3)  # engine restart
        else:
            sid += 1
        dur = rng.randint(10**5, 10**7)

        def maybe(v: object) -> object:
            return None if plain or rng.random() < 0.2 else v

        def lst(k: int) -> list[int] | None:
            if rng.random() < 0.15:
                return None if rng.random() < 0.5 else []
            return [rng.randint(0, 10**6) for _ in range(k)]

        ragged = rng.random() < 0.3
        out.append(StepRecord(
            step_id=sid, start_ns=t, end_ns=t + dur, kind="decode" if plain else rng.choice(["decode", "prefill", "mixed", "weird"]),
            stage_ns=lst(rng.randint(1, 30) if ragged else 9) or [], batch=rng.randint(0, 64),
            tokens=rng.randint(0, 512), prefill_tokens=rng.randint(0, 256), busy_ns=maybe(dur // 2),
            bytes_read=rng.randint(0, 10**12) if plain and seed % 2 == 0 else maybe(rng.randint(0, 10**12)), bytes_written=maybe(rng.randint(0, 10**9)),
            flops=maybe(rng.random() * 1e12), out_tokens=rng.randint(0, 64),
            exit_hist=lst(rng.randint(1, 20) if ragged else 4), loop_ns=lst(4), loop_tokens=lst(rng.randint(0, 18)),
            kv_used=maybe(rng.randint(0, 4096)), kv_total=maybe(4096), kv_per_depth=lst(4),
            waiting=maybe(rng.randint(0, 9)), running=maybe(rng.randint(0, 9)), spec_drafts=rng.randint(0, 9),
            spec_drafted=rng.randint(0, 30), spec_accepted=rng.randint(0, 30), preempted=rng.randint(0, 2),
            flags=rng.randint(0, 15),
        ))  # fmt: skip
        t += dur + rng.randint(0, 10**6)
        if i % 7 == 3:
            out.append(RequestRecord(req_id=str(i), arrival_ns=t - 10**8, finish_ns=t, first_token_ns=t - 10**7,
                                     output_tokens=rng.randint(0, 30)))  # fmt: skip
        if i % 50 == 11:
            out.append(DeviceSample(ts_ns=t))
    return out


def test_columnwise_ingest_matches_the_reference() -> None:
    for seed in range(8):
        recs = _stream(seed, 900, plain=seed >= 6)
        a = TargetStats(capacity=1024)
        b = TargetStats(capacity=1024)
        b._add_steps = types.MethodType(reference_add_steps, b)  # type: ignore[method-assign]
        k = 0
        rng = random.Random(seed)
        while k < len(recs):  # batches of many sizes, one record included
            m = rng.choice([1, 2, 3, 17, 100, 400])
            a.add(recs[k : k + m])  # type: ignore[arg-type]
            b.add(recs[k : k + m])  # type: ignore[arg-type]
            k += m
        for name in b.steps.cols:
            assert np.array_equal(a.steps.cols[name], b.steps.cols[name], equal_nan=True), (seed, name)
        assert (a.steps.n, a.id_gaps, a.last_step_id, a.last_end_ns, a.now_ns) == (
            b.steps.n, b.id_gaps, b.last_step_id, b.last_end_ns, b.now_ns)  # fmt: skip
        assert a.last_step is b.last_step or a.last_step == b.last_step
        wa, wb = a.window(None), b.window(None)
        assert wa.as_summary() == wb.as_summary()
