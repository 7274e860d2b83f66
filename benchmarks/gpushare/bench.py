"""``strata bench gpushare``: GPU sharing's four figures, each against its baseline in the same run.

``run(quick)`` returns a dict and prints a table; ``main(quick, output)`` is the ``strata bench`` entry point
(``output`` also writes the JSON). ``python -m benchmarks.gpushare.bench [--quick] [--output F]`` runs it
directly. Everything runs on this machine's CPU as one virtual GPU, with real training workloads
(``components.train.workloads``) and ``torch.set_num_threads(1)``.

a. **Switch latency.** Two real jobs alternate every iteration on one :class:`DeviceExecutor` (PACK); the
   switch latency is the gap between the end of one job's iteration and the start of the other's. Baseline:
   suspend/resume by checkpoint -- ``torch.save`` the running job's model and optimizer state to a file and
   ``torch.load`` + ``load_state_dict`` the next job's -- which is a *lower bound* of checkpoint switching
   (warm page cache, no fsync, no process restart or model rebuild).
b. **Average job completion time.** A fixed random trace of small, medium and large training jobs
   (mlp-digits and cnn-synthetic of different widths and step counts) arriving over time (Poisson, about
   80 % offered load). Baseline: FIFO with exclusive use of the device -- jobs run one after another in
   arrival order, each with the device to itself. Mechanism: the same device shared under SRTF with
   per-iteration switching. JCT = finish - arrival.
c. **Utilization with small jobs packed.** Small hyperparameter-sweep jobs (mlp-digits variants) whose input
   pipeline takes a fixed host time per batch (a sleep: host work that does not use the device). Utilization
   = device time spent in iterations / device time allocated. Exclusive: each job holds a device of its own
   for its whole run (measured job by job). Packed: all of them on one device under PACK.
d. **Inference tail latency next to training.** A training job (tiny-gpt with 8 transformer blocks) and a
   served model (tiny-gpt, 2 blocks; one 64-character context per request) on one virtual GPU; requests
   arrive as a Poisson stream. Every variant runs on the same virtual-GPU model: **one kernel at a time**,
   kernels from different threads executed in arrival order (a FIFO lock taken around every aten operator).
   - SwitchFlow: the executor; training split into stages (the embedding, the attention and feed-forward
     halves of each block, the head); a request is served in place at the next operator boundary inside
     the running stage (forward, backward or optimizer step: ``stages.OperatorPreemption``), on the same
     execution thread and kernel stream;
   - whole-graph FIFO: the executor with the same training job unsplit: a request waits for the iteration;
   - naive co-location: a training thread and a serving thread with no coordination; their kernels
     interleave one by one on the device;
   - for information, naive OS threads: the same two threads pinned to one CPU core without the kernel
     lock (Linux time-slicing; not a GPU model).
e. **Migration (SwitchFlow).** Two virtual devices, each its own kernel stream (one FIFO lock each; the
   machine's two cores): the executor's device and a fallback device. A low-priority staged training job
   (figure d's 8-block tiny-gpt) runs on the executor's device when higher-priority work arrives:
   - *held by a job*: a high-priority training job (the same model, whole iterations) arrives after a few steps
     and holds the device for ``hold_steps`` iterations. Preempt-only: the low job yields at its next stage
     boundary and waits. Migration: its next stages run on a replica on the fallback device, synced after
     each optimizer step, and it comes back when the device is free. Compared: the low job's completion
     time (fixed steps), its throughput during the hold, and the high job's completion time;
   - *held by inference*: figure d's request stream. Preempt-only is figure d's SwitchFlow (requests served
     between operators, training on the same device); migration moves training to the fallback device while
     the endpoint is busy. Compared: inference p99 and training throughput during the stream.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.benchkit import Figure, document, percentile, table, write
from components.gpushare.executor import DeviceExecutor
from components.gpushare.lanes import MemoryRequest
from components.gpushare.memory import profile_workload
from components.gpushare.migration import MigrationTarget
from components.gpushare.sessions import Progress, WorkloadSession
from components.gpushare.stages import InferenceSession, StagedWorkloadSession
from components.train.spec import TrainSpec
from components.train.workloads import TinyGPTWorkload, builtin_workload

BUDGET = 2 * 2**30
TARGETS = {"switch": 100.0, "switch_ms": 5.0, "jct": 2.0, "utilization": 2.0, "inference": 5.0}
PAPER = {"jct": "Salus 3.19x", "utilization": "Salus 2.38x", "inference": "SwitchFlow: up to 10x"}

QUICK = {
    "switch_steps": 40, "checkpoint_switches": 30,
    "trace_jobs": 8, "trace_scale": 0.5, "load": 0.8,
    "pack_jobs": 4, "pack_steps": 60, "host_ms": 4.0,
    "requests": 200, "request_interval_ms": 30.0, "train_alone_s": 1.0,
    "migration_low_steps": 40, "migration_hold_steps": 20, "migration_requests": 150,
}
FULL = {
    "switch_steps": 200, "checkpoint_switches": 200,
    "trace_jobs": 24, "trace_scale": 1.0, "load": 0.8,
    "pack_jobs": 6, "pack_steps": 200, "host_ms": 4.0,
    "requests": 400, "request_interval_ms": 30.0, "train_alone_s": 3.0,
    "migration_low_steps": 80, "migration_hold_steps": 40, "migration_requests": 300,
}


def _spec(workload: str, **fields: Any) -> dict[str, Any]:
    return TrainSpec().validate({"workload": workload, **fields})


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f} ms"


def _sync(device: Any) -> None:
    """Wait for the device's queued kernels (CUDA); nothing on the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _ratio(baseline: float | None, mechanism: float | None) -> float | None:
    if not baseline or not mechanism:
        return None
    return baseline / mechanism


# -- the virtual GPU's kernel stream ---------------------------------------------------------------------

class FifoLock:
    """A lock granted in request order (a plain ``threading.Lock`` is not fair)."""

    def __init__(self):
        self._guard = threading.Lock()
        self._held = False
        self._waiters: deque[threading.Event] = deque()

    def acquire(self) -> None:
        with self._guard:
            if not self._held:
                self._held = True
                return
            turn = threading.Event()
            self._waiters.append(turn)
        turn.wait()  # ownership is handed over by release()

    def release(self) -> None:
        with self._guard:
            if self._waiters:
                self._waiters.popleft().set()
            else:
                self._held = False


class KernelStream(TorchDispatchMode):
    """Runs every aten operator of the entering thread under the device's FIFO lock: one kernel at a time.

    Dispatch modes are thread-local: each thread enters its own instance, sharing ``lock``.
    """

    def __init__(self, lock: FifoLock):
        super().__init__()
        self.lock = lock

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.lock.acquire()
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.lock.release()


# -- a. switch latency -------------------------------------------------------------------------------------

def bench_switch(sizes: dict[str, Any], say: Callable[[str], None], device: Any = "cpu",
                 budget: int | None = BUDGET) -> dict[str, Any]:
    jobs = {"mlp-1024": ("mlp-digits", {"hidden": 1024}), "cnn-32": ("cnn-synthetic", {"hidden": 32})}
    steps = sizes["switch_steps"]
    # Admit both before the execution thread starts, so that they alternate from the first iteration.
    with DeviceExecutor(device, budget, "pack", measure_iterations=0, enforce_memory_fraction=False,
                        start=False) as executor:
        sessions = {name: WorkloadSession.builtin(kind, steps=steps, **fields)
                    for name, (kind, fields) in jobs.items()}
        for name, session in sessions.items():
            executor.submit(name, session, MemoryRequest(64 * 2**20, 64 * 2**20))
        executor.start()
        for name in jobs:
            executor.wait(name, 600)
        counters = executor.status()["counters"]
    gaps = counters["switch_latency"]
    state_bytes = {name: _state_bytes(session.workload) for name, session in sessions.items()}

    # Baseline: suspend by torch.save, resume by torch.load + load_state_dict.
    workloads = {}
    for name, (kind, fields) in jobs.items():
        workload = builtin_workload(kind)
        workload.setup(_spec(kind, **fields), torch.device(device))
        workloads[name] = workload
    latencies = []
    names = list(workloads)
    with tempfile.TemporaryDirectory(prefix="strata-gpushare-bench-") as directory:
        paths = {name: Path(directory) / f"{name}.pt" for name in names}
        for name, workload in workloads.items():
            torch.save(workload.state_dict(), paths[name])
        for index in range(sizes["checkpoint_switches"]):
            running, following = names[index % 2], names[(index + 1) % 2]
            workload = workloads[running]
            workload.train_step(workload.batch(0, index // 2 % workload.steps_per_epoch()))
            _sync(device)
            began = time.perf_counter()
            torch.save(workload.state_dict(), paths[running])
            state = torch.load(paths[following], map_location=device, weights_only=True)
            workloads[following].load_state_dict(state)
            _sync(device)
            latencies.append(time.perf_counter() - began)
    baseline_p50 = percentile(latencies, 0.5)
    baseline_p99 = percentile(latencies, 0.99)
    ratio = _ratio(baseline_p50, gaps["p50_s"])
    result = {
        "figure": "a. switch latency",
        "mechanism": "iteration-boundary switch (state resident)",
        "baseline": "checkpoint suspend/resume (torch.save + torch.load)",
        "switches": gaps["count"],
        "switch_p50_s": gaps["p50_s"], "switch_p99_s": gaps["p99_s"], "switch_max_s": gaps["max_s"],
        "checkpoint_switches": len(latencies),
        "checkpoint_p50_s": baseline_p50, "checkpoint_p99_s": baseline_p99,
        "state_bytes": state_bytes,
        "ratio": ratio,
        "ratio_p99": _ratio(baseline_p99, gaps["p99_s"]),
        "target": f">= {TARGETS['switch']:.0f}x and <= {TARGETS['switch_ms']:.0f} ms",
        "met": bool(ratio and ratio >= TARGETS["switch"] and (gaps["p99_s"] or 1) <= TARGETS["switch_ms"] / 1000),
        "mechanism_text": f"p50 {_ms(gaps['p50_s'])}, p99 {_ms(gaps['p99_s'])}",
        "baseline_text": f"p50 {_ms(baseline_p50)}, p99 {_ms(baseline_p99)}",
    }
    say(f"  a. {gaps['count']} switches: p50 {_ms(gaps['p50_s'])}, p99 {_ms(gaps['p99_s'])}; checkpoint "
        f"switching of {sum(state_bytes.values()) / 2**20:.1f} MiB of state: p50 {_ms(baseline_p50)}, "
        f"p99 {_ms(baseline_p99)}")
    return result


def _state_bytes(workload) -> int:
    from components.gpushare.memory import persistent_bytes

    counted = persistent_bytes(workload)
    return counted.parameters + counted.optimizer + counted.buffers


# -- b. average JCT ---------------------------------------------------------------------------------------

JOB_TYPES = {
    # name: (workload, spec fields, step range, probability)
    "small": ("mlp-digits", {"hidden": 128}, (30, 90), 0.5),
    "medium": ("cnn-synthetic", {"hidden": 16}, (30, 80), 0.3),
    "large": ("cnn-synthetic", {"hidden": 32, "batch_size": 128}, (60, 120), 0.2),
}


def _calibrate(types: dict[str, tuple], device: Any = "cpu") -> dict[str, dict[str, Any]]:
    """Measured step time, setup time and memory request of each job type on this machine's ``device``."""
    calibration = {}
    for name, (workload_name, fields, _, _) in types.items():
        spec = _spec(workload_name, **fields)
        workload = builtin_workload(workload_name)
        began = time.perf_counter()
        workload.setup(spec, torch.device(device))
        _sync(device)
        setup = time.perf_counter() - began
        for index in range(3):
            workload.train_step(workload.batch(0, index))
        _sync(device)
        began = time.perf_counter()
        for index in range(5):
            workload.train_step(workload.batch(0, 3 + index))
        _sync(device)
        calibration[name] = {
            "step_s": (time.perf_counter() - began) / 5,
            "setup_s": setup,
            "request": profile_workload(lambda w=workload_name: builtin_workload(w), spec),
        }
    return calibration


def make_trace(count: int, scale: float, load: float, calibration: dict[str, dict[str, Any]],
               seed: int = 7) -> list[dict[str, Any]]:
    """A reproducible trace: job type, steps and arrival time of each job (Poisson at ``load``)."""
    rng = random.Random(seed)
    # Stratified: each type's share of the jobs is its probability (rounded), in a random order.
    kinds: list[str] = []
    for name, (_, _, _, share) in JOB_TYPES.items():
        kinds += [name] * max(1, round(share * count))
    while len(kinds) > count:
        kinds.remove(max(JOB_TYPES, key=lambda n: kinds.count(n) - JOB_TYPES[n][3] * count))
    while len(kinds) < count:
        kinds.append("small")
    rng.shuffle(kinds)
    jobs = []
    for index, kind in enumerate(kinds):
        low, high = JOB_TYPES[kind][2]
        steps = max(5, int(rng.randint(low, high) * scale))
        jobs.append({"job_id": f"{kind}-{index}", "type": kind, "steps": steps, "seed": index})
    mean_service = statistics.mean(
        calibration[job["type"]]["setup_s"] + job["steps"] * calibration[job["type"]]["step_s"] for job in jobs
    )
    arrival = 0.0
    for job in jobs:
        job["arrival_s"] = round(arrival, 4)
        arrival += rng.expovariate(load / mean_service)
    return jobs


def run_trace(trace: list[dict[str, Any]], policy: str, calibration: dict[str, dict[str, Any]],
              device: Any = "cpu", budget: int | None = BUDGET) -> dict[str, Any]:
    """Replay ``trace`` on one executor under ``policy``; returns per-job JCTs."""
    with DeviceExecutor(device, budget, policy, enforce_memory_fraction=False) as executor:
        began = time.perf_counter()
        for job in trace:
            delay = began + job["arrival_s"] - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            workload_name, fields, _, _ = JOB_TYPES[job["type"]]
            session = WorkloadSession.builtin(workload_name, steps=job["steps"], seed=job["seed"], **fields)
            executor.submit(job["job_id"], session, calibration[job["type"]]["request"])
        jct = {}
        for job in trace:
            status = executor.wait(job["job_id"], 900)
            if status["state"] != "succeeded":
                raise RuntimeError(f"{job['job_id']} {status['state']}: {status['error']}")
            jct[job["job_id"]] = status["jct_s"]
        counters = executor.status()["counters"]
    makespan = time.perf_counter() - began
    return {"policy": policy, "jct": jct, "mean_jct_s": statistics.mean(jct.values()), "makespan_s": makespan,
            "switches": counters["switches"], "utilization": counters["utilization"]}


def bench_jct(sizes: dict[str, Any], say: Callable[[str], None], device: Any = "cpu",
              budget: int | None = BUDGET) -> dict[str, Any]:
    calibration = _calibrate(JOB_TYPES, device)
    trace = make_trace(sizes["trace_jobs"], sizes["trace_scale"], sizes["load"], calibration)
    counts = {kind: sum(job["type"] == kind for job in trace) for kind in JOB_TYPES}
    fifo = run_trace(trace, "fifo", calibration, device, budget)
    srtf = run_trace(trace, "srtf", calibration, device, budget)
    ratio = _ratio(fifo["mean_jct_s"], srtf["mean_jct_s"])
    by_type = {}
    for kind in JOB_TYPES:
        ids = [job["job_id"] for job in trace if job["type"] == kind]
        if ids:
            by_type[kind] = {"fifo_mean_jct_s": statistics.mean(fifo["jct"][i] for i in ids),
                             "srtf_mean_jct_s": statistics.mean(srtf["jct"][i] for i in ids)}
    say(f"  b. {len(trace)} jobs ({', '.join(f'{n} {k}' for k, n in counts.items())}) over "
        f"{trace[-1]['arrival_s']:.1f} s: mean JCT FIFO-exclusive {fifo['mean_jct_s']:.2f} s, SRTF-shared "
        f"{srtf['mean_jct_s']:.2f} s; makespan {fifo['makespan_s']:.1f} s vs {srtf['makespan_s']:.1f} s")
    return {
        "figure": "b. average JCT, mixed trace",
        "mechanism": "shared device, SRTF per iteration",
        "baseline": "FIFO, exclusive device",
        "trace": trace,
        "calibration": {kind: {"step_s": c["step_s"], "setup_s": c["setup_s"], "request": c["request"].to_dict()}
                        for kind, c in calibration.items()},
        "fifo": fifo, "srtf": srtf, "by_type": by_type,
        "ratio": ratio,
        "target": f">= {TARGETS['jct']:.0f}x ({PAPER['jct']})",
        "met": bool(ratio and ratio >= TARGETS["jct"]),
        "mechanism_text": f"mean JCT {srtf['mean_jct_s']:.2f} s",
        "baseline_text": f"mean JCT {fifo['mean_jct_s']:.2f} s",
    }


# -- c. utilization -----------------------------------------------------------------------------------------

class HostBoundSession(WorkloadSession):
    """A workload whose input pipeline takes ``host_s`` of host time per batch, off the device.

    After each iteration the next batch is "prepared" on a host thread (a sleep standing for reading and
    decoding data); until then the job is not ready and the executor may run someone else.
    """

    def __init__(self, *args, host_s: float, host_pool: ThreadPoolExecutor, **kwargs):
        super().__init__(*args, **kwargs)
        self.host_s = host_s
        self.host_pool = host_pool
        self._ready = threading.Event()
        self._ready.set()

    def ready(self) -> bool:
        return self._ready.is_set()

    def step(self, should_yield=None) -> Progress:
        progress = super().step()
        if progress is not Progress.DONE:
            self._ready.clear()
            self.host_pool.submit(self._prepare_next)
        return progress

    def _prepare_next(self) -> None:
        time.sleep(self.host_s)
        self._ready.set()
        self._wakeup()


def _sweep_jobs(count: int) -> list[dict[str, Any]]:
    grid = [(64, 0.003), (128, 0.001), (256, 0.003), (128, 0.01), (64, 0.01), (256, 0.001), (192, 0.003),
            (96, 0.003)]
    return [{"job_id": f"sweep-{i}", "hidden": grid[i % len(grid)][0], "lr": grid[i % len(grid)][1], "seed": i}
            for i in range(count)]


def bench_utilization(sizes: dict[str, Any], say: Callable[[str], None], device: Any = "cpu",
                      budget: int | None = BUDGET) -> dict[str, Any]:
    jobs = _sweep_jobs(sizes["pack_jobs"])
    host_s = sizes["host_ms"] / 1000
    request = profile_workload(lambda: builtin_workload("mlp-digits"), _spec("mlp-digits", hidden=256))

    def session(job, pool):
        spec = _spec("mlp-digits", hidden=job["hidden"], lr=job["lr"], seed=job["seed"])
        return HostBoundSession(lambda: builtin_workload("mlp-digits"), spec, steps=sizes["pack_steps"],
                                host_s=host_s, host_pool=pool)

    with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="host") as pool:
        exclusive = []
        for job in jobs:  # one device per job: run them one at a time so that they do not share this CPU
            with DeviceExecutor(device, budget, "pack", measure_iterations=0,
                                enforce_memory_fraction=False) as executor:
                executor.submit(job["job_id"], session(job, pool), request)
                status = executor.wait(job["job_id"], 600)
                busy = executor.status()["counters"]["busy_s"]
            exclusive.append({"job_id": job["job_id"], "device_s": status["jct_s"], "busy_s": busy,
                              "jct_s": status["jct_s"]})
        with DeviceExecutor(device, budget, "pack", measure_iterations=0, enforce_memory_fraction=False) as executor:
            began = time.perf_counter()
            for job in jobs:
                executor.submit(job["job_id"], session(job, pool), request)
            packed_jct = [executor.wait(job["job_id"], 600)["jct_s"] for job in jobs]
            device_s = time.perf_counter() - began
            busy = executor.status()["counters"]["busy_s"]
            switches = executor.status()["counters"]["switches"]
    exclusive_util = sum(item["busy_s"] for item in exclusive) / sum(item["device_s"] for item in exclusive)
    packed_util = busy / device_s
    ratio = _ratio(packed_util, exclusive_util)
    say(f"  c. {len(jobs)} small jobs x {sizes['pack_steps']} steps, {sizes['host_ms']:.0f} ms host time per "
        f"batch: utilization exclusive {exclusive_util:.1%} ({len(jobs)} devices, "
        f"{sum(i['device_s'] for i in exclusive):.1f} device-s), packed {packed_util:.1%} (1 device, "
        f"{device_s:.1f} device-s)")
    return {
        "figure": "c. utilization, small jobs",
        "mechanism": "packed on one device (PACK)",
        "baseline": "exclusive device per job",
        "jobs": jobs, "host_ms": sizes["host_ms"], "steps": sizes["pack_steps"],
        "exclusive": exclusive, "exclusive_utilization": exclusive_util,
        "exclusive_device_s": sum(item["device_s"] for item in exclusive),
        "exclusive_mean_jct_s": statistics.mean(item["jct_s"] for item in exclusive),
        "packed_utilization": packed_util, "packed_device_s": device_s, "packed_busy_s": busy,
        "packed_mean_jct_s": statistics.mean(packed_jct), "packed_switches": switches,
        "ratio": ratio,
        "target": f">= {TARGETS['utilization']:.0f}x ({PAPER['utilization']})",
        "met": bool(ratio and ratio >= TARGETS["utilization"]),
        "mechanism_text": f"{packed_util:.1%} busy",
        "baseline_text": f"{exclusive_util:.1%} busy",
    }


# -- d. inference latency ---------------------------------------------------------------------------------

class DeepTinyGPT(TinyGPTWorkload):
    """tiny-gpt with 8 transformer blocks: the training job of figure d."""

    layers = 8


TRAIN_SPEC = {"hidden": 64, "batch_size": 16}


def _training_job(sizes: dict[str, Any]) -> tuple[type[TinyGPTWorkload], dict[str, Any]]:
    """Figure d's training job: :class:`DeepTinyGPT` and :data:`TRAIN_SPEC` unless ``sizes`` names
    ``deep_layers`` or ``train_spec`` (the gpu-check's sizes do)."""
    layers = sizes.get("deep_layers", DeepTinyGPT.layers)
    deep = DeepTinyGPT if layers == DeepTinyGPT.layers else type("DeepTinyGPT", (DeepTinyGPT,), {"layers": layers})
    return deep, _spec("tiny-gpt", **sizes.get("train_spec", TRAIN_SPEC))


def _stream(lock: FifoLock | None):
    """The virtual GPU's kernel stream (``lock``), or nothing on a real device (``None``)."""
    return KernelStream(lock) if lock is not None else _nothing()


def _inference_model(device: Any = "cpu"):
    workload = builtin_workload("tiny-gpt")
    workload.setup(_spec("tiny-gpt"), torch.device(device))
    return workload.model.eval()


def _schedule(count: int, interval_s: float, seed: int = 11) -> list[float]:
    rng = random.Random(seed)
    moments, now = [], 0.0
    for _ in range(count):
        now += rng.expovariate(1 / interval_s)
        moments.append(now)
    return moments


def _send_all(schedule: list[float], send: Callable[[], Any]) -> list[tuple[float, Any]]:
    began = time.perf_counter()
    sent = []
    for moment in schedule:
        delay = began + moment - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        sent.append((time.perf_counter(), send()))
    return sent


def _executor_variant(staged: bool, schedule, request_input, lock: FifoLock | None,
                      migrate_to: MigrationTarget | None = None, *, sizes: dict[str, Any] | None = None,
                      device: Any = "cpu", budget: int | None = BUDGET) -> dict[str, Any]:
    deep, spec = _training_job(sizes or {})
    if staged:
        # Every layer its own stage: the embedding, two halves per block, the head.
        training = StagedWorkloadSession(deep, spec, stages=2 * deep.layers + 2, steps=10**6,
                                         migrate_to=migrate_to)
    else:
        training = WorkloadSession(deep, spec, steps=10**6)
    with DeviceExecutor(device, budget, "pack", measure_iterations=1, enforce_memory_fraction=False,
                        iteration_context=None if lock is None else lambda: KernelStream(lock)) as executor:
        executor.serve("lm", InferenceSession(_inference_model(device)), MemoryRequest(8 * 2**20, 8 * 2**20))
        executor.submit("train", training, MemoryRequest(64 * 2**20, 256 * 2**20))
        while training.step_count < 3:
            time.sleep(0.01)
        steps_before, began = training.step_count, time.perf_counter()
        done: dict[int, float] = {}

        def send():
            future = executor.infer("lm", request_input)
            key = id(future)
            future.add_done_callback(lambda _f, k=key: done.__setitem__(k, time.perf_counter()))
            return future

        sent = _send_all(schedule, send)
        for _, future in sent:
            future.result(60)
        window = time.perf_counter() - began
        steps = training.step_count - steps_before
        counters = executor.status()["counters"]
        migration = training.migration_stats() if staged else None
        durations = getattr(training, "action_durations", {})
    latencies = [done[id(future)] - moment for moment, future in sent]
    return {"latencies": latencies, "train_steps_per_s": steps / window,
            "preemption_latency": counters["preemption_latency"],
            "longest_stage_s": getattr(training, "longest_action_s", None) if durations else None,
            "served_between_operators": getattr(training, "inline_points", None), "migration": migration}


def _naive_variant(schedule, request_input, lock: FifoLock | None, core: int | None, *,
                   sizes: dict[str, Any] | None = None, device: Any = "cpu") -> dict[str, Any]:
    deep, spec = _training_job(sizes or {})
    training = deep()
    training.setup(spec, torch.device(device))
    model = _inference_model(device)
    request_input = request_input.to(device)
    cuda = torch.device(device).type == "cuda"
    stop = threading.Event()
    counter = {"steps": 0}
    warm = threading.Event()

    def device_context():
        return _stream(lock)

    def train():
        torch.set_num_threads(1)
        if core is not None:
            os.sched_setaffinity(0, {core})
        with device_context():
            index = 0
            while not stop.is_set():
                training.train_step(training.batch(*divmod(index, training.steps_per_epoch())))
                index += 1
                counter["steps"] = index
                if index == 3:
                    _sync(device)
                    warm.set()

    trainer = threading.Thread(target=train, name="naive-train", daemon=True)
    trainer.start()
    warm.wait(120)
    latencies = []

    def serve():
        torch.set_num_threads(1)
        if core is not None:
            os.sched_setaffinity(0, {core})
        began = time.perf_counter()
        steps_before = counter["steps"]
        with device_context(), torch.inference_mode():
            for moment in schedule:
                delay = began + moment - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                sent = time.perf_counter()
                model(request_input)
                if cuda:
                    torch.cuda.synchronize(device)
                latencies.append(time.perf_counter() - sent)
        result["window"] = time.perf_counter() - began
        result["steps"] = counter["steps"] - steps_before

    result: dict[str, Any] = {}
    server = threading.Thread(target=serve, name="naive-serve", daemon=True)
    server.start()
    server.join()
    stop.set()
    trainer.join(60)
    return {"latencies": latencies, "train_steps_per_s": result["steps"] / result["window"]}


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return None


def _training_alone(lock: FifoLock | None, seconds: float, *, sizes: dict[str, Any] | None = None,
                    device: Any = "cpu") -> float:
    deep, spec = _training_job(sizes or {})
    training = deep()
    training.setup(spec, torch.device(device))
    with _stream(lock):
        for index in range(2):
            training.train_step(training.batch(0, index))
        _sync(device)
        began, steps = time.perf_counter(), 0
        while time.perf_counter() - began < seconds:
            training.train_step(training.batch(0, 2 + steps % 50))
            steps += 1
        _sync(device)
    return steps / (time.perf_counter() - began)


def _inference_alone(request_input, lock: FifoLock | None, count: int = 50, *, device: Any = "cpu") -> list[float]:
    model = _inference_model(device)
    request_input = request_input.to(device)
    cuda = torch.device(device).type == "cuda"
    latencies = []
    with _stream(lock), torch.inference_mode():
        for _ in range(5):
            model(request_input)
        _sync(device)
        for _ in range(count):
            began = time.perf_counter()
            model(request_input)
            if cuda:
                torch.cuda.synchronize(device)
            latencies.append(time.perf_counter() - began)
    return latencies


def bench_inference(sizes: dict[str, Any], say: Callable[[str], None], device: Any = "cpu",
                    budget: int | None = BUDGET) -> dict[str, Any]:
    """Figure d. On the CPU every variant runs on the virtual GPU (one kernel at a time under a FIFO lock); on a
    real device (``device`` CUDA) without the lock, and without the naive-OS-threads variant (a CPU model)."""
    schedule = _schedule(sizes["requests"], sizes["request_interval_ms"] / 1000)
    request_input = torch.randint(0, 95, (1, 64), generator=torch.Generator().manual_seed(0))
    virtual = torch.device(device).type == "cpu"
    lock = FifoLock() if virtual else None
    alone = _inference_alone(request_input, lock, device=device)
    train_alone = _training_alone(lock, sizes["train_alone_s"], sizes=sizes, device=device)
    on = {"sizes": sizes, "device": device}
    variants = {
        "switchflow": _executor_variant(True, schedule, request_input, lock, budget=budget, **on),
        "whole_graph_fifo": _executor_variant(False, schedule, request_input, lock, budget=budget, **on),
        "naive": _naive_variant(schedule, request_input, lock, None, **on),
    }
    if virtual and hasattr(os, "sched_setaffinity"):
        core = min(os.sched_getaffinity(0))
        variants["naive_os_threads"] = _naive_variant(schedule, request_input, None, core, sizes=sizes)
    summary = {}
    for name, variant in variants.items():
        latencies = variant["latencies"]
        summary[name] = {
            "p50_s": percentile(latencies, 0.5), "p99_s": percentile(latencies, 0.99), "max_s": max(latencies),
            "train_steps_per_s": variant["train_steps_per_s"],
            "train_slowdown": train_alone / variant["train_steps_per_s"] if variant["train_steps_per_s"] else None,
        }
        if "preemption_latency" in variant:
            summary[name]["preemption_latency"] = variant["preemption_latency"]
            summary[name]["longest_stage_s"] = variant["longest_stage_s"]
            summary[name]["served_between_operators"] = variant["served_between_operators"]
    mechanism = summary["switchflow"]["p99_s"]
    ratio = _ratio(summary["naive"]["p99_s"], mechanism)
    ratio_fifo = _ratio(summary["whole_graph_fifo"]["p99_s"], mechanism)
    say(f"  d. {len(schedule)} requests, mean every {sizes['request_interval_ms']:.0f} ms; inference alone p99 "
        f"{_ms(percentile(alone, 0.99))}; training alone {train_alone:.1f} it/s")
    for name, item in summary.items():
        say(f"     {name:17s} p50 {_ms(item['p50_s']):>10s}  p99 {_ms(item['p99_s']):>10s}  training "
            f"{item['train_steps_per_s']:.1f} it/s")
    return {
        "figure": "d. inference p99 next to training",
        "mechanism": "SwitchFlow preemption (stages + between operators)",
        "baseline": "naive co-location (kernels interleaved)",
        "requests": len(schedule), "request_interval_ms": sizes["request_interval_ms"],
        "inference_alone": {"p50_s": percentile(alone, 0.5), "p99_s": percentile(alone, 0.99)},
        "training_alone_steps_per_s": train_alone,
        "variants": summary,
        "ratio": ratio,
        "ratio_vs_whole_graph_fifo": ratio_fifo,
        "ratio_vs_naive_os_threads": _ratio(summary.get("naive_os_threads", {}).get("p99_s"), mechanism),
        "target": f">= {TARGETS['inference']:.0f}x vs naive ({PAPER['inference']})",
        "met": bool(ratio and ratio >= TARGETS["inference"]),
        "mechanism_text": f"p99 {_ms(mechanism)}",
        "baseline_text": f"p99 {_ms(summary['naive']['p99_s'])} (whole-graph FIFO "
                         f"{_ms(summary['whole_graph_fifo']['p99_s'])})",
    }


# -- e. migration -----------------------------------------------------------------------------------------

def held_by_job(sizes: dict[str, Any], lock: FifoLock | None, target: MigrationTarget | None, *,
                device: Any = "cpu", budget: int | None = BUDGET) -> dict[str, Any]:
    """The low job (staged, ``migration_low_steps``) runs; after 3 steps a high-priority job holds the device
    for ``migration_hold_steps`` iterations. ``lock``: the virtual device's kernel stream (``None`` on a real
    device). ``weights``: the low job's final weights, copied to the CPU."""
    deep, spec = _training_job(sizes)
    low = StagedWorkloadSession(deep, spec, stages=2 * deep.layers + 2,
                                steps=sizes["migration_low_steps"], migrate_to=target)
    high = WorkloadSession(deep, spec, steps=sizes["migration_hold_steps"])
    request = MemoryRequest(64 * 2**20, 256 * 2**20)
    with DeviceExecutor(device, budget, "priority", measure_iterations=0, enforce_memory_fraction=False,
                        iteration_context=None if lock is None else lambda: KernelStream(lock)) as executor:
        executor.submit("low", low, request)
        while low.step_count < 3:
            time.sleep(0.002)
        at = low.step_count
        executor.submit("high", high, request, priority=1)
        high_status = executor.wait("high", 600)
        during = low.step_count - at
        low_status = executor.wait("low", 600)
    hold_s = high_status["jct_s"]
    return {"low_jct_s": low_status["jct_s"], "high_jct_s": hold_s, "low_steps_during_hold": during,
            "low_steps_per_s_during_hold": during / hold_s if hold_s else None,
            "migration": low_status["migration"], "state": low_status["state"],
            "weights": [tensor.detach().to("cpu", copy=True) for tensor in low.workload.model.state_dict().values()]}


def bench_migration(sizes: dict[str, Any], say: Callable[[str], None]) -> dict[str, Any]:
    lock, second = FifoLock(), FifoLock()

    def target() -> MigrationTarget:
        return MigrationTarget("cpu", context=lambda: KernelStream(second), name="virtual:1")

    train_alone = _training_alone(lock, sizes["train_alone_s"])
    held = {"preempt_only": held_by_job(sizes, lock, None), "migration": held_by_job(sizes, lock, target())}
    # Exactness in the benchmark's own setting (a preempted staged run is bit-identical to an uninterrupted one).
    identical = all(torch.equal(a, b) for a, b in zip(held["preempt_only"].pop("weights"),
                                                       held["migration"].pop("weights"), strict=True))
    schedule = _schedule(sizes["migration_requests"], sizes["request_interval_ms"] / 1000)
    request_input = torch.randint(0, 95, (1, 64), generator=torch.Generator().manual_seed(0))
    served = {"preempt_only": _executor_variant(True, schedule, request_input, lock),
              "migration": _executor_variant(True, schedule, request_input, lock, target())}
    serving = {}
    for name, variant in served.items():
        latencies = variant["latencies"]
        serving[name] = {"p50_s": percentile(latencies, 0.5), "p99_s": percentile(latencies, 0.99),
                         "max_s": max(latencies), "train_steps_per_s": variant["train_steps_per_s"],
                         "migration": variant["migration"]}
    ratio = _ratio(held["preempt_only"]["low_jct_s"], held["migration"]["low_jct_s"])
    say(f"  e. held by a job ({sizes['migration_hold_steps']} high-priority iterations; low job "
        f"{sizes['migration_low_steps']} steps; training alone {train_alone:.1f} it/s)")
    for name, item in held.items():
        say(f"     {name:13s} low JCT {item['low_jct_s']:.2f} s, {item['low_steps_during_hold']} low steps during "
            f"the hold ({item['low_steps_per_s_during_hold']:.1f} it/s), high JCT {item['high_jct_s']:.2f} s")
    say(f"     migrated run's weights bit-identical to the preempt-only run's: {identical}")
    say(f"     held by inference ({len(schedule)} requests, mean every {sizes['request_interval_ms']:.0f} ms)")
    for name, item in serving.items():
        say(f"     {name:13s} p50 {_ms(item['p50_s']):>10s}  p99 {_ms(item['p99_s']):>10s}  training "
            f"{item['train_steps_per_s']:.1f} it/s")
    return {
        "figure": "e. migration: low-priority job's JCT while a high-priority job holds the device",
        "mechanism": "SwitchFlow migration to a second virtual device",
        "baseline": "preempt-only (yield at a stage boundary and wait)",
        "training_alone_steps_per_s": train_alone,
        "held_by_job": held,
        "migrated_weights_bit_identical": identical,
        "held_by_inference": serving,
        "requests": len(schedule), "request_interval_ms": sizes["request_interval_ms"],
        "ratio": ratio,
        "ratio_inference_p99": _ratio(serving["preempt_only"]["p99_s"], serving["migration"]["p99_s"]),
        "ratio_training_during_inference": _ratio(serving["migration"]["train_steps_per_s"],
                                                  serving["preempt_only"]["train_steps_per_s"]),
        "target": "> 1x (no target in the issue)",
        "met": bool(ratio and ratio > 1.0),
        "mechanism_text": f"low JCT {held['migration']['low_jct_s']:.2f} s, "
                          f"{held['migration']['low_steps_per_s_during_hold']:.1f} it/s during the hold",
        "baseline_text": f"low JCT {held['preempt_only']['low_jct_s']:.2f} s, "
                         f"{held['preempt_only']['low_steps_per_s_during_hold']:.1f} it/s during the hold",
    }


# -- the harness ------------------------------------------------------------------------------------------

FIGURES = {"switch": bench_switch, "jct": bench_jct, "utilization": bench_utilization, "inference": bench_inference,
           "migration": bench_migration}


def run(quick: bool = False, *, figures: list[str] | None = None, say: Callable[[str], None] | None = None,
        sizes: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the benchmark (``quick``: small sizes, well under 30 s); print and return the results.

    ``figures`` picks some of ``switch``, ``jct``, ``utilization``, ``inference``; ``sizes`` overrides
    entries of the size table (tests use tiny ones).
    """
    say = say or (lambda line: print(line, flush=True))
    sizes = {**(QUICK if quick else FULL), **(sizes or {})}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    started = datetime.now(UTC)
    machine = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
               "torch": torch.__version__, "device": "virtual GPU (CPU), torch threads 1"}
    say(f"strata bench gpushare{' --quick' if quick else ''}: {started:%Y-%m-%d %H:%M} UTC, "
        f"{machine['cpus']} CPUs, torch {machine['torch']}")
    results: dict[str, Any] = {"quick": quick, "date": started.isoformat(), "machine": machine, "sizes": sizes,
                               "figures": {}}
    began = time.perf_counter()
    try:
        warm_up()
        for name in figures or list(FIGURES):
            figure_began = time.perf_counter()
            results["figures"][name] = FIGURES[name](sizes, say)
            results["figures"][name]["seconds"] = time.perf_counter() - figure_began
    finally:
        torch.set_num_threads(threads)
    results["seconds"] = time.perf_counter() - began
    say("")
    say(format_table(results))
    return results


def warm_up(device: Any = "cpu") -> None:
    """Import and first-use costs (scikit-learn's digits, torch's kernels) out of every measurement."""
    for name in ("mlp-digits", "cnn-synthetic", "tiny-gpt"):
        workload = builtin_workload(name)
        workload.setup(_spec(name), torch.device(device))
        workload.train_step(workload.batch(0, 0))
    _sync(device)


def format_table(results: dict[str, Any]) -> str:
    rows = [("figure", "mechanism", "baseline", "ratio", "target", "met")]
    for item in results["figures"].values():
        ratio = item.get("ratio")
        rows.append((item["figure"], f"{item['mechanism']}: {item['mechanism_text']}",
                     f"{item['baseline']}: {item['baseline_text']}",
                     "-" if ratio is None else f"{ratio:.2f}x", item["target"], "yes" if item["met"] else "no"))
    lines = table(rows[1:], rows[0]).splitlines()
    extra = results["figures"].get("inference")
    if extra:
        lines.append(f"d. vs whole-graph FIFO: {extra['ratio_vs_whole_graph_fifo']:.2f}x lower p99"
                     + (f"; vs naive OS threads on one core: {extra['ratio_vs_naive_os_threads']:.2f}x"
                        if extra.get("ratio_vs_naive_os_threads") else ""))
    lines.append(f"total {results['seconds']:.1f} s")
    return "\n".join(lines)


def main(quick: bool = False, output: str | None = None) -> int:
    """``strata bench gpushare`` entry point: run, print, optionally write JSON; 0 on success."""
    results = run(quick)
    write(document("gpushare", quick, common_figures(results), details=results, machine=results["machine"]),
          output)
    return 0


def common_figures(results: dict[str, Any]) -> list[Figure]:
    """The harness's figures (numbers, ratio oriented higher-is-better) from each figure's details. The switch
    figure's target is the 100x ratio; its 5 ms p99 bound is in the details' ``met``."""
    found = []
    for key, item in results["figures"].items():
        if key == "switch":
            found.append(Figure(key, item["figure"] + " (p50)", item["switch_p50_s"], item["checkpoint_p50_s"], "s",
                                target=TARGETS["switch"], mechanism_text=item["mechanism_text"],
                                baseline_text=item["baseline_text"],
                                extra={"p99_bound_met": (item["switch_p99_s"] or 1) <= TARGETS["switch_ms"] / 1000}))
        elif key == "jct":
            found.append(Figure(key, item["figure"], item["srtf"]["mean_jct_s"], item["fifo"]["mean_jct_s"], "s",
                                target=TARGETS["jct"], mechanism_text=item["mechanism_text"],
                                baseline_text=item["baseline_text"]))
        elif key == "utilization":
            found.append(Figure(key, item["figure"], item["packed_utilization"], item["exclusive_utilization"],
                                "busy fraction", lower_is_better=False, target=TARGETS["utilization"],
                                mechanism_text=item["mechanism_text"], baseline_text=item["baseline_text"]))
        elif key == "inference":
            variants = item["variants"]
            found.append(Figure(key, item["figure"], variants["switchflow"]["p99_s"], variants["naive"]["p99_s"], "s",
                                target=TARGETS["inference"], mechanism_text=item["mechanism_text"],
                                baseline_text=item["baseline_text"]))
        elif key == "migration":
            held, serving = item["held_by_job"], item["held_by_inference"]
            found.append(Figure(key, item["figure"], held["migration"]["low_jct_s"],
                                held["preempt_only"]["low_jct_s"], "s", target=1.0,
                                mechanism_text=item["mechanism_text"], baseline_text=item["baseline_text"]))
            found.append(Figure("migration_inference", "e. inference p99 next to training, migration vs preempt-only",
                                serving["migration"]["p99_s"], serving["preempt_only"]["p99_s"], "s",
                                mechanism_text=f"p99 {_ms(serving['migration']['p99_s'])}, training "
                                               f"{serving['migration']['train_steps_per_s']:.1f} it/s",
                                baseline_text=f"p99 {_ms(serving['preempt_only']['p99_s'])}, training "
                                              f"{serving['preempt_only']['train_steps_per_s']:.1f} it/s"))
    return found


def combined(outcomes: list[dict[str, Any]]) -> list[Figure]:
    """One figure per key over several runs: mechanism and baseline are the medians, ``runs`` the per-run
    ratios, ``ratio_median`` and ``range`` their median and [min, max]."""
    per_run = [common_figures(outcome) for outcome in outcomes]
    result = []
    for index, figure in enumerate(per_run[0]):
        same = [figures[index] for figures in per_run]
        ratios = [item.ratio for item in same if item.ratio is not None]
        mechanisms = [item.mechanism for item in same if item.mechanism is not None]
        baselines = [item.baseline for item in same if item.baseline is not None]
        result.append(Figure(
            figure.key, figure.figure, percentile(mechanisms, 0.5) if mechanisms else None,
            percentile(baselines, 0.5) if baselines else None, figure.unit, figure.lower_is_better, figure.target,
            mechanism_text="; ".join(item.mechanism_text for item in same),
            baseline_text="; ".join(item.baseline_text for item in same),
            extra={"runs": ratios, "ratio_median": percentile(ratios, 0.5) if ratios else None,
                   "range": [min(ratios), max(ratios)] if ratios else None,
                   "met_runs": sum(1 for item in same if item.met)}))
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output")
    parser.add_argument("--figure", action="append", choices=list(FIGURES))
    parser.add_argument("--runs", type=int, default=1, help="repeat the run; the JSON has the median and range")
    arguments = parser.parse_args()
    if arguments.runs > 1:
        outcomes = [run(arguments.quick, figures=arguments.figure) for _ in range(arguments.runs)]
        doc = document("gpushare", arguments.quick, combined(outcomes), details={"runs": outcomes},
                       machine=outcomes[0]["machine"])
        for key, item in doc["figures"].items():
            print(f"{key}: ratio median {item['ratio_median']}, range {item['range']}, met {item['met_runs']}/"
                  f"{arguments.runs}", flush=True)
        write(doc, arguments.output)
        sys.exit(0)
    if arguments.figure:
        outcome = run(arguments.quick, figures=arguments.figure)
        write(document("gpushare", arguments.quick, common_figures(outcome), details=outcome,
                       machine=outcome["machine"]), arguments.output)
        sys.exit(0)
    sys.exit(main(arguments.quick, arguments.output))
