"""``rltperf compare`` of two capture bundles: operator, stage and step differences that
locate where time moved.  Both sides are profiled: not a speed-up claim."""

from __future__ import annotations

from typing import Any

from rltperf_tui.analysis.compare_inputs import SCOPE, bundle_config_note, check_distinct, config_diff


def compare_bundles(a_path: str, b_path: str, top: int = 20) -> dict[str, Any]:
    """Operator, stage and step differences between two capture bundles (profiled)."""
    from rltperf_tui.analysis.report import analyze_bundle

    check_distinct([a_path, b_path])
    A = analyze_bundle(a_path)
    B = analyze_bundle(b_path)
    ra, rb = A.report, B.report
    warnings: list[str] = []
    ca = ra.get("contract") or {}
    cb = rb.get("contract") or {}
    # how each side was captured comes first: a mode or window difference changes every
    # figure below without any engine difference
    capture_diff = config_diff(
        {"capture.mode": ra.get("mode"), "capture.steps (N)": ra.get("steps_requested")},
        {"capture.mode": rb.get("mode"), "capture.steps (N)": rb.get("steps_requested")},
    )
    cdiff = capture_diff + config_diff(
        {k: v for k, v in ca.items() if k != "profiled"}, {k: v for k, v in cb.items() if k != "profiled"}
    )
    if not ca or not cb:
        warnings.append("a contract is missing: configuration differences cannot be listed in full")
    for lab, r in (("A", ra), ("B", rb)):
        if not r["complete"]:
            more = len(r["problems"]) - 3
            warnings.append(
                f"{lab} is incomplete ({'; '.join(r['problems'][:3])}"
                f"{f'; and {more} more' if more > 0 else ''}): what is missing there is "
                "not a saving or a cost"
            )
    if ra.get("mode") != rb.get("mode"):
        warnings.append(
            f"A was captured in {ra.get('mode')} mode and B in {rb.get('mode')} mode: full mode records more "
            "and runs slower; that is not an engine difference — compare matching modes"
        )
    if ra.get("steps_found") != rb.get("steps_found"):
        warnings.append(
            f"the windows differ ({ra.get('steps_found')} vs {rb.get('steps_found')} steps): figures "
            "are per step"
        )
    na = ra.get("steps_found") or 1
    nb = rb.get("steps_found") or 1

    stages = {}
    for name in list(ra["stage_ms"]) + [n for n in rb["stage_ms"] if n not in ra["stage_ms"]]:
        sa = (ra["stage_ms"].get(name) or {}).get("mean")
        sb = (rb["stage_ms"].get(name) or {}).get("mean")
        stages[name] = {"a": sa, "b": sb, "diff": (sb - sa) if sa is not None and sb is not None else None}
    ia, ib = ra.get("idle_fraction"), rb.get("idle_fraction")
    return {
        "kind": "bundles",
        "a": {
            "bundle": ra["bundle"],
            "mode": ra["mode"],
            "steps_found": ra["steps_found"],
            "complete": ra["complete"],
        },
        "b": {
            "bundle": rb["bundle"],
            "mode": rb["mode"],
            "steps_found": rb["steps_found"],
            "complete": rb["complete"],
        },
        "config_differences": cdiff,
        "same_configuration": not cdiff,
        "config_note": bundle_config_note(capture_diff, cdiff[len(capture_diff) :]),
        "profiled": True,
        "note": (
            "Both sides are profiled captures: these differences show where time moved, not a speed-up; "
            "claim gains only from unprofiled recordings."
        ),
        "step_ms": {"a": ra["step_ms"], "b": rb["step_ms"]},
        "stages_ms_mean": stages,
        "idle_fraction": {"a": ia, "b": ib, "diff": (ib - ia) if ia is not None and ib is not None else None},
        "host_ops": _op_rows(A.host_ops, B.host_ops, na, nb, top),
        "device_ops": _op_rows(A.device_ops, B.device_ops, na, nb, top)
        if (A.device_ops or B.device_ops)
        else None,
        "warnings": warnings,
        "scope": SCOPE,
        "_analyses": (A, B),
    }


def _op_rows(oa: list[Any], ob: list[Any], na: int, nb: int, top: int) -> list[dict[str, Any]]:
    """Operators of A and B per step (self time, count), largest |difference| first."""
    ma = {o.name: o for o in oa}
    mb = {o.name: o for o in ob}
    rows = []
    for name in set(ma) | set(mb):
        x, y = ma.get(name), mb.get(name)
        sa = x.self_us / 1e3 / na if x else 0.0
        sb = y.self_us / 1e3 / nb if y else 0.0
        ka = x.count / na if x else 0.0
        kb = y.count / nb if y else 0.0
        rows.append(
            {
                "name": name,
                "a_ms_per_step": round(sa, 5),
                "b_ms_per_step": round(sb, 5),
                "diff_ms_per_step": round(sb - sa, 5),
                "a_count_per_step": round(ka, 3),
                "b_count_per_step": round(kb, 3),
                "diff_count_per_step": round(kb - ka, 3),
                "only_in": "A" if y is None else "B" if x is None else None,
            }
        )
    rows.sort(key=lambda r: abs(r["diff_ms_per_step"]), reverse=True)
    return rows[:top]
