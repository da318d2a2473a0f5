"""``rltperf bench peers --baseline-root DIR``: the baseline monitor runs DIR's code.

It is started with ``python -m rltperf_tui.cli``, which puts its start directory first
on ``sys.path``, ahead of ``PYTHONPATH``.  The bench used to start every monitor from the
directory it was run in: run from a checkout (as the README says), the "baseline" was
that checkout again, and a before/after compared a change with itself."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
from pathlib import Path

from rltperf_tui.bench import SOURCE_ROOT
from rltperf_tui.bench.peers import monitors, tmux_args

PROBE = "import rltperf_tui.cli as c; print(c.__file__)"


def _imported(cmd: list[str], cwd: str) -> Path:
    """The ``rltperf_tui.cli`` file that ``cmd`` (a monitor's shell command as tmux runs it,
    with ``python -m rltperf_tui.cli`` turned into a probe of what it imports) loads in ``cwd``."""
    argv = shlex.split(cmd[-1])
    assert argv[:2] == ["exec", "env"]
    env_words = [w for w in argv[2:] if "=" in w and not w.startswith("-")]
    env = dict(w.split("=", 1) for w in env_words)
    rest = argv[2 + len(env_words) :]
    i = rest.index("-m")
    assert rest[i + 1] == "rltperf_tui.cli"
    probe = [*rest[:i], "-c", PROBE]  # the same interpreter, start directory and path rules
    out = subprocess.run(
        probe,
        cwd=cwd,
        env={**os.environ, **env, "PYTHONSAFEPATH": ""},
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip()).resolve()


def test_the_baseline_monitor_imports_the_baseline_checkout(tmp_path: Path) -> None:
    base = tmp_path / "base"
    (base / "rltperf_tui").mkdir(parents=True)
    (base / "rltperf_tui" / "__init__.py").write_text("")
    (base / "rltperf_tui" / "cli.py").write_text("")
    args = argparse.Namespace(
        target="vllm+http://127.0.0.1:1", baseline_root=str(base), htop="/nonexistent", interval=0.5
    )
    mons, missing = monitors(args)
    assert missing is not None and [m.name for m in mons] == ["rltperf", "rltperf (base)"]
    run_from = os.getcwd()  # where a person runs the bench: this checkout, as in the README
    for m, root in zip(mons, (Path(SOURCE_ROOT), base), strict=True):
        cmd = tmux_args("s", m, 160, 48)
        cwd = cmd[cmd.index("-c") + 1] if "-c" in cmd else run_from  # tmux: the client's directory
        assert _imported(cmd, cwd) == (root / "rltperf_tui" / "cli.py").resolve(), m.name
