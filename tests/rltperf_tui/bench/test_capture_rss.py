"""``rltperf bench capture``'s memory figure (``capture_rss``; the live run is ``tests/engine_adapters/probe/test_capture_memory.py``)."""

from __future__ import annotations

import pytest

from rltperf_tui.bench.capture_rss import net_growth_mb


def test_the_engines_own_growth_is_taken_out_and_a_fall_is_not_charged_to_the_captures() -> None:
    # grew 2 MB in 10 s by itself: 4 of the 6 MB over 20 s of captures are theirs
    assert net_growth_mb(6.0, 2.0, 20.0, 10.0) == pytest.approx(2.0)
    # a parallel run: +4.7 MB over the ten captures, then -9.6 MB without them (memory
    # handed back); that read +14.3 MB net, over the 10 MB goal, before the fix
    assert net_growth_mb(4.7, -9.6, 15.7, 15.7) == pytest.approx(4.7)
    assert net_growth_mb(None, 1.0, 10.0, 10.0) is None
    assert net_growth_mb(1.0, 1.0, 10.0, 0.0) is None
