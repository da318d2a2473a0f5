"""Energy counters: RAPL through a folder laid out like ``/sys/class/powercap`` (none
exists on these machines: it is a fake tree, with a wrap), NVML's energy counter through
the FAKE pynvml (``fake_pynvml.py``: a counter advancing at a known rate), the real host
of this machine (no counter: the reason, never an estimate), the window's power and
joules figures against numbers computed by hand, and the Prometheus counter."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from fake_pynvml import FakeGpu, FakeNvml

from engine_adapters.definitions import energy as E
from engine_adapters.definitions import figures as F
from engine_adapters.definitions.records import FLAG_PROFILED, DeviceSample
from engine_adapters.probe.devices import HostSampler, NvmlSampler, SamplerThread
from engine_adapters.probe.rapl import RaplReader


def _zone(root: Path, name: str, label: str, uj: int, max_uj: int) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "name").write_text(label + "\n")
    (d / "energy_uj").write_text(f"{uj}\n")
    (d / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return d


def _powercap(tmp_path: Path) -> tuple[Path, Path, Path]:
    root = tmp_path / "powercap"
    p0 = _zone(root, "intel-rapl:0", "package-0", 900_000, 1_000_000)
    p1 = _zone(root, "intel-rapl:1", "package-1", 10, 1_000_000)
    # a sub-zone is part of package 0: counting it too would count its joules twice
    _zone(root, "intel-rapl:0:0", "core", 5, 1_000_000)
    return root, p0, p1


def test_unwrapper_counts_across_a_wrap() -> None:
    u = E.Unwrapper(1000)
    assert u.add(990) == 0
    assert u.add(995) == 5
    assert u.add(3) == 13  # wrapped: 5 to the top, 3 after it
    assert u.add(3) == 13


def test_rapl_sums_packages_undoes_the_wrap_and_skips_subzones(tmp_path: Path) -> None:
    root, p0, p1 = _powercap(tmp_path)
    r = RaplReader(str(root))
    assert r.reason is None and r.names == ["package-0", "package-1"]
    assert r.read_j() == 0.0
    (p0 / "energy_uj").write_text("50000\n")  # wrapped: +100_000 + 50_000 µJ
    (p1 / "energy_uj").write_text("250010\n")  # +250_000 µJ
    (root / "intel-rapl:0:0" / "energy_uj").write_text("999999\n")  # ignored
    assert r.read_j() == pytest.approx(0.4)
    (p0 / "energy_uj").write_text("60000\n")
    assert r.read_j() == pytest.approx(0.41)


def test_rapl_absent_or_unreadable_says_why(tmp_path: Path) -> None:
    r = RaplReader(str(tmp_path / "none"))
    assert r.read_j() is None and r.reason is not None and "RAPL not present" in r.reason
    empty = tmp_path / "empty"
    empty.mkdir()
    r = RaplReader(str(empty))
    assert r.reason is not None and "no intel-rapl zone" in r.reason
    root, p0, _ = _powercap(tmp_path / "broken")
    (p0 / "energy_uj").unlink()
    (p0 / "energy_uj").mkdir()  # unreadable as a file
    r = RaplReader(str(root))
    assert r.read_j() is None and r.reason is not None and "RAPL not readable" in r.reason


def test_rapl_root_only_file_read_by_another_user_says_root_only() -> None:
    top = Path(tempfile.mkdtemp(prefix="rltperf-rapl-"))  # pytest's tmp_path is private to root
    top.chmod(0o755)
    root, p0, _ = _powercap(top)
    os.chmod(p0 / "energy_uj", 0o400)  # as on kernels patched for CVE-2020-8694
    r_fd, w_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reads as an unprivileged user (root reads anything)
        try:
            os.close(r_fd)
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            os.write(w_fd, str(RaplReader(str(root)).reason).encode())
        finally:
            os._exit(0)
    os.close(w_fd)
    with os.fdopen(r_fd) as f:
        reason = f.read()
    os.waitpid(pid, 0)
    shutil.rmtree(top)
    assert "RAPL not readable" in reason and "root only" in reason, reason


def test_this_host_has_no_counter_and_says_why_never_zero() -> None:
    s = HostSampler(os.getpid()).sample()
    if os.path.isdir("/sys/class/powercap") and RaplReader().reason is None:
        assert s.energy_j is not None and s.energy_source == "rapl"
    else:
        assert s.energy_j is None and s.energy_source is None
        assert s.energy_na is not None and "RAPL" in s.energy_na


def test_sampler_thread_cpu_sample_reason_names_nvml_and_rapl(tmp_path: Path) -> None:
    import pynvml

    got: list[DeviceSample] = []
    th = SamplerThread(got.append, pid=os.getpid(), period_s=0.05, devices=["cpu"],
                       nvml=FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND),
                       powercap=str(tmp_path / "none"))  # fmt: skip
    th.start()
    time.sleep(0.3)
    th.stop()
    th.join(5)
    assert got and all(s.energy_j is None for s in got)
    na = got[-1].energy_na or ""
    assert "no NVIDIA driver" in na and "RAPL not present" in na, na


def test_sampler_thread_reads_rapl_on_a_cpu_engine(tmp_path: Path) -> None:
    root, p0, _ = _powercap(tmp_path)
    got: list[DeviceSample] = []
    th = SamplerThread(got.append, pid=os.getpid(), period_s=0.05, devices=["cpu"], powercap=str(root))
    th.start()
    time.sleep(0.2)
    (p0 / "energy_uj").write_text("100000\n")  # wrapped: +200_000 µJ
    time.sleep(0.2)
    th.stop()
    th.join(5)
    assert got[-1].energy_source == "rapl" and got[-1].energy_j == pytest.approx(0.2)
    assert got[0].energy_j == 0.0


def test_nvml_energy_counter_gives_power_times_time() -> None:
    now = [100.0]
    gpu = FakeGpu(power_mw=250_000, energy_mj=7_000_000)
    nv = FakeNvml([gpu])
    nv.clock = lambda: now[0]
    s = NvmlSampler(["cuda:0"], nvml=nv)
    a = s.sample()[0]
    now[0] += 4.0
    b = s.sample()[0]
    assert a.energy_source == b.energy_source == "nvml" and a.energy_na is None
    assert a.energy_j == pytest.approx(7000.0)
    assert b.energy_j is not None and b.energy_j - a.energy_j == pytest.approx(250.0 * 4.0)
    s.close()


def test_gpu_without_energy_counter_is_na_with_reason() -> None:
    nv = FakeNvml([FakeGpu(energy_mj=None)])
    s = NvmlSampler(["cuda:0"], nvml=nv)
    d = s.sample()[0]
    d2 = s.sample()[0]
    assert d.energy_j is None and d2.energy_j is None
    assert d2.energy_na is not None and "no energy counter" in d2.energy_na
    assert nv.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1  # never asked again
    s.close()


# --------------------------------------------------------------------------- the window's figures


def _steps(n: int) -> dict[str, np.ndarray]:
    # n contiguous 1-second steps from t = 0, 10 tokens each, nothing else reported
    start = np.arange(n, dtype=np.int64) * 10**9
    return {
        "start": start,
        "end": start + 10**9,
        "busy": np.full(n, np.nan),
        "nbytes": np.full(n, np.nan),
        "flops": np.full(n, np.nan),
        "tokens": np.full(n, 10.0),
    }


def _readings(every_s: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    # 100 W for 0-10 s, 300 W for 10-20 s, the counter read every `every_s` seconds
    t = np.arange(0, 20 + every_s / 2, every_s)
    e = np.where(t <= 10, 100 * t, 1000 + 300 * (t - 10))
    return t * 1e9, e + 5000.0  # a counter does not start at 0


def test_window_power_and_joules_per_token_by_hand() -> None:
    st = _steps(20)
    fig = F.window_figures(**st, flags=np.zeros(20, dtype=np.int64), w0_ns=0, w1_ns=20 * 10**9,
                           energy=[_readings()])  # fmt: skip
    assert fig.power_w == pytest.approx(200.0)
    assert fig.tokens_per_s == pytest.approx(10.0)
    assert fig.joules_per_token == pytest.approx(20.0)
    assert fig.joules_per_step == pytest.approx(200.0)
    # the 300 W half profiled: its time leaves T and its energy leaves the joules
    flags = np.where(np.arange(20) >= 10, FLAG_PROFILED, 0)
    fig = F.window_figures(**st, flags=flags, w0_ns=0, w1_ns=20 * 10**9, energy=[_readings()])
    assert fig.seconds == pytest.approx(10.0)
    assert fig.power_w == pytest.approx(100.0) and fig.joules_per_token == pytest.approx(10.0)
    # readings every 4 s: the counter is interpolated between them (the same answer here)
    fig = F.window_figures(**st, flags=np.zeros(20, dtype=np.int64), w0_ns=0, w1_ns=20 * 10**9,
                           energy=[_readings(4.0)])  # fmt: skip
    assert fig.power_w == pytest.approx(200.0)
    # two devices read in the same ticks: their powers add
    fig = F.window_figures(**st, flags=np.zeros(20, dtype=np.int64), w0_ns=0, w1_ns=20 * 10**9,
                           energy=[_readings(), _readings()])  # fmt: skip
    assert fig.power_w == pytest.approx(400.0) and fig.joules_per_token == pytest.approx(40.0)


def test_window_power_over_covered_time_only_and_none_when_too_little() -> None:
    st = _steps(20)
    t, e = _readings()
    # the window runs past the last reading: power over the covered 5 s, not 10
    fig = F.window_figures(**st, flags=np.zeros(20, dtype=np.int64), w0_ns=15 * 10**9, w1_ns=25 * 10**9,
                           energy=[(t, e)])  # fmt: skip
    assert fig.energy_s == pytest.approx(5.0) and fig.power_w == pytest.approx(300.0)
    # readings covering less than MIN_SPAN_S: no figure rather than the counter's quantisation
    fig = F.window_figures(**st, flags=np.zeros(20, dtype=np.int64), w0_ns=0, w1_ns=20 * 10**9,
                           energy=[(t[:2], e[:2])])  # fmt: skip
    assert fig.energy_s == pytest.approx(1.0) and fig.power_w is None and fig.joules_per_token is None
    # no counter at all
    fig = F.window_figures(**st, flags=np.zeros(20, dtype=np.int64), w0_ns=0, w1_ns=20 * 10**9)
    assert fig.joules is None and fig.power_w is None


def test_energy_ratio_figures_on_arrays_and_scalars() -> None:
    s = F.RatioSums(
        seconds=np.array([10.0, 20.0]),
        tokens=np.array([100.0, 50.0]),
        busy_s=np.zeros(2),
        nbytes=np.zeros(2),
        joules=np.array([2000.0, 3000.0]),
        energy_s=np.array([10.0, 15.0]),
    )
    assert list(F.ratio_figure("power_w", s)) == pytest.approx([200.0, 200.0])
    assert list(F.ratio_figure("joules_per_token", s)) == pytest.approx([20.0, 80.0])
    one = F.RatioSums(seconds=10.0, tokens=100.0, busy_s=0.0, nbytes=0.0, joules=1000.0, energy_s=10.0)
    assert F.ratio_figure("joules_per_token", one) == pytest.approx(10.0)
    assert F.ratio_figure("power_w", F.RatioSums(seconds=1.0, tokens=1.0, busy_s=0.0, nbytes=0.0)) is None


def test_every_source_has_a_caveat() -> None:
    assert set(E.CAVEATS) == set(E.SOURCES)
    assert all("whole" in c for c in E.CAVEATS.values())


# --------------------------------------------------------------------------- Prometheus


def test_prometheus_energy_counter_follows_the_device_counter() -> None:
    from engine_adapters.probe import Probe

    p = Probe("127.0.0.1:0", {"name": "x", "device": "cuda:0"}, warm_profiler=False, sample_devices=False,
              prometheus_port=0)  # fmt: skip
    try:
        exp = p._prometheus
        assert exp is not None
        # the device counter as the sampler sends it: 1000 J at the start, +50 J a sample
        exp.observe([DeviceSample(ts_ns=i, index=0, kind="cuda", energy_j=1000.0 + 50 * i, energy_source="nvml")
                     for i in range(5)])  # fmt: skip
        body = urllib.request.urlopen(f"http://{exp.address}/metrics", timeout=10).read().decode()
        line = [ln for ln in body.splitlines() if ln.startswith("rltperf_device_energy_joules_total{")]
        assert line and line[0].endswith(" 200.0"), line
        assert 'device="cuda:0"' in line[0] and 'source="nvml"' in line[0]
    finally:
        p.close("test done")
