"""Repeated captures must not grow the engine's memory (issue 20 §2).

The reference engine (tiny preset, CPU, closed:4) in a subprocess, sequential ops
captures through a real probe socket, its RSS read from ``/proc`` after each capture's
export (``rltperf bench capture``'s memory run).  Before the fix every capture left its
profiler results behind (~8 MB for 4 steps, ~16 MB for 8): ``torch.profiler.profile``
refers to itself, so only a full pass of the cyclic garbage collector, rare in a
long-running engine, freed them.
"""

from __future__ import annotations

import argparse

import pytest

from rltperf_tui.bench import capture as bench

pytestmark = pytest.mark.slow


def test_the_memory_run_reads_the_engines_rss_around_each_capture() -> None:
    """The bench's memory run, live and short: three sequential captures, the engine's RSS
    from ``/proc`` before and after each, the growth after the warm-up and its control.

    The issue's goal (ten captures after two warm-ups grow RSS by at most 10 MB net) is
    ``rltperf bench capture``'s figure, not this test's: it waits for a young engine's
    RSS to settle (~28 s of a busy engine) and, since a window runs as several profiler
    sessions (``segments.py``), no longer tells the leak from its fix (ten captures grew
    +6.1 MB net without ``release_results``, +0.1 with it).  The next test pins the
    cause itself."""
    args = argparse.Namespace(
        target=None, workload="closed:4", steps=4, repeats=1, modes="", token=None, pid=None,
        rss_captures=3, rss_warmup=1, rss_mode="ops", rss_settle_max=0.0,
    )  # fmt: skip
    r = bench.run(args)
    rss = r["rss"]
    print(rss)
    assert r["ok"] and not rss["failed"], rss
    assert rss["source"].startswith("/proc/") and rss["settled_s"] is None, rss  # no wait asked
    mb = rss["rss_mb"]
    assert len(mb) == 4 and None not in mb and all(50 < v < 4096 for v in mb), rss
    # the growth is over the captures after the warm-up: from the reading after the first
    assert rss["growth_mb"] == pytest.approx(mb[3] - mb[1]), rss
    assert rss["per_capture_mb"] == pytest.approx(rss["growth_mb"] / 2), rss
    assert rss["counted_s"] > 0 and rss["control_s"] == rss["counted_s"] and rss["control_mb"] is not None, (
        rss
    )
    # a gross leak fails this (~8 MB a capture, what one unsegmented window's results held);
    # the unreleased results of today's segmented windows do not (+2.6 and +4.3 MB net here,
    # against +2.1 with the release), hence the next test
    assert rss["net_mb"] is not None and rss["net_mb"] <= 10.0, rss


def test_a_stopped_profiler_frees_its_results_only_when_released() -> None:
    """The cause, in this process: a stopped ``torch.profiler.profile`` dropped by its
    last holder keeps its results (its ``action_map`` refers to its own methods) until
    the cyclic collector runs; ``release_results`` frees them at once."""
    import gc
    import weakref

    import torch
    from torch.profiler import ProfilerActivity, profile

    from engine_adapters.probe.segments import release_results

    def stopped() -> profile:
        p = profile(activities=[ProfilerActivity.CPU])
        p.start()
        torch.randn(8, 8) @ torch.randn(8, 8)
        p.stop()
        return p

    was = gc.isenabled()
    gc.disable()  # no collection may run between the drop and the check
    try:
        p = stopped()
        results = weakref.ref(p.profiler)
        del p
        assert results() is not None, "torch no longer keeps a stopped profile in a cycle"
        gc.collect()
        assert results() is None
        p = stopped()
        results = weakref.ref(p.profiler)
        assert release_results(p) is True
        assert results() is None
        del p
    finally:
        if was:
            gc.enable()
