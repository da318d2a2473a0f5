"""``rltperf report`` prints the input shapes of a real full capture whole (they were cut
at 32 characters: ``[[2, 2864, 32], [], [256], [2, 2``), and its name columns cut only
at a boundary, marked with "…".  The bundle comes from the reference engine (its paged
KV cache gives the long shape lists)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import start_engine

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def full_bundle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from test_report_cmd import capture

    snaps = tmp_path_factory.mktemp("refsnaps")
    eng = start_engine(
        ["-m", "rltperf_tui.cli", "engine", "--preset", "tiny", "--device", "cpu", "--workload",
         "steady-bursts", "--listen", "127.0.0.1:0", "--snapshots", str(snaps), "--duration", "180"],
        timeout=180,
    )  # fmt: skip
    try:
        time.sleep(1.0)
        yield capture(eng.target, 2, "full")
    finally:
        eng.stop()


_capsys: Any = None


@pytest.fixture(autouse=True)
def _cap(capsys: pytest.CaptureFixture[str]) -> Iterator[None]:
    global _capsys
    _capsys = capsys
    yield
    _capsys = None


def report(*args: str) -> tuple[int, str, str]:
    from rltperf_tui.cli import main

    _capsys.readouterr()
    rc = main(["report", *args])
    out = _capsys.readouterr()
    return rc, out.out, out.err


def test_shapes_print_whole(full_bundle: str) -> None:
    from rltperf_tui.analysis.report import analyze_bundle, render_text

    # every shape, not the default top 15 by self time: which are top varies run to run
    # (in a loaded full-suite run none of the long ones was, and the test proved nothing);
    # the text lists the first 10, so the long ones (the paged KV cache's index_copy_,
    # the attention's copy_ and masked_fill_) are put first to be sure they print
    rep = analyze_bundle(full_bundle, top=10_000).report
    shapes = sorted(rep["shapes"], key=lambda o: -len(str(o["input_dims"])))[:10]
    assert len(str(shapes[0]["input_dims"])) > 32, "no long shape: the test proves nothing"
    rep["shapes"] = shapes
    lines = render_text(rep).splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith("by input shape"))
    rows = lines[i + 1 : i + 1 + len(shapes)]
    for o, ln in zip(shapes, rows, strict=True):
        assert str(o["input_dims"]) in ln, (ln, o["input_dims"])  # whole, wherever it stands
    for o, ln in zip(shapes, rows, strict=True):
        assert re.search(rf"\s{o['count']}\s+{o['self_ms']:.3f}(\s|$)", ln), ln


def test_name_columns_cut_only_at_a_boundary(full_bundle: str) -> None:
    rc, text, _ = report(full_bundle)
    assert rc == 0
    assert not re.search(r"[\d.]…", text)
    for ln in text.splitlines():
        for word in re.findall(r"(\S+)…", ln):
            # a cut word ends at an element boundary (aten::_foo_…), never mid-number
            assert word[-1] in ",;:/)]}_|" or not word[-1].isdigit(), ln
