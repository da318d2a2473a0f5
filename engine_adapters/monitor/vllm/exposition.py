"""A reader of the Prometheus text exposition format 0.0.4, for the families ``parse_scrape`` keeps.

``read_families(text, prefix)`` returns the families whose name starts with ``prefix``
(``"vllm:"``), each with its ``# TYPE`` and its samples (name, labels, value,
timestamp), in the order of the page.  Lines of other families are skipped after a
look at their first characters, without being parsed: a vLLM page is ~20 % Python
process metrics that ``parse_scrape`` never reads.  (A line that cannot begin a sample
or a comment, e.g. an HTML page's ``<``, still raises ``ScrapeError``.)

Grouping follows what the text says, as the Prometheus client libraries read it:

- ``# TYPE name type`` opens the family ``name`` (``# HELP`` of a new name opens an
  untyped one); a second ``# TYPE`` of the current name changes its type.
- A sample belongs to the open family when its name is the family's (counter, gauge,
  untyped), or the family's plus ``_bucket``/``_count``/``_sum`` (histogram) or
  ``_count``/``_sum`` (summary).  Any other sample closes the open family: it and the
  samples after it, until the next ``# TYPE``/``# HELP``, belong to no kept family.
- A counter's samples are returned under their own names (``parse_scrape`` reads a
  name without ``_total`` as ``..._total``, as prometheus_client does); a 0.0.4 page
  from a Python client names them ``..._total`` and exposes ``..._created`` as a gauge
  family of its own.

Lines are checked as they are read: a malformed line of a kept family (name, labels,
escapes, value, timestamp) raises ``ScrapeError`` naming the line; nothing is guessed.
Label values are unescaped (``\\\\``, ``\\"``, ``\\n``; any other escape is an error).
Values are ``float``s (``NaN``, ``+Inf``, ``-Inf``, exponents); a timestamp (integer
milliseconds) is kept on the sample and otherwise unused.

A server's pages keep one shape scrape after scrape: the same lines in the same order,
only the numbers changed.  The second page read of a shape (its text with each line's
numeric last token cut out, ``_cut``) leaves a template (``_Template``), and each later
page of that shape takes its families from it with only the numbers read anew: two passes of one
regular expression instead of a Python pass per line (``rltperf bench ingest`` prints
both costs).  The result is the full reading's, errors included: a template is kept only
from a page read whole without error and without timestamps, and a number the template
cannot take sends the page to the full reading, which says what is wrong and where.
"""

from __future__ import annotations

import re
from collections.abc import Container
from dataclasses import dataclass, field
from typing import TypeVar

_T = TypeVar("_T")


class ScrapeError(ValueError):
    """The answer is not a Prometheus exposition the parser understands."""


Sample = tuple[str, dict[str, str], float, "int | None"]
"""One sample line of a kept family: ``(name, labels, value, timestamp_ms)``.  A plain tuple
(a NamedTuple costs a Python call per line); ``labels`` maps label names to unescaped
values and is shared between samples of the same label text: do not mutate it."""


@dataclass(slots=True)
class Family:
    """A ``# TYPE``d family and its samples, in page order."""

    name: str
    type: str
    samples: list[Sample] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    """Line number (from 1) of each sample, as read from the page (empty otherwise)."""
    shape: object | None = None
    """The template entry this family was filled from: one object for every page of its
    shape, whose samples differ only in value; None for a family read line by line.  A
    reader may keep what it works out of the samples' names and labels under it
    (``histogram_read.read_histogram``)."""


TYPES = ("counter", "gauge", "histogram", "summary", "untyped")
"""The types format 0.0.4 knows."""

_NAME_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_:")
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_SHAPE = "not a sample line (name, optional {labels}, value, optional timestamp)"
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*(?:,|$)')
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\]*)"')
_PLAIN_LABELS = re.compile(r'[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*")*,?')
_ESCAPE = re.compile(r"\\(.)")
_UNESCAPED = {"\\": "\\", '"': '"', "n": "\n"}
_LABELS_SEEN: dict[str, dict[str, str]] = {"": {}}
"""Parsed labels by their text, for every page read: a server's pages repeat the same label
sets scrape after scrape (~500 on a vLLM page, most of them histogram buckets), and
parsing them was about half of a scrape's parse (``rltperf bench ingest``'s stored page).
A label text parses to the same labels on any page, so one page's results serve the next."""
_LABELS_KEPT = 20_000
"""More label texts than this (a server whose labels keep changing) start the cache afresh
(and the same for the family names below)."""
_NAMES_SEEN: set[str] = set()
"""Family names of ``# TYPE``/``# HELP`` lines found valid, as the label texts above: a page
names the same ~70 families scrape after scrape."""
_ALLOWED_SEEN: dict[tuple[str, str], tuple[str, ...]] = {}
"""(family name, type) -> its sample names (``_allowed``)."""


_TAIL = re.compile(
    r" ([-+]?(?:[0-9][0-9.]*(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?|Inf|NaN))$", re.M
)
"""A line's last token when it is a number in the form exposition pages write (a sample's
value, or its timestamp); the line's shape is what is left (``_cut``)."""
_MARK = "\0"
"""What stands for a cut-out number in a shape (a page holding it has no shape)."""
_TEMPLATES: dict[tuple[str, str, object], _Template] = {}
"""Page shape, prefix, skipped histograms -> the families read from a page of that shape."""
_TEMPLATES_KEPT = 8
"""Shapes kept (the oldest goes first): one per server watched, and a few spare."""
_SHAPES_SEEN: dict[tuple[str, str, object], None] = {}
"""Shapes read once, without a template yet (the oldest goes first, ``_TEMPLATES_KEPT`` at
most): a template is built for a shape's second page, so a server whose shape keeps
changing (vLLM's ``lora_requests_info`` gains a series for each new set of running LoRA
adapters) does not pay for templates it never uses."""


@dataclass(slots=True)
class _Template:
    """A page's families with each sample's value as the index of a number cut from its shape."""

    numbers: int
    """Numbers a page of this shape has (one per line at most)."""
    families: list[tuple[str, str, list[tuple[str, dict[str, str], int]]]]
    """(name, type, [(sample name, labels, index of its value among the numbers)])."""

    def fill(self, numbers: list[str]) -> list[Family] | None:
        """The families with these values; None when one is no float (the full reading
        says why)."""
        if len(numbers) != self.numbers:
            return None
        try:
            return [
                Family(
                    entry[0],
                    entry[1],
                    [(sn, lb, float(numbers[k]), None) for sn, lb, k in entry[2]],
                    [],
                    entry,
                )
                for entry in self.families
            ]
        except ValueError:
            return None


def _cut(text: str) -> tuple[str, list[str], list[str]] | None:
    """``text`` cut at the numeric last token of each line (``_TAIL``): its shape (the rest,
    ``_MARK`` for each number), the numbers, and the pieces between them; None when
    the text holds ``_MARK`` (its shape could be mistaken for another's)."""
    if _MARK in text:
        return None
    parts = _TAIL.split(text)
    pieces = parts[0::2]
    return _MARK.join(pieces), parts[1::2], pieces


def _template(pieces: list[str], families: list[Family]) -> _Template | None:
    """The template of a page read whole (``families``; ``pieces`` from ``_cut``), or None
    when a sample's value is not its line's last token as ``_TAIL`` finds it (a
    timestamp, a tab, another spelling)."""
    index: dict[int, int] = {}  # line number -> index of its number
    lineno = 1
    for i in range(len(pieces) - 1):
        lineno += pieces[i].count("\n")
        index[lineno] = i
    kept = []
    for fam in families:
        if len(fam.lines) != len(fam.samples):
            return None
        samples = []
        for (sname, labels, _, ts), line in zip(fam.samples, fam.lines, strict=True):
            at = index.get(line)
            if ts is not None or at is None:
                return None
            samples.append((sname, labels, at))
        kept.append((fam.name, fam.type, samples))
    return _Template(len(pieces) - 1, kept)


def forget_pages() -> None:
    """Drop the page templates (the next two pages of each shape are read whole)."""
    _TEMPLATES.clear()
    _SHAPES_SEEN.clear()


def read_families(text: str, prefix: str = "vllm:", skip_histograms: Container[str] = ()) -> list[Family]:
    """The families of ``text`` whose name starts with ``prefix`` (see the module docstring).

    A family named in ``skip_histograms`` is passed over like another prefix's once its
    ``# TYPE`` says histogram: its sample lines (those that start with its name, until the
    next ``# TYPE``/``# HELP`` of another name or another family's sample) are skipped
    unparsed, and a later ``# TYPE`` or ``# HELP`` of its name keeps it skipped.  A vLLM
    page's histograms are most of its lines, and half of them are figures ``parse_scrape``
    never reads.

    A page of a shape read before takes that reading's families with its own numbers
    (the module docstring)."""
    cut = _cut(text)
    key: tuple[str, str, object] | None = None
    if cut is not None:
        key = (cut[0], prefix, skip_histograms)
        try:
            known = _TEMPLATES.get(key)
        except TypeError:  # skip_histograms that cannot be a key: no templates
            key = known = None
        if known is not None:
            families = known.fill(cut[1])
            if families is not None:
                return families
    out = _read(text, prefix, skip_histograms)
    if key is not None and cut is not None:
        if key not in _SHAPES_SEEN:
            _remember(_SHAPES_SEEN, key, None)
            return out
        template = _template(cut[2], out)
        if template is not None:
            _SHAPES_SEEN.pop(key, None)
            _remember(_TEMPLATES, key, template)
    return out


def _remember(kept: dict[tuple[str, str, object], _T], key: tuple[str, str, object], value: _T) -> None:
    """``kept[key] = value``, the oldest entries dropped past ``_TEMPLATES_KEPT``."""
    while len(kept) >= _TEMPLATES_KEPT:
        kept.pop(next(iter(kept)), None)
    kept[key] = value


def _read(text: str, prefix: str, skip_histograms: Container[str]) -> list[Family]:
    """``read_families`` line by line (the full reading)."""
    out: list[Family] = []
    cur: Family | None = None  # the open family, when it is a kept one
    allowed: tuple[str, ...] = ()  # sample names that belong to ``cur``
    skip: str | None = None  # the open family, when it is a histogram to skip
    labels_seen = _LABELS_SEEN  # label text -> parsed labels, kept from page to page
    if len(labels_seen) > _LABELS_KEPT:
        labels_seen.clear()
        labels_seen[""] = {}
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.startswith(prefix):
            if line[:1] in (" ", "\t"):
                line = line.strip()
            if not line:
                continue
            if not line.startswith(prefix):
                if line[0] == "#":
                    parts = line.split(None, 3)
                    if len(parts) > 2 and parts[0] == "#" and parts[1] in ("TYPE", "HELP"):
                        if parts[2] == skip:
                            continue
                        skip = None
                        if parts[2].startswith(prefix):
                            cur, allowed = _directive(out, cur, parts, lineno)
                            if cur is not None and cur.type == "histogram" and cur.name in skip_histograms:
                                if out and out[-1] is cur:  # the open family is the newest
                                    out.pop()
                                skip, cur, allowed = cur.name, None, ()
                        else:
                            cur, allowed = None, ()  # another family opens
                elif line[0] in _NAME_START:
                    cur, allowed, skip = None, (), None  # another family's sample closes the open one
                else:
                    raise ScrapeError(f"line {lineno}: not a metric line: {line[:200]!r}")
                continue
        if skip is not None and line.startswith(skip):
            continue  # a sample of a histogram skipped
        # a sample line of a kept name: parse all of it, whether or not it is kept
        b = line.find("{")
        if b >= 0:  # name{labels} value [timestamp]
            e = line.rfind("}")
            name, rest = line[:b], line[e + 1 :].split()
            if e < b or len(rest) not in (1, 2):
                raise ScrapeError(f"line {lineno}: {_SHAPE}: {line[:200]!r}")
            ltext = line[b + 1 : e]
            labels = labels_seen.get(ltext)
            if labels is None:
                labels = labels_seen[ltext] = _labels(ltext, lineno)
            vtext = rest[0]
        else:  # name value [timestamp]
            rest = line.split()
            if len(rest) not in (2, 3):
                raise ScrapeError(f"line {lineno}: {_SHAPE}: {line[:200]!r}")
            name, vtext = rest[0], rest[1]
            del rest[0]
            labels = labels_seen[""]
        keep = name in allowed
        if not keep:  # only a name of the open family needs no check
            name = name.rstrip(" \t")
            if not _NAME.fullmatch(name):
                raise ScrapeError(f"line {lineno}: invalid metric name {name!r}")
            keep = name in allowed
        if "_" in vtext:
            raise ScrapeError(f"line {lineno}: invalid value {vtext!r}")
        try:
            value = float(vtext)
        except ValueError:
            raise ScrapeError(
                f"line {lineno}: invalid value {vtext!r} (a float, NaN, +Inf or -Inf)"
            ) from None
        ts: int | None = None
        if len(rest) == 2:
            try:
                ts = int(rest[1])
            except ValueError:
                raise ScrapeError(
                    f"line {lineno}: invalid timestamp {rest[1]!r} (integer milliseconds)"
                ) from None
        if keep and cur is not None:
            cur.samples.append((name, labels, value, ts))
            cur.lines.append(lineno)
        else:
            cur, allowed = None, ()  # a sample of no open family closes it (and is not kept)
    return out


def _directive(
    out: list[Family], cur: Family | None, parts: list[str], lineno: int
) -> tuple[Family | None, tuple[str, ...]]:
    """A ``# TYPE`` or ``# HELP`` line of a kept family, split in (up to) four words."""
    word, name = parts[1], parts[2]
    if cur is None or cur.name != name:
        if name not in _NAMES_SEEN and not _valid_name(name):
            raise ScrapeError(f"line {lineno}: invalid metric name {name!r} in # {word}")
        if word == "HELP":
            cur = Family(name, "untyped")
            out.append(cur)
            return cur, (name,)
        cur = None
    elif word == "HELP":
        return cur, _allowed(name, cur.type)
    if len(parts) < 4:
        raise ScrapeError(f"line {lineno}: # TYPE {name} without a type")
    typ = parts[3].rstrip()
    if typ not in TYPES:
        raise ScrapeError(
            f"line {lineno}: unknown type {typ!r} for {name} (format 0.0.4 knows {', '.join(TYPES)})"
        )
    if cur is None:
        cur = Family(name, typ)
        out.append(cur)
    cur.type = typ
    return cur, _allowed(name, typ)


def _valid_name(name: str) -> bool:
    """Whether ``name`` is a metric name (remembered in ``_NAMES_SEEN`` when it is)."""
    if not _NAME.fullmatch(name):
        return False
    if len(_NAMES_SEEN) > _LABELS_KEPT:
        _NAMES_SEEN.clear()
    _NAMES_SEEN.add(name)
    return True


def _allowed(name: str, typ: str) -> tuple[str, ...]:
    """The sample names of a family ``name`` of type ``typ``."""
    allowed = _ALLOWED_SEEN.get((name, typ))
    if allowed is not None:
        return allowed
    if typ == "histogram":
        allowed = (name + "_bucket", name + "_count", name + "_sum")
    elif typ == "summary":
        allowed = (name, name + "_count", name + "_sum")
    else:
        allowed = (name,)
    if len(_ALLOWED_SEEN) > _LABELS_KEPT:
        _ALLOWED_SEEN.clear()
    _ALLOWED_SEEN[(name, typ)] = allowed
    return allowed


def _labels(text: str, lineno: int) -> dict[str, str]:
    """The labels between the braces of a sample line."""
    if _PLAIN_LABELS.fullmatch(text):  # the common form: no blanks, no escapes (so no quote in a value)
        pairs = _PAIR.findall(text)
        labels = dict(pairs)
        if len(labels) != len(pairs):
            raise ScrapeError(f"line {lineno}: a label given twice in {{{text[:200]}}}")
        return labels
    labels = {}
    pos, end = 0, len(text)
    while pos < end:
        m = _LABEL.match(text, pos)
        if m is None:
            if not text[pos:].strip():
                break
            raise ScrapeError(f"line {lineno}: malformed labels at {text[pos : pos + 80]!r}")
        key, raw = m.group(1), m.group(2)
        if key in labels:
            raise ScrapeError(f"line {lineno}: label {key!r} given twice")
        labels[key] = _unescape(raw, lineno) if "\\" in raw else raw
        pos = m.end()
    return labels


def _unescape(raw: str, lineno: int) -> str:
    def one(m: re.Match[str]) -> str:
        c = _UNESCAPED.get(m.group(1))
        if c is None:
            raise ScrapeError(f"line {lineno}: invalid escape \\{m.group(1)} in a label value")
        return c

    return _ESCAPE.sub(one, raw)
