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
    s = ProbeAdapter(f"tcp://{probe.address}").connect()
    first = s.read(1.0)
    hello = next(r for r in first if isinstance(r, Hello))
    names = hello.stage_names
    for _i in range(5):
        with probe.step("decode", 2, 2) as st:
            st.mark("schedule")
            time.sleep(0.004)
            st.mark("forward")
            time.sleep(0.012)
            st.mark("sample")
        with probe.step("prefill", 1, 100) as st:  # the with form, with un-staged time between
            with st.stage("prepare"):
                time.sleep(0.003)
            time.sleep(0.006)  # between stages: counted in the step, in no stage
            with st.stage("forward"):
                time.sleep(0.005)
    recs = _collect(s, 3.0, until=lambda o: sum(isinstance(r, StepRecord) for r in o) >= 10)
    steps = [r for r in recs if isinstance(r, StepRecord)]
    assert [r.step_id for r in steps] == list(range(10))
    for r in steps[0::2]:
        st = dict(zip(names, r.stage_ns, strict=False))
        assert 4e6 <= st["schedule"] < 9e6 and 12e6 <= st["forward"] < 20e6
        assert st["sample"] < 1e6
        assert abs((r.end_ns - r.start_ns) - sum(r.stage_ns)) < 1e6
    for r in steps[1::2]:
        st = dict(zip(names, r.stage_ns, strict=False))
        assert r.kind == "prefill" and r.tokens == 100
        assert 3e6 <= st["prepare"] < 8e6 and 5e6 <= st["forward"] < 10e6
        unstaged = (r.end_ns - r.start_ns) - sum(r.stage_ns)
        assert 6e6 <= unstaged < 12e6
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
        ra += _collect(a, 0.2)
        ids_a = [r.step_id for r in ra if isinstance(r, StepRecord)]
        assert ids_a == list(range(ids_a[0], ids_a[0] + len(ids_a))), "no gaps for a healthy subscriber"
        assert any(isinstance(r, Hello) for r in rc)
        ids_c = [r.step_id for r in rc if isinstance(r, StepRecord)]
        assert ids_c and ids_c[0] > ids_a[0]
        stats = [r for r in ra if isinstance(r, Stats)]
        assert stats and stats[-1].sub_dropped == 0 and stats[-1].subscribers >= 2
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
