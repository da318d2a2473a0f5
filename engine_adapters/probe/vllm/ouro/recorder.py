"""The Ouro model's loop recorder: per-pass time, exits and collective wait of one worker.

``OuroModel.forward`` calls ``begin`` before the first pass, ``mark(t)`` after pass t,
``end`` after the last, and ``compute_logits`` adds the LM head's time
(``add_logits``); each forward becomes one record in this worker's loop ring
(``loopring.py``), read by the engine core's tap.  The model's tensor-parallel
all-reduces go through a ``CollectiveTimer``, so a record also holds the time this rank
spent inside them: where it waited for its peers (a straggler's peers wait for it).

**Nothing here may break vLLM.**  Every call is guarded: the first exception turns the
recorder off for good, with one logged warning naming the call and the error, and the
forward goes on.  (``faults.py`` can make each call raise, for the tests.)

**Devices.**  On the CPU the pass boundaries are host clock reads and the exit
histogram a numpy ``bincount`` of the output rows (views, no copies).  On CUDA the
boundaries are CUDA events and the histogram a ``scatter_add_`` into a fresh device
tensor, copied into a preallocated pinned host buffer with ``non_blocking``; both are
read a few forwards later, once an event says the GPU passed them: the recorder never
synchronises the host with the GPU (checked under ``torch.cuda.set_sync_debug_mode
("error")`` by ``tests/gpu/device_check.py``).  Collective wait is measured on the CPU
only (a CUDA all-reduce returns before it ran); on CUDA it is n/a.  Under CUDA graph
capture nothing is recorded.

Imports torch and numpy, not vLLM (the device check runs it without vLLM).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from time import perf_counter_ns as _clk
from typing import Any

import numpy as np
import torch

from engine_adapters.probe.vllm.faults import Faults
from engine_adapters.probe.vllm.ouro import loopring

log = logging.getLogger("vllm.rltperf")

PENDING_MAX = 64
"""CUDA records waiting for their events; older ones are dropped (never waited for)."""


class CollectiveTimer:
    """The model's tensor-parallel all-reduce, timed while the recorder is on.

    ``reduce`` is vLLM's ``tensor_model_parallel_all_reduce`` (None: one rank, nothing to
    reduce).  On the CPU the call returns when the sum is there, so its wall time is
    this rank's wait for its peers plus the (small) reduction itself."""

    __slots__ = ("ns", "on", "reduce")

    def __init__(self, reduce: Callable[[torch.Tensor], torch.Tensor] | None) -> None:
        self.reduce = reduce
        self.ns = 0
        self.on = False

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.reduce is None:
            return x
        if not self.on:
            return self.reduce(x)
        t0 = _clk()
        y = self.reduce(x)
        self.ns += _clk() - t0
        return y


class LoopRecorder:
    """Times each pass and counts exits into this worker's loop ring (module docstring)."""

    def __init__(
        self,
        writer: loopring.RingWriter,
        passes: int,
        device: torch.device,
        rank: str = "tp0",
        comm: CollectiveTimer | None = None,
        faults: Faults | None = None,
        slow_ms: float = 0.0,
    ) -> None:
        self.writer = writer
        self.passes = passes
        self.cuda = device.type == "cuda"
        self.rank = rank
        self.comm = comm
        self.faults = faults
        self.slow_s = slow_ms / 1e3
        self.stamps = [0] * (passes + 1)
        self.events: list[Any] = []
        self.pending: deque[tuple[Any, ...]] = deque()
        self.t_start = 0
        self.n = 0
        self.active = False
        self.dead = False
        """Set by the first failure: the recorder stays off."""
        self._host: Any = None
        self._host_i = 0
        if self.cuda:
            # one pinned row per pending record (+2 spare), so a non-blocking copy never
            # lands in a row still to be read
            self._host = torch.zeros((PENDING_MAX + 2, passes), dtype=torch.long, pin_memory=True)

    def _off(self, where: str, exc: BaseException) -> None:
        self.active = False
        if self.comm is not None:
            self.comm.on = False
        if not self.dead:
            self.dead = True
            log.warning("rltperf: Ouro loop recording stopped on %s: %s failed (%s: %s); vLLM serves on",
                        self.rank, where, type(exc).__name__, exc)  # fmt: skip

    def begin(self, n_tokens: int) -> None:
        """Before the first pass of a forward over ``n_tokens`` tokens."""
        if not self.dead:
            try:
                if self.faults is not None:
                    self.faults.check("begin")
                self.n = n_tokens
                self.active = not (self.cuda and torch.cuda.is_current_stream_capturing())
                if self.active:
                    self.t_start = _clk()
                    if self.cuda:
                        self._resolve()
                        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(self.passes + 1)]
                        self.events[0].record()
                    else:
                        self.stamps[0] = self.t_start
                        if self.comm is not None:
                            self.comm.ns = 0
                            self.comm.on = True
            except Exception as exc:
                self._off("begin", exc)
        if self.slow_s:  # an injected straggler: inside the timed forward, as slow compute is
            time.sleep(self.slow_s)

    def mark(self, t: int) -> None:
        """After pass ``t``."""
        if not self.active:
            return
        try:
            if self.faults is not None:
                self.faults.check("mark")
            if self.cuda:
                self.events[t + 1].record()
            else:
                self.stamps[t + 1] = _clk()
        except Exception as exc:
            self._off("mark", exc)

    def end(self, depth: torch.Tensor | None, qsl: torch.Tensor | None) -> None:
        """After the last pass: the exit histogram of the rows that get logits (each
        request's last token, from the batch's ``query_start_loc`` ``qsl``), and the
        record.  ``depth`` None: every token ran to the end."""
        if not self.active:
            return
        try:
            self._end(depth, qsl)
        except Exception as exc:
            self._off("end", exc)

    def _end(self, depth: torch.Tensor | None, qsl: torch.Tensor | None) -> None:
        T = self.passes
        n_rows = int(qsl.numel()) - 1 if qsl is not None else 0
        if self.cuda:
            host = None
            if depth is not None and qsl is not None and n_rows:
                rows = (qsl[1:] - 1).to(device=depth.device, dtype=torch.long, non_blocking=True)
                idx = depth.index_select(0, rows)
                counts = torch.zeros(T + 1, dtype=torch.long, device=depth.device)
                counts.scatter_add_(0, idx, torch.ones_like(idx))
                host = self._host[self._host_i % self._host.shape[0]]
                self._host_i += 1
                host.copy_(counts[1:], non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            self.pending.append((self.t_start, self.n, n_rows, self.events, host, done))
            if len(self.pending) > PENDING_MAX:
                self.pending.popleft()
            return
        comm = self.comm
        wait = -1
        if comm is not None:
            comm.on = False
            if comm.reduce is not None:
                wait = comm.ns
        s = self.stamps
        loop_ns = [s[t + 1] - s[t] for t in range(T)]
        if depth is not None and n_rows and qsl is not None:
            # CPU tensors: numpy views, no copies (a few µs, not torch's per-op overhead)
            hist: Any = np.bincount(depth.numpy()[qsl.numpy()[1:] - 1], minlength=T + 1)[1 : T + 1]
        else:
            hist = [0] * (T - 1) + [n_rows]
        self.writer.write(self.t_start, _clk(), self.n, n_rows, loop_ns, [self.n] * T, hist, wait)

    def add_logits(self, ns: int) -> None:
        """Add the LM head's time to this forward's record (CPU)."""
        if self.dead:
            return
        try:
            if self.faults is not None:
                self.faults.check("add_logits")
            self.writer.add_logits(ns)
        except Exception as exc:
            self._off("add_logits", exc)

    def _resolve(self) -> None:
        while self.pending and self.pending[0][5].query():
            t0, n, n_rows, evs, host, _ = self.pending.popleft()
            loop_ns = [int(evs[t].elapsed_time(evs[t + 1]) * 1e6) for t in range(self.passes)]
            hist = host.tolist() if host is not None else [0] * (self.passes - 1) + [n_rows]
            self.writer.write(t0, t0 + sum(loop_ns), n, n_rows, loop_ns, [n] * self.passes, hist)
