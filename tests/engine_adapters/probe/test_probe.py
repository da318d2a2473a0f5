"""The probe over a real socket: stage timing, subscribers coming and going, requests."""

from __future__ import annotations

import threading
import time

import pytest

from engine_adapters.definitions.records import Hello, RequestRecord, StageTable, Stats, StepRecord
from engine_adapters.monitor.tcp import ProbeAdapter
from engine_adapters.probe import Probe, now_ns


@pytest.fixture
def probe():
    p = Probe("127.0.0.1:0", {"name": "unit", "model": "m"}, warm_profiler=False, sample_devices=False)
    yield p
    p.close()


def _collect(session, seconds, until=None):
    out = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        out += session.read(0.05)
        if until and until(out):
            break
    return out


def test_stage_durations_match_known_sleeps(probe):
    """Each stage and the un-staged time against the wall clock read around the same calls
    (``perf_counter_ns``, the probe's clock): a stage lies between the clock read inside
    its two marks and the one read outside them, exactly, however loaded the machine
    (fixed upper bounds failed in a loaded run: a 12 ms sleep took 366 ms)."""
    clk = time.perf_counter_ns
    s = ProbeAdapter(f"tcp://{probe.address}").connect()
    first = s.read(1.0)
    hello = next(r for r in first if isinstance(r, Hello))
    names = hello.stage_names
    walls: list[tuple[int, ...]] = []
    for _i in range(5):
        with probe.step("decode", 2, 2) as st:
            t1 = clk()
            st.mark("schedule")
            t2 = clk()
            time.sleep(0.004)
            t3 = clk()
            st.mark("forward")
            t4 = clk()
            time.sleep(0.012)
            t5 = clk()
            st.mark("sample")
            t6 = clk()
        walls.append((t1, t2, t3, t4, t5, t6))
        s0 = clk()
        with probe.step("prefill", 1, 100) as st:  # the with form, with un-staged time between
            s1 = clk()
            p1 = clk()
            with st.stage("prepare"):
                p2 = clk()
                time.sleep(0.003)
                p3 = clk()
            p4 = clk()
            time.sleep(0.006)  # between stages: counted in the step, in no stage
            f1 = clk()
            with st.stage("forward"):
                f2 = clk()
                time.sleep(0.005)
                f3 = clk()
            f4 = clk()
            s2 = clk()
        s3 = clk()
        walls.append((s0, s1, s2, s3, p1, p2, p3, p4, f1, f2, f3, f4))
    recs = _collect(s, 3.0, until=lambda o: sum(isinstance(r, StepRecord) for r in o) >= 10)
    steps = [r for r in recs if isinstance(r, StepRecord)]
    assert [r.step_id for r in steps] == list(range(10))
    for r, (t1, t2, t3, t4, t5, t6) in zip(steps[0::2], walls[0::2], strict=True):
        st = dict(zip(names, r.stage_ns, strict=False))
        assert t3 - t2 <= st["schedule"] <= t4 - t1 and st["schedule"] >= 4e6, (st, t1, t6)
        assert t5 - t4 <= st["forward"] <= t6 - t3 and st["forward"] >= 12e6, (st, t1, t6)
        assert st["sample"] <= r.end_ns - t5  # from the last mark to the step's end
        assert 0 <= (r.end_ns - r.start_ns) - sum(r.stage_ns) <= t2 - r.start_ns  # before the 1st mark
    for r, w in zip(steps[1::2], walls[1::2], strict=True):
        s0, s1, s2, s3, p1, p2, p3, p4, f1, f2, f3, f4 = w
        st = dict(zip(names, r.stage_ns, strict=False))
        assert r.kind == "prefill" and r.tokens == 100
        assert s0 <= r.start_ns <= s1 and s2 <= r.end_ns <= s3
        assert p3 - p2 <= st["prepare"] <= p4 - p1 and st["prepare"] >= 3e6, st
        assert f3 - f2 <= st["forward"] <= f4 - f1 and st["forward"] >= 5e6, st
        unstaged = (r.end_ns - r.start_ns) - sum(r.stage_ns)
        assert f1 - p4 <= unstaged and unstaged >= 6e6, (unstaged, st)
    s.close()


def test_new_stage_names_reach_subscribers(probe):
    s = ProbeAdapter(f"tcp://{probe.address}").connect()
    s.read(0.5)
    with probe.step() as st:
        st.mark("my_custom_stage")
        time.sleep(0.002)
    recs = _collect(s, 2.0, until=lambda o: any(isinstance(r, StepRecord) for r in o))
    table = [r for r in recs if isinstance(r, StageTable)]
    step = next(r for r in recs if isinstance(r, StepRecord))
    assert table and table[-1].stage_names[-1] == "my_custom_stage"
    idx = table[-1].stage_names.index("my_custom_stage")
    assert step.stage_ns[idx] >= 2e6
    s.close()


def test_several_subscribers_attach_and_detach_any_time(probe):
    stop = threading.Event()

    def engine():
        while not stop.is_set():
            with probe.step() as st:
                st.mark("forward")
                time.sleep(0.0005)

    t = threading.Thread(target=engine)
    t.start()
    try:
        a = ProbeAdapter(f"tcp://{probe.address}").connect()
        b = ProbeAdapter(f"tcp://{probe.address}").connect()
        ra = _collect(a, 0.6)
        b.close()  # detach one mid-stream
        ra += _collect(a, 0.6)
        c = ProbeAdapter(f"tcp://{probe.address}").connect()  # attach late
        rc = _collect(c, 0.8)
        both = now_ns()  # c has its stream: a's next heartbeat counts both
        ra += _collect(a, 10.0, until=lambda out: any(isinstance(r, Stats) and r.ts_ns > both for r in out))
        ids_a = [r.step_id for r in ra if isinstance(r, StepRecord)]
        assert ids_a == list(range(ids_a[0], ids_a[0] + len(ids_a))), "no gaps for a healthy subscriber"
        assert any(isinstance(r, Hello) for r in rc)
        ids_c = [r.step_id for r in rc if isinstance(r, StepRecord)]
        assert ids_c and ids_c[0] > ids_a[0]
        stats = [r for r in ra if isinstance(r, Stats)]
        assert stats and stats[-1].ts_ns > both, "a heartbeat about a second apart"
        assert stats[-1].sub_dropped == 0 and stats[-1].subscribers == 2
        a.close()
        c.close()
    finally:
        stop.set()
        t.join()


def test_request_records_and_step_facts(probe):
    s = ProbeAdapter(f"tcp://{probe.address}").connect()
    s.read(0.5)
    t0 = now_ns()
    with probe.step("decode", 3, 3) as st:
        st.mark("forward")
        st.set(
            bytes_read=1000,
            bytes_written=24,
            flops=5e6,
            exit_hist=[1, 2],
            out_tokens=3,
            kv_used=7,
            kv_total=64,
        )
        st.set(not_a_field=1)  # ignored with a warning, never an error on the step path
    probe.request_done(
        "r1",
        arrival_ns=t0,
        first_token_ns=t0 + 5_000_000,
        finish_ns=t0 + 25_000_000,
        prompt_tokens=10,
        output_tokens=5,
    )
    recs = _collect(s, 2.0, until=lambda o: any(isinstance(r, RequestRecord) for r in o))
    step = next(r for r in recs if isinstance(r, StepRecord))
    assert (step.bytes_read, step.bytes_written, step.flops, step.exit_hist) == (1000, 24, 5e6, [1, 2])
    assert (step.out_tokens, step.kv_used, step.kv_total) == (3, 7, 64)
    req = next(r for r in recs if isinstance(r, RequestRecord))
    assert req.req_id == "r1" and req.output_tokens == 5 and req.first_token_ns - req.arrival_ns == 5_000_000
    s.close()


def test_port_in_use_is_a_clear_error(probe):
    with pytest.raises(OSError, match=r"(?i)address already in use"):
        Probe(probe.address, {"name": "second"}, warm_profiler=False, sample_devices=False)


def test_step_without_with_and_mark_overflow_are_safe(probe):
    st = probe.step()
    for i in range(100):  # more boundaries than a slot holds: counted, not an error
        st.mark(f"s{i % 3}")
    st.finish()
    assert probe.steps_total == 1


def test_close_ships_every_record_before_the_bye():
    from engine_adapters.definitions.records import Bye

    p = Probe("127.0.0.1:0", {"name": "unit"}, warm_profiler=False, sample_devices=False)
    s = ProbeAdapter(f"tcp://{p.address}", reconnect=False).connect()
    s.read(0.5)
    for i in range(500):
        with p.step() as st:
            st.mark("forward")
        p.request_done(f"r{i}", arrival_ns=now_ns(), finish_ns=now_ns())
    p.close("done")  # immediately: nothing may be lost, the Bye comes last
    recs = _collect(s, 3.0, until=lambda o: any(isinstance(r, Bye) for r in o))
    kinds = [type(r).__name__ for r in recs]
    assert kinds.count("StepRecord") == 500 and kinds.count("RequestRecord") == 500
    assert kinds.index("Bye") > max(i for i, k in enumerate(kinds) if k in ("StepRecord", "RequestRecord"))
    s.close()


def test_failed_probe_construction_leaves_nothing_listening():
    import socket

    import psutil

    me = psutil.Process()

    def listening() -> set[int]:
        return {c.laddr.port for c in me.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy_port = s.getsockname()[1]
        before = listening()
        # threads of probes closed by earlier tests in this process may still be ending
        threads_before = {t.ident for t in threading.enumerate() if t.name.startswith("rltperf-")}
        with pytest.raises(OSError):  # the Prometheus port is taken: the probe cannot start
            Probe(
                "127.0.0.1:0",
                {"name": "x"},
                warm_profiler=False,
                sample_devices=True,
                prometheus_port=busy_port,
            )
        assert listening() == before
    assert not [
        t.name
        for t in threading.enumerate()
        if t.name.startswith("rltperf-") and t.ident not in threads_before
    ]
