"""The device layer: which GPUs a node has, and how busy they are.

A node has CUDA devices when torch sees any, and otherwise (or when asked to) *virtual* GPUs: the CPU with a
memory budget, so the whole platform runs and can be tested without a GPU. Virtual devices are sampled by
adding up the CPU time and resident memory of the processes bound to them.

torch, pynvml and psutil are imported lazily: the control plane imports this module for
:class:`DeviceInfo` alone.

CUDA and forked workers: initialising CUDA in a process breaks CUDA in children it forks later. The node
agent forks attempt processes, so :func:`detect_devices` probes CUDA in a short-lived subprocess and
:func:`sample_devices` reads NVML (which does not initialise CUDA), touching ``torch.cuda`` memory queries
only in a process where CUDA is already initialised.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_VIRTUAL_GPU_MEMORY = 8 * 2**30
CUDA_PROBE_TIMEOUT_S = 120
# CPU times advance in clock ticks (10 ms): shorter intervals between samples give noise, not information.
MIN_SAMPLE_INTERVAL_S = 0.25


@dataclass(frozen=True)
class DeviceInfo:
    """One device of a node. ``memory_total`` is in bytes; ``uuid`` identifies a CUDA device to NVML."""

    kind: str  # "cuda" or "virtual"
    index: int
    name: str
    memory_total: int
    uuid: str = ""

    @property
    def virtual(self) -> bool:
        return self.kind != "cuda"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "virtual": self.virtual}


def virtual_devices(count: int, memory: int = DEFAULT_VIRTUAL_GPU_MEMORY) -> list[DeviceInfo]:
    if count < 1:
        raise ValueError(f"a node needs at least one virtual GPU, got {count}")
    if memory < 1:
        raise ValueError(f"a virtual GPU needs a positive memory budget, got {memory}")
    return [DeviceInfo("virtual", index, f"Virtual GPU {index} (CPU)", int(memory)) for index in range(count)]


def detect_devices(
    virtual_gpus: int | None = None, virtual_gpu_memory: int = DEFAULT_VIRTUAL_GPU_MEMORY
) -> list[DeviceInfo]:
    """The node's devices.

    ``virtual_gpus > 0`` forces that many virtual GPUs of ``virtual_gpu_memory`` bytes each. Otherwise the
    CUDA devices torch can see (honouring ``CUDA_VISIBLE_DEVICES``), or a single virtual GPU when there are
    none or torch is not installed.
    """
    if virtual_gpus is not None and virtual_gpus < 0:
        raise ValueError(f"virtual_gpus cannot be negative, got {virtual_gpus}")
    if virtual_gpus:
        return virtual_devices(virtual_gpus, virtual_gpu_memory)
    cuda = _probe_cuda()
    if cuda:
        return visible_indices(cuda)
    return virtual_devices(1, virtual_gpu_memory)


def visible_ids() -> list[int] | None:
    """The device ids ``CUDA_VISIBLE_DEVICES`` lists when it is set to integers (the GPUs a batch system such as
    Slurm granted, say), else None (unset, or devices named by UUID)."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    parts = [part.strip() for part in value.split(",") if part.strip()]
    if not parts or not all(part.isdigit() for part in parts):
        return None
    return [int(part) for part in parts]


def visible_indices(devices: list[DeviceInfo]) -> list[DeviceInfo]:
    """CUDA devices as torch numbers them under ``CUDA_VISIBLE_DEVICES`` (0, 1, ...) renumbered with the ids it
    lists ("2,3": 2 and 3), so that an index means the same device in every process of the node: the agent drops
    the variable and the worker narrows each attempt's ranks to their own ids. Unchanged when it is unset or
    names devices by UUID."""
    ids = visible_ids()
    if ids is None or len(ids) < len(devices):
        return devices
    return [replace(device, index=ids[position]) if not device.virtual else device
            for position, device in enumerate(devices)]


_CUDA_PROBE = """
import json
try:
    import torch
except ImportError:
    print("[]")
    raise SystemExit
found = []
if torch.cuda.is_available():
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        found.append([index, properties.name, int(properties.total_memory), str(getattr(properties, "uuid", ""))])
print(json.dumps(found))
"""


def _probe_cuda() -> list[DeviceInfo]:
    """CUDA devices as torch sees them, probed in a subprocess so that this process stays fork-safe."""
    try:
        import torch
    except ImportError:
        return []
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return []  # a CPU-only build of torch: nothing to probe
    if torch.cuda.is_initialized():  # CUDA is already up here: no fork-safety left to preserve
        return _cuda_devices_in_process()
    try:
        completed = subprocess.run(
            [sys.executable, "-c", _CUDA_PROBE],
            capture_output=True,
            text=True,
            timeout=CUDA_PROBE_TIMEOUT_S,
            check=True,
        )
        found = json.loads(completed.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as error:
        log.warning("probing CUDA in a subprocess failed (%s); probing in process", error)
        return _cuda_devices_in_process()
    return [DeviceInfo("cuda", index, name, memory, _nvml_uuid(uuid)) for index, name, memory, uuid in found]


def _nvml_uuid(uuid: str) -> str:
    """torch prints a device UUID bare; NVML wants it as "GPU-<uuid>"."""
    return uuid if not uuid or uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def _cuda_devices_in_process() -> list[DeviceInfo]:
    import torch

    if not torch.cuda.is_available():
        return []
    devices = []
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        uuid = _nvml_uuid(str(getattr(properties, "uuid", "")))
        devices.append(DeviceInfo("cuda", index, properties.name, int(properties.total_memory), uuid))
    return devices


# -- sampling ------------------------------------------------------------------------------------------------

_lock = threading.Lock()
# psutil.Process objects by pid, and the CPU time each had at the previous sample. psutil's Process checks
# its creation time, so a reused pid shows up as a different process and is replaced.
_processes: dict[int, Any] = {}
_cpu_seen: dict[int, tuple[float, float, float]] = {}  # pid -> (cpu seconds, monotonic time, percent)
_nvml: Any = None  # the pynvml module once initialised, False when unavailable


def sample_devices(devices: list[DeviceInfo], pids_by_device: dict[int, list[int]]) -> list[dict[str, Any]]:
    """One sample per device: ``{"index", "utilization" (0-100), "memory_used", "memory_total"}`` (bytes).

    CUDA devices are read from NVML (``nvidia-ml-py``), or from torch where CUDA is already initialised in
    this process. A virtual device's utilization is the CPU use of the processes bound to it (and of their
    children) since the previous sample, in percent of one core, capped at 100; its memory is their resident
    memory, capped at the device's budget. The first sample of a process averages over its lifetime.
    """
    with _lock:
        samples = []
        tracked: set[int] = set()
        now = time.monotonic()
        for device in devices:
            if device.virtual:
                sample = _sample_virtual(device, pids_by_device.get(device.index, []), now, tracked)
            else:
                sample = _sample_cuda(device)
            samples.append(sample)
        for pid in list(_processes):
            if pid not in tracked:
                _processes.pop(pid, None)
                _cpu_seen.pop(pid, None)
        return samples


def _sample_virtual(device: DeviceInfo, pids: list[int], now: float, tracked: set[int]) -> dict[str, Any]:
    import psutil

    cpu_percent = 0.0
    rss = 0
    for process in _with_children(pids):
        pid = process.pid
        try:
            with process.oneshot():
                times = process.cpu_times()
                cpu = times.user + times.system
                rss += process.memory_info().rss
                previous = _cpu_seen.get(pid)
                if previous is None:
                    # Average over the process's life so that a first sample is meaningful.
                    percent = 100.0 * cpu / max(time.time() - process.create_time(), 1e-3)
                    _cpu_seen[pid] = (cpu, now, percent)
                elif now - previous[1] < MIN_SAMPLE_INTERVAL_S:
                    percent = previous[2]  # too soon for the clock-tick granularity of CPU times
                else:
                    percent = 100.0 * max(cpu - previous[0], 0.0) / (now - previous[1])
                    _cpu_seen[pid] = (cpu, now, percent)
                cpu_percent += percent
                tracked.add(pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return {
        "index": device.index,
        "utilization": round(min(cpu_percent, 100.0), 2),
        "memory_used": min(rss, device.memory_total),
        "memory_total": device.memory_total,
    }


def _with_children(pids: list[int]):
    """The live processes ``pids`` and their descendants, each once, from the module cache."""
    import psutil

    seen: set[int] = set()
    for pid in pids:
        process = _process(pid)
        if process is None:
            continue
        try:
            family = [process, *process.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        for member in family:
            if member.pid in seen:
                continue
            seen.add(member.pid)
            cached = _process(member.pid, member)
            if cached is not None:
                yield cached


def _process(pid: int, candidate: Any = None):
    import psutil

    process = _processes.get(pid)
    if process is not None and process.is_running():
        return process
    _cpu_seen.pop(pid, None)
    try:
        process = candidate if candidate is not None else psutil.Process(pid)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        _processes.pop(pid, None)
        return None
    _processes[pid] = process
    return process


def _sample_cuda(device: DeviceInfo) -> dict[str, Any]:
    sample = {
        "index": device.index,
        "utilization": 0.0,
        "memory_used": 0,
        "memory_total": device.memory_total,
    }
    nvml = _nvml_module()
    if nvml:
        try:
            handle = _nvml_handle(nvml, device)
            sample["utilization"] = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            sample["memory_used"] = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
            return sample
        except nvml.NVMLError as error:
            log.debug("NVML could not sample cuda:%s: %s", device.index, error)
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        # mem_get_info creates a CUDA context: only where one already exists, never in the (forking) agent.
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            free, total = torch.cuda.mem_get_info(device.index)
            sample["memory_used"] = int(total - free)
    return sample


def _nvml_handle(nvml, device: DeviceInfo):
    # NVML numbers all GPUs while CUDA numbers the visible ones: the UUID is the reliable key.
    if device.uuid:
        try:
            return nvml.nvmlDeviceGetHandleByUUID(device.uuid)
        except nvml.NVMLError:
            pass
    return nvml.nvmlDeviceGetHandleByIndex(device.index)


def _nvml_module():
    global _nvml
    if _nvml is None:
        try:
            import pynvml

            pynvml.nvmlInit()
            _nvml = pynvml
        except Exception as error:  # ImportError, or NVMLError when no driver is loaded
            log.debug("NVML unavailable: %s", error)
            _nvml = False
    return _nvml
