"""Adapter selection through the ``rltperf.adapters`` entry points, with a real package.

A throwaway adapter package (``toy/``) is "installed" the way ``importlib.metadata``
finds any installed package: a folder on ``sys.path`` / ``PYTHONPATH`` holding the
module and a ``*.dist-info`` with its ``entry_points.txt``.  No mocks: the registry,
the CLI and the monitor find it as they would find a pip-installed one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_adapters.definitions.records import Record
from engine_adapters.monitor import registry
from engine_adapters.monitor.base import Adapter, AdapterTargetError, Reconnecting, ReplayControl, Session
from engine_adapters.monitor.recording import SUFFIX, RecordingWriter
from engine_adapters.monitor.registry import adapter_for, available, candidates
from engine_adapters.monitor.replay import ReplayAdapter, ReplaySession
from engine_adapters.monitor.tcp import ProbeAdapter
from engine_adapters.monitor.vllm.adapter import VllmAdapter
from tests.conftest import ROOT

TOY = Path(__file__).resolve().parent / "toy"


def install(site: Path, entries: dict[str, str]) -> Path:
    """Make ``site`` an installed package "toy-adapters" with these entry points."""
    site.mkdir(parents=True, exist_ok=True)
    for f in ("toy_adapter.py", "toy_broken.py"):
        shutil.copy(TOY / f, site / f)
    info = site / "toy_adapters-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-adapters\nVersion: 0.1\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entries.items())
    (info / "entry_points.txt").write_text(f"[{registry.GROUP}]\n{lines}")
    return site


@pytest.fixture
def toy_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Installs the toy adapter (and a broken one) into this process for one test."""
    site = install(tmp_path / "site", {"toy": "toy_adapter:ToyAdapter", "toybroken": "toy_broken:Nope"})
    monkeypatch.syspath_prepend(str(site))
    yield site
    forget_toys()


def forget_toys() -> None:
    """Drop the toy modules and their cached classes (the next test installs its own)."""
    for mod in [m for m in sys.modules if m.startswith("toy_")]:
        del sys.modules[mod]
    for value in [v for v in registry._LOADED if v.startswith("toy_")]:
        del registry._LOADED[value]


def rltperf(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``rltperf ARGS`` in a fresh process with the toy package installed."""
    env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{ROOT}")
    return subprocess.run(
        [sys.executable, "-m", "rltperf_tui.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=cwd,
    )


def test_an_installed_adapter_is_listed_lazily_and_selected_by_its_scheme(toy_site: Path) -> None:
    entries = available()
    assert entries["toy"].value == "toy_adapter:ToyAdapter" and not entries["toy"].builtin
    assert "toy_adapter" not in sys.modules and "toy_broken" not in sys.modules  # listing imports nothing
    adapter = adapter_for("toy://x")
    assert type(adapter).__name__ == "ToyAdapter" and type(adapter).__module__ == "toy_adapter"
    with adapter.connect() as session:
        recs = session.read(0.1)
    assert [type(r).__name__ for r in recs] == ["Hello", "Stats"] + ["StepRecord"] * 5 + ["Stats"]
    # the broken package is reported, and the built-in adapters still work beside it
    assert isinstance(adapter_for("tcp://127.0.0.1:1"), ProbeAdapter)
    broken = {e.name: e.error for e in candidates("tcp://127.0.0.1:1")[1]}
    assert list(broken) == ["toybroken"] and "libtoy" in (broken["toybroken"] or "")
    with pytest.raises(AdapterTargetError) as err:
        adapter_for("nope://x")
    msg = str(err.value)
    assert "unknown target scheme 'nope'" in msg and "toy://…" in msg and "tcp://HOST:PORT" in msg
    assert "'toybroken' could not be asked (ImportError: toy_broken needs libtoy" in msg


def test_rltperf_adapters_lists_the_installed_one_and_the_broken_one(toy_site: Path, tmp_path: Path) -> None:
    out = rltperf(toy_site, "adapters", "-l", cwd=tmp_path)
    assert out.returncode == 1, out.stderr  # one adapter is broken
    rows = {ln.split()[0]: ln for ln in out.stdout.splitlines() if ln and not ln.startswith(" ")}
    assert "toy://…" in rows["toy"] and "a toy engine" in rows["toy"]
    assert "toy_adapter:ToyAdapter" in out.stdout
    assert rows["toybroken"].startswith("toybroken BROKEN") and "libtoy" in rows["toybroken"]
    assert "tcp://…" in rows["tcp"] and "*.rltrec" in rows["replay"] and "vllm+http://…" in rows["vllm"]


def test_record_and_summary_of_an_installed_adapter(toy_site: Path, tmp_path: Path) -> None:
    rec = tmp_path / "toy.rltrec"
    out = rltperf(toy_site, "record", "toy://x", "--duration", "1", "-o", str(rec), "-q", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "(5 steps)" in out.stdout
    out = rltperf(toy_site, "summary", str(rec), "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    summ = json.loads(out.stdout)
    # the toy's steps as it made them: 5 steps of 8 ms every 10 ms, 4 tokens each
    assert summ["steps"] == 5
    assert summ["step_ms"]["p50"] == pytest.approx(8.0)
    assert summ["gap_ms"]["p50"] == pytest.approx(2.0)
    assert summ["wall_s"] == pytest.approx(0.05)
    assert summ["tokens_per_s"] == pytest.approx(20 / 0.05)


def test_the_monitor_attaches_to_an_installed_adapter(toy_site: Path) -> None:
    import asyncio

    from rltperf_tui.tui.app import MonitorApp

    async def run() -> None:
        app = MonitorApp(["toy://x"], wait=True)
        async with app.run_test(size=(100, 30)) as pilot:
            h = app.handles[0]
            for _ in range(100):
                if len(h.stats.steps) == 5:
                    break
                await pilot.pause(0.1)
            assert len(h.stats.steps) == 5
            assert type(h.adapter).__name__ == "ToyAdapter" and h.live and h.replay_text() is None

    asyncio.run(run())


def test_ranking_when_two_adapters_accept_a_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = install(
        tmp_path / "site",
        {
            "toy": "toy_adapter:ToyAdapter",
            "atoy": "toy_adapter:ToyShadow",  # sorts before "toy"
            "zfast": "toy_adapter:ToyFast",
            "zfile": "toy_adapter:ToyFile",
            "notone": "toy_adapter:NotAnAdapter",
        },
    )
    monkeypatch.syspath_prepend(str(site))
    try:

        def names(target: str) -> list[str]:
            return [e.name for e, _ in candidates(target)[0]]

        # a built-in keeps its scheme: installing a package never moves tcp:// targets
        assert names("tcp://h:1") == ["tcp", "atoy"]
        assert isinstance(adapter_for("tcp://h:1"), ProbeAdapter)
        # two installed adapters, same scheme: the entry-point name decides
        assert names("toy://x") == ["atoy", "toy"]
        # the longer scheme wins whatever its name
        assert names("toy://fast/x") == ["zfast", "atoy", "toy"]
        # a declared suffix beats the replay adapter's "any existing file"; a declared
        # scheme beats a suffix
        f = tmp_path / "a.toyrec"
        f.write_bytes(b"")
        assert names(str(f)) == ["zfile", "replay"]
        r = tmp_path / f"a{SUFFIX}"
        RecordingWriter(str(r), target="x").close()
        assert names(str(r)) == ["replay"] and isinstance(adapter_for(str(r)), ReplayAdapter)
        assert names(f"toy://x{SUFFIX}") == ["atoy", "toy"]
        # an entry point naming something other than an Adapter is reported, not used
        broken = {e.name: e.error for e in candidates("toy://x")[1]}
        assert "not an Adapter subclass" in (broken["notone"] or "")
    finally:
        forget_toys()


def test_built_in_targets_and_messages_without_installed_packages(tmp_path: Path) -> None:
    assert isinstance(adapter_for("tcp://127.0.0.1:1"), ProbeAdapter)
    assert isinstance(adapter_for("vllm+https://h:1"), VllmAdapter)
    assert isinstance(adapter_for("replay://x.rltrec"), ReplayAdapter)
    with pytest.raises(
        AdapterTargetError, match=r"use tcp://HOST:PORT, vllm\+http://HOST:PORT or a recording file$"
    ):
        adapter_for("bogus://x")
    missing = str(tmp_path / f"missing{SUFFIX}")
    with pytest.raises(AdapterTargetError) as err:
        adapter_for(missing)
    assert str(err.value) == (
        f"{missing!r} is neither a target (tcp://HOST:PORT, vllm+http://HOST:PORT) nor an existing recording file"
    )


def test_optional_features_are_declared_protocols(tmp_path: Path) -> None:
    assert issubclass(ReplaySession, ReplayControl) and issubclass(ReplayAdapter, Adapter)
    assert issubclass(ProbeAdapter, Reconnecting) and issubclass(VllmAdapter, Reconnecting)
    assert not issubclass(ReplayAdapter, Reconnecting)
    r = tmp_path / f"a{SUFFIX}"
    RecordingWriter(str(r), target="x").close()
    with adapter_for(str(r)).connect() as s:
        assert isinstance(s, ReplayControl)
        assert not s.paused and s.toggle_pause() and s.paused
    probe = ProbeAdapter("tcp://h:1").session()
    assert not isinstance(probe, ReplayControl)
    probe.close()

    class Quiet(Session):
        def read(self, timeout: float) -> list[Record]:
            return []

    # a flag without the protocol (or the reverse) fails when the class is defined
    with pytest.raises(TypeError, match="does not declare the Reconnecting protocol"):

        class Claims(Adapter):
            SUPPORTS_RECONNECT = True

            def connect(self) -> Session:
                return Quiet()

    with pytest.raises(TypeError, match="declares the Reconnecting protocol"):

        class Hides(Adapter, Reconnecting):
            def connect(self) -> Session:
                return Quiet()

            def session(self) -> Session:
                return Quiet()
