"""The terminal driver: Textual's ``LinuxDriver`` with an input thread that sleeps until
there is something to read.

Textual 8.2's input thread selects on the terminal with a 0.1 s timeout, so it wakes ten
times a second whether or not a key came: to let its escape-sequence parser time out (a
lone ``Esc`` is told from the start of a sequence by the silence after it) and to notice
``exit_event``.  On this kind of machine a thread's wake costs ~0.1 ms of CPU (a bare
``select(0.1)`` loop: 0.92 ms a second), and the input thread was 1.68 ms a second of
the ~11 ms a second the whole monitor spent on an idle vLLM server (per-thread
``/proc/PID/task/TID/schedstat``; ``rltperf bench peers`` compares the whole process with
vllm-htop, issue 21 §1).

``QuietInputDriver`` selects with the parser's own deadline while it holds an
incomplete sequence, and otherwise for up to ``IDLE_S``; setting ``exit_event`` also
writes a byte to a pipe the thread selects on, so it leaves at once rather than at the
end of a timeout.  The terminal, the parser and the messages are Textual's; only the
waiting differs.  The parser's deadline is the private ``Parser._timeout_time`` of the
pinned Textual (8.2.8, pyproject): without it the thread waits 0.1 s, as Textual does.
"""

from __future__ import annotations

import os
import selectors
import threading
from codecs import getincrementaldecoder
from typing import Any

from textual._parser import ParseError
from textual._time import get_time
from textual._xterm_parser import XTermParser
from textual.drivers.linux_driver import LinuxDriver

IDLE_S = 1.0
"""Longest wait of the input thread with no incomplete sequence (a bound, in case a wake is
ever missed: exit and input wake it at once)."""
TEXTUAL_WAIT_S = 0.1
"""Textual's own wait, used when the parser's deadline cannot be read."""
_NO_DEADLINE = object()


class _WakingEvent(threading.Event):
    """A ``threading.Event`` whose ``set`` also writes a byte to ``fd`` (waking a select)."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def set(self) -> None:
        super().set()
        try:
            os.write(self._fd, b"\0")
        except OSError:  # the pipe is full: the thread has a byte to wake it already
            pass


class QuietInputDriver(LinuxDriver):
    """``LinuxDriver`` whose input thread wakes for input, a parser timeout or exit only."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        # never closed: a driver lives as long as its app, and a closed number could be
        # reused by a file that a late ``set`` would then write to
        self.exit_event = _WakingEvent(self._wake_w)

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 512):
                pass
        except OSError:  # empty (EAGAIN)
            pass

    def wait_s(self, parser: XTermParser) -> float:
        """How long the input thread may wait now: until the parser's deadline for an
        incomplete sequence, else ``IDLE_S``."""
        deadline = getattr(parser, "_timeout_time", _NO_DEADLINE)
        if deadline is None:
            return IDLE_S
        if not isinstance(deadline, (int, float)):
            return TEXTUAL_WAIT_S
        return max(0.0, min(IDLE_S, deadline - get_time()))

    def run_input_thread(self) -> None:
        """Read the terminal and dispatch its events until ``exit_event`` is set."""
        fileno, wake = self.fileno, self._wake_r
        parser = XTermParser(self._debug)
        decode = getincrementaldecoder("utf-8")().decode
        selector = selectors.SelectSelector()
        selector.register(fileno, selectors.EVENT_READ)
        selector.register(wake, selectors.EVENT_READ)
        reading = True
        try:
            while not self.exit_event.is_set():
                for key, _mask in selector.select(self.wait_s(parser)):
                    if key.fd == wake:
                        self._drain_wake()
                        continue
                    data = os.read(fileno, 4096)
                    if not data:  # end of input (a pipe): stop selecting on it, it stays readable
                        if reading:
                            selector.unregister(fileno)
                            reading = False
                        continue
                    text = decode(data)  # "" while a character's bytes are still coming
                    if text:
                        for event in parser.feed(text):
                            self.process_message(event)
                for event in parser.tick():
                    self.process_message(event)
        finally:
            selector.close()
            self._drain_wake()
            try:
                for _event in parser.feed(""):
                    pass
            except (EOFError, ParseError):
                pass
