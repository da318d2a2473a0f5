"""The command line as a new user meets it: help for every command, the adapter list."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from engine_adapters.monitor.registry import available
from rltperf_tui.cli import COMMANDS, _named_command
from tests.conftest import ROOT, CliStuck, run_cli, run_rltperf


def test_top_level_help_names_every_command_and_the_keys() -> None:
    out = run_rltperf("--help")
    assert out.returncode == 0, out.stderr
    for name in COMMANDS:
        assert f"\n    {name} " in out.stdout, name
    assert "rltperf demo" in out.stdout and "q quit" in out.stdout


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_explains_itself(name: str) -> None:
    out = run_rltperf(name, "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: rltperf {name}") and "options:" in out.stdout
    body = out.stdout.split("\n\n", 2)[1]  # the description paragraph under the usage line
    assert len(body.split()) >= 8, body


def test_adapters_lists_each_installed_adapter_with_its_target_forms() -> None:
    out = run_rltperf("adapters", "-l")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    for name, entry in available().items():
        row = next(ln for ln in lines if ln.startswith(f"{name} "))
        for scheme in entry.load().SCHEMES:
            assert scheme in row, (scheme, row)
        assert entry.value in out.stdout
    assert "tcp://" in out.stdout and "vllm+http://" in out.stdout


def test_a_command_named_on_the_line_loads_only_its_own_module() -> None:
    """Start-up CPU is what a command waits for on cores a loaded server saturates: naming
    a command builds its parser alone (all of them only for the top-level help)."""
    code = (
        "import sys, rltperf_tui.cli as c\n"
        "assert c.main(['-v', 'adapters']) == 0\n"
        "print(' '.join(m for m in sys.modules if m.startswith('rltperf_tui.commands.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    loaded = set(out.stdout.split()) & set(COMMANDS.values())
    assert loaded == {COMMANDS["adapters"]}, loaded
    assert _named_command(["-vv", "capture", "tcp://h:1"]) == "capture"
    assert _named_command(["--version"]) is None and _named_command(["bogus", "x"]) is None
    assert _named_command(["--", "record"]) is None


def test_a_command_past_its_time_fails_the_test_saying_where_it_was() -> None:
    """``kill -USR1`` makes a command print its threads' stacks (cli.py); ``run_cli`` sends it
    to a command past its time, so a stuck one in CI says where it was, not only that it
    timed out.  Here: ``record`` at a port that accepts and never says hello (it would
    give up after 5 s; the test's limit is 2)."""
    with socket.socket() as quiet:
        quiet.bind(("127.0.0.1", 0))
        quiet.listen(1)
        port = quiet.getsockname()[1]
        with pytest.raises(CliStuck) as stuck:
            run_cli(["record", f"tcp://127.0.0.1:{port}", "--duration", "60", "-o", os.devnull], timeout=2)
    text = str(stuck.value)
    assert "still ran after 2 s" in text and "waited" in text and "threads by state: S" in text, text
    assert "Current thread" in text and "in _handshake" in text and "record.py" in text, text


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--refresh", "0"], "--refresh must be above 0 and at most 30 Hz (got 0)"),
        (["--refresh", "31"], "--refresh must be above 0 and at most 30 Hz (got 31)"),
        (["--window", "0"], "--window and --timeline must be positive"),
        (["--history", "10"], "--history must be at least 1024 steps"),
    ],
)
def test_a_bad_monitor_option_is_one_sentence_before_any_connection(args: list[str], says: str) -> None:
    """The option is refused before the target is tried (nothing listens at port 1)."""
    out = run_rltperf("attach", *args, "tcp://127.0.0.1:1")
    assert out.returncode == 2 and out.stderr.strip() == f"rltperf attach: error: {says}", out.stderr


@pytest.mark.parametrize("command", ["summary", "engine"])
def test_a_monitor_command_starts_no_idle_math_threads(command: str) -> None:
    """numpy's OpenBLAS starts a thread per other core at import (each spins before it
    sleeps: CPU taken from the server watched, at every command's start); a monitor
    command runs numpy with one, an engine keeps the library's default."""
    code = (
        "import os, sys\n"
        f"sys.argv = ['rltperf', '{command}', '--help']\n"
        "import rltperf_tui.cli as c\n"
        "try:\n    c.main()\nexcept SystemExit:\n    pass\n"
        "import numpy\n"
        "print(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'), file=sys.stderr)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, check=True
    )
    threads, setting = out.stderr.split()[-2:]
    if command == "engine":
        assert setting == "None"  # the library's default pool (a thread per core, up to its maximum)
    else:
        assert (int(threads), setting) == (1, "1")
