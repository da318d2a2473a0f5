"""Every command the documentation shows runs: the README's code blocks and the example
sections of each ``--help``, extracted here, so a command added to either is covered.

How a documented command becomes a runnable one (``runnable``):

- placeholders become real things made by the fixtures: ``tcp://HOST:PORT`` a reference
  engine started for this module, ``run.rltrec`` / ``base.rltrec`` / ``new.rltrec`` /
  ``A1`` … ``B3`` recordings of it, ``snapshots/<bundle>`` / ``bundleA`` / ``bundleB``
  captures of it; a placeholder nobody maps fails the test (add it to ``placeholders``);
- optional parts in brackets are all included (``[--json]`` runs with ``--json``),
  except a repeated placeholder (``[TARGET ...]``);
- durations are shortened through their own flag: ``rltperf engine`` runs with
  ``--duration 1.5`` (added when absent; its clock starts once the model is built and
  warm, so each engine still makes its steps; 3 s took 45 s and 64 CPU s for the test,
  1.5 s 38 and 55: the engines run one at a time), ``--listen 127.0.0.1:0`` (7788 may be taken)
  and ``--no-warm-profiler`` (nothing captures them: ``/usr/bin/time rltperf engine
  --duration 1.5`` took 3.2-3.6 CPU s with the profiler's warm-up, 2.1 without),
  ``rltperf record`` with ``--duration 3`` and ``-o`` a fresh file (the fixtures made
  the one the README names, and recordings are never overwritten), ``rltperf watch``
  with ``--duration 3`` and a fresh ``--out``;
- the monitor itself (demo, attach, replay) runs in a pseudo-terminal: it must draw,
  still be running after a few seconds, and quit on ``q`` with status 0;
- skipped, each with the reason printed: what needs hardware this machine lacks
  (``--device cuda``), vLLM server starts and downloads, the installs (``pip install``,
  ``python3 -m venv``, ``-m compileall``: .ci/run runs that block verbatim on a fresh clone) and the test
  suite itself (``python -m pytest``);
- what attaches to a vLLM server (a ``vllm+http://`` target, or a command after a vLLM
  server start in the same README block, such as the Ouro section's ``attach
  tcp://127.0.0.1:7788``) runs in ``test_documented_commands_on_vllm`` against the
  shared real vLLM servers (``vllm_servers.py``), never against the reference engine.

Every command reads only what the fixtures made and writes under a fresh name (a
recording, a watch folder), so no command depends on another: they run ``PARALLEL`` at
a time in one scratch folder (most of their time is their own shortened duration or a
screen left to settle, not CPU; the CPU-bound engines one at a time), and are listed in
the order documented.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PACED_WORKLOAD, ROOT, free_ports, start_engine
from tests.rltperf_tui.tui._uihelpers import drain_pty

README = ROOT / "README.md"
ENGINE_DURATION_S = "1.5"
RECORD_DURATION_S = "3"
TUI_COMMANDS = ("demo", "attach", "replay")
PARALLEL = 3
"""Documented commands run at the same time (in sequence they took ≈ 140 s)."""
_fresh = itertools.count()


@dataclass
class Documented:
    """A command as written in the documentation, and where."""

    where: str
    text: str
    after_server: str = ""
    """The vLLM server start before it in the same code block (README): what it attaches to."""


def _strip_comment(line: str) -> str:
    return re.sub(r"\s+#\s.*$", "", line).strip()


def readme_commands(text: str | None = None) -> list[Documented]:
    """Each command line of the README's shell code blocks (not ```python)."""
    text = README.read_text() if text is None else text
    out: list[Documented] = []
    in_block = False
    lang = ""
    pending = ""  # a command continued with a trailing backslash
    server = ""  # a vLLM server started earlier in this block
    for no, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            in_block = not in_block
            lang = line[3:].strip() if in_block else ""
            server = ""
            continue
        if not in_block or lang not in ("", "sh", "bash", "shell", "console"):
            continue
        if line.lstrip().startswith("#"):  # a comment line
            continue
        cmd = _strip_comment(line.removeprefix("$ "))
        if cmd.endswith("\\"):
            pending += cmd[:-1] + " "
            continue
        cmd, pending = pending + cmd, ""
        if cmd:
            out.append(Documented(f"README.md:{no}", cmd, server))
            if VLLM_SERVER_START in cmd:
                server = cmd
    return out


EXAMPLE_LINE = re.compile(r"^\s*(?:[A-Za-z][A-Za-z ]*:\s+)?(rltperf\s.+?)(?:\s{2,}\S.*)?$")


def help_commands() -> list[Documented]:
    """Each ``rltperf …`` line of the epilogs (example sections) of every ``--help``."""
    import argparse

    from rltperf_tui.cli import build_parser

    out: list[Documented] = []

    def walk(p: argparse.ArgumentParser, name: str) -> None:
        for line in (p.epilog or "").splitlines():
            m = EXAMPLE_LINE.match(line)
            if m:
                out.append(Documented(f"{name} --help", m.group(1).strip()))
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    walk(sub, f"{name} {sub_name}")

    walk(build_parser(), "rltperf")
    return out


def expand_options(cmd: str) -> str:
    """``[--json]`` → ``--json``; ``[TARGET ...]`` (a repeated placeholder) is dropped."""
    while True:
        m = re.search(r"\[([^\[\]]*)\]", cmd)
        if not m:
            return re.sub(r"\s+", " ", cmd).strip()
        inner = m.group(1)
        keep = "" if ("..." in inner or "…" in inner) else inner
        cmd = cmd[: m.start()] + keep + cmd[m.end() :]


def shell_segments(cmd: str) -> list[str]:
    """``a && b && c`` → its commands."""
    return [s.strip() for s in cmd.split("&&") if s.strip()]


VLLM_SERVER_START = "vllm.entrypoints.openai.api_server"
ON_VLLM = "runs in test_documented_commands_on_vllm, against the shared real vLLM servers"


def needs_vllm(doc: Documented) -> bool:
    """A command that attaches to a vLLM server: one the README starts just before it, or
    a ``vllm+http://`` target."""
    return bool(doc.after_server) or "vllm+http://" in doc.text


def skip_reason(argv: list[str]) -> str | None:
    """Why a documented command cannot run in this test (None: it runs)."""
    while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[0]):  # VAR=value before the command
        argv = argv[1:]
    joined = " ".join(argv)
    if VLLM_SERVER_START in argv or argv[:2] == ["vllm", "serve"]:
        return "starts a vLLM server (the shared test servers are started as vllm_fixtures.serve does)"
    if argv[:2] == ["hf", "download"]:
        return "downloads from the Hugging Face Hub (no internet on the test machines)"
    if argv[:1] == ["python3"] and "venv" in argv:
        return "creates a virtual environment (.ci/run runs the install block verbatim on a fresh clone)"
    if (argv and argv[0].endswith("pip")) or "compileall" in argv:
        return "installs packages (.ci/run runs the install block verbatim on a fresh clone)"
    if "pytest" in argv:
        return "the test suite itself (this test is part of it)"
    if "vllm+http://" in joined:
        return ON_VLLM
    if "cuda" in argv or any(a.startswith("--device=cuda") for a in argv):
        return "needs a CUDA device"
    return None


@dataclass
class Fixtures:
    """Real things the placeholders stand for."""

    engine_target: str
    work: Path
    recordings: dict[str, Path]
    bundles: dict[str, Path]

    def placeholders(self) -> dict[str, str]:
        m = {"tcp://HOST:PORT": self.engine_target, "tcp://127.0.0.1:7788": self.engine_target}
        port = int(self.engine_target.rsplit(":", 1)[1])
        m["8000-8100"] = f"{port - 2}-{port + 2}"  # --auto: a range holding the engine's probe
        m.update({name: str(p) for name, p in self.recordings.items()})
        # the rounds by their file names too (the README's CI recipe: A1.rltrec ...)
        m.update({f"{name}.rltrec": str(p) for name, p in self.recordings.items() if "." not in name})
        m["snapshots/<bundle>"] = str(self.bundles["bundleA"])
        m.update({name: str(p) for name, p in self.bundles.items()})
        m["BUNDLE"] = str(self.bundles["bundleA"])
        m["charts/"] = str(self.work / "charts")
        return m


def runnable(doc: Documented, fx: Fixtures) -> tuple[list[str] | None, str]:
    """The argv to run for ``doc`` (``rltperf`` as this checkout's CLI), or None and why not."""
    if doc.after_server:  # it attaches to that server, not to a reference engine
        return None, ON_VLLM
    cmd = expand_options(doc.text)
    for key, value in sorted(fx.placeholders().items(), key=lambda kv: -len(kv[0])):
        cmd = re.sub(rf"(?<![\w/.+-]){re.escape(key)}(?![\w/.-])", value.replace("\\", "\\\\"), cmd)
    argv = shlex.split(cmd)
    if argv and argv[0].endswith("/rltperf"):  # .venv/bin/rltperf
        argv[0] = "rltperf"
    why = skip_reason(argv)
    if why:
        return None, why
    left = [a for a in argv if re.search(r"<[^>]+>|\b[A-Z]{3,}(:[A-Z]+)?\b", a)]
    assert not left, f"{doc.where}: placeholder(s) {left} in {doc.text!r}: map them in Fixtures.placeholders"
    assert argv[0] == "rltperf", f"{doc.where}: not an rltperf command: {doc.text!r}"
    if argv[1:2] == ["engine"] and "--analytic" not in argv:
        argv = _set_flag(argv, "--duration", ENGINE_DURATION_S)
        argv = _set_flag(argv, "--listen", "127.0.0.1:0")
        argv = _set_flag(argv, "--snapshots", str(fx.work / "snapshots-engine"))
        if "--no-warm-profiler" not in argv:  # never captured here: no profiler start-up
            argv = [*argv, "--no-warm-profiler"]
    if argv[1:2] == ["watch"]:
        argv = _set_flag(argv, "--duration", RECORD_DURATION_S)
        argv = _set_flag(argv, "--out", str(fx.work / f"documented-watch-{next(_fresh)}"))
    if "--jsonl" in argv:  # no screen: a plain command, its duration shortened
        argv = _set_flag(argv, "--duration", RECORD_DURATION_S)
    if argv[1:2] == ["record"]:
        argv = _set_flag(argv, "--duration", RECORD_DURATION_S)
        # recordings are never overwritten: a fresh name beside the fixtures' own
        out = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("-o", "--output")), "out.rltrec")
        argv = _set_flag(argv, "-o", str(fx.work / f"documented-{next(_fresh)}-{Path(out).name}"))
    return argv, ""


def _set_flag(argv: list[str], flag: str, value: str) -> list[str]:
    if flag in argv:
        i = argv.index(flag)
        return [*argv[: i + 1], value, *argv[i + 2 :]]
    return [*argv, flag, value]


def _env(cwd: Path) -> dict[str, str]:
    """A documented command's environment; its temporary files go in ``cwd``'s ``tmp``
    (``rltperf demo``'s default log is ``rltperf-demo-<pid>.log`` in the temp folder, and
    one was left in /tmp by each run of the suite)."""
    tmp = cwd / "tmp"
    tmp.mkdir(exist_ok=True)
    return dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="160", LINES="48", TERM="xterm-256color",
                TMPDIR=str(tmp))  # fmt: skip


def run_cli(argv: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run a (non-screen) documented command as this checkout's CLI."""
    return subprocess.run([sys.executable, "-m", "rltperf_tui.cli", *argv[1:]], cwd=cwd, env=_env(cwd),
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def run_tui(
    argv: list[str], cwd: Path, settle_s: float = 4.0, start_timeout: float = 90.0
) -> tuple[int, str]:
    """Run a monitor command in a pseudo-terminal: wait for its screen, let it run
    ``settle_s``, press ``q``; returns (exit status, everything it drew)."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # the child: the monitor, as a person starts it in a terminal
        os.chdir(cwd)
        os.execve(sys.executable, [sys.executable, "-m", "rltperf_tui.cli", *argv[1:]], _env(cwd))
    buf = bytearray()

    def pump(seconds: float) -> None:
        got: list[bytes] = []
        drain_pty(fd, seconds, got)
        buf.extend(b"".join(got))

    try:
        deadline = time.monotonic() + start_timeout
        while time.monotonic() < deadline and b"\x1b[?1049h" not in buf:  # the app's alternate screen
            pump(0.5)
            if os.waitpid(pid, os.WNOHANG) != (0, 0):
                return -1, buf.decode("utf-8", "replace")
        assert b"\x1b[?1049h" in buf, f"no screen within {start_timeout} s: {buf[-2000:]!r}"
        pump(settle_s)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), buf.decode("utf-8", "replace")
        os.write(fd, b"q")
        end = time.monotonic() + 30
        while time.monotonic() < end:
            pump(0.3)
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status), buf.decode("utf-8", "replace")
        raise AssertionError(f"{argv}: still running 30 s after q")
    finally:
        with __import__("contextlib").suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)


def _capture(target: str, cwd: Path) -> Path:
    p = run_cli(["rltperf", "capture", target, "--steps", "4", "--mode", "ops"], cwd, timeout=180)
    assert p.returncode == 0, p.stderr
    return Path(p.stdout.strip().splitlines()[0])


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fixtures]:
    work = tmp_path_factory.mktemp("documented")
    eng = start_engine(
        [
            "-m",
            "rltperf_tui.cli",
            "engine",
            "--listen",
            f"127.0.0.1:{free_ports()}",  # the --auto ranges around it hold no port-0 listener
            "--workload",
            PACED_WORKLOAD,
            "--duration",
            "600",
            "--snapshots",
            str(work / "snapshots"),
        ],
        cwd=work,
    )
    try:
        # every recording its own (compare refuses a copy as a second round), started a
        # moment apart so no two hold the same stream
        names = ("base.rltrec", "new.rltrec", "run.rltrec", "A1", "B1", "A2", "B2", "A3", "B3")
        recs = {n: work / (n if n.endswith(".rltrec") else f"{n}.rltrec") for n in names}
        procs = []
        for p in recs.values():
            time.sleep(0.3)
            procs.append(subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "rltperf_tui.cli",
                    "record",
                    eng.target,
                    "--duration",
                    RECORD_DURATION_S,
                    "-q",
                    "-o",
                    str(p),
                ],
                cwd=work,
                env=_env(work),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            ))  # fmt: skip
        for pr in procs:
            _, err = pr.communicate(timeout=120)
            assert pr.returncode == 0, err
        bundles = {"bundleA": _capture(eng.target, work), "bundleB": _capture(eng.target, work)}
        yield Fixtures(eng.target, work, recs, bundles)
    finally:
        eng.stop()


def documented() -> list[Documented]:
    """Every documented command, one per ``&&`` segment, each once."""
    seen: set[str] = set()
    out = []
    for d in readme_commands() + help_commands():
        for seg in shell_segments(d.text):
            if seg not in seen:
                seen.add(seg)
                out.append(Documented(d.where, seg, d.after_server))
    return out


def test_extraction_finds_the_known_commands() -> None:
    """The extractor sees what a reader sees (guards against a silently empty list)."""
    texts = [d.text for d in documented()]
    for must in (".venv/bin/rltperf demo", "rltperf engine --workload rate-4096:0.5 --duration 60",
                 "rltperf report snapshots/<bundle> [--json] [--png charts/]",
                 "rltperf engine --preset ouro-1.4b-shape --analytic"):  # fmt: skip
        assert must in texts, texts
    assert expand_options("rltperf attach tcp://H:1 [TARGET ...] [--slo-ttft-ms 200 --slo-tpot-ms 50]") == (
        "rltperf attach tcp://H:1 --slo-ttft-ms 200 --slo-tpot-ms 50"
    )


def run_documented(argv: list[str], work: Path) -> tuple[bool, str, str]:
    """Run one documented command as a user would; (failed, what it printed, details)."""
    if argv[1] in TUI_COMMANDS and not {"--jsonl", "--list"} & set(argv):
        rc, out = run_tui(argv, work)
        return rc != 0 or "Traceback" in out, out, out[-1500:]
    p = run_cli(argv, work, timeout=180)
    bad = p.returncode != 0 or "Traceback" in p.stderr
    out = p.stdout
    if argv[1] == "engine" and "--analytic" not in argv and not bad:
        # it ran: the target first, steps made, stopped by the (shortened) duration
        first = out.splitlines()[0] if out else ""
        bad = not first.startswith("tcp://") or "duration reached" not in out or " 0 steps" in out
    return bad, out, f"exit {p.returncode}\nstdout: {p.stdout[-800:]}\nstderr: {p.stderr[-1500:]}"


@pytest.mark.slow
def test_every_documented_command_runs(fixtures: Fixtures) -> None:
    todo: list[tuple[Documented, list[str]]] = []
    skipped: list[str] = []
    done: set[tuple[str, ...]] = set()
    for doc in documented():
        argv, why = runnable(doc, fixtures)
        if argv is None:
            skipped.append(f"{doc.where}: {doc.text!r}: {why}")
            continue
        if tuple(argv) in done:  # `.venv/bin/rltperf demo` and `rltperf demo` run once
            continue
        done.add(tuple(argv))
        todo.append((doc, argv))

    def one(item: tuple[Documented, list[str]]) -> tuple[float, bool, str]:
        t0 = time.monotonic()
        bad, _out, detail = run_documented(item[1], fixtures.work)
        return time.monotonic() - t0, bad, detail

    t_all = time.monotonic()
    # the engines (CPU-bound from start to end) one at a time, beside the other commands
    with ThreadPoolExecutor(1) as engines, ThreadPoolExecutor(PARALLEL - 1) as others:
        futures = [
            (engines if argv[1] == "engine" else others).submit(one, (doc, argv)) for doc, argv in todo
        ]
        results = [f.result() for f in futures]
    ran = [
        f"{took:5.1f} s  {shlex.join(argv)}" for (_, argv), (took, _, _) in zip(todo, results, strict=True)
    ]
    failures = [f"{doc.where}: {doc.text!r} ran as {shlex.join(argv)}:\n{detail}"
                for (doc, argv), (_, bad, detail) in zip(todo, results, strict=True) if bad]  # fmt: skip
    print(f"\nran {len(ran)} documented commands, {PARALLEL} at a time, in {time.monotonic() - t_all:.0f} s:")
    print("\n".join(ran))
    print(f"skipped {len(skipped)}:")
    print("\n".join(skipped))
    assert not failures, "\n\n".join(failures)
    # what the commands leave in the temp folder stays in the scratch folder: the demo's log
    if any(argv[1] == "demo" for _, argv in todo):
        assert list((fixtures.work / "tmp").glob("rltperf-demo-*.log")), "the demo's log went elsewhere"


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\x1b[=>]")


@pytest.mark.slow
def test_documented_commands_on_vllm(vllm_server: Any, ouro_server: Any, tmp_path: Path) -> None:
    """What the documentation attaches to a vLLM server, against the shared real ones: the
    README's Ouro ``attach tcp://127.0.0.1:7788`` (the probe of the Ouro server it starts
    just before) against the shared Ouro server's probe, ``vllm+http://`` examples against
    the shared Llama server.  Each must draw a screen that names vLLM, run, and quit on q."""
    docs = [d for d in documented() if needs_vllm(d)]
    assert any(d.after_server for d in docs) and any("vllm+http://" in d.text for d in docs), docs
    failures: list[str] = []
    for doc in docs:
        if doc.after_server:
            assert "Ouro" in doc.after_server, doc.after_server  # the README's server is an Ouro one
            probe = re.search(r"RLTPERF_PROBE=(\S+)", doc.after_server)
            assert probe and f"tcp://{probe[1]}" in doc.text, (doc.after_server, doc.text)
            cmd = doc.text.replace(f"tcp://{probe[1]}", f"tcp://{ouro_server.probe}")
        else:
            cmd = re.sub(r"vllm\+http://[\w.:-]+", f"vllm+http://127.0.0.1:{vllm_server.port}", doc.text)
        argv = shlex.split(expand_options(cmd))
        argv[0] = "rltperf"
        bad, out, detail = run_documented(argv, tmp_path)
        screen = ANSI.sub("", out)
        if bad or "vllm" not in screen.lower():
            failures.append(f"{doc.where}: {doc.text!r} ran as {shlex.join(argv)}:\n{detail}")
    assert not failures, "\n\n".join(failures)
