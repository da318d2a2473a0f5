"""The default KV pool runs every documented workload and keeps the demo's KV pressure."""

from __future__ import annotations

import pytest

from engine_adapters.reference.engine import KV_FIT_REQUESTS, Engine, EngineConfig, EngineError

# the workloads the README and `rltperf engine --help` name
DOCUMENTED = (
    "single-128",
    "burst16-1024",
    "rate-4096",
    "rate-4096:0.5",
    "poisson:4",
    "closed:8",
    "steady-bursts",
)


@pytest.mark.parametrize("workload", DOCUMENTED)
def test_default_kv_holds_two_requests_of_every_documented_workload(workload: str) -> None:
    eng = Engine(EngineConfig(workload=workload, warmup=False))
    w = eng.workload
    need = w.prompt_len + w.output_len
    assert eng.kv.num_blocks * eng.kv.block_tokens >= KV_FIT_REQUESTS * need


def test_the_demo_keeps_the_presets_budget() -> None:
    """tiny's 14 MiB budget (179 blocks of 16) is what makes the demo's bursts meet KV
    pressure: a short workload does not raise it."""
    eng = Engine(EngineConfig(warmup=False))
    assert eng.kv.num_blocks == 179 and eng.kv_raised is None


def test_an_explicit_kv_blocks_is_kept_and_checked() -> None:
    with pytest.raises(EngineError, match="raise --kv-blocks"):
        Engine(EngineConfig(workload="rate-4096:0.5", kv_blocks=100, warmup=False))
