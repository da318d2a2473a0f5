"""A recording made by hand, for figures worked out by hand (test_one_definition,
the gate's rounds): 80 decode steps of 10 ms, each after a 2 ms gap, so every step owns
12 ms and the recording is 0.96 s; per quarter of 20 steps, the output tokens, device
busy time and bytes per step given (by default those test_one_definition's table
works out)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine_adapters.definitions.records import (
    FLAG_EXPORTING,
    SCHEMA_VERSION,
    EngineInfo,
    Hello,
    Stats,
    StepRecord,
)
from engine_adapters.monitor.recording import RecordingWriter

MS_NS = 1_000_000
QUARTER_TOKENS = (2, 3, 4, 5)
QUARTER_BUSY_MS = (2, 4, 6, 8)
QUARTER_BYTES = (1_200_000, 2_400_000, 3_600_000, 4_800_000)


def hand_recording(
    path: Path,
    tokens: tuple[int, ...] = QUARTER_TOKENS,
    busy_ms: tuple[float, ...] = QUARTER_BUSY_MS,
    nbytes: tuple[int, ...] = QUARTER_BYTES,
    excluded_from: int = 80,
    quiet_ms: int = 0,
) -> None:
    """80 steps of 10 ms after 2 ms gaps; per quarter: ``tokens``, ``busy_ms``, ``nbytes``
    per step.  Steps from ``excluded_from`` on are flagged exporting; a heartbeat between
    steps ``quiet_ms`` after the last step's end makes the recording end quiet."""
    t0 = 5 * 10**9
    recs: list[Any] = [
        Hello(schema=SCHEMA_VERSION, engine=EngineInfo(name="by-hand"), stage_names=[]),
        Stats(ts_ns=t0, in_step_since_ns=0),  # the stream starts 2 ms before the first step
    ]
    for i in range(80):
        q = i // 20
        start = t0 + i * 12 * MS_NS + 2 * MS_NS
        recs.append(
            StepRecord(
                step_id=i,
                start_ns=start,
                end_ns=start + 10 * MS_NS,
                kind="decode",
                batch=1,
                tokens=1,
                out_tokens=tokens[q],
                busy_ns=int(busy_ms[q] * MS_NS),
                bytes_read=nbytes[q] - 200_000,
                bytes_written=200_000,
                flops=1e6,
                flags=FLAG_EXPORTING if i >= excluded_from else 0,
            )
        )
    if quiet_ms:
        recs.append(Stats(ts_ns=t0 + 80 * 12 * MS_NS + quiet_ms * MS_NS, in_step_since_ns=0))
    w = RecordingWriter(path)
    w.write(recs)
    w.close()
