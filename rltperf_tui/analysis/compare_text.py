"""``rltperf compare`` as text: the result dict of ``compare_recordings`` or
``compare_bundles``, configuration differences first."""

from __future__ import annotations

import textwrap
from typing import Any

from rltperf_tui.analysis import stats as S
from rltperf_tui.analysis.gate import gate_lines
from rltperf_tui.elide import elide

_f = S.fmt


def _config_lines(res: dict[str, Any]) -> list[str]:
    """The configuration differences, values in full: a value too long for its column
    is given its own lines rather than cut."""
    L = ["configuration differences (listed first):"]
    if not res["config_differences"]:
        L.append("  none — " + res["config_note"])
    else:
        for d in res["config_differences"]:
            name, va, vb = d["field"], str(d["a"]), str(d["b"])
            if len(name) <= 34 and len(va) <= 30 and len(vb) <= 40:
                L.append(f"  {name:<34} A: {va:<30}  B: {vb}")
            else:
                L.append(f"  {name}")
                for lab, v in (("A", va), ("B", vb)):
                    wrapped = textwrap.wrap(v, 96, break_on_hyphens=False, break_long_words=False) or [""]
                    L.append(f"    {lab}: {wrapped[0]}")
                    L += [f"       {w}" for w in wrapped[1:]]
        L.append("  → " + res["config_note"])
    return L


def render_text(res: dict[str, Any]) -> str:
    """A comparison as text."""
    L: list[str] = []
    if res["kind"] == "recordings":
        L += _recording_lines(res)
    else:
        L += _bundle_lines(res)
    for w in res["warnings"]:
        L.append(f"warning: {w}")
    if res["kind"] == "recordings":
        L.append("")
        L.append("method: " + res["method"])
    L.append("scope: " + res["scope"])
    for p in res.get("pngs", []):
        L.append(f"wrote {p}")
    for s in res.get("png_skipped", []):
        L.append(f"not drawn: {s}")
    if "gate" in res:  # last, where a CI log ends
        L.append("")
        L += gate_lines(res["gate"])
    return "\n".join(L)


def _recording_lines(res: dict[str, Any]) -> list[str]:
    """Two recordings (or rounds): sides, configuration, the metric table, why each
    verdict, stages, drift and rounds."""
    L: list[str] = []
    for lab in ("a", "b"):
        s = res[lab]
        rw = " [random weights]" if s["random_weights"] else ""
        L.append(
            f"{lab.upper()}: {', '.join(s['recordings'])} — {s['engine']}{rw}, {s['steps']} steps"
            f" ({s['steps_excluded']} profiled/warm-up left out), {s['requests_ok']} requests ok,"
            f" {s['requests_failed']} failed"
        )
    L += _config_lines(res)
    L.append("")
    L.append(f"{'metric':<18} {'A':>10} {'B':>10} {'B-A':>10} {'rel':>8}  {'95% CI of B-A':<24} verdict")
    for m in res["metrics"]:
        ci = S.fmt_ci(*m["ci95"])
        name = m["metric"] + ("" if m["unit"] in ("fraction",) else f" {m['unit']}")
        L.append(
            f"{elide(name, 18):<18} {S.fmt(m['a']):>10} {S.fmt(m['b']):>10} {S.fmt(m['diff']):>10} "
            f"{S.fmt_rel(m['rel_diff']):>8}  {ci:<24} {m['verdict']}"
        )
    L.append("")
    L += res["summary"]
    # every verdict short of significant says which condition it failed, with the numbers
    why = [m for m in res["metrics"] if not m["significant"] and m["reason"]]
    if why:
        L.append("why not significant:")
        for m in why:
            said = m["reason"] if m["failed"] else f"{m['verdict']} — {m['reason']}"
            L.append(f"  {m['metric']}: {said}")
    if res["stages_ms_mean"]:
        L.append("")
        L.append("mean stage time per step (ms)     A          B        B-A")
        for n, r in res["stages_ms_mean"].items():
            L.append(f"  {elide(n, 28):<28} {_f(r['a']):>9} {_f(r['b']):>10} {_f(r['diff']):>10}")
    dr = res["drift"]
    for m in res["metrics"]:
        if "segment_spread" in m:
            L.append(
                f"drift check {m['metric']}: quarters of a recording differ by up to "
                f"{S.fmt(m['segment_spread'])} {m['unit']} vs |B-A| {S.fmt(abs(m['diff']))} → {m['verdict']}"
            )
    if len(res["a"]["recordings"]) == 1:
        L.append(
            "one recording per side: run-to-run variation is estimated from inside each recording (time "
            "blocks, quarters); interleaved rounds (A B A B ...) establish small differences better"
        )
    if dr["rounds"]:
        bad = [r["key"] for r in dr["rounds"]["metrics"] if not r["consistent_sign"]]
        L.append(
            f"rounds: {dr['rounds']['n']} interleaved A/B rounds; "
            + (
                f"the difference changes sign across rounds for {', '.join(bad)}"
                if bad
                else "every round's difference has the same sign"
            )
        )
    return L


def _bundle_lines(res: dict[str, Any]) -> list[str]:
    """Two bundles: sides, configuration, step time, idle, stages and operators (profiled)."""
    L: list[str] = []
    L.append(f"A: {res['a']['bundle']} ({res['a']['mode']}, {res['a']['steps_found']} steps)")
    L.append(f"B: {res['b']['bundle']} ({res['b']['mode']}, {res['b']['steps_found']} steps)")
    L += _config_lines(res)
    L.append("PROFILED: " + res["note"])
    L.append("")
    sa, sb = res["step_ms"]["a"], res["step_ms"]["b"]
    L.append(f"step ms p50   A {_f(sa['p50'])}   B {_f(sb['p50'])}   (profiled)")
    idl = res["idle_fraction"]
    L.append(f"idle fraction A {_f(idl['a'], '{:.1%}')}   B {_f(idl['b'], '{:.1%}')}")
    if res["stages_ms_mean"]:
        L.append("mean stage ms per step            A          B        B-A")
        for n, r in res["stages_ms_mean"].items():
            L.append(f"  {elide(n, 28):<28} {_f(r['a']):>9} {_f(r['b']):>10} {_f(r['diff']):>10}")
    for title, key in (("host operators", "host_ops"), ("device activities", "device_ops")):
        rows = res.get(key)
        if not rows:
            continue
        L.append(f"{title} by |Δ self ms per step|   A ms/step  B ms/step   Δ ms/step   A n/step  B n/step")
        for r in rows:
            only = f"  (only in {r['only_in']})" if r["only_in"] else ""
            L.append(
                f"  {elide(r['name'], 32):<32} {r['a_ms_per_step']:>10.4f} {r['b_ms_per_step']:>10.4f} "
                f"{r['diff_ms_per_step']:>+11.4f} {r['a_count_per_step']:>9.2f} {r['b_count_per_step']:>9.2f}{only}"
            )
    return L
