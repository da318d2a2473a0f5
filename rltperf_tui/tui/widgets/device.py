"""Device: event-based idle fraction beside NVML utilisation, and the idle-gap list."""

from __future__ import annotations

from engine_adapters.definitions.energy import SHORT
from engine_adapters.definitions.figures import QUIET_AFTER_S
from rltperf_tui.elide import elide
from rltperf_tui.live.window_stats import Window
from rltperf_tui.tui.widgets._fmt import Lines, ms, pct, size
from rltperf_tui.tui.widgets.panel import Panel, PanelContext


def gap_rows(height: int) -> int:
    """Idle gaps the panel can list at a content ``height`` (without GPU lines), plus one
    to know there are more (the view keeps this many)."""
    return max(1, max(1, height) - 4) + 1


def energy_line(ln: Lines, w: Window, width: int) -> None:
    """Power, joules per output token and per step from the device's energy counter,
    with the counter's source; or why there are none (never an estimate)."""
    ln.add("energy    ", "$text-muted")
    if w.power_w is None:
        ln.add(elide(w.energy_na or "no energy counter", max(10, width - 10)), "$text-muted").nl()
        return
    ln.add(f"{w.power_w:>5.0f} W ", "bold")
    if w.joules_per_token is not None:
        ln.add(f"{w.joules_per_token:.3g} J/tok ", "bold")
    if w.joules_per_step is not None:
        ln.add(f"{w.joules_per_step:.3g} J/step ")
    ln.add(f"({SHORT.get(w.energy_source or '', w.energy_source or '?')})", "$text-muted").nl()


class DevicePanel(Panel):
    """Idle fraction = 1 - Σ busy / W from the probe's device events; NVML's utilisation
    (share of a 1/6-1 s period with any kernel running) is shown beside it as a coarse
    cross-check.  Gaps between steps over the threshold are listed with the stage that
    grew most in the step before each gap.  The energy line: mean power over the window's
    baseline time from the device's own energy counter, joules per output token and per
    step (``definitions/energy.py``)."""

    DEFAULT_CSS = """
    DevicePanel { height: 10; }
    """

    def panel_title(self, ctx: PanelContext) -> str:
        return f"Device · idle = 1 - Σbusy/W (probe events) · {ctx.window_span}"

    def body(self, ctx: PanelContext, width: int, height: int) -> Lines:
        st = ctx.stats
        w = ctx.window
        ln = Lines()
        bw = max(6, min(24, width - 42))
        ln.add("idle      ", "$text-muted")
        ln.add(f"{pct(w.idle_fraction):>6} ", "bold")
        ln.bar(w.idle_fraction, bw, "$warning")
        if ctx.silent_s is not None:
            ln.add(f" stale: nothing heard for {ctx.silent_s:.0f} s", "bold $error").nl()
        elif st.quiet_s >= QUIET_AFTER_S:
            ln.add(f" · no steps for {st.quiet_s:.0f} s", "bold $warning").nl()
        else:
            ln.add(f" busy known {w.busy_known_steps:,}/{w.steps:,}", "$text-muted").nl()
        gpus = sorted((k, d) for k, d in st.devices.items() if k[0] == "cuda")
        nvml = st.gpu_util_mean
        ln.add("NVML util ", "$text-muted")
        if nvml is None:
            note = st.device_notes[0] if st.device_notes else "no GPU sampled"
            ln.add(f"{'n/a':>6} ", "bold").add(f"({note})", "$text-muted")
        else:
            ln.add(f"{pct(nvml):>6} ", "bold").add("coarse: time any kernel ran", "$text-muted")
        ln.nl()
        energy_line(ln, w, width)
        for (_kind, index), d in gpus[:2]:
            ln.add(f"gpu{index} ", "$text-muted").add(elide(d.name, 24) + " ")
            if d.dram_bw_util is not None:
                ln.add("DRAM ", "$text-muted").add(pct(d.dram_bw_util) + " ")
            if d.mem_used is not None and d.mem_total:
                ln.add("mem ", "$text-muted").add(f"{size(d.mem_used)}/{size(d.mem_total)} ")
            if d.power_w is not None:
                ln.add(f"{d.power_w:.0f} W ")
            if d.sm_clock_mhz is not None:
                ln.add(f"{d.sm_clock_mhz:.0f} MHz", "$text-muted")
            ln.nl()
        thr = st.idle_gap_threshold_ms
        room = max(1, height - 4 - len(gpus[:2]))
        gaps = list(st.idle_gaps[: room + 1])  # newest first
        ln.add(f"idle gaps > {ms(thr)} ms: ", "$text-muted")
        if gaps:
            more = len(gaps) > room
            gaps = gaps[:room]
            ln.add(f"{'more than ' if more else ''}{len(gaps)}, newest first", "$text-muted")
        else:
            ln.add("none", "$text-muted")
        ln.nl()
        p50 = w.step_ms["p50"]
        for g in gaps:
            ago = (st.now_ns - g.at_ns) / 1e9
            ln.add(f"t-{ago:.1f} s".rjust(9) + " ", "$text-muted")
            ln.add(f"{ms(g.length_ms):>7} ms", "bold $warning")
            ln.add(f" after #{g.after_step}", "$text-muted")
            # name the stage only when it grew by something worth reading (>= 5% of a step)
            if g.grown_stage and g.grown_ms is not None and g.grown_ms >= max(0.01, 0.05 * (p50 or 0.0)):
                ln.add(" grew: ", "$text-muted").add(f"{g.grown_stage} +{ms(g.grown_ms)}")
            ln.nl()
        return ln
