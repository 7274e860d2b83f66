import dataclasses
import subprocess
import sys
import time
import types

import psutil
import pytest
from support import wait_for

from components.runtime.node import devices
from components.runtime.node.devices import DeviceInfo, detect_devices, sample_devices

MiB = 2**20
BUSY = (
    "import time\nballast = bytearray({mib} * 2**20)\nend = time.time() + 60\nwhile time.time() < end: pass\n"
)
# A parent that idles while its child burns CPU: a device's load includes the children of its processes.
PARENT = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', {busy!r}])\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def spawn():
    """Start Python processes; kill them (and their children) by pid when the test ends."""
    started: list[subprocess.Popen] = []

    def start(code: str) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-c", code])
        started.append(process)
        return process

    yield start
    for process in started:
        try:
            children = psutil.Process(process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        for child in children:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        process.kill()
        process.wait(timeout=10)
        psutil.wait_procs(children, timeout=10)


def wait_for_children(pid: int, count: int) -> None:
    deadline = time.monotonic() + 10
    while len(psutil.Process(pid).children(recursive=True)) < count:
        assert time.monotonic() < deadline, "the child process did not start"
        time.sleep(0.05)


def test_virtual_gpus_on_request():
    found = detect_devices(virtual_gpus=3, virtual_gpu_memory=2 * 2**30)
    assert [device.index for device in found] == [0, 1, 2]
    assert all(device.kind == "virtual" and device.virtual for device in found)
    assert all(device.memory_total == 2 * 2**30 for device in found)
    assert found[1].to_dict() == {
        "kind": "virtual",
        "index": 1,
        "name": "Virtual GPU 1 (CPU)",
        "memory_total": 2 * 2**30,
        "uuid": "",
        "virtual": True,
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        found[0].index = 5


def test_bad_virtual_gpu_requests_are_refused():
    with pytest.raises(ValueError):
        detect_devices(virtual_gpus=-1)
    with pytest.raises(ValueError):
        detect_devices(virtual_gpus=1, virtual_gpu_memory=0)


def test_without_cuda_a_node_gets_one_virtual_gpu(monkeypatch):
    monkeypatch.setattr(devices, "_probe_cuda", lambda: [])
    assert detect_devices(virtual_gpu_memory=4 * 2**30) == [
        DeviceInfo("virtual", 0, "Virtual GPU 0 (CPU)", 4 * 2**30)
    ]
    assert detect_devices(virtual_gpus=0) == [DeviceInfo("virtual", 0, "Virtual GPU 0 (CPU)", 8 * 2**30)]


def test_cuda_devices_win_over_the_virtual_fallback(monkeypatch):
    gpu = DeviceInfo("cuda", 0, "NVIDIA H100", 80 * 2**30, "GPU-1234")
    monkeypatch.setattr(devices, "_probe_cuda", lambda: [gpu])
    assert detect_devices() == [gpu]
    assert not gpu.virtual
    assert detect_devices(virtual_gpus=2)[0].virtual  # an explicit request still wins


def test_detection_on_this_machine_matches_torch():
    import torch

    found = detect_devices()
    if torch.cuda.is_available():
        assert [device.kind for device in found] == ["cuda"] * torch.cuda.device_count()
        assert all(device.memory_total > 0 and device.uuid.startswith(("GPU-", "MIG-")) for device in found)
    else:
        assert found == [DeviceInfo("virtual", 0, "Virtual GPU 0 (CPU)", 8 * 2**30)]


def test_sampling_a_busy_virtual_gpu(spawn):
    busy = spawn(BUSY.format(mib=64))
    found = detect_devices(virtual_gpus=2)
    time.sleep(0.6)
    first = sample_devices(found, {0: [busy.pid]})
    time.sleep(0.6)
    second = sample_devices(found, {0: [busy.pid]})
    for sample in (first, second):
        assert [entry["index"] for entry in sample] == [0, 1]
        assert 0 < sample[0]["utilization"] <= 100  # busy, though a loaded machine may give it little CPU
        assert 64 * MiB <= sample[0]["memory_used"] < 1024 * MiB
        assert sample[0]["memory_total"] == 8 * 2**30
        assert sample[1] == {"index": 1, "utilization": 0.0, "memory_used": 0, "memory_total": 8 * 2**30}


def test_sampling_counts_children_and_caps_memory(spawn):
    parent = spawn(PARENT.format(busy=BUSY.format(mib=32)))
    wait_for_children(parent.pid, 1)
    small = DeviceInfo("virtual", 0, "small", 16 * MiB)
    sample_devices([small], {0: [parent.pid]})
    samples = []

    def busy():  # the parent sleeps; its child is the busy one (on a loaded machine it may get a small share)
        time.sleep(0.6)
        samples.append(sample_devices([small], {0: [parent.pid]})[0])
        return samples[-1]["utilization"] > 20

    wait_for(busy, 60, message="the busy child to be counted")
    assert samples[-1]["memory_used"] == 16 * MiB  # capped at the device's budget


def test_sampling_survives_processes_that_are_gone(spawn):
    gone = spawn("pass")
    gone.wait(timeout=10)
    device = DeviceInfo("virtual", 0, "v", 2**30)
    assert sample_devices([device], {0: [gone.pid, 999_999_999]}) == [
        {"index": 0, "utilization": 0.0, "memory_used": 0, "memory_total": 2**30}
    ]
    assert gone.pid not in devices._processes


def test_cuda_devices_are_sampled_through_nvml(monkeypatch):
    class NVMLError(Exception):
        pass

    handles = {"GPU-abc": "handle-by-uuid", 1: "handle-by-index"}

    def by_uuid(uuid):
        if uuid not in handles:
            raise NVMLError(uuid)
        return handles[uuid]

    fake = types.SimpleNamespace(
        NVMLError=NVMLError,
        nvmlDeviceGetHandleByUUID=by_uuid,
        nvmlDeviceGetHandleByIndex=lambda index: handles[index],
        nvmlDeviceGetUtilizationRates=lambda handle: types.SimpleNamespace(
            gpu=37 if handle == "handle-by-uuid" else 5
        ),
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(used=3 * 2**30),
    )
    monkeypatch.setattr(devices, "_nvml", fake)
    gpus = [
        DeviceInfo("cuda", 0, "GPU", 80 * 2**30, "GPU-abc"),
        DeviceInfo("cuda", 1, "GPU", 80 * 2**30, "GPU-unknown"),  # falls back to the index
    ]
    assert sample_devices(gpus, {0: [12345]}) == [
        {"index": 0, "utilization": 37.0, "memory_used": 3 * 2**30, "memory_total": 80 * 2**30},
        {"index": 1, "utilization": 5.0, "memory_used": 3 * 2**30, "memory_total": 80 * 2**30},
    ]


def test_devices_module_imports_no_heavy_libraries():
    code = (
        "import sys, components.runtime.node.devices\n"
        "heavy = [name for name in ('torch', 'psutil', 'pynvml') if name in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
