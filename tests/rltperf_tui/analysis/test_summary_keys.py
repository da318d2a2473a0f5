"""``rltperf summary --json`` has one key set (``SUMMARY_KEYS``) for every kind of target.

The fixed UI recording (the reference engine) is checked here; a real vLLM ``/metrics``
recording and a fresh reference-engine recording are compared with it in
``tests/engine_adapters/vllm/test_vllm_announce.py`` (needs vLLM).
"""

from __future__ import annotations

import json
import shutil

from rltperf_tui.analysis.summary import SUMMARY_KEYS, load_recording, summarize
from tests.conftest import run_rltperf
from tests.rltperf_tui.tui._uihelpers import RECORDING


def test_summary_keys_are_the_declared_ones_and_nulls_keep_them(tmp_path) -> None:
    stats, _, _ = load_recording(RECORDING)
    out = summarize(stats)
    assert list(out) == list(SUMMARY_KEYS)  # a new figure is declared in SUMMARY_KEYS
    assert out["figures_from"] == "steps" and out["metrics"] is None and out["warning"] is None
    # the command adds nothing of its own: a damaged copy has the same keys, its warning filled
    cut = tmp_path / "cut.rltrec"
    shutil.copyfile(RECORDING, cut)
    with open(cut, "r+b") as f:
        f.truncate(cut.stat().st_size - 7)
    p = run_rltperf("summary", str(cut), "--json")
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert list(got) == list(SUMMARY_KEYS) and got["warning"]
