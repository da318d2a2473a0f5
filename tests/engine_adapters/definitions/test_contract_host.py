"""Host facts in the contract are read, not forked for: the probe asks for them inside the
engine's processes (a vLLM worker holds gigabytes) and the monitor on a loaded host."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

_SPAWNS = ("subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.system")


def test_cpu_model_comes_from_proc_cpuinfo_without_starting_a_process() -> None:
    code = (
        "import sys\n"
        "seen = []\n"
        f"sys.addaudithook(lambda e, a: seen.append(e) if e in {_SPAWNS!r} else None)\n"
        "from engine_adapters.definitions.contract import cpu_model\n"
        "name = cpu_model()\n"
        "print(name)\n"
        "print(seen)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    name, seen = out.stdout.splitlines()
    assert seen == "[]", seen  # platform.processor() forked `uname -p` here
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        model = None
    import os
    import platform

    assert name == f"{model or platform.machine()} ({os.cpu_count()} logical cores)"
