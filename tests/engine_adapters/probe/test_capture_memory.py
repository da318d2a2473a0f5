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


def test_repeated_captures_leave_the_engine_rss_flat() -> None:
    args = argparse.Namespace(
        target=None, workload="closed:4", steps=4, repeats=1, modes="", token=None, pid=None,
        rss_captures=12, rss_warmup=2, rss_mode="ops",
    )  # fmt: skip
    r = bench.run(args)
    rss = r["rss"]
    print(rss)
    assert r["ok"] and not rss["failed"], rss
    assert rss["source"].startswith("/proc/") and None not in rss["rss_mb"], rss
    # counted once the young engine's own growth has ended (its probe reader's recent
    # steps: ~28 s, bench.capture_rss._settle)
    assert rss["settled_s"] is not None, rss
    # Memory, not time, and the goal as it is written: after 2 warm-up captures,
    # the next 10 grow RSS by at most 10 MB in all, beyond what the engine grew by itself
    # over as long without captures.  Without ``release_results``: +16.8 MB over the ten
    # (+12.9 over five: +12.5, +2.3, -2.6, +0.5, +0.2, the cyclic collector freeing some
    # now and then); with it, +0.4.  Since a window runs as several profiler sessions
    # (``segments.py``), each session's results are smaller and the collector runs more
    # often: without the release the ten now grew +6.1 MB net 1 s apart and +2.7 back to
    # back (as ``capture_rss`` runs them since), +0.1 and +0.2 with it, so this goal no
    # longer tells the two apart; the next test pins the cause itself.
    # Not 1 MB for each of five, as this test once asked:
    # the allocator settles in a step, not a slope, and
    # a parallel run failed that with +0.9, +0.3, +0.1, +0.6, +4.3 MB, while 22 captures
    # beside a CPU hog grew +2.5 MB over the 20 after the warm-up, +1.4 of it at one
    # capture and nothing over the last twelve
    # (`rltperf bench capture --modes "" --rss-captures 22 --json`).
    assert rss["captures"] - rss["warmup"] == 10, rss
    assert rss["net_mb"] <= 10.0, rss


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
