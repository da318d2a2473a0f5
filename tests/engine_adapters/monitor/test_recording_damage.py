"""Damaged recordings: real files (the demo fixture and one recorded from the real engine
with `rltperf record`), real bytes damaged in several places, read by the real reader and
by `rltperf summary / compare / replay`.

Every assertion compares against the undamaged file: records of frames the damage does
not touch are all kept, in order, and nothing is made up.
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_adapters.definitions.records import Batch, Record, StepRecord
from engine_adapters.definitions.wire import decode_body
from engine_adapters.monitor.recording import MAGIC, RecordingReader, read_all
from tests.conftest import LOOP_ENGINE, ROOT, run_rltperf, start_engine

DEMO = ROOT / "tests" / "rltperf_tui" / "tui" / "data" / "demo.rltrec"


def frames(data: bytes) -> list[tuple[int, int, list[Record]]]:
    """(start, end, records) of every frame of an intact recording, walked independently
    of the reader under test (the strict per-frame decoder)."""
    (n,) = struct.unpack_from(">I", data, len(MAGIC))
    pos = len(MAGIC) + 4 + n
    out = []
    while pos < len(data):
        (size,) = struct.unpack_from(">I", data, pos)
        rec = decode_body(data[pos + 4 : pos + 4 + size])
        out.append((pos, pos + 4 + size, list(rec.records) if isinstance(rec, Batch) else [rec]))
        pos += 4 + size
    assert pos == len(data)
    return out


def read(path: Path, data: bytes) -> tuple[list[Record], RecordingReader]:
    path.write_bytes(data)
    with RecordingReader(path) as r:
        return list(r.records()), r


def untouched(fr: list[tuple[int, int, list[Record]]], lo: int, hi: int) -> list[Record]:
    """Records of every frame that does not overlap the damaged bytes [lo, hi)."""
    return [rec for s, e, recs in fr if e <= lo or s >= hi for rec in recs]


def is_subsequence(small: list[Record], big: list[Record]) -> bool:
    it = iter(big)
    return all(any(x == y for y in it) for x in small)


@pytest.fixture(scope="module")
def engine_recording(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A recording of the real torch loop made with `rltperf record` (Batch frames), paced
    at 400 steps/s: unpaced, its size (and the fuzzing's time over it, 9-31 s) went with
    whatever CPU the loop got."""
    d = tmp_path_factory.mktemp("rec")
    path = d / "loop.rltrec"
    eng = start_engine(
        [str(LOOP_ENGINE), "--duration", "30", "--snapshots", str(d), "--no-warm", "--rate", "400"]
    )
    try:
        out = run_rltperf("record", eng.target, "--duration", "2.5", "-o", str(path), "-q")
        assert out.returncode == 0, out.stderr
    finally:
        eng.stop()
    yield path


def test_the_engine_recording_has_batch_frames(engine_recording):
    fr = frames(engine_recording.read_bytes())
    assert sum(len(recs) > 1 for _, _, recs in fr) >= 3, "the test needs Batch frames to damage"


def _cases(fr: list[tuple[int, int, list[Record]]], size: int) -> dict[str, tuple[int, int]]:
    """Damaged byte ranges [lo, hi) by name (one byte unless named otherwise)."""
    first, mid, last = fr[0], fr[len(fr) // 2], fr[-1]
    return {
        "first frame body (tag)": (first[0] + 6, first[0] + 7),
        "middle frame body (tag)": (mid[0] + 6, mid[0] + 7),
        "last frame body (tag)": (last[0] + 6, last[0] + 7),
        "middle frame length, high byte": (mid[0], mid[0] + 1),
        "middle frame length, low byte": (mid[0] + 3, mid[0] + 4),
        "last frame length, second byte": (last[0] + 1, last[0] + 2),
        "garbage across three frames": (mid[0] + 10, fr[len(fr) // 2 + 2][0] + 10),
    }


def _damage(data: bytes, lo: int, hi: int) -> bytes:
    b = bytearray(data)
    for i in range(lo, hi):
        b[i] ^= 0x5A if hi - lo > 1 else 0x40
    return bytes(b)


@pytest.mark.parametrize("which", ["demo", "engine"])
def test_records_before_and_after_damage_are_kept(which, engine_recording, tmp_path):
    src = DEMO if which == "demo" else engine_recording
    data = src.read_bytes()
    fr = frames(data)
    _, good = read_all(src)
    assert good == [r for _, _, recs in fr for r in recs]
    for name, (lo, hi) in _cases(fr, len(data)).items():
        recs, r = read(tmp_path / "d.rltrec", _damage(data, lo, hi))
        keep = untouched(fr, lo, hi)
        assert is_subsequence(keep, recs), f"{name}: records of undamaged frames lost"
        assert is_subsequence(recs, good), f"{name}: a record that is not in the file"
        assert r.records_read == len(recs)
        assert r.damage or r.truncated_bytes, name
        assert r.warning and str(r.damage[0].offset if r.damage else "") in r.warning
        if r.damage:
            d = r.damage[0]
            # The skipped run starts at the damaged frame (a file offset) and covers it.
            start = max(s for s, _, _ in fr if s <= lo)
            assert d.offset == start, (name, d, start)
            assert d.offset + d.size >= hi, (name, d)


def test_a_flipped_byte_inside_a_batch_keeps_the_batchs_other_records(engine_recording, tmp_path):
    data = engine_recording.read_bytes()
    fr = frames(data)
    s, e, recs_in = max(fr, key=lambda f: len(f[2]))  # the biggest Batch frame
    assert len(recs_in) > 20
    body = data[s + 4 : e]
    # The tag of one step record in the middle of the batch: that record is lost, the
    # records around it inside the same frame are recovered.
    k = body.index(b"\xa4step", len(body) // 2)
    recs, r = read(tmp_path / "b.rltrec", _damage(data, s + 4 + k + 1, s + 4 + k + 2))
    _, good = read_all(engine_recording)
    assert len(recs) == len(good) - 1
    assert is_subsequence(recs, good)
    assert r.recovered_records == len(recs_in) - 1
    assert len(r.damage) == 1 and r.damage[0].offset == s and r.damage[0].size == e - s
    assert f"at byte {s}" in (r.warning or "") and "recovered" in (r.warning or "")


def test_truncated_tail_keeps_every_whole_record(engine_recording, tmp_path):
    data = engine_recording.read_bytes()
    fr = frames(data)
    s, e, recs_in = max(fr[-10:], key=lambda f: len(f[2]))
    cut = s + (e - s) // 2  # in the middle of a Batch frame
    recs, r = read(tmp_path / "t.rltrec", data[:cut])
    before = [x for fs, _, rr in fr if fs < s for x in rr]
    assert recs[: len(before)] == before
    assert 0 < len(recs) - len(before) < len(recs_in), "the cut batch's whole records are kept"
    assert r.truncated_bytes == cut - s and not r.damage
    assert f"from byte {s}" in (r.warning or "")


def test_all_garbage_after_the_header_reads_nothing_and_says_so(tmp_path):
    data = DEMO.read_bytes()
    (n,) = struct.unpack_from(">I", data, len(MAGIC))
    start = len(MAGIC) + 4 + n
    import random

    junk = bytes(random.Random(7).randbytes(len(data) - start))
    recs, r = read(tmp_path / "g.rltrec", data[:start] + junk)
    assert recs == []
    assert r.skipped_bytes + r.truncated_bytes == len(junk)
    assert r.warning and "read 0 records" in r.warning


def test_a_damaged_header_still_reads_the_frames(tmp_path):
    data = DEMO.read_bytes()
    _, good = read_all(DEMO)
    b = bytearray(data)
    b[len(MAGIC) + 5] ^= 0xFF  # inside the header map
    b[2] ^= 0x01  # and one byte of the magic
    recs, r = read(tmp_path / "h.rltrec", bytes(b))
    assert recs == good
    assert r.header_damaged and r.warning and "header is damaged" in r.warning


# -- the commands ----------------------------------------------------------------------------


def _steps(recs: list[Record]) -> int:
    return sum(isinstance(x, StepRecord) for x in recs)


def test_summary_warns_with_offsets_and_exits_0_when_something_was_read(tmp_path):
    data = DEMO.read_bytes()
    fr = frames(data)
    last = fr[-1]
    bad = tmp_path / "last.rltrec"
    bad.write_bytes(_damage(data, last[0] + 6, last[0] + 7))  # the case: the last frame
    res = run_rltperf("summary", str(bad))
    assert res.returncode == 0, res.stderr
    assert "warning" in res.stderr and f"at byte {last[0]}" in res.stderr
    _, good = read_all(DEMO)
    from engine_adapters.definitions.figures import EXCLUDED_FLAGS

    def baseline(recs: list[Record]) -> int:  # summary counts baseline steps (not profiled)
        return sum(isinstance(x, StepRecord) and not x.flags & EXCLUDED_FLAGS for x in recs)

    lost = baseline(last[2])
    assert f"steps       {baseline(good) - lost} over" in res.stdout


def test_summary_compare_replay_exit_nonzero_when_nothing_was_read(tmp_path):
    data = DEMO.read_bytes()
    (n,) = struct.unpack_from(">I", data, len(MAGIC))
    start = len(MAGIC) + 4 + n
    junk = tmp_path / "junk.rltrec"
    junk.write_bytes(data[:start] + bytes(range(256)) * 40)
    res = run_rltperf("summary", str(junk))
    assert res.returncode == 1 and "no readable records" in res.stderr and "skipped" in res.stderr
    assert "steps" not in res.stdout
    res = run_rltperf("compare", str(DEMO), str(junk))
    assert res.returncode == 1 and "no readable records" in res.stderr
    res = run_rltperf("replay", str(junk))
    assert res.returncode == 1 and "no readable records" in res.stderr
    res = run_rltperf("attach", str(junk))  # a recording given to attach: the same check
    assert (
        res.returncode == 1 and "rltperf attach: error:" in res.stderr and "no readable records" in res.stderr
    )


def test_compare_warns_on_stderr_and_compares_what_was_read(engine_recording, tmp_path):
    data = engine_recording.read_bytes()
    fr = frames(data)
    mid = fr[len(fr) // 2]
    a = tmp_path / "a.rltrec"
    shutil.copy(engine_recording, a)
    b = tmp_path / "b.rltrec"
    b.write_bytes(_damage(data, mid[0], mid[0] + 1))
    res = run_rltperf("compare", str(a), str(b), "--resamples", "50")
    assert res.returncode == 0, res.stderr
    assert f"{b}: skipped" in res.stderr and f"at byte {mid[0]}" in res.stderr


# -- property: random flips -----------------------------------------------------------------


@pytest.fixture(scope="module")
def sources(engine_recording: Path) -> dict[str, tuple[bytes, list[tuple[int, int, list[Record]]]]]:
    """The demo file (one record per frame) and the engine's (Batch frames), parsed once."""
    out = {}
    for name, path in (("demo", DEMO), ("engine", engine_recording)):
        data = path.read_bytes()
        out[name] = (data, frames(data))
    return out


@pytest.mark.parametrize("which", ["demo", "engine"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.floats(0, 1), st.integers(1, 255)), min_size=1, max_size=6))
def test_random_flips_never_raise_never_lose_undamaged_frames(which, flips, sources, tmp_path):
    data, fr = sources[which]
    good = [r for _, _, recs in fr for r in recs]
    first_frame = fr[0][0]
    at = [
        (first_frame + min(int(f * (len(data) - first_frame)), len(data) - first_frame - 1), x)
        for f, x in flips
    ]
    b = bytearray(data)
    for i, x in at:
        b[i] ^= x
    recs, r = read(tmp_path / "p.rltrec", bytes(b))  # must not raise
    first = min(i for i, _ in at)
    before = untouched(fr, first, len(data))
    assert recs[: len(before)] == before, "records of frames before the first damaged byte"
    damaged = {max(s for s, _, _ in fr if s <= i) for i, _ in at}
    keep = [x for s, _, rr in fr if s not in damaged for x in rr]
    assert is_subsequence(keep, recs), "records of undamaged frames (after the damage too)"
    if len(recs) < len(good):
        assert r.skipped_bytes > 0 or r.truncated_bytes > 0
        assert r.warning


def test_replay_prints_the_damage_then_plays_what_was_read(tmp_path):
    """`rltperf replay` on a real terminal (a pty): the warning with its byte offset comes
    first, the screen plays the rest to its end, q quits with status 0."""
    import fcntl
    import os
    import pty
    import select
    import subprocess
    import sys
    import termios
    import time

    data = DEMO.read_bytes()
    last = frames(data)[-1]
    bad = tmp_path / "dmg.rltrec"
    bad.write_bytes(_damage(data, last[0] + 6, last[0] + 7))
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = dict(os.environ, PYTHONPATH=str(ROOT), TERM="xterm-256color")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rltperf_tui.cli", "replay", str(bad), "--speed", "0"],
        stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True,
    )  # fmt: skip
    os.close(slave)
    out = b""
    quit_sent = False
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < 90 and proc.poll() is None:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    out += os.read(master, 65536)
                except OSError:
                    break
            if not quit_sent and (b"ended" in out or time.monotonic() - t0 > 30):
                os.write(master, b"q")
                quit_sent = True
        proc.wait(15)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    text = out.decode("utf-8", "replace")
    assert proc.returncode == 0, text[-2000:]
    assert f"rltperf replay: warning: {bad}: skipped" in text and f"at byte {last[0]}" in text
    n_good = sum(len(recs) for _, _, recs in frames(data))
    assert f"read {n_good - len(last[2])} records" in text
    assert b"ended" in out, "the screen played the recording to its end"
