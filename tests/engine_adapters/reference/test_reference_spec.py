"""Self-speculative decoding: acceptance statistics and exactness of greedy verification."""

from __future__ import annotations

import math

import pytest

from engine_adapters.reference.engine import Engine, EngineConfig
from engine_adapters.reference.presets import ModelConfig
from engine_adapters.reference.spec import expected_accept_len
from rltperf_tui.live.aggregator import TargetStats

FAST = ModelConfig(
    name="fast", vocab=128, hidden=64, ffn=128, n_heads=2, n_kv_heads=1, head_dim=32,
    n_prelude=0, n_shared=1, n_coda=0, max_loops=2,
)  # fmt: skip


def _accept_len_var(alpha: float, g: int) -> float:
    """Variance of the tokens committed per verification (1 + accepted drafts)."""
    probs = [alpha ** (k - 1) * (1 - alpha) for k in range(1, g + 1)] + [alpha**g]
    mean = sum(k * p for k, p in zip(range(1, g + 2), probs, strict=True))
    return sum((k - mean) ** 2 * p for k, p in zip(range(1, g + 2), probs, strict=True))


@pytest.mark.parametrize(("alpha", "g"), [(0.7, 3), (0.4, 2)])
def test_oracle_acceptance_length_matches_theory(run_reference, alpha: float, g: int) -> None:
    cfg = EngineConfig(
        model=FAST, spec=f"1,{g}", spec_accept=f"oracle:{alpha}", workload="closed:32,in=8,out=500",
        max_num_seqs=32, token_budget=512, kv_blocks=2048, threads=1, seed=7,
    )  # fmt: skip
    run = run_reference(cfg, steps=60)
    steps = [s for s in run.steps if s.spec_drafts]
    drafts = sum(s.spec_drafts for s in steps)
    assert drafts >= 1500
    assert all(s.spec_drafted == g * s.spec_drafts for s in steps)  # outputs are long: no truncated drafts
    assert all(0 <= s.spec_accepted <= s.spec_drafted for s in steps)
    # every drafting row commits its accepted drafts plus one verified token
    for s in steps:
        if s.kind == "decode":
            assert s.out_tokens == s.spec_drafts + s.spec_accepted
            assert sum(s.exit_hist or []) == s.out_tokens
    ts = TargetStats(grow=True)
    ts.add(run.records)
    w = ts.window(None)
    theory = expected_accept_len(alpha, g)
    se = math.sqrt(_accept_len_var(alpha, g) / w.spec_drafts)
    assert w.mean_acceptance_len is not None
    assert abs(w.mean_acceptance_len - theory) < 4 * se, (w.mean_acceptance_len, theory, se)
    assert w.acceptance_rate == pytest.approx(w.spec_accepted / w.spec_drafted)
    info = run.engine.engine_info()
    assert info["spec_config"].startswith(f"self-speculative: draft {g} tokens at 1 loops")
    assert info["contract"]["spec_config"] == info["spec_config"]


def test_greedy_speculation_is_exact() -> None:
    """Greedy verification at full depth commits exactly what plain greedy decoding makes."""

    class NoProbe:
        def step(self, *a: object) -> object:
            class Slot:
                kind = ""
                batch = 0
                tokens = 0

                def mark(self, name: str) -> None:
                    pass

                def set(self, **facts: object) -> None:
                    pass

                def __enter__(self) -> Slot:
                    return self

                def __exit__(self, *exc: object) -> None:
                    pass

            return Slot()

        def request_done(self, *a: object, **k: object) -> None:
            pass

    outs = {}
    totals = {}
    for spec in (None, "2,3", "1,4"):
        e = Engine(
            EngineConfig(workload="closed:4,in=16,out=40,n=8", spec=spec, keep_outputs=True, max_num_seqs=4)
        )
        e.attach(NoProbe())
        e.run()
        outs[spec] = e.outputs
        totals[spec] = e.totals
    assert len(outs[None]) == 8 and all(len(v) == 40 for v in outs[None].values())
    for spec in ("2,3", "1,4"):
        assert outs[spec] == outs[None]
        t = totals[spec]
        assert t.drafts > 0 and 0 < t.accepted < t.drafted  # some drafts accepted, some rolled back
        assert t.steps < totals[None].steps  # fewer steps for the same tokens
    assert EngineConfig().spec is None
