"""What a vLLM trace shows the profiler did, read from real torch.profiler traces.

vLLM's profiler settings are fixed at server start, so the bundle reads them back from
the trace: shapes ("Input Dims" args), stacks ("python_function" events) and memory
("[memory]" events).  The traces here are written by torch.profiler itself, with vLLM's
step annotation name, and the detection is checked against the settings used.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from engine_adapters.monitor.vllm.capture import profile_prefix, validate_request
from engine_adapters.monitor.vllm.trace_files import mode_note, trace_facts


def _trace(path: Path, steps: int, **kw: bool) -> Path:
    import torch
    from torch.profiler import profile, record_function

    x = torch.randn(32, 32)
    with profile(**kw) as prof:
        for i in range(steps):
            with record_function(f"execute_context_{i % 2}({i})_generation_1(1)"):
                (x @ x).sum()
    raw = path.with_suffix("")
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(path, "wb") as dst:
        dst.write(src.read())
    return path


def test_ops_trace_is_read_as_ops(tmp_path: Path) -> None:
    facts = trace_facts(str(_trace(tmp_path / "ops.json.gz", 3)))
    assert len(facts.annotations) == 3
    assert [a["name"] for a in facts.annotations][:2] == ["execute_context_0(0)_generation_1(1)",
                                                          "execute_context_1(1)_generation_1(1)"]  # fmt: skip
    assert not (facts.record_shapes or facts.with_stack or facts.profile_memory)
    assert mode_note("ops", facts) is None
    note = mode_note("full", facts)
    assert note and all(
        k in note
        for k in ("torch_profiler_record_shapes", "torch_profiler_with_memory", "torch_profiler_with_stack")
    )


def test_full_trace_is_read_as_full(tmp_path: Path) -> None:
    facts = trace_facts(str(_trace(tmp_path / "full.json.gz", 2, record_shapes=True, profile_memory=True,
                                   with_stack=True)))  # fmt: skip
    assert (facts.record_shapes, facts.with_stack, facts.profile_memory) == (True, True, True)
    assert mode_note("full", facts) is None
    note = mode_note("ops", facts)
    assert note and '"torch_profiler_with_stack": false' in note
    with gzip.open(tmp_path / "full.json.gz") as f:
        assert facts.events == len(json.load(f)["traceEvents"])


def test_stacks_only_is_neither_mode(tmp_path: Path) -> None:
    # vLLM's default config records stacks but not shapes or memory
    facts = trace_facts(str(_trace(tmp_path / "stack.json.gz", 1, with_stack=True)))
    assert (facts.record_shapes, facts.with_stack, facts.profile_memory) == (False, True, False)
    ops, full = mode_note("ops", facts), mode_note("full", facts)
    assert ops and "with_stack" in ops and full and "torch_profiler_record_shapes" in full


@pytest.mark.parametrize(("steps", "mode", "ok"), [(8, "ops", True), (0, "ops", False), (4, "fast", False)])
def test_request_validation(steps: int, mode: str, ok: bool) -> None:
    assert (validate_request(steps, mode) is None) == ok


def test_profile_prefix_is_what_vllm_accepts() -> None:
    p = profile_prefix("abc123", "my label/../x")
    assert p[0].isalnum() and len(p) <= 128 and all(c.isalnum() or c in "._-" for c in p)
