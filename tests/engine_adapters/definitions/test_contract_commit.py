"""The contract's ``commit`` is the git state of the engine's code, not of the folder the
engine was started in (real git, real folders)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from engine_adapters.definitions.contract import build_contract, code_state, git_state, is_unknown
from engine_adapters.definitions.records import EngineInfo

ROOT = Path(__file__).resolve().parents[3]


def _head() -> str:
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("the code under test is not a git checkout")
    return out.stdout.strip()


def test_code_dir_wins_over_a_working_directory_outside_any_checkout(tmp_path: Path) -> None:
    head = _head()
    assert is_unknown(git_state(str(tmp_path))["commit"])  # tmp_path is no checkout
    info = EngineInfo(name="mine", contract={"code_dir": str(ROOT / "engine_adapters")})
    c = build_contract(info, cwd=str(tmp_path))
    assert c["commit"] == head
    assert str(ROOT / "engine_adapters") in c["commit_source"] and "the engine's code" in c["commit_source"]


def test_an_engine_that_read_its_commit_is_believed(tmp_path: Path) -> None:
    info = EngineInfo(name="mine", contract={"commit": "abc123", "diff_sha256": "clean"})
    c = build_contract(info, cwd=str(tmp_path))
    assert c["commit"] == "abc123" and c["diff_sha256"] == "clean"


def test_no_checkout_anywhere_names_every_place_looked_at(tmp_path: Path) -> None:
    a, b = tmp_path / "code", tmp_path / "cwd"
    a.mkdir()
    b.mkdir()
    st = code_state(str(a), cwd=str(b))
    assert is_unknown(st["commit"]) and str(a) in st["commit"] and str(b) in st["commit"]
