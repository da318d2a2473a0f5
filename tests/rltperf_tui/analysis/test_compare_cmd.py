"""``rltperf compare`` on real recordings of real engines, and on real bundles.

The recordings and bundles are committed (``data/compare/``, made by
``data/make_compare_data.py``): three reference loop engines recorded at the same time
(so the machine's load hit all of them alike), A and A2 with the same configuration, B
with an injected stall (20 ms after every 10th step), each unprofiled for a few
seconds; then captures.  The analysis is offline: fixed inputs make its verdicts the
same on every run (the same-configuration check once failed on a loaded machine's luck).
The live capture -> bundle -> analysis path is ``test_report_cmd.py``'s.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).resolve().parent / "data" / "compare"
"""The fixed recordings and bundles (``data/make_compare_data.py`` regenerates them)."""

_capsys: Any = None


@pytest.fixture(autouse=True)
def _cap(capsys: pytest.CaptureFixture[str]) -> Iterator[None]:
    global _capsys
    _capsys = capsys
    yield
    _capsys = None


def cli(*args: str) -> tuple[int, str, str]:
    """Run ``rltperf`` in this process (an exception here is a traceback a user would see)."""
    from rltperf_tui.cli import main

    _capsys.readouterr()
    rc = main(list(args))
    out = _capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def runs() -> dict[str, Any]:
    """The committed recordings (A, A2: one configuration; B, B2: the stall, two rounds)
    and bundles (two ops captures of A, a full one of B, a 6-step full one of A)."""
    rec = {n: DATA / f"{n}.rltrec" for n in ("a", "a2", "b", "b2")}
    bundles = [DATA / "bundles" / n for n in ("a_ops_1", "a_ops_2", "b_full", "a_full_6")]
    missing = [str(p) for p in [*rec.values(), *bundles] if not p.exists()]
    assert not missing, f"fixture data missing (run data/make_compare_data.py): {missing}"
    return {"rec": {n: str(p) for n, p in rec.items()}, "bundles": [str(b) for b in bundles]}


def _metric(res: dict[str, Any], key: str) -> dict[str, Any]:
    return next(m for m in res["metrics"] if m["key"] == key)


def test_compare_finds_injected_stall(runs: dict[str, Any]) -> None:
    rc, out, err = cli("compare", runs["rec"]["a"], runs["rec"]["b"], "--json")
    assert rc == 0, err
    res = json.loads(out)
    gap99 = _metric(res, "gap_ms.p99")
    assert gap99["significant"] is True, gap99
    # a 20 ms stall after every 10th step; under heavy machine load A's own P99 gap grows
    # (preemption), so only the sign and a clear margin are asserted
    assert gap99["diff"] > 5 and gap99["ci95"][0] > 0
    assert "gap_ms.p99" in res["significant"]
    # configuration differences come first, and name the stall
    assert [d["field"] for d in res["config_differences"]] == ["contract.stall"]
    assert "isolates that change" in res["config_note"]
    assert "never combined" in res["scope"]
    rc, text, _ = cli("compare", runs["rec"]["a"], runs["rec"]["b"])
    assert text.index("configuration differences") < text.index("metric")
    assert "step gap P99: B is" in text and "significant" in text


def test_compare_same_configuration_finds_nothing(runs: dict[str, Any]) -> None:
    rc, out, err = cli("compare", runs["rec"]["a"], runs["rec"]["a2"], "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["config_differences"] == [] and res["same_configuration"] is True
    assert res["significant"] == [], [m for m in res["metrics"] if m["significant"]]
    assert res["summary"][0].startswith("No significant difference")
    gap99 = _metric(res, "gap_ms.p99")
    assert not gap99["significant"] and gap99["failed"], gap99
    assert gap99["verdict"] in (
        "not significant after Holm",
        "below min effect",
        "not significant, below min effect",
        "not established (drift)",
    )


def test_compare_rounds_and_refusals(runs: dict[str, Any], tmp_path: Path) -> None:
    r = runs["rec"]
    rc, out, err = cli("compare", r["a"], r["b"], r["a2"], r["b2"], "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["drift"]["rounds"]["n"] == 2
    g = next(m for m in res["drift"]["rounds"]["metrics"] if m["key"] == "gap_ms.p99")
    assert g["consistent_sign"] is True and _metric(res, "gap_ms.p99")["significant"]
    # three configurations (base, +X, +Y) would make one claim of two comparisons: refused
    rc, out, err = cli("compare", r["a"], r["b"], r["a2"])
    assert rc == 2 and "refused" in err and "combined mode" in err
    rc, out, err = cli("compare", r["a"], runs["bundles"][0])
    assert rc == 2 and "recording (unprofiled) with a bundle" in err
    rc, out, err = cli("compare", r["a"], str(tmp_path / "missing.rltrec"))
    assert rc == 1 and "does not exist" in err
    from engine_adapters.monitor.recording import RecordingWriter

    RecordingWriter(tmp_path / "empty.rltrec").close()
    rc, out, err = cli("compare", str(tmp_path / "empty.rltrec"), r["b"])
    assert rc == 1 and "no readable records" in err  # a file without records: nothing to compare


def _passes_per_step(bundle: str) -> float:
    """Mean loop passes of the window's steps, from the engine's step records in the bundle
    (``exit_hist``: rows per exit depth; the loop runs to the deepest exit)."""
    import gzip

    with gzip.open(Path(bundle) / "trace.json.gz", "rt") as f:
        names = [e.get("name", "") for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    ids = {int(m.group(1)) for n in names if (m := re.match(r"rltperf\.step#(\d+)", n))}
    passes = []
    for line in (Path(bundle) / "steps.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("type") == "step" and r["step_id"] in ids:
            hist = r["exit_hist"]
            passes.append(max(i for i, k in enumerate(hist) if k) + 1)
    assert len(passes) == len(ids) == 4, (len(passes), sorted(ids))
    return round(sum(passes) / len(passes), 3)


def test_compare_bundles(runs: dict[str, Any]) -> None:
    a1, a2, bfull, _ = runs["bundles"]
    rc, out, err = cli("compare", a1, a2, "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["kind"] == "bundles" and res["profiled"] is True
    names = [o["name"] for o in res["host_ops"]]
    assert "aten::mm" in names
    mm = next(o for o in res["host_ops"] if o["name"] == "aten::mm")
    # the engine's own accounting: one aten::mm per loop pass, and the passes of a step
    # are data-dependent (a step stops when every row has exited), so the counts of two
    # windows of the same code may differ, each equal to its steps' passes
    assert (mm["a_count_per_step"], mm["b_count_per_step"]) == (_passes_per_step(a1), _passes_per_step(a2))
    assert set(res["stages_ms_mean"]) >= {"schedule", "forward", "sample"}
    assert res["config_differences"] == [] or all(
        d["field"] in ("commit", "diff_sha256") for d in res["config_differences"]
    )
    rc, out, err = cli("compare", a1, bfull)
    assert rc == 0, err
    assert out.index("configuration differences") < out.index("host operators")
    assert "contract.stall" not in out and "stall" in out  # the contract field differs: listed
    assert "mode" in out and "not an engine difference" in out


def _png(p: Path) -> tuple[int, int]:
    data = p.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_compare_png(runs: dict[str, Any], tmp_path: Path) -> None:
    rc, out, err = cli("compare", runs["rec"]["a"], runs["rec"]["b"], "--png", str(tmp_path), "--json")
    assert rc == 0, err
    res = json.loads(out)
    names = sorted(os.path.basename(p) for p in res["pngs"])
    assert names == ["cdfs.png", "exit_depth.png", "roofline.png", "step_stages.png"], res["png_skipped"]
    for n in names:
        w, h = _png(tmp_path / n)
        assert w > 300 and h > 200 and (tmp_path / n).stat().st_size > 10_000


# --------------------------------------------------------------------------- issue 14: say exactly what was found

NUM = r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?"
ROW = re.compile(
    rf"^(?P<name>.{{18}}) +(?P<a>\S+) +(?P<b>\S+) +(?P<diff>\S+) +(?P<rel>\S+)  "
    rf"(?:\[(?P<lo>{NUM}), (?P<hi>{NUM})\])? +(?P<verdict>[a-z].*)$"
)


def _table(text: str) -> dict[str, dict[str, str]]:
    """The metrics table as printed: metric name -> its cells."""
    rows = {}
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("metric "))
    for ln in lines[start + 1 :]:
        if not ln.strip():
            break
        m = ROW.match(ln)
        assert m, ln
        name = m["name"].strip().removesuffix(" ms").removesuffix(" tok/s")
        rows[name] = m.groupdict()
    return rows


def _why(text: str) -> dict[str, str]:
    """The "why not significant" lines: metric -> reason."""
    lines = text.splitlines()
    i = lines.index("why not significant:")
    out = {}
    for ln in lines[i + 1 :]:
        if not ln.startswith("  "):
            break
        name, _, reason = ln.strip().partition(": ")
        out[name] = reason
    return out


def test_reasons_match_the_printed_interval_after_holm(runs: dict[str, Any]) -> None:
    """A Holm-failed metric whose interval excludes 0 says so (it once read 'CI [19.57,
    19.82] includes 0 or p=…'); every metric short of significant says why."""
    r = runs["rec"]
    # alpha 0.001 cannot be reached by 13 metrics with 1000 resamples (the smallest
    # bootstrap p is 2/1001, 0.026 after Holm): every tested metric fails Holm, the
    # injected stall's gap P95/P99 among them, with intervals far from 0
    rc, text, err = cli("compare", r["a"], r["b"], "--alpha", "0.001")
    assert rc == 0, err
    table, why = _table(text), _why(text)
    tested = {k: v for k, v in table.items() if v["lo"] is not None}
    assert len(tested) >= 10
    excluding = 0
    for name, row in tested.items():
        assert row["verdict"] in ("not significant after Holm", "not significant, below min effect"), row
        reason = why[name]  # every one of them is explained
        assert reason.startswith("not significant after Holm: p="), reason
        p_holm = float(re.search(rf"p=({NUM}) ≥ 0\.001", reason)[1])  # type: ignore[index]
        assert p_holm >= 0.001
        lo, hi = float(row["lo"]), float(row["hi"])
        ci = f"[{row['lo']}, {row['hi']}]"
        assert ci in reason, (ci, reason)  # the same interval, printed the same way
        if lo <= 0 <= hi:
            assert f"CI {ci}" in reason and "includes 0" in reason and "excludes 0" not in reason
        else:
            excluding += 1
            assert "excludes 0" in reason and "includes 0" not in reason, reason
    assert excluding >= 2  # the stall's gap P95 and P99 at least


def test_reasons_name_the_smallest_effect_of_interest(runs: dict[str, Any]) -> None:
    """A difference below the smallest effect of interest says that, with the effect's
    size, not "within noise"."""
    r = runs["rec"]
    rc, out, err = cli("compare", r["a"], r["b"], "--min-effect", "50", "--json")
    assert rc == 0, err
    res = json.loads(out)
    rc, text, err = cli("compare", r["a"], r["b"], "--min-effect", "50")
    table, why = _table(text), _why(text)
    gap = _metric(res, "gap_ms.p99")
    assert gap["p_holm"] < 0.05 and gap["failed"] == ["min_effect"]  # real, but below 5000 % of A
    assert table["step gap P99"]["verdict"] == "below min effect"
    reason = why["step gap P99"]
    need = 50 * gap["a"]
    assert reason.startswith("below the smallest effect of interest (5000% of A: ")
    assert f"5000% of A: {float(reason.split('5000% of A: ')[1].split(' ms')[0]):.4g}" in reason
    assert float(reason.split("5000% of A: ")[1].split(" ms")[0]) == pytest.approx(need, rel=1e-3)
    # |B-A| and its share of A in the sentence are the table's cells, character for character
    row = table["step gap P99"]
    assert f"|B-A| is {row['diff'].lstrip('-')} ms ({row['rel']} of A)" in reason
    for m in res["metrics"]:
        assert "within noise" not in m["verdict"] and "within noise" not in m["reason"]


def test_summary_and_table_print_each_number_once_and_alike(runs: dict[str, Any]) -> None:
    """The sentence under the table prints B-A, its share of A and the interval exactly as
    the table does (the table once read +90.2 % and the sentence +90.3 %)."""
    r = runs["rec"]
    rc, text, err = cli("compare", r["a"], r["b"])
    assert rc == 0, err
    table = _table(text)
    said = re.findall(
        rf"^(.+?): B is ({NUM}) \S+ (higher|lower) than A \(([+-]\S+%) of A; 95% CI \[({NUM}), ({NUM})\]\)",
        text,
        re.M,
    )
    assert said, text
    for name, diff, direction, rel, lo, hi in said:
        row = table[name]
        assert row["verdict"] == "significant"
        assert diff == row["diff"].lstrip("-") and rel == row["rel"]
        assert (lo, hi) == (row["lo"], row["hi"])
        assert (direction == "higher") == (not row["diff"].startswith("-"))


def test_one_figure_one_formatting_rel_diff() -> None:
    """The table and the sentences format one rounded figure through one function (a
    relative difference of 0.902549 printed +90.2 % in the table, from the JSON rounded
    to 4 decimals, and +90.3 % in the sentence, from the raw number)."""
    from rltperf_tui.analysis import compare as C
    from rltperf_tui.analysis import stats as S

    d = S.Diff("x P50", "ms", 1.0, 1.902549, diff=0.902549, rel=0.902549, ci_low=0.8, ci_high=1.0, p=0.001)
    d.extra["key"] = "x.p50"
    S.decide([d])
    m = d.as_dict()
    (sentence,) = C._summary([m])
    assert f"({S.fmt_rel(m['rel_diff'])} of A;" in sentence
    assert S.fmt_rel(m["rel_diff"]) == "+90.3%"


def test_repeated_input_is_refused(runs: dict[str, Any], tmp_path: Path) -> None:
    """One file given twice (same path, a hard link, or a copy) is refused with one
    sentence and exit 2: it would pass as two independent rounds."""
    import shutil

    r = runs["rec"]
    rc, out, err = cli("compare", r["a"], r["b"], r["a2"], r["b"])
    assert rc == 2 and out == ""
    assert err.strip() == (
        f"rltperf compare: error: input 4 ({r['b']}) is input 2 ({r['b']}) again: each input must be its own "
        "recording or bundle, so one file cannot count as two rounds or as both A and B"
    )
    assert err.strip().count(". ") == 0 and len(err.strip().splitlines()) == 1
    copy = tmp_path / "b-copy.rltrec"
    shutil.copyfile(r["b"], copy)
    rc, out, err = cli("compare", r["a"], r["b"], r["a2"], str(copy))
    assert rc == 2 and f"input 4 ({copy}) has the same content as input 2 ({r['b']})" in err
    link = tmp_path / "a-link.rltrec"
    os.link(r["a"], link)
    rc, out, err = cli("compare", r["a"], str(link))
    assert rc == 2 and "is input 1" in err
    rc, out, err = cli("compare", r["a"], r["a"])
    assert rc == 2 and "is input 1" in err
    bcopy = tmp_path / "bundle-copy"
    shutil.copytree(runs["bundles"][0], bcopy)
    rc, out, err = cli("compare", runs["bundles"][0], str(bcopy))
    assert rc == 2 and "has the same content as input 1" in err
    # a missing file is still "cannot be read" (1), not a repetition
    rc, out, err = cli("compare", r["a"], r["b"], r["a2"], str(copy) + "-none")
    assert rc == 1 and "does not exist" in err


def test_bundles_in_other_modes_list_mode_and_n_first(runs: dict[str, Any]) -> None:
    """Two captures of one engine in ops (4 steps) and full (6 steps) mode: the capture
    mode and N are configuration differences, listed first (they once read "none — A and
    B report the same configuration")."""
    a1, _, _, afull = runs["bundles"]
    rc, out, err = cli("compare", a1, afull, "--json")
    assert rc == 0, err
    res = json.loads(out)
    fields = [d["field"] for d in res["config_differences"]]
    assert fields[:2] == ["capture.mode", "capture.steps (N)"], fields
    assert res["config_differences"][:2] == [
        {"field": "capture.mode", "a": "ops", "b": "full"},
        {"field": "capture.steps (N)", "a": 4, "b": 6},
    ]
    assert res["same_configuration"] is False
    rc, text, err = cli("compare", a1, afull)
    lines = text.splitlines()
    i = lines.index("configuration differences (listed first):")
    assert re.match(r"  capture\.mode +A: ops +B: full$", lines[i + 1])
    assert re.match(r"  capture\.steps \(N\) +A: 4 +B: 6$", lines[i + 2])
    assert "none — " not in text and "report the same configuration" not in text
    assert "captured differently" in text and "the engine configuration is the same" in text
    # every contract field that differs is listed too (here: none but the capture)
    assert len(fields) == 2 or all(f in ("commit", "diff_sha256") for f in fields[2:])


def test_config_values_are_never_cut(runs: dict[str, Any]) -> None:
    """Long configuration values (the reference engine's contract: '30 ms host stall in
    the schedule stage every 150 steps') print whole, wrapped, never cut mid-word."""
    demo = str(Path(__file__).resolve().parents[1] / "tui" / "data" / "demo.rltrec")
    rc, out, err = cli("compare", demo, runs["rec"]["a"], "--json")
    assert rc == 0, err
    res = json.loads(out)
    rc, text, err = cli("compare", demo, runs["rec"]["a"])
    block = text[text.index("configuration differences") : text.index("\nmetric ")]
    flat = " ".join(block.split())
    long_values = 0
    for d in res["config_differences"]:
        for v in (d["a"], d["b"]):
            s = " ".join(str(v).split())
            assert s in flat, s
            long_values += len(s) > 30
    assert long_values >= 5
    assert "30 ms host stall in the schedule stage every 150 steps" in flat
