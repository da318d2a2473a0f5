"""Target header: what is attached, its state, and the headline figures."""

from __future__ import annotations

from engine_adapters.definitions.figures import QUIET_AFTER_S
from engine_adapters.definitions.ranks import identity_text
from engine_adapters.definitions.records import EngineInfo
from engine_adapters.definitions.server_window import MetricsWindow
from rltperf_tui.live.window_stats import Window
from rltperf_tui.tui.widgets._fmt import NA, Lines, ms, pct, si
from rltperf_tui.tui.widgets.panel import Panel, PanelContext

STATE_STYLE = {
    "connected": "bold $success",
    "connecting": "bold $warning",
    "reconnecting": "bold $warning",
    "waiting": "bold $warning",
    "ended": "bold $text-muted",
    "error": "bold $error",
}


class TargetHeader(Panel):
    """Target, engine, model, dtype, loop/exit config, connection state, drops, and a
    RANDOM WEIGHTS badge when the engine says its weights are random."""

    DEFAULT_CSS = """
    TargetHeader { height: 5; }
    """

    def panel_title(self, ctx: PanelContext) -> str:
        return ctx.target

    def body(self, ctx: PanelContext, width: int, height: int) -> Lines:
        st = ctx.stats
        info = st.info
        w = ctx.window
        ln = Lines()
        state = st.state
        if state == "reconnecting" and st.hello is None:
            state = "waiting"  # never connected yet: the engine may still be starting
        if ctx.silent_s is not None:
            ln.add(f"● hung? no heartbeat for {ctx.silent_s:.0f} s", "bold reverse $error")
        else:
            ln.add("● " + state, STATE_STYLE.get(state, "bold"))
        if ctx.replay and state != "ended":
            ln.add(" (replay)", "$text-muted")
        ln.add("  ")
        if info is not None and info.random_weights:
            # first, so that no width truncates it away
            ln.add(" RANDOM WEIGHTS ", "bold reverse $error").add("  ")
        if info is None:
            ln.add("no engine hello yet", "$text-muted")
        else:
            # what the engine said; on a server seen over HTTP, what it cannot say is left out
            said = [(info.model, "model ?"), (info.dtype, "dtype ?")]
            if info.quantization and info.quantization != "none":
                said.append((info.quantization, ""))
            said.append((info.device, "device ?"))
            parts = [info.name + (f" {info.version}" if info.version else "")]
            parts += [v or unknown for v, unknown in said if v or not st.scrapes_only]
            ln.add(" · ".join(parts), "bold")
            ident = identity_text(info.dp_rank, info.tp_size, info.pp_size, info.host)
            if ident and (info.dp_rank is not None or (info.tp_size or 1) > 1):
                ln.add(" · " + ident, "$text-muted")
        ln.nl()
        if info is not None and st.scrapes_only:
            _server_config(ln, info, width)
        elif info is not None:
            # the engine's hello is all it will say: what it left out is not shown as n/a
            config: list[tuple[str, str | None]] = [
                ("loops ", info.loop_config or (f"max {info.max_loops}" if info.max_loops else None)),
                ("exit ", info.exit_config),
                ("KV ", info.kv_policy),
                ("spec ", info.spec_config or "off"),
                ("workload ", info.workload),
            ]
            for i, (label, value) in enumerate((lb, v) for lb, v in config if v):
                ln.add((" · " if i else "") + label, "$text-muted").add(value or "")
        ln.nl()
        # Headline figures: readable even when the panels below are scrolled away.
        if ctx.silent_s is not None:
            ln.add(f"stale: as of {ctx.silent_s:.0f} s ago · ", "bold $error")
        elif w.stale_s is not None:  # a capture's export owns the window: its last figures
            ln.add(f"stale: as of {w.stale_s:.0f} s ago (capture) · ", "bold $warning")
        elif st.quiet_s >= QUIET_AFTER_S and not st.scrapes_only:
            ln.add(f"no steps for {st.quiet_s:.0f} s · ", "bold $warning")
        if st.scrapes_only:
            _server_headline(ln, st.metrics)
        elif st.hello is None:
            ln.add("figures: waiting for the target's first answer", "$text-muted")
        elif st.last_step is None:
            ln.add("step figures: waiting for the engine's first steps", "$text-muted")
        else:
            _step_headline(ln, w)
            ln.add(" · dropped ", "$text-muted")
            ln.add(f"{st.dropped:,}", "bold reverse $error" if st.dropped else "")
        ln.nl()
        ln.add(f"{st.records:,} records", "$text-muted")
        if ctx.recording:
            ln.add("  ● REC ", "bold $error").add(ctx.recording, "$text-muted")
        detail = ""
        if state == "waiting" and ctx.waiting_text:
            detail = ctx.waiting_text
        elif state != "connected" and st.state_detail:
            detail = st.state_detail
        if detail:
            ln.add(" · ", "$text-muted").add(detail, STATE_STYLE.get(state, ""))
        if ctx.note:
            ln.add(" · ", "$text-muted").add(ctx.note, "$text-muted")
        return ln


PLUGIN_HINT = "per-step figures: install rltperf in the server (plugin)"
"""What a vLLM server seen only over HTTP lacks, and where it comes from."""
NO_PROBE_HINT = "per-step figures: serve with RLTPERF_PROBE=HOST:PORT (rltperf plugin)"
"""The plugin announced the server but runs no probe (no ``RLTPERF_PROBE``)."""
SHORT_HINTS = {
    PLUGIN_HINT: "per-step figures: rltperf plugin",
    NO_PROBE_HINT: "per-step: RLTPERF_PROBE=HOST:PORT",
}
"""The hints in a narrow column (two replicas side by side), where the long ones are cut."""


def server_hint(info: EngineInfo) -> tuple[str, str]:
    """Where a server seen over HTTP has its per-step figures, long and short: the exact
    command when the plugin announced its probes, else what to start the server with."""
    if info.probes:  # announced, with RLTPERF_PROBE: one command away
        cmd = "rltperf attach " + " ".join(info.probes)
        return "per-step figures: " + cmd, "per-step: " + cmd
    hint = NO_PROBE_HINT if info.pid is not None else PLUGIN_HINT  # an announced engine has a pid
    return hint, SHORT_HINTS[hint]


def _server_config(ln: Lines, info: EngineInfo, width: int) -> None:
    """What a server seen over HTTP is (its /metrics, what its config said) and where its
    per-step figures come from, the hint whole even in a narrow column; nothing it can
    never say (loops, exit, spec as n/a)."""
    hint, short = server_hint(info)
    what = "seen through its /metrics over HTTP"
    if len(what) + 3 + len(hint) > width:
        what, hint = "/metrics only", short
    ln.add(what, "$text-muted").add(" · ", "$text-muted").add(hint, "$warning")
    used = len(what) + 3 + len(hint)
    extra = []
    if info.max_loops:
        extra.append(("loops ", info.loop_config or f"max {info.max_loops}"))
    if info.kv_capacity_blocks and info.kv_block_tokens:
        extra.append(("KV cache ", si(info.kv_capacity_blocks * info.kv_block_tokens, " tokens")))
    for label, value in extra:
        used += 3 + len(label) + len(value)
        if used > width:
            break
        ln.add(" · " + label, "$text-muted").add(value)


def _server_headline(ln: Lines, m: MetricsWindow | None) -> None:
    """A metrics endpoint's headline: rates and gauges of the last scrapes (waiting for a
    pair of scrapes says so); vLLM's MBU estimate only when the server makes one."""
    if m is None or m.tokens_per_s is None:
        ln.add("waiting for two /metrics scrapes (rates need a pair)", "$text-muted")
        return
    ln.add(si(m.tokens_per_s, "tok/s"), "bold")
    ln.add(" · running ", "$text-muted").add(si(m.running, digits=0), "bold")
    ln.add(" · waiting ", "$text-muted").add(si(m.waiting, digits=0), "bold")
    if m.kv_usage is not None:
        ln.add(" · KV used ", "$text-muted").add(pct(m.kv_usage), "bold")
    if m.mbu is not None:
        ln.add(" · MBU ", "$text-muted").add(pct(m.mbu) + " (vLLM's estimate)", "bold")


def _step_headline(ln: Lines, w: Window) -> None:
    """A probe's headline: step time, idle share, MBU and tokens/s over the window."""
    p50 = w.step_ms["p50"]
    ln.add("step p50 ", "$text-muted").add(ms(p50) + (" ms" if p50 is not None else ""), "bold")
    ln.add(" · idle ", "$text-muted").add(pct(w.idle_fraction), "bold")
    ln.add(" · MBU ", "$text-muted")
    if w.mbu is None:
        ln.add(NA, "bold")
    elif w.mbu_overcount:
        ln.add(pct(w.mbu) + " ⚠ >1", "bold reverse $error")
    else:
        ln.add(pct(w.mbu), "bold")
    ln.add(" · ", "$text-muted").add(si(w.tokens_per_s, "tok/s"), "bold")
