"""The capture bundle's format: its name, how it is sealed, its ``meta.json`` as a struct.

Two writers make bundles (the probe, ``engine_adapters.probe.bundle``; the vLLM path,
``engine_adapters.monitor.vllm.capture``) and the offline tools read them
(``rltperf_tui.analysis.report``).  Everything they share is defined here once:

- what a capture request may ask for: ``capture_request_problem`` (id, mode, N; N at
  most ``records.MAX_CAPTURE_STEPS`` on every path);
- the folder name, ``<UTC time>_<engine>_<mode>_<N>steps[_<label>]`` (``bundle_name``),
  written under a temporary name (``temp_bundle_dir``) and renamed when complete
  (``seal_bundle``: never replacing a bundle);
- ``meta.json``: ``BundleMeta`` with its ``CaptureMeta``.  Fields one writer has and the
  other has not default to ``UNSET`` and are left out of the file, so each writer's
  ``meta.json`` keeps exactly the keys (and order) it always had; bundles written before
  this struct existed decode into it (``tests/engine_adapters/definitions/data/meta_*_v1.json``);
- reading it back: ``read_meta`` (the file, the typed struct when it fits, a sentence
  when it cannot be read) and ``missing_meta_fields`` (what a report must say is missing).
"""

from __future__ import annotations

import errno
import json
import os
import re
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from engine_adapters.definitions.records import (
    CAPTURE_ID_PATTERN,
    MAX_CAPTURE_STEPS,
    SCHEMA_VERSION,
    CaptureDone,
    CaptureFailed,
    EngineInfo,
    to_builtins,
)

__all__ = [
    "BUNDLE_FORMAT",
    "CAPTURE_MODES",
    "MAX_CAPTURE_STEPS",
    "META_FILE",
    "OPTIONAL_META",
    "REQUIRED_META",
    "BundleMeta",
    "CaptureMeta",
    "MetaRead",
    "bundle_name",
    "capture_id_problem",
    "capture_request_problem",
    "missing_meta_fields",
    "new_meta",
    "os_error_text",
    "post_outcome",
    "read_meta",
    "sanitize_label",
    "seal_bundle",
    "temp_bundle_dir",
]

BUNDLE_FORMAT = 1
"""Version of the bundle layout, in ``meta.json``."""
META_FILE = "meta.json"
CAPTURE_MODES = ("ops", "full")
"""``ops``: CPU (+ device) activities only; ``full``: shapes, memory and stacks too."""
_CAPTURE_ID_RE = re.compile(CAPTURE_ID_PATTERN)

# ---------------------------------------------------------------------------- requests


def capture_id_problem(capture_id: object) -> str | None:
    """Why ``capture_id`` is not acceptable (it becomes part of file names), or None."""
    if isinstance(capture_id, str) and _CAPTURE_ID_RE.fullmatch(capture_id):
        return None
    return (
        f"invalid capture id {str(capture_id)[:80]!r}: use 1 to 64 letters, digits, '_' or '-' "
        "(starting with a letter or digit)"
    )


def capture_request_problem(steps: int, mode: str, capture_id: str | None = None) -> str | None:
    """A reason to refuse a capture of ``steps`` steps in ``mode`` (and ``capture_id``,
    when given), or None.  The one check every capture path makes."""
    if capture_id is not None:
        bad = capture_id_problem(capture_id)
        if bad:
            return bad
    if mode not in CAPTURE_MODES:
        return f"unknown capture mode {mode!r}: use 'ops' or 'full'"
    if not 1 <= steps <= MAX_CAPTURE_STEPS:
        return f"capture length {steps} out of range: 1 to {MAX_CAPTURE_STEPS} steps"
    return None


def sanitize_label(label: str | None) -> str:
    """A label safe for a folder name: letters, digits, ``.``, ``_``, ``-``; at most 40."""
    if not label:
        return ""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-.")[:40]


# ---------------------------------------------------------------------------- naming and sealing


def bundle_name(engine: str, mode: str, steps: int, label: str, when: float | None = None) -> str:
    """``<UTC time>_<engine>_<mode>_<N>steps[_<label>]``, safe for a folder name."""
    ts = datetime.fromtimestamp(when or time.time(), tz=timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    name = f"{ts}_{sanitize_label(engine) or 'engine'}_{mode}_{steps}steps"
    return f"{name}_{label}" if label else name


def temp_bundle_dir(root: str, capture_id: str) -> str:
    """Where a bundle is written before ``seal_bundle`` names it (a dot folder: listings
    and the snapshot budget skip it)."""
    return os.path.join(root, f".tmp-{capture_id}-{os.getpid()}")


def os_error_text(exc: OSError, what: str) -> str:
    """A sentence for a failed write of ``what`` that says what to do."""
    if exc.errno == errno.ENOSPC:
        return f"disk full while writing {what} ({exc.filename or ''}): free space or capture fewer steps"
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"cannot write {what}: {exc.strerror} ({exc.filename or ''}); choose a writable snapshot root"
    return f"cannot write {what}: {exc}"


def _rename_unique(tmp: str, final: str) -> str:
    """Rename ``tmp`` to ``final`` or ``final-2``, ``-3``...; never replaces a bundle."""
    candidate = final
    for i in range(2, 1000):
        if not os.path.exists(candidate):
            try:
                os.rename(tmp, candidate)
                return candidate
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
        candidate = f"{final}-{i}"
    raise OSError(errno.EEXIST, "no free bundle name", final)


def seal_bundle(tmp: str, final: str, meta: BundleMeta) -> str:
    """Write ``meta.json`` into the temp folder and rename it to a new bundle name
    (never replacing one); returns the bundle path.  Raises ``OSError``."""
    with open(os.path.join(tmp, META_FILE), "w", encoding="utf-8") as f:
        json.dump(meta_builtins(meta), f, indent=2, default=str)
        f.write("\n")
    return _rename_unique(tmp, final)


def post_outcome(
    job: Any,
    path: str,
    post: Callable[[Any], None],
    *,
    steps_captured: int,
    trace_bytes: int,
    events: int,
    export_s: float,
    note: str | None = None,
    via: str | None = None,
) -> None:
    """After ``seal_bundle``: a job that met an error is failed (its bundle kept and named),
    otherwise saved; set its state and post ``CaptureFailed`` or ``CaptureDone``."""
    if job.error:
        job.state = "failed"
        post(CaptureFailed(capture_id=job.capture_id, reason=job.error, bundle=path))
        return
    job.state = "saved"
    post(
        CaptureDone(
            capture_id=job.capture_id,
            bundle=path,
            steps_requested=job.steps,
            steps_captured=steps_captured,
            trace_bytes=trace_bytes,
            events=events,
            export_s=round(export_s, 4),
            mode=job.mode,
            note=note,
            via=via,
        )
    )


# ---------------------------------------------------------------------------- meta.json


class CaptureMeta(msgspec.Struct, kw_only=True):
    """``meta.json`` ``capture``: what was asked for and what the bundle holds.

    The field order is the file's key order; ``UNSET`` fields belong to one writer only
    (probe: ``profiler_warmup_step``, ``export_in``, ``engine_cost``, ``complete``, ``partial_reason``;
    vLLM: the server's profiler facts) and are left out of the other's file.
    """

    capture_id: str
    label: str | None
    via: str | UnsetType = UNSET
    """How the capture was taken, when not by the probe (vLLM's own profiler)."""
    mode: str
    mode_honoured: bool | UnsetType | None = UNSET
    mode_note: str | UnsetType | None = UNSET
    requested: dict[str, bool] | UnsetType = UNSET
    steps_requested: int
    steps_captured: int
    step_ids: list[int]
    """Engine step ids of the captured steps (the probe's ``StepRecord.step_id``)."""
    profiler_warmup_step: int | UnsetType | None = UNSET
    step_ids_note: str | UnsetType = UNSET
    steps_note: str | UnsetType = UNSET
    """Probe: why ``steps.jsonl`` lacks some of the window's step records (absent when it has them all)."""
    step_annotations: list[dict[str, Any]] | UnsetType = UNSET
    record_shapes: bool
    profile_memory: bool
    with_stack: bool
    with_flops: bool | UnsetType = UNSET
    settings_source: str | UnsetType = UNSET
    activities: list[str]
    device_trace: bool
    cold: bool
    """The profiler initialised during this capture (its first use: slower steps)."""
    cold_basis: str | UnsetType = UNSET
    start_call_s: float | UnsetType = UNSET
    stop_call_s: float | UnsetType = UNSET
    export_s: float
    export_in: str | UnsetType | None = UNSET
    """``child`` (forked export) or ``thread`` (the fallback; stalls the engine)."""
    trace_read_s: float | UnsetType = UNSET
    engine_cost: dict[str, float] | UnsetType = UNSET
    """Probe: what the capture cost the engine process (``CaptureJob.costs``): the
    profiler's start and stop on the engine thread, the release of its results, in ms,
    wall and that thread's CPU time."""
    trace_bytes: int
    events: int
    error: str | None
    complete: bool | UnsetType = UNSET
    partial_reason: str | UnsetType | None = UNSET
    requested_ns: int | None
    window_start_ns: int | None
    window_end_ns: int | None
    engine_steps_at_start: float | UnsetType | None = UNSET
    profile_prefix: str | UnsetType = UNSET
    server_profiler_dir: str | UnsetType | None = UNSET
    server_files: dict[str, int] | UnsetType = UNSET
    trace_vllm_version: str | UnsetType | None = UNSET
    ranks: dict[str, Any] | UnsetType = UNSET
    """vLLM path: the ranks the capture expected, holds and misses, and each one's trace
    file (``definitions.ranks.ranks_held``)."""


class BundleMeta(msgspec.Struct, kw_only=True):
    """A bundle's ``meta.json`` (``new_meta`` fills the format, version and time)."""

    bundle_format: int
    rltperf_version: str
    schema: int
    created_utc: str
    profiled: bool
    note: str
    engine: dict[str, Any]
    """``EngineInfo`` with every field (``records.to_builtins``)."""
    stage_names: list[str]
    capture: CaptureMeta
    live_at_trigger: dict[str, Any]
    """Figures at the moment the capture was requested."""
    trigger: dict[str, Any] | None
    """The trigger rule that asked for the capture (``TriggerInfo``), or None; with
    ``delay_steps`` and ``delay_ms`` from the offending step's end to the first captured
    step (the profiler's warm-up step is not counted as captured)."""
    ceiling: dict[str, Any] | UnsetType | None = UNSET
    """The device ceiling the probe knew (the report's roofline); the vLLM path has none."""
    contract: dict[str, Any]
    files: dict[str, str]
    """Files of the bundle and what each holds."""
    energy: dict[str, Any] | UnsetType | None = UNSET
    """The device energy counter over ``steps.jsonl``'s steps: ``readings`` (``{"kind:index":
    [[ts_ns, joules], ...]}``, the probe's clock), ``source`` (``nvml`` / ``rapl``) and
    ``reason`` when there are none (``definitions.energy``)."""


def new_meta(
    *,
    note: str,
    engine: EngineInfo,
    stage_names: list[str],
    capture: CaptureMeta,
    live_at_trigger: dict[str, Any],
    trigger: dict[str, Any] | None,
    contract: dict[str, Any],
    files: dict[str, str],
    ceiling: dict[str, Any] | UnsetType | None = UNSET,
    energy: dict[str, Any] | UnsetType | None = UNSET,
) -> BundleMeta:
    """A ``BundleMeta`` of this rltperf, written now, of profiled timings."""
    from engine_adapters import __version__

    return BundleMeta(
        bundle_format=BUNDLE_FORMAT,
        rltperf_version=__version__,
        schema=SCHEMA_VERSION,
        created_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        profiled=True,
        note=note,
        engine=to_builtins(engine),
        stage_names=stage_names,
        capture=capture,
        live_at_trigger=live_at_trigger,
        trigger=trigger,
        ceiling=ceiling,
        contract=contract,
        files=files,
        energy=energy,
    )


def meta_builtins(meta: BundleMeta) -> dict[str, Any]:
    """``meta`` as the JSON object written to ``meta.json`` (``UNSET`` fields left out)."""
    out: dict[str, Any] = msgspec.to_builtins(meta, enc_hook=str)
    return out


class MetaRead(msgspec.Struct, kw_only=True):
    """What ``read_meta`` found."""

    raw: dict[str, Any] | None = None
    """The JSON object as read (None when it could not be read)."""
    meta: BundleMeta | None = None
    """The same as a ``BundleMeta``, when every field is there with its type."""
    problem: str | None = None
    """Why there is no ``raw`` (missing, unreadable, not JSON, not an object)."""
    invalid: str | None = None
    """Why ``raw`` is not a ``BundleMeta`` (a field missing or of the wrong type)."""


def read_meta(folder: str) -> MetaRead:
    """Read ``folder/meta.json``: the object, the typed struct where it fits, and a
    sentence for a report when it cannot be read.  Never raises for a bad file."""
    path = os.path.join(folder, META_FILE)
    if not os.path.exists(path):
        return MetaRead(problem="meta.json is missing: what was requested and the test contract are unknown")
    try:
        with open(path, encoding="utf-8") as f:
            loaded = json.load(f)  # json, not msgspec: files of older writers may hold NaN
    except ValueError as exc:
        return MetaRead(problem=f"meta.json is not valid JSON ({exc}): the file is cut or damaged")
    except OSError as exc:
        return MetaRead(problem=f"meta.json cannot be read: {exc.strerror}")
    if not isinstance(loaded, dict):
        return MetaRead(problem="meta.json is not a JSON object")
    try:
        return MetaRead(raw=loaded, meta=msgspec.convert(loaded, BundleMeta))
    except msgspec.ValidationError as exc:
        return MetaRead(raw=loaded, invalid=str(exc))


REQUIRED_META: tuple[tuple[str, ...], ...] = (
    ("capture",),
    ("capture", "steps_requested"),
    ("capture", "steps_captured"),
    ("capture", "mode"),
    ("capture", "error"),
    ("engine",),
    ("engine", "name"),
    ("contract",),
)
"""meta.json fields without which the bundle cannot be judged complete."""
OPTIONAL_META: tuple[tuple[str, ...], ...] = (
    ("capture", "step_ids"),
    ("capture", "export_s"),
    ("capture", "trace_bytes"),
    ("capture", "events"),
    ("stage_names",),
    ("live_at_trigger",),
)
"""meta.json fields a report notes the absence of."""


def _has(d: Any, path: tuple[str, ...]) -> bool:
    cur = d
    for k in path:
        if not isinstance(cur, dict) or k not in cur:
            return False
        cur = cur[k]
    return True


def missing_meta_fields(raw: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The ``REQUIRED_META`` and then the ``OPTIONAL_META`` fields ``raw`` lacks, dotted
    (``capture.steps_requested``)."""
    required = [".".join(fp) for fp in REQUIRED_META if not _has(raw, fp)]
    optional = [".".join(fp) for fp in OPTIONAL_META if not _has(raw, fp)]
    return required, optional
