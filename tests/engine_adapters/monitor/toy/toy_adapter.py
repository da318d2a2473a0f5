"""A third-party adapter as a package outside rltperf would write it: scheme ``toy://``.

Its session sends a Hello, a heartbeat, ``STEPS`` steps of ``STEP_MS`` ms every
``PERIOD_MS`` ms (times known here, so a test can check what rltperf computes from
them), a closing heartbeat, and then nothing (a live target that went quiet).  The
other classes claim targets that another adapter also accepts, to test the ranking.
"""

from __future__ import annotations

import time
from typing import ClassVar

from engine_adapters.definitions.records import SCHEMA_VERSION, EngineInfo, Hello, Record, Stats, StepRecord
from engine_adapters.monitor.base import Adapter, Session

STEPS = 5
STEP_MS = 8
PERIOD_MS = 10
TOKENS = 4


class ToySession(Session):
    """Five steps, then quiet."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._sent = False
        self._closed = False

    def read(self, timeout: float) -> list[Record]:
        if self._sent:
            time.sleep(min(timeout, 0.05))
            return []
        self._sent = True
        self.info = EngineInfo(name="toy")
        t0 = time.perf_counter_ns()
        out: list[Record] = [
            Hello(schema=SCHEMA_VERSION, engine=self.info, stage_names=[]),
            Stats(ts_ns=t0, in_step_since_ns=0),
        ]
        for i in range(STEPS):
            start = t0 + i * PERIOD_MS * 1_000_000
            end = start + STEP_MS * 1_000_000
            out.append(
                StepRecord(
                    step_id=i, start_ns=start, end_ns=end, batch=TOKENS, tokens=TOKENS, out_tokens=TOKENS
                )
            )
        out.append(Stats(ts_ns=t0 + STEPS * PERIOD_MS * 1_000_000, steps_total=STEPS, in_step_since_ns=0))
        return out

    def close(self) -> None:
        self._closed = True


class ToyAdapter(Adapter):
    """``toy://ANYTHING``: five steps of a made-up engine."""

    NAME: ClassVar[str] = "toy"
    SCHEMES: ClassVar[tuple[str, ...]] = ("toy://",)
    DESCRIPTION: ClassVar[str] = "a toy engine for the registry tests"

    def connect(self) -> ToySession:
        return ToySession(self.target)


class ToyShadow(ToyAdapter):
    """Claims ``tcp://`` (a built-in's scheme) and ``toy://`` (another package's)."""

    SCHEMES: ClassVar[tuple[str, ...]] = ("tcp://", "toy://")


class ToyFast(ToyAdapter):
    """A longer scheme inside ``toy://``."""

    SCHEMES: ClassVar[tuple[str, ...]] = ("toy://fast/",)


class ToyFile(ToyAdapter):
    """Files ending in ``.toyrec`` (any existing file is also the replay adapter's)."""

    SCHEMES: ClassVar[tuple[str, ...]] = ()
    SUFFIXES: ClassVar[tuple[str, ...]] = (".toyrec",)


class NotAnAdapter:
    """An entry point that names something other than an Adapter."""
