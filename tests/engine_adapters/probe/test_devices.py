"""Device sampler: the real no-driver path on this machine, the GPU paths through a FAKE
pynvml (``fake_pynvml.py``; no NVIDIA GPU here), and the sampler thread."""

from __future__ import annotations

import os
import threading
import time

import msgspec
import pynvml
import pytest
from fake_pynvml import FakeGpu, FakeNvml

from engine_adapters.definitions.records import DeviceSample
from engine_adapters.definitions.wire import FrameReader, encode
from engine_adapters.probe import devices
from engine_adapters.probe.devices import NvmlSampler, SamplerThread, cuda_ordinals

MIB = 1 << 20


def _real_nvml_works() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def _h100(**kw: object) -> FakeGpu:
    g = FakeGpu(**kw)  # type: ignore[arg-type]
    g.gpm_values = {
        pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 83.0,
        pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 40.0,
        pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 25.0,
        pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 100.0,
        pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: 50.0,
        pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: 10.0,
        pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: 20.0,
    }
    return g


def _a100_pcie() -> FakeGpu:
    return FakeGpu(name="NVIDIA A100 80GB PCIe", uuid="GPU-aaaaaaaa-0000", gpm=False, nvlinks=0)


# --------------------------------------------------------------------------- real NVML, no driver


@pytest.mark.skipif(_real_nvml_works(), reason="an NVIDIA driver is present here")
def test_real_pynvml_without_driver_says_so_and_cpu_is_the_device() -> None:
    s = NvmlSampler(["cpu"])  # the real pynvml module
    assert s.gpus == []
    assert s.note is not None
    assert "no NVIDIA driver" in s.note and "the CPU is the device" in s.note
    s.close()
    # an engine that asked for a GPU is told its GPU readings are N/A, not zero
    s = NvmlSampler(["cuda:0"])
    assert s.note is not None and "N/A" in s.note
    assert s.sample() == []


@pytest.mark.skipif(_real_nvml_works(), reason="an NVIDIA driver is present here")
def test_sampler_thread_real_host_samples_and_note_once() -> None:
    got: list[DeviceSample] = []
    th = SamplerThread(got.append, pid=os.getpid(), period_s=0.05, devices=["cpu"])
    t0 = time.monotonic()
    th.start()
    # 6 samples, however long a loaded machine takes to give the thread them (a parallel
    # run's thread got 3 in 0.6 s), then never more than the 20 Hz period allows
    while len(got) < 6 and time.monotonic() - t0 < 30:
        time.sleep(0.05)
    time.sleep(0.3)
    th.stop()
    th.join(5)
    took = time.monotonic() - t0
    assert not th.is_alive()
    assert all(s.kind == "cpu" for s in got)
    assert 6 <= len(got) <= took / 0.05 + 2, (len(got), took)  # drift-free: no burst to catch up
    notes = [s.note for s in got if s.note]
    assert len(notes) == 1 and got[0].note == notes[0]  # said once (repeated only every 10 s)
    assert "no NVIDIA driver" in notes[0]
    last = got[-1]
    assert last.proc_rss and last.proc_rss > 10 * MIB
    assert last.host_cpu is not None and len(last.host_cpu) == os.cpu_count()
    assert last.host_mem_total and last.host_mem_used and last.host_mem_used < last.host_mem_total
    assert last.proc_cpu is not None and last.proc_cpu >= 0
    # GPU fields of a CPU sample are unknown, never zero
    assert last.gpu_util is None and last.dram_bw_util is None and last.power_w is None


# --------------------------------------------------------------------------- fake NVML: GPU paths


def test_hopper_with_gpm_reads_every_field() -> None:
    gpu = _h100(samples=[(1_000, 90), (2_000, 95)])  # old samples, before the sampler started
    nv = FakeNvml([gpu])
    s = NvmlSampler(["cuda:0"], nvml=nv)
    assert s.note is None and s.notes() == []
    assert len(s.gpus) == 1
    gpu.samples += [(3_000, 50), (4_000, 70)]
    d = s.sample()[0]
    assert (d.kind, d.index, d.name) == ("cuda", 0, "NVIDIA H100 80GB HBM3")
    assert d.gpu_util == pytest.approx(0.37) and d.mem_util == pytest.approx(0.12)
    assert d.util_samples == pytest.approx([0.5, 0.7])  # only samples newer than the start
    assert d.dram_bw_util == pytest.approx(0.83)
    assert d.sm_occupancy == pytest.approx(0.40) and d.tensor_util == pytest.approx(0.25)
    assert d.pcie_tx_bps == pytest.approx(100 * MIB) and d.pcie_rx_bps == pytest.approx(50 * MIB)
    assert d.nvlink_bps == pytest.approx(30 * MIB)
    assert (d.mem_used, d.mem_total) == (20 << 30, 80 << 30)
    assert (d.sm_clock_mhz, d.mem_clock_mhz, d.power_w, d.temp_c) == (1980, 2619, 350.0, 54)
    assert nv.calls.get("nvmlDeviceGetPcieThroughput", 0) == 0  # GPM gives PCIe: no 20 ms call
    # the next interval: DRAM idle, no new utilisation samples -> [] (none new), not None
    gpu.gpm_values[pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL] = 1.0
    d2 = s.sample()[0]
    assert d2.dram_bw_util == pytest.approx(0.01)
    assert d2.util_samples == []
    assert nv.calls["nvmlGpmSampleAlloc"] == 2  # two samples, reused every tick
    assert nv.calls["nvmlGpmSampleGet"] == 3  # one at setup, one per tick
    s.close()
    assert nv.gpm_freed == 2 and nv.calls["nvmlShutdown"] == 1


def test_gpu_without_gpm_or_nvlink_reports_na_not_zero() -> None:
    nv = FakeNvml([_a100_pcie()])
    s = NvmlSampler(["cuda:0"], nvml=nv)
    assert any("no GPM" in n for n in s.notes())
    out = [s.sample()[0] for _ in range(10)]
    d = out[0]
    assert d.dram_bw_util is None and d.sm_occupancy is None and d.tensor_util is None
    assert d.nvlink_bps is None  # a PCIe card has no NVLink: N/A, not 0
    assert d.gpu_util == pytest.approx(0.37)
    assert d.pcie_tx_bps == pytest.approx(1000 * 1024) and d.pcie_rx_bps == pytest.approx(2000 * 1024)
    # the 20 ms PCIe call runs on ticks 1, 5 and 10 only (tx + rx each), value repeated between
    assert nv.calls["nvmlDeviceGetPcieThroughput"] == 6
    assert all(x.pcie_tx_bps == d.pcie_tx_bps for x in out)


def test_unsupported_call_is_none_and_never_retried() -> None:
    nv = FakeNvml([_h100(util_supported=False)])  # e.g. a MIG slice
    s = NvmlSampler(["cuda:0"], nvml=nv)
    ds = [s.sample()[0] for _ in range(4)]
    assert all(d.gpu_util is None and d.mem_util is None for d in ds)
    assert nv.calls["nvmlDeviceGetUtilizationRates"] == 1
    assert ds[-1].dram_bw_util == pytest.approx(0.83)  # the rest still works


class _OldNvml(FakeNvml):
    """A fake of an old nvidia-ml-py without GPM or sample buffers."""

    def __getattribute__(self, name: str) -> object:
        if name in ("nvmlGpmQueryDeviceSupport", "nvmlDeviceGetSamples"):
            raise AttributeError(name)
        return super().__getattribute__(name)


def test_missing_functions_in_old_bindings_are_na() -> None:
    s = NvmlSampler(["cuda:0"], nvml=_OldNvml([_h100()]))
    d = s.sample()[0]
    assert d.util_samples is None and d.dram_bw_util is None
    assert d.gpu_util == pytest.approx(0.37)


@pytest.mark.parametrize(
    ("code", "devs", "want"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, None, "no NVIDIA driver (libnvidia-ml.so.1 not found): the CPU is the device"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, ["cpu"], "NVIDIA driver not loaded: the CPU is the device"),
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, ["cuda:0"], "no NVIDIA driver (libnvidia-ml.so.1 not found): GPU utilisation"),
    ],
)  # fmt: skip
def test_no_driver_notes(code: int, devs: list[str] | None, want: str) -> None:
    s = NvmlSampler(devs, nvml=FakeNvml([_h100()], init_error=code))
    assert s.note is not None and s.note.startswith(want)
    assert s.sample() == []


def test_cpu_engine_on_gpu_host_samples_no_gpu() -> None:
    s = NvmlSampler(["cpu"], nvml=FakeNvml([_h100(), _h100()]))
    assert s.gpus == []
    assert (
        s.note == "the engine runs on the CPU: the CPU is the device (2 NVIDIA GPU(s) present, not sampled)"
    )


def _three() -> list[FakeGpu]:
    return [
        _h100(uuid="GPU-00000000-aaaa"),
        FakeGpu(name="NVIDIA L4", uuid="GPU-11111111-bbbb", gpm=False, nvlinks=0),
        FakeGpu(name="NVIDIA A10", uuid="GPU-22222222-cccc", gpm=False, nvlinks=0),
    ]


def test_cuda_visible_devices_maps_ordinals_to_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    s = NvmlSampler(["cuda:0"], nvml=FakeNvml(_three()))
    d = s.sample()[0]
    assert (d.index, d.name) == (0, "NVIDIA A10")  # cuda:0 is NVML device 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1111,GPU-2222")  # UUID prefixes
    s = NvmlSampler(["cuda:1"], nvml=FakeNvml(_three()))
    assert [(x.index, x.name) for x in s.sample()] == [(1, "NVIDIA A10")]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,7,0")  # CUDA stops at the bad entry
    s = NvmlSampler(["cuda:1"], nvml=FakeNvml(_three()))
    assert s.gpus == [] and s.note is not None and "cuda:1 is not among the 1 GPU(s)" in s.note
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    s = NvmlSampler(None, nvml=FakeNvml(_three()))  # engine did not say: every visible GPU
    assert [x.name for x in s.sample()] == ["NVIDIA H100 80GB HBM3", "NVIDIA L4", "NVIDIA A10"]


def test_mixed_models_without_pci_order_get_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    s = NvmlSampler(None, nvml=FakeNvml(_three()))
    assert s.note is not None and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in s.note


def test_cuda_ordinals() -> None:
    assert cuda_ordinals(None) is None
    assert cuda_ordinals([None]) is None
    assert cuda_ordinals(["cpu"]) == []
    assert cuda_ordinals(["cuda"]) == [0]
    assert cuda_ordinals(["cuda:1", "cuda:0", "cuda:1"]) == [0, 1]


def test_sampler_thread_with_fake_gpu_sends_host_and_gpu_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    got: list[DeviceSample] = []
    lock = threading.Lock()

    def sink(s: DeviceSample) -> None:
        with lock:
            got.append(s)

    th = SamplerThread(
        sink, pid=os.getpid(), period_s=0.05, devices=["cuda:0"], nvml=FakeNvml([_a100_pcie()])
    )
    th.start()
    time.sleep(0.4)
    th.stop()
    th.join(5)
    cpu = [s for s in got if s.kind == "cpu"]
    gpu = [s for s in got if s.kind == "cuda"]
    assert cpu and abs(len(cpu) - len(gpu)) <= 1
    assert all(s.gpu_util == pytest.approx(0.37) for s in gpu)
    assert cpu[0].note is not None and "no GPM" in cpu[0].note
    # samples survive the wire with their None fields intact
    frames = b"".join(encode(s) for s in got[:4])
    back = FrameReader().feed(frames)
    assert back == got[:4]
    assert all(b.dram_bw_util is None for b in back if isinstance(b, DeviceSample) and b.kind == "cuda")


def test_note_repeats_for_late_subscribers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "NOTE_REPEAT_S", 0.15)
    got: list[DeviceSample] = []
    th = SamplerThread(got.append, pid=os.getpid(), period_s=0.05, devices=["cpu"],
                       nvml=FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))  # fmt: skip
    th.start()
    time.sleep(0.5)
    th.stop()
    th.join(5)
    noted = [i for i, s in enumerate(got) if s.note]
    assert 2 <= len(noted) < len(got)  # repeated now and then, not on every sample
    assert len({got[i].note for i in noted}) == 1


def test_device_sample_schema_is_appended_only() -> None:
    # the sampler fills existing fields only; a default sample is all-None past the ids
    d = DeviceSample(ts_ns=1)
    unknown = [f for f in DeviceSample.__struct_fields__[4:] if getattr(d, f) is not None]
    assert unknown == []
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(d), type=DeviceSample) == d
