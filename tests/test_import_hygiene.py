"""engine_adapters never imports textual; rltperf_tui never imports torch or vllm at import time;
the probe's modules import each other without a cycle; layers import down only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
        "import rltperf_tui, rltperf_tui.cli, rltperf_tui.live.aggregator, rltperf_tui.analysis.summary\n"
        "rltperf_tui.cli.build_parser()"
    )
    assert "torch" not in mods and "vllm" not in mods


# ---------------------------------------------------------------------------- import graph


def _module_imports() -> dict[str, set[str]]:
    """Every ``engine_adapters`` module and the ``engine_adapters`` modules it imports,
    anywhere in its source (top level, inside functions, under ``TYPE_CHECKING``): a lazy
    or type-only import still ties the two modules together."""
    import ast

    mods: dict[str, Path] = {}
    for path in sorted((ROOT / "engine_adapters").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # "from pkg import mod" imports the module pkg.mod when there is one
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            deps.update(t for t in targets if t in mods and t != name)
        graph[name] = deps
    return graph


def _cycle(graph: dict[str, set[str]], within: str) -> list[str] | None:
    """One import cycle among the modules under ``within``, or None."""
    nodes = {n for n in graph if n == within or n.startswith(within + ".")}
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for d in sorted(graph[n] & nodes):
            # a package's __init__ re-exporting its modules is not a cycle with them
            if n == within and d.startswith(within + "."):
                continue
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


def test_probe_modules_import_each_other_without_a_cycle():
    graph = _module_imports()
    assert "engine_adapters.probe.core" in graph and "engine_adapters.probe.ring" in graph
    assert _cycle(graph, "engine_adapters.probe") is None
    # nothing in the probe imports the module that wires it together
    users = sorted(n for n, deps in graph.items() if "engine_adapters.probe.core" in deps)
    assert users == ["engine_adapters.probe"], users


def test_layers_import_down_only():
    graph = _module_imports()
    for name, deps in graph.items():
        if name.startswith("engine_adapters.monitor"):
            assert not {d for d in deps if d.startswith("engine_adapters.probe")}, name
        if name.startswith("engine_adapters.definitions"):
            up = {
                d for d in deps if not d.startswith("engine_adapters.definitions") and d != "engine_adapters"
            }
            assert not up, (name, up)


def test_no_probe_module_over_500_lines():
    sizes = {
        p.name: len(p.read_text().splitlines()) for p in (ROOT / "engine_adapters" / "probe").glob("*.py")
    }
    assert max(sizes.values()) <= 500, sizes
