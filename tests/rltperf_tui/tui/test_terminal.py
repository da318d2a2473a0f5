"""The monitor's terminal driver (``rltperf_tui.tui.terminal``): its input thread, on a real
pseudo-terminal, wakes for input, for the parser's escape deadline and for exit, not ten
times a second as Textual's does; keys still arrive as Textual's own events."""

from __future__ import annotations

import asyncio
import os
import pty
import signal
import threading
import time
import tty
from typing import Any

import pytest
from textual import events
from textual.drivers.linux_driver import LinuxDriver

from rltperf_tui.tui import terminal as quiet


def _wakes(t: threading.Thread) -> int:
    """The thread's voluntary context switches so far (each blocking wait that ended)."""
    with open(f"/proc/self/task/{t.native_id}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches")


def _run(base: type[LinuxDriver], idle_s: float) -> dict[str, Any]:
    """Drive ``base``'s input thread on a pty: its wakes over ``idle_s`` of silence, the keys
    it made of ``é`` (its two bytes read apart), ``a`` and a lone Esc, and how long it took to leave once told to."""
    got: list[tuple[float, Any]] = []

    class Capture(base):  # type: ignore[misc,valid-type]
        def process_message(self, message: Any) -> None:
            got.append((time.monotonic(), message))

    def wait_for(n: int, limit_s: float) -> None:
        end = time.monotonic() + limit_s
        while len(got) < n and time.monotonic() < end:
            time.sleep(0.01)

    async def main() -> dict[str, Any]:
        master, slave = pty.openpty()
        tty.setraw(slave)  # as Textual sets the terminal: bytes as typed, no line editing
        handlers = {s: signal.getsignal(s) for s in (signal.SIGTSTP, signal.SIGCONT)}
        try:
            d = Capture(None)  # the app is only reached through process_message
            d.fileno = slave
            t = threading.Thread(target=d.run_input_thread, daemon=True)
            t.start()
            time.sleep(0.3)
            w0 = _wakes(t)
            time.sleep(idle_s)
            idle_wakes = _wakes(t) - w0
            os.write(master, "é".encode()[:1])  # a character split across two reads
            time.sleep(0.2)
            os.write(master, "é".encode()[1:] + b"a")
            wait_for(2, 10)
            sent = time.monotonic()
            os.write(master, b"\x1b")  # a lone Esc: a key only once the parser's deadline passes
            wait_for(3, 10)
            told = time.monotonic()
            d.exit_event.set()
            t.join(10)
            return {
                "idle_wakes": idle_wakes,
                "keys": [m.key for _, m in got if isinstance(m, events.Key)],
                "esc_after_s": got[2][0] - sent if len(got) > 2 else None,
                "left_after_s": time.monotonic() - told,
                "alive": t.is_alive(),
            }
        finally:
            for s, h in handlers.items():
                signal.signal(s, h)
            os.close(master)
            os.close(slave)

    return asyncio.run(main())


def test_input_thread_wakes_for_input_escape_deadline_and_exit_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # a 30 s idle bound: an Esc or an exit that waited for it instead of waking would show
    monkeypatch.setattr(quiet, "IDLE_S", 30.0)
    ours = _run(quiet.QuietInputDriver, idle_s=2.0)
    textual = _run(LinuxDriver, idle_s=2.0)
    print(ours, textual)
    for r in (ours, textual):
        assert r["keys"] == ["é", "a", "escape"], r
        assert not r["alive"], r
    # Textual's thread wakes ~20 times in 2 s of silence (select with a 0.1 s timeout); ours
    # sleeps through (a wake or two: the start of the silence, the GIL)
    assert ours["idle_wakes"] <= 4 and ours["idle_wakes"] * 4 <= textual["idle_wakes"], (ours, textual)
    # the Esc came at the parser's deadline (0.1 s, Textual's ESCDELAY) and the thread left
    # on the exit byte, both long before the 30 s idle bound
    assert ours["esc_after_s"] < 5 and ours["left_after_s"] < 5, ours


def test_wait_follows_the_parser_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """``wait_s``: the idle bound without a pending sequence, the time left to the parser's
    deadline with one, and Textual's 0.1 s when the deadline cannot be read."""

    class Parser:
        _timeout_time: float | None = None

    d = object.__new__(quiet.QuietInputDriver)
    p = Parser()
    assert d.wait_s(p) == quiet.IDLE_S  # type: ignore[arg-type]
    p._timeout_time = quiet.get_time() + 0.05
    assert 0.0 <= d.wait_s(p) <= 0.05  # type: ignore[arg-type]
    p._timeout_time = quiet.get_time() - 1.0
    assert d.wait_s(p) == 0.0  # type: ignore[arg-type]
    assert d.wait_s(object()) == quiet.TEXTUAL_WAIT_S  # type: ignore[arg-type]
