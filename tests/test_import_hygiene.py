"""engine_adapters never imports textual; rltperf_tui never imports torch or vllm at import time."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys; print('\\n'.join(sys.modules))"],
        capture_output=True,
        text=True,
        cwd=str(ROOT),
        check=True,
    )
    return {m.split(".")[0] for m in out.stdout.split()}


def test_engine_adapters_never_imports_textual():
    mods = _modules_after(
        "import engine_adapters, engine_adapters.definitions.records, engine_adapters.definitions.wire, engine_adapters.probe, "
        "engine_adapters.monitor.tcp, engine_adapters.monitor.replay, engine_adapters.monitor.registry, engine_adapters.monitor.recording"
    )
    assert "textual" not in mods and "rltperf_tui" not in mods


def test_monitor_never_imports_torch_or_vllm():
    mods = _modules_after(
        "import rltperf_tui, rltperf_tui.cli, rltperf_tui.aggregator, rltperf_tui.analysis.summary\n"
        "rltperf_tui.cli.build_parser()"
    )
    assert "torch" not in mods and "vllm" not in mods
