"""Our Prometheus text-format reader (``exposition.py``) against prometheus_client's, as the oracle.

``parse_scrape`` used prometheus_client's parser until it was measured at ~93 % of a
scrape's CPU; ``_oracle_scrape`` below is that former ``parse_scrape`` body, kept here
only to check that ours gives the same ``Scrape``: on two real vLLM 0.32 pages, and on
generated pages (hypothesis) with escapes in label values, NaN/±Inf/exponent values,
timestamps, other families around ours and histograms over several label sets.
Malformed lines must raise ``ScrapeError``, never a wrong number.
"""

from __future__ import annotations

import importlib.util
import math
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from engine_adapters.monitor.vllm import exposition
from engine_adapters.monitor.vllm.exposition import forget_pages, read_families
from engine_adapters.monitor.vllm.metrics import (
    HISTOGRAMS_SKIPPED,
    ITERATION_TOKENS,
    KV_USAGE,
    LATENCY_HISTOGRAMS,
    REQUEST_SUCCESS,
    Histogram,
    Scrape,
    ScrapeError,
    parse_scrape,
)

DATA = Path(__file__).parent / "data"
HAVE_ORACLE = importlib.util.find_spec("prometheus_client") is not None
needs_oracle = pytest.mark.skipif(
    not HAVE_ORACLE, reason="prometheus_client (the oracle, a vLLM dependency) is absent"
)
REAL = ("vllm_0.32_metrics_a.txt", "vllm_0.32_metrics_b.txt")


# ---- the oracle: the former parse_scrape, on prometheus_client's parser -------------------


def _oracle_scrape(text: str, ts_ns: int) -> Scrape:
    from prometheus_client.parser import text_string_to_metric_families

    out = Scrape(ts_ns=ts_ns)
    kv_n = 0
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith("vllm:"):
            continue
        if fam.type == "counter":
            for s in fam.samples:
                if not s.name.endswith("_total"):
                    continue
                eng = s.labels.get("engine")
                if eng is not None:
                    out.engines.add(eng)
                out.counters[s.name] = out.counters.get(s.name, 0.0) + s.value
                if s.name == REQUEST_SUCCESS:
                    reason = s.labels.get("finished_reason", "?")
                    out.finished[reason] = out.finished.get(reason, 0.0) + s.value
        elif fam.type == "gauge":
            if fam.name.endswith("_info"):
                if fam.samples and fam.name not in out.info:
                    out.info[fam.name] = dict(fam.samples[0].labels)
                continue
            for s in fam.samples:
                if s.name != fam.name:
                    continue
                if s.name in KV_USAGE:
                    kv_n += 1
                out.gauges[s.name] = out.gauges.get(s.name, 0.0) + s.value
        elif fam.type == "histogram" and fam.name not in HISTOGRAMS_SKIPPED:  # named as unread
            _oracle_histogram(out, fam)
    for name in KV_USAGE:
        if name in out.gauges and kv_n > 1:
            out.gauges[name] /= kv_n
    return out


def _oracle_histogram(out: Scrape, fam: Any) -> None:
    buckets: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
    count = total = 0.0
    for s in fam.samples:
        if s.name.endswith("_bucket"):
            le = s.labels.get("le")
            if le is None:
                continue
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            # float(): prometheus_client reads "12" as an int, and ints past 2**53 would
            # then add up exactly here but rounded in ours (which keeps every value a float)
            buckets.setdefault(key, []).append((float(le), float(s.value)))
        elif s.name.endswith("_count"):
            count += s.value
        elif s.name.endswith("_sum"):
            total += s.value
    merged: Histogram | None = None
    for series in buckets.values():
        series.sort()
        bounds = [b for b, _ in series if b != float("inf")]
        counts = [c for b, c in series if b != float("inf")]
        if merged is None:
            merged = Histogram(bounds, counts)
        elif merged.bounds == bounds:
            merged.counts = [a + b for a, b in zip(merged.counts, counts, strict=True)]
    if merged is None:
        merged = Histogram([], [])
    merged.count, merged.sum = count, total
    out.hists[fam.name] = merged


def _canon(x: Any) -> Any:
    """A Scrape's content with NaN made comparable (NaN != NaN)."""
    if isinstance(x, float):
        return "NaN" if math.isnan(x) else x
    if isinstance(x, dict):
        return {k: _canon(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_canon(v) for v in x]
    if isinstance(x, set):
        return sorted(x)
    if isinstance(x, Histogram):
        return {
            "bounds": _canon(x.bounds),
            "counts": _canon(x.counts),
            "count": _canon(x.count),
            "sum": _canon(x.sum),
        }
    return x


def _fields(s: Scrape) -> dict[str, Any]:
    return {
        f: _canon(getattr(s, f))
        for f in ("ts_ns", "counters", "finished", "gauges", "hists", "info", "engines")
    }


# ---- (1) the two real pages -----------------------------------------------------------------


@needs_oracle
@pytest.mark.parametrize("name", REAL)
def test_real_vllm_pages_give_the_oracles_scrape(name: str) -> None:
    text = (DATA / name).read_text()
    ours, oracle = parse_scrape(text, 7), _oracle_scrape(text, 7)
    # field by field, so a failure names what differs
    assert ours.counters == oracle.counters and len(ours.counters) >= 10
    assert ours.finished == oracle.finished and ours.finished
    assert ours.gauges == oracle.gauges and len(ours.gauges) >= 20
    assert ours.info == oracle.info and ours.info["vllm:cache_config_info"]
    assert ours.engines == oracle.engines == {"0"}
    assert ours.hists.keys() == oracle.hists.keys() and len(ours.hists) == 16 - len(HISTOGRAMS_SKIPPED)
    for fam, h in oracle.hists.items():
        mine = ours.hists[fam]
        assert (mine.bounds, mine.counts, mine.count, mine.sum) == (h.bounds, h.counts, h.count, h.sum), fam
    assert _fields(ours) == _fields(oracle)


def test_only_vllm_families_are_read() -> None:
    fams = read_families((DATA / REAL[0]).read_text(), "vllm:")
    assert fams and all(f.name.startswith("vllm:") for f in fams)
    assert {f.type for f in fams} == {"counter", "gauge", "histogram"}
    ttft = next(f for f in fams if f.name == "vllm:time_to_first_token_seconds")
    assert {s[0] for s in ttft.samples} == {ttft.name + x for x in ("_bucket", "_count", "_sum")}


def test_skipped_histograms_are_vllms_own_and_nothing_reads_them() -> None:
    """``parse_scrape`` passes over the histograms it never reads: each name is one of a real
    vLLM 0.32 page's histograms, none is one the sample carries, and the other families
    come out exactly as without skipping."""
    text = (DATA / REAL[0]).read_text()
    whole = read_families(text, "vllm:")
    kept = read_families(text, "vllm:", HISTOGRAMS_SKIPPED)
    hists = {f.name for f in whole if f.type == "histogram"}
    assert hists >= HISTOGRAMS_SKIPPED and len(hists - HISTOGRAMS_SKIPPED) == 8
    read = {ITERATION_TOKENS, *(n for names in LATENCY_HISTOGRAMS.values() for n in names)}
    assert not read & HISTOGRAMS_SKIPPED and read <= hists
    assert [(f.name, f.type, f.samples) for f in kept] == [
        (f.name, f.type, f.samples) for f in whole if f.name not in HISTOGRAMS_SKIPPED
    ]
    lines = text.count("\n")
    skipped = sum(len(f.samples) for f in whole if f.name in HISTOGRAMS_SKIPPED)
    assert skipped > lines / 8  # what is saved: 102 of the 604 lines of this page
    # a skipped family's lines are not parsed: a damaged one passes, one of a read family raises
    bad = text.replace("vllm:request_params_n_bucket{", "vllm:request_params_n_bucket{le=1,", 1)
    assert bad != text and read_families(bad, "vllm:", HISTOGRAMS_SKIPPED)
    with pytest.raises(ScrapeError):
        read_families(bad, "vllm:")
    with pytest.raises(ScrapeError):
        parse_scrape(
            text.replace(
                "vllm:e2e_request_latency_seconds_bucket{", "vllm:e2e_request_latency_seconds_bucket{le=1,", 1
            ),
            1,
        )


# ---- (2) generated pages ------------------------------------------------------------------

_LABEL_NAMES = ("engine", "model_name", "finished_reason", "a", "b_c", "_x")
_label_value = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")) | st.sampled_from('\\"\n{},= #'),
    max_size=8,
)
_float = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(10**20), 10**20)


def _fmt_value(v: float | int, style: int) -> str:
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return ("NaN", "nan", "NaN")[style % 3]
    if math.isinf(v):
        return ("+Inf", "Inf", "+inf")[style % 3] if v > 0 else ("-Inf", "-inf", "-Inf")[style % 3]
    return (repr(v), f"{v:.17e}", f"{v:.17E}")[style % 3]


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def _sample_line(draw: Any, name: str, labels: dict[str, str]) -> str:
    value = _fmt_value(draw(_float), draw(st.integers(0, 2)))
    lt = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    if labels and draw(st.booleans()):
        lt += ","  # a trailing comma is allowed
    head = f"{name}{{{lt}}}" if labels or draw(st.booleans()) else name
    ts = f" {draw(st.integers(-(2**40), 2**45))}" if draw(st.booleans()) else ""
    return f"{head} {value}{ts}"


@st.composite
def _label_sets(draw: Any, n_max: int = 3) -> list[dict[str, str]]:
    names = draw(st.lists(st.sampled_from(_LABEL_NAMES), unique=True, max_size=3))
    return draw(st.lists(st.fixed_dictionaries({k: _label_value for k in names}), min_size=1, max_size=n_max))


@st.composite
def _family(draw: Any) -> list[str]:
    prefix = draw(st.sampled_from(("vllm:", "vllm:", "vllm:", "python_", "vllm_", "myvllm:", "process_")))
    base = prefix + draw(
        st.sampled_from(("kv_cache_usage_perc", "request_success", "x", "y_total", "z_info", "h"))
    )
    typ = draw(st.sampled_from(("counter", "gauge", "histogram", "untyped")))
    lines: list[str] = []
    if draw(st.booleans()):
        lines.append(f"# HELP {base} {draw(_label_value).replace(chr(10), '')} \\\\ help \\n text")
    if typ == "counter":
        name = base + ("_total" if not base.endswith("_total") and draw(st.booleans()) else "")
        lines.append(f"# TYPE {name} counter")
        lines += [draw(_sample_line(name, ls)) for ls in draw(_label_sets())]
        return lines
    if typ in ("gauge", "untyped"):
        lines.append(f"# TYPE {base} {typ}")
        lines += [draw(_sample_line(base, ls)) for ls in draw(_label_sets())]
        return lines
    lines.append(f"# TYPE {base} histogram")
    bounds = sorted(set(draw(st.lists(st.floats(-1e6, 1e6), min_size=0, max_size=4))))
    for ls in draw(_label_sets()):
        ls.pop("le", None)
        for b in [*bounds, math.inf]:
            lines.append(
                draw(_sample_line(base + "_bucket", {**ls, "le": _fmt_value(b, draw(st.integers(0, 2)))}))
            )
        lines.append(draw(_sample_line(base + "_count", ls)))
        lines.append(draw(_sample_line(base + "_sum", ls)))
    return lines


@st.composite
def _page(draw: Any) -> str:
    lines: list[str] = []
    for fam in draw(st.lists(_family(), max_size=6)):
        lines += fam
        if draw(st.booleans()):
            lines.append(draw(st.sampled_from(("", "# a comment", "  ", '# EOF-ish comment {a="b"}'))))
    return "\n".join(lines) + ("\n" if draw(st.booleans()) else "")


# a second # TYPE of a family turns the samples read under the first into a counter's:
# found by the generator (a histogram named *_total, then a counter of that name)
_RETYPED = (
    '# TYPE vllm:{0} histogram\nvllm:{0}_bucket{{engine="",le="+Inf"}} 1\nvllm:{0}_count{{engine=""}} 1\n'
    'vllm:{0}_sum{{engine=""}} 2\n# TYPE vllm:{0} counter\nvllm:{0} 3'
)


@needs_oracle
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_page())
@example(_RETYPED.format("y_total"))
@example(_RETYPED.format("x"))
def test_generated_pages_give_the_oracles_scrape(text: str) -> None:
    assert _fields(parse_scrape(text, 1)) == _fields(_oracle_scrape(text, 1))


@needs_oracle
@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet='vlm:_{}="\\ #01.e+-InfNaTYPEHELcoutrgahisb\t', max_size=30), max_size=6))
def test_any_text_gives_a_scrape_or_a_scrape_error(lines: list[str]) -> None:
    """Fuzz: nothing but ScrapeError escapes, and a page the oracle reads gives its numbers."""
    text = "\n".join(lines)
    try:
        ours = parse_scrape(text, 1)
    except ScrapeError:
        return
    try:
        oracle = _oracle_scrape(text, 1)
    except Exception:
        return  # the oracle is stricter or laxer on a few odd shapes; ours answered cleanly
    assert _fields(ours) == _fields(oracle)


def test_escapes_timestamps_and_special_values() -> None:
    text = (
        "# TYPE vllm:g gauge\n"
        'vllm:g{model_name="a\\\\b\\"c\\nd",engine="1"} -Inf 1700000000000\n'
        'vllm:g{model_name="x}y{z",engine="2",} 1.5e-3\n'
        "vllm:g NaN\n"
        "# TYPE vllm:c_total counter\n"
        'vllm:c_total{engine="1"} +Inf -5\n'
    )
    (g, c) = read_families(text)
    assert [s[1] for s in g.samples] == [
        {"model_name": 'a\\b"c\nd', "engine": "1"},
        {"model_name": "x}y{z", "engine": "2"},
        {},
    ]
    assert g.samples[0][2:] == (-math.inf, 1700000000000)
    assert g.samples[1][2:] == (0.0015, None)
    assert math.isnan(g.samples[2][2])
    assert c.samples == [("vllm:c_total", {"engine": "1"}, math.inf, -5)]
    s = parse_scrape(text, 0)
    assert math.isnan(s.gauges["vllm:g"]) and s.engines == {"1"}


# ---- (2b) pages of a shape read before (templates) -------------------------------------


def _reading(text: str) -> Any:
    """``parse_scrape``'s fields, or the ``ScrapeError`` message, of the full reading."""
    forget_pages()
    try:
        return _fields(parse_scrape(text, 1))
    except ScrapeError as exc:
        return str(exc)


def test_a_page_of_a_known_shape_is_read_from_its_template(monkeypatch: pytest.MonkeyPatch) -> None:
    """Page b of the server (the same shape as page a, other numbers) after page a: its
    families come from a's template, not a reading line by line, and give b's oracle."""
    a, b = ((DATA / n).read_text() for n in REAL)
    assert a != b
    forget_pages()
    parse_scrape(a, 1)
    assert not exposition._TEMPLATES  # a shape read once: no template yet
    parse_scrape(a, 1)
    assert len(exposition._TEMPLATES) == 1

    def no_full_reading(*args: object) -> None:
        raise AssertionError("read line by line")

    monkeypatch.setattr(exposition, "_read", no_full_reading)
    got = _fields(parse_scrape(b, 1))
    monkeypatch.undo()
    assert got == _reading(b)
    if HAVE_ORACLE:
        assert got == _fields(_oracle_scrape(b, 1))
    # a number the template cannot take: the full reading says what and where
    line = next(i for i, x in enumerate(b.split("\n"), 1) if x.startswith("vllm:num_requests_running{"))
    lines = b.split("\n")
    lines[line - 1] = lines[line - 1].rsplit(" ", 1)[0] + " 1.2.3"
    bad = "\n".join(lines)
    parse_scrape(a, 1)
    with pytest.raises(ScrapeError, match=f"line {line}: invalid value '1.2.3'"):
        parse_scrape(bad, 1)


def test_histograms_of_two_engines_from_a_template(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two engines' series of each histogram (merged bucket by bucket, steps per engine), and
    a series of other bounds (left out): from a template, the full reading's figures."""
    rows = []
    for fam in ("vllm:time_to_first_token_seconds", ITERATION_TOKENS):
        rows.append(f"# TYPE {fam} histogram")
        for eng, bounds in (("0", ("0.1", "1.0")), ("1", ("0.1", "1.0")), ("2", ("0.5",))):
            rows += [f'{fam}_bucket{{engine="{eng}",le="{b}"}} @' for b in (*bounds, "+Inf")]
            rows += [f'{fam}_count{{engine="{eng}"}} @', f'{fam}_sum{{engine="{eng}"}} @']
    page = "\n".join(rows) + "\n"

    def numbered(values: Any) -> str:
        it = iter(values)
        return "".join(
            p + (str(next(it)) if i < page.count("@") else "") for i, p in enumerate(page.split("@"))
        )

    first = numbered(range(100))
    second = numbered(3 * k + 0.5 for k in range(100))
    forget_pages()
    parse_scrape(first, 1)
    parse_scrape(first, 1)
    monkeypatch.setattr(exposition, "_read", lambda *a: pytest.fail("read line by line"))
    got = parse_scrape(second, 1)
    monkeypatch.undo()
    assert _fields(got) == _reading(second)
    assert got.engine_steps == _fields_steps(second) and len(got.engine_steps) == 3
    h = got.hists["vllm:time_to_first_token_seconds"]
    assert h.bounds == [0.1, 1.0] and h.counts == [0.5 + 15.5, 3.5 + 18.5]  # values 0, 1 and 5, 6 of the page


def _fields_steps(text: str) -> dict[str, float]:
    forget_pages()
    return parse_scrape(text, 1).engine_steps


def test_a_page_with_timestamps_keeps_no_template() -> None:
    """A timestamp is a line's last number: such a page is always read line by line."""
    forget_pages()
    page = '# TYPE vllm:g gauge\nvllm:g{{engine="0"}} {} 1700000000000\n'
    for _ in range(2):  # the second page of a shape would leave its template
        assert parse_scrape(page.format(5), 1).gauges == {"vllm:g": 5.0}
    assert not exposition._TEMPLATES
    assert parse_scrape(page.format(5).replace("1700000000000", "1700000000500"), 1).gauges == {"vllm:g": 5.0}


_NUMBERS = st.one_of(
    st.integers(-(10**20), 10**20).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(("+Inf", "-Inf", "NaN", "07", "1.", ".5", "-0", "1e5", "1E-07", "+3")),
)
"""Numbers as a page spells them (each keeps the page's shape)."""
_DAMAGED = st.sampled_from(("1.2.3", "1..", "1e", "-", "1_0", "x", "", "nan", "0x10"))
"""Last tokens the full reading refuses or that change the shape."""


@needs_oracle
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_page(), st.data())
def test_generated_pages_of_a_known_shape_give_the_full_reading(text: str, data: Any) -> None:
    """A page read (its template kept), then the same page with each line's last number
    replaced (other numbers, other spellings, bad ones): the result is the full
    reading's, error or scrape, and the oracle's where the oracle reads it."""
    forget_pages()
    try:
        if data.draw(st.booleans()):  # the kept samples' timestamps cut (a page that has a template)
            lines = text.split("\n")
            for fam in read_families(text, "vllm:", HISTOGRAMS_SKIPPED):
                for (_, _, _, ts), line in zip(fam.samples, fam.lines, strict=True):
                    if ts is not None:
                        lines[line - 1] = lines[line - 1].rstrip().rsplit(None, 1)[0]
            text = "\n".join(lines)
        parse_scrape(text, 1)
        parse_scrape(text, 1)
    except ScrapeError:
        return
    numbers = exposition._TAIL.findall(text)
    new = [data.draw(_NUMBERS) for _ in numbers]
    if new and data.draw(st.booleans()):  # one damaged number
        new[data.draw(st.integers(0, len(new) - 1))] = data.draw(_DAMAGED)
    it = iter(new)
    again = exposition._TAIL.sub(lambda m: " " + next(it), text)
    try:
        got: Any = _fields(parse_scrape(again, 1))
    except ScrapeError as exc:
        got = str(exc)
    assert got == _reading(again)
    if isinstance(got, dict):
        try:
            oracle = _oracle_scrape(again, 1)
        except Exception:
            return  # the oracle is stricter or laxer on a few odd spellings
        assert got == _fields(oracle)


# ---- (3) malformed input ------------------------------------------------------------------

_BAD = [
    ('vllm:x{engine="0" 1', "line 2"),  # unclosed brace
    ("vllm:x{engine=0} 1", "labels"),  # unquoted value
    ('vllm:x{engine="0} 1', "line 2"),  # unterminated quote
    ('vllm:x{engine="0"} abc', "invalid value"),
    ('vllm:x{engine="0"} 1_000', "invalid value"),
    ('vllm:x{engine="0"} 1 12.5', "timestamp"),
    ('vllm:x{engine="0"} 1 2 3', "not a sample line"),
    ("vllm:x", "not a sample line"),
    ('vllm:x{engine="a\\q"} 1', "invalid escape"),
    ('vllm:x{engine="0",engine="1"} 1', "twice"),
    ('vllm:x{="0"} 1', "labels"),
    ('vllm:x{engine="0"}} 1', "labels"),
    ('vllm:x{engine="0"}{a="1"} 1', "labels"),
    ("vllm:x-y 1", "invalid metric name"),
    ("# TYPE vllm:y", "without a type"),
    ("# TYPE vllm:y countr", "unknown type"),
    ("# TYPE vllm:y-z counter", "invalid metric name"),
    ("<html><body>404</body></html>", "not a metric line"),
]


@pytest.mark.parametrize(("line", "why"), _BAD)
def test_malformed_lines_raise_scrape_error(line: str, why: str) -> None:
    text = f"# TYPE vllm:x gauge\n{line}\nvllm:x 1\n"
    with pytest.raises(ScrapeError, match=why) as info:
        parse_scrape(text, 0)
    assert "line 2" in str(info.value)


def test_a_bad_bucket_bound_raises_scrape_error() -> None:
    text = '# TYPE vllm:h histogram\nvllm:h_bucket{le="abc"} 1\nvllm:h_count 1\nvllm:h_sum 1\n'
    with pytest.raises(ScrapeError, match="le='abc'"):
        parse_scrape(text, 0)


def test_other_families_are_not_parsed() -> None:
    """A line of another family is skipped unread (its shape is the exporter's business)."""
    text = "# TYPE python_x gauge\npython_x{a=b} notanumber\n# TYPE vllm:x gauge\nvllm:x 2\n"
    assert parse_scrape(text, 0).gauges == {"vllm:x": 2.0}


@needs_oracle
def test_ours_is_faster_than_the_oracle_on_the_real_page() -> None:
    """The reason this reader exists: interleaved runs, ratio of the best of each (measured ~7x)."""
    text = (DATA / REAL[0]).read_text()
    ours, oracle = [], []
    for _ in range(5):
        c = time.thread_time()
        parse_scrape(text, 0)
        ours.append(time.thread_time() - c)
        c = time.thread_time()
        _oracle_scrape(text, 0)
        oracle.append(time.thread_time() - c)
    assert min(oracle) > 2.5 * min(ours), (min(oracle), min(ours))


def test_bench_ingest_states_the_stored_page_parse_time(capsys: pytest.CaptureFixture[str]) -> None:
    from rltperf_tui.bench.metrics_ingest import print_metrics_only, stored_page_parse

    p = stored_page_parse(repeats=3)
    assert p["body_bytes"] == len((DATA / REAL[0]).read_bytes()) and 0 < p["parse_cpu_ms"] < 1000
    assert 0 < p["parse_afresh_cpu_ms"] < 1000
    print_metrics_only({"measured": False, "why": "no target", "stored_page_parse": p})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "/metrics-only target: not measured (no target)"
    assert (
        out[1].startswith("  parse_scrape of the stored real page (53,928 bytes")
        and "ms of CPU per scrape after a page of its shape" in out[1]
        and "ms read afresh" in out[1]
    )
