"""Host facts in the contract are read, not forked for: the probe asks for them inside the
engine's processes (a bundle's contract, written by a vLLM worker holding gigabytes) and
the monitor asks on a loaded host (a fork there waited seconds for the CPU)."""

from __future__ import annotations

import ast
import os
import platform
import subprocess
import sys

from tests.conftest import ROOT

_SPAWNS = ("subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.system")


def _spawns_during(call: str) -> tuple[str, list[str]]:
    """``call``'s repr and the process starts it made (in a fresh interpreter, torch and
    the contract module imported before the hook: only ``call`` is watched)."""
    code = (
        "import sys, torch\n"
        "from engine_adapters.definitions import contract\n"
        "seen = []\n"
        f"sys.addaudithook(lambda e, a: seen.append(e) if e in {_SPAWNS!r} else None)\n"
        f"out = {call}\n"
        "print(repr(out))\n"
        "print(seen)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    value, seen = out.stdout.splitlines()[-2:]
    return value, ast.literal_eval(seen)


def _proc_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        return None


def test_cpu_model_comes_from_proc_cpuinfo_without_starting_a_process() -> None:
    value, seen = _spawns_during("contract.cpu_model()")
    assert seen == [], seen  # platform.processor() forked `uname -p` here
    assert value == repr(f"{_proc_model() or platform.machine()} ({os.cpu_count()} logical cores)")


def test_the_environment_of_a_contract_starts_no_process_and_names_the_platform() -> None:
    value, seen = _spawns_during("contract.environment()")
    assert seen == [], seen  # platform.platform() unpacked uname(), whose processor forks
    env = ast.literal_eval(value)
    assert env["platform"] == platform.platform() and env["cpu"].endswith("logical cores)")
