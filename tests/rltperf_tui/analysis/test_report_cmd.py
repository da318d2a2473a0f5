"""``rltperf report`` on real bundles (ops and full) from a real engine, on damaged copies,
and the ``--png`` charts."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LOOP_ENGINE, start_engine, tmpfs_mount

STEPS = 5


def capture(target: str, steps: int, mode: str) -> str:
    from engine_adapters.definitions.records import CaptureDone, CaptureFailed, Refused
    from engine_adapters.monitor.registry import adapter_for

    s = adapter_for(target, reconnect=False).connect()
    try:
        cid = s.request_capture(steps, mode)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            for r in s.read(0.2):
                if isinstance(r, (CaptureDone, CaptureFailed, Refused)) and r.capture_id == cid:
                    assert isinstance(r, CaptureDone), r
                    return r.bundle
    finally:
        s.close()
    raise AssertionError("no capture result")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    snaps = tmp_path_factory.mktemp("snaps")
    eng = start_engine(
        [
            str(LOOP_ENGINE),
            "--duration",
            "120",
            "--snapshots",
            str(snaps),
            "--loops",
            "4",
            "--sleep-ms",
            "0.5",
        ]
    )
    try:
        time.sleep(0.5)
        yield {"ops": capture(eng.target, STEPS, "ops"), "full": capture(eng.target, STEPS, "full")}
    finally:
        eng.stop()


_capsys: Any = None


@pytest.fixture(autouse=True)
def _cap(capsys: pytest.CaptureFixture[str]) -> Iterator[None]:
    global _capsys
    _capsys = capsys
    yield
    _capsys = None


def report(*args: str) -> tuple[int, str, str]:
    """Run ``rltperf report`` in this process (an exception here is a traceback a user would see)."""
    from rltperf_tui.cli import main

    _capsys.readouterr()
    rc = main(["report", *args])
    out = _capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("mode", ["ops", "full"])
def test_report_on_real_bundle_is_complete(bundles: dict[str, str], mode: str) -> None:
    rc, out, err = report(bundles[mode], "--json")
    assert rc == 0, err
    rep = json.loads(out)
    assert rep["complete"] is True, rep["problems"]
    assert rep["problems"] == []
    assert rep["steps_requested"] == rep["steps_found"] == rep["steps_recorded"] == STEPS
    assert rep["mode"] == mode and rep["step_source"] == "ProfilerStep"
    meta = json.loads((Path(bundles[mode]) / "meta.json").read_text())
    assert [s["step_id"] for s in rep["steps"]] == meta["capture"]["step_ids"]
    assert set(rep["stage_ms"]) >= {"schedule", "forward", "sample"}
    for s in rep["steps"]:  # stages fit inside their step
        assert 0 < sum(s["stage_ms"].values()) <= s["step_ms"] <= s["cycle_ms"]
    assert 0 < rep["idle_fraction"] < 1
    ib = rep["idle_breakdown"]
    assert ib["basis"] == "engine-thread operators" and ib["kernel_wait_s"] is None
    assert ib["host_wait_s"] == pytest.approx(ib["idle_s"], abs=1e-9)
    host = rep["top_ops"]["host"]
    assert host and "aten::mm" in [o["name"] for o in host[:3]]
    assert rep["top_ops"]["device"] is None and "CPU-only" in rep["top_ops"]["device_note"]
    assert "tokenizer" in rep["unknown_contract_fields"] and "model" not in rep["unknown_contract_fields"]
    assert rep["profiled"] is True and "NOT a baseline" in rep["note"]
    if mode == "full":
        assert rep["shapes"] and any(o.get("input_dims") for o in rep["shapes"])
        assert rep["memory"] and rep["memory"][0]["peak_allocated_bytes"] > 0
        assert rep["stacks"]["python_function_events"] > 0
    else:
        assert rep["shapes"] is None and rep["memory"] is None
    ctx = rep["unprofiled_context"]
    assert ctx["steps_before"] > 0 and ctx["profiler_slowdown_p50"] > 0


def test_report_text_says_profiled_and_complete(bundles: dict[str, str]) -> None:
    rc, out, _ = report(bundles["ops"])
    assert rc == 0
    assert out.count("not a baseline") >= 2 or "NOT a baseline" in out
    assert f"COMPLETE: steps requested {STEPS}" in out
    assert "tokenizer" in out


def _copy(src: str, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_report_on_truncated_trace_says_what_is_missing(bundles: dict[str, str], tmp_path: Path) -> None:
    b = _copy(bundles["full"], tmp_path / "cut")
    tr = b / "trace.json.gz"
    raw = tr.read_bytes()
    tr.write_bytes(raw[: len(raw) // 3])
    rc, out, err = report(str(b), "--json")
    assert rc == 3 and "Traceback" not in err
    rep = json.loads(out)
    assert rep["complete"] is False
    text = " ".join(rep["problems"])
    assert "damaged" in text and "cut short" in text
    assert rep["steps_found"] < STEPS
    assert f"{rep['steps_found']} steps found in the trace" in text and f"{STEPS} were requested" in text
    assert rep["step_ids"]["missing_in_trace"]  # exactly which steps are missing
    rc, out, err = report(str(b))
    assert rc == 3 and "INCOMPLETE" in out and "Traceback" not in err


def test_report_on_missing_meta_field_names_it(bundles: dict[str, str], tmp_path: Path) -> None:
    b = _copy(bundles["ops"], tmp_path / "nometa")
    meta = json.loads((b / "meta.json").read_text())
    del meta["capture"]["steps_requested"]
    del meta["contract"]
    (b / "meta.json").write_text(json.dumps(meta))
    rc, out, err = report(str(b), "--json")
    assert rc == 3 and "Traceback" not in err
    rep = json.loads(out)
    assert rep["complete"] is False and rep["steps_requested"] is None
    assert set(rep["missing_meta_fields"]) == {"capture.steps_requested", "contract"}
    assert "meta.json has no 'capture.steps_requested'" in rep["problems"]
    assert rep["steps_found"] == STEPS  # the trace itself is fine


def test_report_on_broken_or_absent_files(bundles: dict[str, str], tmp_path: Path) -> None:
    b = _copy(bundles["ops"], tmp_path / "broken")
    (b / "meta.json").write_text('{"capture": {"steps_requ')
    (b / "steps.jsonl").unlink()
    rc, out, err = report(str(b), "--json")
    assert rc == 3 and "Traceback" not in err
    probs = " ".join(json.loads(out)["problems"])
    assert "meta.json is not valid JSON" in probs
    rc, _, err = report(str(tmp_path / "nowhere"))
    assert rc == 1 and "does not exist" in err and "Traceback" not in err
    (tmp_path / "x.txt").write_text("hello")
    rc, _, err = report(str(tmp_path / "x.txt"))
    assert rc == 1 and "neither a bundle" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("not a bundle")
    rc, _, err = report(str(empty))
    assert rc == 1 and "is not a capture bundle" in err and "Traceback" not in err


def _png_size(p: Path) -> tuple[int, int]:
    data = p.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_report_png_charts(bundles: dict[str, str], tmp_path: Path) -> None:
    out_dir = tmp_path / "png"
    rc, out, err = report(
        bundles["ops"], "--png", str(out_dir), "--peak-gbps", "20", "--peak-gflops", "50", "--json"
    )
    assert rc == 0, err
    rep = json.loads(out)
    names = sorted(os.path.basename(p) for p in rep["pngs"])
    assert names == ["exit_depth.png", "roofline.png", "step_stages.png"], rep.get("png_skipped")
    for n in names:
        w, h = _png_size(out_dir / n)
        assert w > 300 and h > 200
        assert (out_dir / n).stat().st_size > 10_000  # drawn, not blank


def test_vllm_trace_file_reported_as_bare_trace(tmp_path: Path) -> None:
    """A vLLM worker trace on its own: steps from the execute annotations, nothing requested known."""
    from rltperf_tui.analysis.traces import save_trace

    ev: list[dict[str, Any]] = []
    t = 0.0
    for i in range(8):
        name = "execute_context_1(16)_generation_0(0)" if i == 0 else "execute_context_0(0)_generation_1(1)"
        ev.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": name,
                "pid": 7,
                "tid": 7,
                "ts": t,
                "dur": 6000.0,
                "args": {},
            }
        )
        ev.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "pid": 7,
                "tid": 7,
                "ts": t + 100,
                "dur": 5000.0,
                "args": {},
            }
        )
        t += 7000
    p = tmp_path / "rank0.123.pt.trace.json.gz"
    save_trace(p, ev)
    rc, out, _ = report(str(p), "--json")
    assert rc == 3  # a bare trace: nothing requested is known, so it cannot be called complete
    rep = json.loads(out)
    assert rep["step_source"] == "vllm execute annotations" and rep["steps_found"] == 8
    assert [s["kind"] for s in rep["steps"]][:2] == ["prefill", "decode"]
    assert rep["complete"] is False and "meta.json" not in " ".join(rep["problems"])
    assert "bare trace" in " ".join(rep["notes"])
    # a vLLM bundle folder: meta.json + the worker trace under vLLM's own file name
    b = tmp_path / "vllm_bundle"
    b.mkdir()
    shutil.copy(p, b / p.name)
    meta = {
        "capture": {"steps_requested": 8, "steps_captured": 8, "mode": "ops", "error": None},
        "engine": {"name": "vllm"},
        "contract": {"model": "tiny"},
    }
    (b / "meta.json").write_text(json.dumps(meta))
    rc, out, _ = report(str(b), "--json")
    rep = json.loads(out)
    assert rc == 0, rep["problems"]
    assert rep["complete"] is True and rep["steps_found"] == rep["steps_requested"] == 8
    assert rep["idle_fraction"] == pytest.approx(1 - 8 * 5000 / (7 * 7000 + 6000))


def test_report_on_a_folder_of_bundles_points_to_one(bundles: dict[str, str]) -> None:
    rc, _, err = report(os.path.dirname(bundles["ops"]))
    assert rc == 1 and "holds 2 bundles, not one" in err and "newest" in err


def test_png_without_matplotlib_still_prints_the_report(
    bundles: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A missing optional part costs only that part: the text report, then the reason."""
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if matplotlib were not installed
    rc, out, err = report(bundles["ops"], "--png", str(tmp_path))
    assert "top host operators by self time" in out and "not a baseline" in out, out
    assert rc == 4 and "no charts" in err and "needs matplotlib" in err
    rc, out, err = report(bundles["ops"], "--png", str(tmp_path), "--json")
    rep = json.loads(out)
    assert rc == 4 and rep["complete"] is True and "needs matplotlib" in rep["png_error"]


def test_charts_on_a_full_disk_leave_no_empty_file(bundles: dict[str, str], tmp_path: Path) -> None:
    """A chart that cannot be written (a 16 KiB tmpfs filled up) costs only the charts:
    the report, the reason, and no empty or half-written PNG left behind (one was)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if not tmpfs_mount(disk, "16k"):
        pytest.skip("cannot mount a tiny tmpfs here (needs root and mount)")
    try:
        (disk / "charts").mkdir()
        with contextlib.suppress(OSError), open(disk / "filler", "wb") as f:
            while True:  # the disk full to its last byte
                f.write(b"\0" * 4096)
                f.flush()
        rc, out, err = report(bundles["ops"], "--png", str(disk / "charts"))
        charts = disk / "charts"
        left = {p.name: p.read_bytes() for p in charts.iterdir()} if charts.exists() else {}
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
    assert "top host operators by self time" in out, out
    assert rc == 4 and "No space left on device" in err, err
    cut = [n for n, data in left.items() if not data.endswith(b"IEND\xaeB`\x82")]  # a PNG's last chunk
    assert not cut, cut
