"""The import rules of docs/ARCHITECTURE.md, checked on the whole source tree:

- no import circle anywhere in ``engine_adapters`` and ``rltperf_tui`` (a lazy import
  inside a function or one under ``TYPE_CHECKING`` still ties two modules together);
- layers import down only: ``monitor`` never imports ``probe``, ``definitions`` imports
  nothing above it, nothing in the probe imports the module that wires it;
- ``engine_adapters`` and ``rltperf_tui.live`` never import Textual; ``rltperf_tui`` never
  imports torch or vllm at import time;
- every module is at most ``MAX_LINES`` long (except the schema, ``records.py``);
- no two test modules share a name (pytest imports each by its bare name).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

PACKAGES = ("engine_adapters", "rltperf_tui")
MAX_LINES = 500
LONG_ALLOWED = {"engine_adapters/definitions/records.py"}
"""The one module allowed past ``MAX_LINES``: the schema, every field documented."""


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
        "import rltperf_tui, rltperf_tui.cli, rltperf_tui.live.aggregator, rltperf_tui.analysis.summary\n"
        "rltperf_tui.cli.build_parser()"
    )
    assert "torch" not in mods and "vllm" not in mods


def test_the_live_model_runs_without_textual():
    """The driver and the aggregator stack load (and a target is driven) without Textual."""
    mods = _modules_after(
        "import rltperf_tui.live, rltperf_tui.live.driver, rltperf_tui.live.view, rltperf_tui.commands.headless\n"
        "from rltperf_tui.live.driver import LiveTarget, TargetSpec\n"
        "from engine_adapters.monitor.replay import ReplayAdapter\n"
        "a = ReplayAdapter('tests/rltperf_tui/tui/data/demo.rltrec', speed=0)\n"
        "t = LiveTarget(TargetSpec('demo', session=a.connect(), adapter=a))\n"
        "while not t.ended: t.ingest(t.read(0.05))\n"
        "assert t.stats.steps.n > 0"
    )
    assert "textual" not in mods


# ---------------------------------------------------------------------------- import graph


def _sources() -> dict[str, Path]:
    """Every module of the source packages by dotted name (a package by its own name)."""
    mods: dict[str, Path] = {}
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


def _imported_names(name: str, path: Path) -> set[str]:
    """Every dotted name ``path`` imports anywhere in its source (top level, inside
    functions, under ``TYPE_CHECKING``), relative imports resolved; ``from pkg import x``
    names both ``pkg`` and ``pkg.x`` (the module ``pkg.x`` when there is one)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.add(module)
            out.update(f"{module}.{a.name}" for a in node.names)
    return out


def _module_imports() -> dict[str, set[str]]:
    """Every module of the source packages and the modules of the packages it imports."""
    mods = _sources()
    return {n: {t for t in _imported_names(n, p) if t in mods and t != n} for n, p in mods.items()}


def _cycle(graph: dict[str, set[str]], within: str = "") -> list[str] | None:
    """One import cycle among the modules under ``within`` (all: ""), or None."""
    nodes = {n for n in graph if not within or n == within or n.startswith(within + ".")}
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for d in sorted(graph[n] & nodes):
            if state.get(d) == 1:
                return [*path[path.index(d) :], d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        path.pop()
        state[n] = 2
        return None

    for n in sorted(nodes):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_import_graph_finds_a_cycle_when_there_is_one():
    graph = {"p": set(), "p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}}
    assert _cycle(graph, "p") == ["p.a", "p.b", "p.c", "p.a"]
    graph["p.c"] = set()
    assert _cycle(graph, "p") is None
    # a package whose __init__ imports a module that imports the package back
    assert _cycle({"q": {"q.m"}, "q.m": {"q"}}) == ["q", "q.m", "q"]


def test_imports_are_read_lazy_type_only_and_relative_alike(tmp_path: Path):
    src = tmp_path / "pkg" / "sub" / "mod.py"
    src.parent.mkdir(parents=True)
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg.a import A\n"
        "def f():\n    import pkg.b\n    from . import c\n    from ..d import e\n"
    )
    names = _imported_names("pkg.sub.mod", src)
    assert {"pkg.a", "pkg.b", "pkg.sub", "pkg.sub.c", "pkg.d", "pkg.d.e"} <= names


def test_no_import_cycle_anywhere():
    graph = _module_imports()
    assert len(graph) > 100 and "rltperf_tui.live.driver" in graph
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_probe_modules_never_import_the_module_that_wires_them():
    graph = _module_imports()
    assert "engine_adapters.probe.core" in graph and "engine_adapters.probe.ring" in graph
    users = sorted(n for n, deps in graph.items() if "engine_adapters.probe.core" in deps)
    assert users == ["engine_adapters.probe"], users


def test_layers_import_down_only():
    graph = _module_imports()
    for name, deps in graph.items():
        if name.startswith("engine_adapters"):
            assert not {d for d in deps if d.startswith("rltperf_tui")}, name
        if name.startswith("engine_adapters.monitor"):
            assert not {d for d in deps if d.startswith("engine_adapters.probe")}, name
        if name.startswith("engine_adapters.definitions"):
            up = {
                d for d in deps if not d.startswith("engine_adapters.definitions") and d != "engine_adapters"
            }
            assert not up, (name, up)
        # the live model is the monitor's floor: the screen and the commands sit on it
        if name.startswith(("rltperf_tui.live", "rltperf_tui.analysis")):
            up = {d for d in deps if d.startswith(("rltperf_tui.tui", "rltperf_tui.commands"))}
            assert not up, (name, up)


def test_no_textual_under_engine_adapters_or_the_live_model():
    mods = _sources()
    for name, path in mods.items():
        if name.startswith(("engine_adapters", "rltperf_tui.live")):
            textual = {t for t in _imported_names(name, path) if t.split(".")[0] == "textual"}
            assert not textual, (name, textual)


def test_no_module_over_500_lines():
    long = {}
    for top in PACKAGES:
        for p in (ROOT / top).rglob("*.py"):
            rel = p.relative_to(ROOT).as_posix()
            n = len(p.read_text().splitlines())
            if n > MAX_LINES and rel not in LONG_ALLOWED:
                long[rel] = n
    assert not long, long


def test_no_two_test_modules_share_a_name():
    """The test tree has no ``__init__.py``: pytest imports each test module by its bare
    name, so a second module of one name stops the whole run at collection ("import file
    mismatch"), although each passes alone.  tests/rltperf_tui/tui/test_driver.py did that
    beside tests/rltperf_tui/test_driver.py on a fresh clone."""
    seen: dict[str, list[str]] = {}
    for p in sorted((ROOT / "tests").rglob("test_*.py")):
        seen.setdefault(p.name, []).append(p.relative_to(ROOT).as_posix())
    shared = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not shared, shared
