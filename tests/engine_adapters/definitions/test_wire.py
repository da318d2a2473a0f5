"""Schema and framing: round trips, evolution, and every kind of bad frame."""

from __future__ import annotations

import struct

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_adapters.definitions.records import (
    SCHEMA_VERSION,
    Capture,
    ClientHello,
    DeviceSample,
    EngineInfo,
    Hello,
    RequestRecord,
    StepRecord,
    to_builtins,
)
from engine_adapters.definitions.wire import (
    MAX_FRAME,
    FrameEncoder,
    FrameError,
    FrameReader,
    encode,
    parse_hostport,
)


def test_round_trip_every_frame_split():
    recs = [
        Hello(
            schema=SCHEMA_VERSION, engine=EngineInfo(name="e", model="m", max_loops=4), stage_names=["a", "b"]
        ),
        StepRecord(step_id=7, start_ns=10, end_ns=20, stage_ns=[3, 4], exit_hist=[1, 0, 2], bytes_read=5),
        RequestRecord(req_id="r1", arrival_ns=1, finish_ns=9, first_token_ns=3, output_tokens=4),
        DeviceSample(ts_ns=5, gpu_util=None, proc_cpu=0.5),
    ]
    blob = FrameEncoder().encode_many(recs)
    assert blob == b"".join(encode(r) for r in recs)
    # Feed one byte at a time: the reader must reassemble every frame exactly once.
    r = FrameReader()
    out = []
    for i in range(len(blob)):
        out.extend(r.feed(blob[i : i + 1]))
    assert out == recs
    assert r.pending == 0


def test_array_like_schema_evolution_both_ways():
    class StepV2(msgspec.Struct, tag="step", array_like=True, kw_only=True, frozen=True):
        step_id: int
        start_ns: int
        end_ns: int

    # An older writer (fewer fields) decodes into the current record with defaults...
    old = msgspec.msgpack.encode(StepV2(step_id=1, start_ns=2, end_ns=3))
    rec = FrameReader().feed(struct.pack(">I", len(old)) + old)[0]
    assert isinstance(rec, StepRecord) and rec.step_id == 1 and rec.stage_ns == [] and rec.busy_ns is None
    # ...and a newer writer with an appended field is read by the current schema.
    body = msgspec.msgpack.encode(StepRecord(step_id=1, start_ns=2, end_ns=3))
    arr = msgspec.msgpack.decode(body)
    arr.append("a field from the future")
    body2 = msgspec.msgpack.encode(arr)
    rec2 = FrameReader().feed(struct.pack(">I", len(body2)) + body2)[0]
    assert rec2 == StepRecord(step_id=1, start_ns=2, end_ns=3)


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (struct.pack(">I", MAX_FRAME + 1), "exceeds"),
        (struct.pack(">I", 0), "empty frame"),
        (_frame(b"\xc1\xc1\xc1"), "undecodable"),
        (_frame(msgspec.msgpack.encode(["nosuchtag", 1, 2])), "bad record"),
        (_frame(msgspec.msgpack.encode(["step", "x", 2])), "bad record"),
    ],
)
def test_bad_frames_raise_with_reason(data, why):
    with pytest.raises(FrameError, match=why):
        FrameReader().feed(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=300))
def test_garbage_never_raises_anything_but_frame_error(data):
    r = FrameReader(max_frame=1024)
    try:
        r.feed(data)
    except FrameError:
        pass


def test_to_builtins_has_field_names():
    d = to_builtins(StepRecord(step_id=1, start_ns=2, end_ns=3))
    assert d["type"] == "step" and d["step_id"] == 1 and d["exit_hist"] is None


def test_capture_and_hello_tags_distinct():
    tags = {
        c.__struct_config__.tag
        for c in (Capture, ClientHello, Hello, StepRecord, RequestRecord, DeviceSample)
    }
    assert len(tags) == 6


@pytest.mark.parametrize(
    ("addr", "expect"),
    [
        ("127.0.0.1:7788", ("127.0.0.1", 7788)),
        (":0", ("127.0.0.1", 0)),
        ("localhost", ("localhost", 7788)),
        ("[::1]:9000", ("::1", 9000)),
    ],
)
def test_parse_hostport(addr, expect):
    assert parse_hostport(addr) == expect


@pytest.mark.parametrize("addr", ["host:notaport", "host:70000", ""])
def test_parse_hostport_errors(addr):
    with pytest.raises(ValueError):
        parse_hostport(addr)


def test_batched_frames_keep_order_and_flatten():
    from engine_adapters.definitions.records import Bye, Stats

    recs = [
        StepRecord(step_id=1, start_ns=1, end_ns=2),
        StepRecord(step_id=2, start_ns=3, end_ns=4),
        Stats(ts_ns=5),
        RequestRecord(req_id="a", arrival_ns=1, finish_ns=6),
        DeviceSample(ts_ns=7),
        StepRecord(step_id=3, start_ns=8, end_ns=9),
        Bye(reason="x"),
    ]
    enc = FrameEncoder()
    blob = enc.encode_batched(recs)
    assert FrameReader().feed(blob) == recs
    big = [StepRecord(step_id=i, start_ns=i, end_ns=i + 1) for i in range(3000)]
    assert FrameReader().feed(enc.encode_batched(big)) == big  # split into several batches


def test_a_control_record_inside_a_batch_is_a_bad_frame():
    body = msgspec.msgpack.encode(["batch", [["bye", "x"]]])
    with pytest.raises(FrameError, match="bad record"):
        FrameReader().feed(_frame(body))


def test_decoded_records_are_not_tracked_by_the_cycle_collector() -> None:
    """A monitor decodes ~1,000 step records a second; tracked by the cyclic GC, each one
    counts towards the next collection, which walks every tracked object of the app.
    Records are frozen and hold no reference back to themselves: untracked (``gc=False``)."""
    import gc

    frames = FrameEncoder().encode_batched(
        [StepRecord(step_id=i, start_ns=i, end_ns=i + 1, stage_ns=[1, 2], exit_hist=[0, 1]) for i in range(3)]
        + [RequestRecord(req_id="r", arrival_ns=0, finish_ns=1)]
    )
    recs = FrameReader().feed(frames)
    assert len(recs) == 4
    assert [gc.is_tracked(r) for r in recs] == [False] * 4
