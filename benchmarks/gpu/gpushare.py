"""gpu-check part ``gpushare``: GPU sharing (Salus, SwitchFlow) on a CUDA device, through the sharing service's own
executor (:class:`components.gpushare.executor.DeviceExecutor`) and sessions, each figure against its baseline in
the same process on the same device.

- **switch**: two real training jobs (``mlp-digits`` width 1024, ``cnn-synthetic`` width 32) alternating every
  iteration on one executor (PACK): the gap between one job's iteration and the other's, against checkpoint
  switching (``torch.save`` of the running job's state, ``torch.load(map_location=device)`` + ``load_state_dict``
  of the next, synchronized: a lower bound, warm page cache, no process restart).
- **admission**: jobs that really allocate device memory (a persistent tensor for their life, an ephemeral one
  per iteration, written) submitted together to an executor whose budget holds two jobs' bytes (plus half an
  ephemeral: the service shares ephemeral lanes, so it may admit a third): it admits what fits, queues the rest,
  and every job succeeds; the figure is the peak (the sessions' live bytes, and on CUDA the allocator's
  ``memory_allocated`` sampled after each allocation) against the same jobs all admitted at once (a budget that
  holds them all): what running them without admission takes. ``peak_within_budget`` says whether it held.
- **jct**: a seeded Poisson trace of small and medium training jobs at about 80 % offered load: FIFO with the
  device to each job in turn, against SRTF with per-iteration switching (JCT = finish - arrival).
- **utilization**: small sweep jobs whose input takes a fixed host time per batch: each alone on the device
  (exclusive) against all packed on one (PACK); utilization = time in iterations / device time.
- **inference**: a training job (tiny-gpt, 8 blocks) and a served tiny-gpt on one device, requests on a Poisson
  schedule: SwitchFlow (staged training, requests served between operators) against naive co-location (a training
  thread and a serving thread issuing kernels with no coordination) and whole-graph FIFO (the executor, unstaged).

The gpushare benchmark (:mod:`benchmarks.gpushare.bench`) runs these on a virtual GPU only (its executors and
baselines name ``"cpu"``); this part is the same measurement with the device passed through.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from benchmarks.benchkit import Figure, percentile
from components.gpushare.executor import DeviceExecutor
from components.gpushare.lanes import MemoryRequest
from components.gpushare.sessions import Progress, Session, WorkloadSession
from components.gpushare.stages import InferenceSession, StagedWorkloadSession
from components.train.spec import TrainSpec
from components.train.workloads import TinyGPTWorkload, builtin_workload

MiB = 2**20
DRY = {"switch_steps": 8, "checkpoint_switches": 6, "alloc_mib": 4, "alloc_jobs": 4, "alloc_steps": 4,
       "trace_jobs": 4, "trace_steps": (3, 8), "pack_jobs": 2, "pack_steps": 6, "host_ms": 4.0,
       "requests": 20, "request_interval_ms": 15.0, "train_spec": {"hidden": 32, "batch_size": 4},
       "deep_layers": 2}
GPU = {"switch_steps": 200, "checkpoint_switches": 100, "alloc_mib": 2048, "alloc_jobs": 6, "alloc_steps": 20,
       "trace_jobs": 16, "trace_steps": (40, 160), "pack_jobs": 6, "pack_steps": 150, "host_ms": 4.0,
       "requests": 400, "request_interval_ms": 10.0, "train_spec": {"hidden": 256, "batch_size": 64},
       "deep_layers": 8}
TARGETS = {"switch": 100.0, "jct": 2.0, "utilization": 2.0, "inference": 5.0}


def _spec(workload: str, **fields: Any) -> dict[str, Any]:
    return TrainSpec().validate({"workload": workload, **fields})


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(rec) -> None:
    sizes = rec.size(DRY, GPU)
    device = torch.device(rec.device)
    rec.detail("sizes", sizes)
    budget = (torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 8 * 2**30)
    rec.detail("device_memory", budget)
    rec.step("warm-up", _warm_up, device)
    for name, function in (("switch", switch), ("admission", admission), ("jct", jct),
                           ("utilization", utilization), ("inference", inference)):
        result = rec.step(name, function, device, sizes, budget, rec.say)
        if result is not None:
            figure, details = result
            rec.details[name] = details
            rec.figure(figure)


def _warm_up(device: torch.device) -> None:
    for name in ("mlp-digits", "cnn-synthetic", "tiny-gpt"):
        workload = builtin_workload(name)
        workload.setup(_spec(name), device)
        workload.train_step(workload.batch(0, 0))
    _sync(device)


# -- switch -------------------------------------------------------------------------------------------------------

def switch(device: torch.device, sizes: dict[str, Any], budget: int, say) -> tuple[Figure, dict[str, Any]]:
    jobs = {"mlp-1024": ("mlp-digits", {"hidden": 1024}), "cnn-32": ("cnn-synthetic", {"hidden": 32})}
    steps = sizes["switch_steps"]
    with DeviceExecutor(device, budget, "pack", measure_iterations=0, enforce_memory_fraction=False,
                        start=False) as executor:
        for name, (kind, fields) in jobs.items():
            executor.submit(name, WorkloadSession.builtin(kind, steps=steps, **fields),
                            MemoryRequest(64 * MiB, 64 * MiB))
        executor.start()
        for name in jobs:
            executor.wait(name, 600)
        gaps = executor.status()["counters"]["switch_latency"]
    workloads = {}
    for name, (kind, fields) in jobs.items():
        workload = builtin_workload(kind)
        workload.setup(_spec(kind, **fields), device)
        workloads[name] = workload
    names = list(workloads)
    latencies = []
    with tempfile.TemporaryDirectory(prefix="strata-gpu-check-") as directory:
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
            workloads[following].load_state_dict(torch.load(paths[following], map_location=device,
                                                            weights_only=True))
            _sync(device)
            latencies.append(time.perf_counter() - began)
    checkpoint_p50 = percentile(latencies, 0.5)
    say(f"switch p50 {gaps['p50_s'] * 1000:.3f} ms p99 {gaps['p99_s'] * 1000:.3f} ms ({gaps['count']} switches); "
        f"checkpoint p50 {checkpoint_p50 * 1000:.2f} ms")
    details = {"switches": gaps["count"], "switch_p50_s": gaps["p50_s"], "switch_p99_s": gaps["p99_s"],
               "checkpoint_switches": len(latencies), "checkpoint_p50_s": checkpoint_p50,
               "checkpoint_p99_s": percentile(latencies, 0.99)}
    return Figure("switch", "switch latency between two training jobs (p50), iteration boundary vs checkpoint",
                  gaps["p50_s"], checkpoint_p50, "s", target=TARGETS["switch"],
                  extra={"p99_s": gaps["p99_s"], "checkpoint_p99_s": details["checkpoint_p99_s"]}), details


# -- admission with real allocations ----------------------------------------------------------------------------

class _Live:
    """Bytes the allocating sessions hold right now and the most they held at once; on CUDA also the most the
    device's allocator had allocated at those moments (sampled after each allocation: the executor resets CUDA's
    own peak statistics around every iteration it measures, so ``max_memory_allocated`` covers one iteration)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.now = self.peak = 0
        self.cuda_peak: int | None = None

    def add(self, amount: int, device: torch.device | None = None) -> None:
        with self.lock:
            self.now += amount
            self.peak = max(self.peak, self.now)
            if device is not None and device.type == "cuda":
                allocated = torch.cuda.memory_allocated(device)
                self.cuda_peak = max(self.cuda_peak or 0, allocated)


class AllocatingSession(Session):
    """A job that allocates ``persistent`` bytes on the device for its life and ``ephemeral`` bytes per
    iteration (and touches them: a real allocation, written), ``steps`` iterations."""

    def __init__(self, persistent: int, ephemeral: int, steps: int, live: _Live):
        self.persistent, self.ephemeral, self.steps, self.live = persistent, ephemeral, steps, live
        self.state: torch.Tensor | None = None
        self.done = 0

    def start(self, device) -> None:
        self.state = torch.ones(self.persistent, dtype=torch.uint8, device=device)
        self.live.add(self.persistent, self.state.device)

    def step(self, should_yield=None) -> Progress:
        assert self.state is not None
        scratch = torch.empty(self.ephemeral, dtype=torch.uint8, device=self.state.device)
        self.live.add(self.ephemeral, self.state.device)
        scratch.fill_(self.done % 251)
        self.state[: min(len(self.state), len(scratch))].add_(scratch[: min(len(self.state), len(scratch))])
        _sync(self.state.device)
        del scratch
        self.live.add(-self.ephemeral)
        self.done += 1
        return Progress.DONE if self.done >= self.steps else Progress.ITERATION

    def remaining_steps(self) -> int:
        return self.steps - self.done

    def resident(self):
        return (self.state,) if self.state is not None else ()

    def close(self) -> None:
        if self.state is not None:
            self.state = None
            self.live.add(-self.persistent)


def _admission_run(device: torch.device, sizes: dict[str, Any], budget: int) -> dict[str, Any]:
    each = sizes["alloc_mib"] * MiB
    request = MemoryRequest(each, each)
    live = _Live()
    _sync(device)
    base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    with DeviceExecutor(device, budget, "fifo", measure_iterations=0, enforce_memory_fraction=False,
                        start=False) as executor:
        admissions = {}
        for index in range(sizes["alloc_jobs"]):
            job = f"alloc-{index}"
            admission = executor.submit(job, AllocatingSession(each, each, sizes["alloc_steps"], live), request)
            admissions[job] = admission.status
        executor.start()
        states = {job: executor.wait(job, 600)["state"] for job in admissions}
    peak_cuda = (live.cuda_peak - base) if live.cuda_peak is not None else None
    return {"budget": budget, "admitted_at_submit": sum(state == "admitted" for state in admissions.values()),
            "admissions": admissions, "final": states,
            "peak_live_bytes": live.peak, "peak_cuda_bytes": peak_cuda}


def admission(device: torch.device, sizes: dict[str, Any], budget: int, say) -> tuple[Figure, dict[str, Any]]:
    each = sizes["alloc_mib"] * MiB
    jobs = sizes["alloc_jobs"]
    # Two jobs' persistent + ephemeral bytes, plus room for the allocator's rounding: the service admits two.
    tight = 2 * 2 * each + each // 2
    admitted = _admission_run(device, sizes, tight)
    everyone = _admission_run(device, sizes, max(budget, jobs * 2 * each + each))
    succeeded = sum(state == "succeeded" for state in admitted["final"].values())
    within = admitted["peak_live_bytes"] <= tight and (admitted["peak_cuda_bytes"] is None
                                                       or admitted["peak_cuda_bytes"] <= tight)
    cuda_peak = "-" if admitted["peak_cuda_bytes"] is None else f"{admitted['peak_cuda_bytes'] / MiB:.0f}"
    say(f"admission: budget {tight / MiB:.0f} MiB, {admitted['admitted_at_submit']}/{jobs} admitted at submit, "
        f"{succeeded}/{jobs} succeeded, peak {admitted['peak_live_bytes'] / MiB:.0f} MiB (CUDA {cuda_peak} MiB); "
        f"all at once: peak {everyone['peak_live_bytes'] / MiB:.0f} MiB")
    details = {"budget_bytes": tight, "with_admission": admitted, "all_at_once": everyone,
               "succeeded": succeeded, "jobs": jobs, "peak_within_budget": within}
    return Figure("admission", "peak device memory of jobs that allocate for real: admitted into a budget below their sum "
                  "vs all at once", admitted["peak_cuda_bytes"] or admitted["peak_live_bytes"],
                  everyone["peak_cuda_bytes"] or everyone["peak_live_bytes"], "bytes",
                  extra={"budget_bytes": tight, "peak_within_budget": within, "succeeded": succeeded,
                         "jobs": jobs}), details


# -- JCT -----------------------------------------------------------------------------------------------------------

JOB_TYPES = {"small": ("mlp-digits", {"hidden": 128}, 0.6), "medium": ("cnn-synthetic", {"hidden": 16}, 0.4)}


def _trace(device: torch.device, sizes: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, float]]:
    step_s = {}
    for kind, (workload_name, fields, _) in JOB_TYPES.items():
        workload = builtin_workload(workload_name)
        workload.setup(_spec(workload_name, **fields), device)
        for index in range(2):
            workload.train_step(workload.batch(0, index))
        _sync(device)
        began = time.perf_counter()
        for index in range(5):
            workload.train_step(workload.batch(0, 2 + index))
        _sync(device)
        step_s[kind] = (time.perf_counter() - began) / 5
    rng = random.Random(7)
    jobs = []
    for index in range(sizes["trace_jobs"]):
        kind = "small" if rng.random() < JOB_TYPES["small"][2] else "medium"
        jobs.append({"job_id": f"{kind}-{index}", "type": kind, "steps": rng.randint(*sizes["trace_steps"]),
                     "seed": index})
    mean_service = statistics.mean(job["steps"] * step_s[job["type"]] + 0.01 for job in jobs)
    arrival = 0.0
    for job in jobs:
        job["arrival_s"] = round(arrival, 4)
        arrival += rng.expovariate(0.8 / mean_service)
    return jobs, step_s


def _replay(device: torch.device, trace: list[dict[str, Any]], policy: str, budget: int) -> dict[str, Any]:
    with DeviceExecutor(device, budget, policy, enforce_memory_fraction=False) as executor:
        began = time.perf_counter()
        for job in trace:
            delay = began + job["arrival_s"] - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            workload_name, fields, _ = JOB_TYPES[job["type"]]
            session = WorkloadSession.builtin(workload_name, steps=job["steps"], seed=job["seed"], **fields)
            executor.submit(job["job_id"], session, MemoryRequest(64 * MiB, 64 * MiB))
        jct = {}
        for job in trace:
            status = executor.wait(job["job_id"], 600)
            if status["state"] != "succeeded":
                raise RuntimeError(f"{job['job_id']} {status['state']}: {status['error']}")
            jct[job["job_id"]] = status["jct_s"]
        counters = executor.status()["counters"]
    return {"policy": policy, "mean_jct_s": statistics.mean(jct.values()), "jct": jct,
            "makespan_s": time.perf_counter() - began, "switches": counters["switches"]}


def jct(device: torch.device, sizes: dict[str, Any], budget: int, say) -> tuple[Figure, dict[str, Any]]:
    trace, step_s = _trace(device, sizes)
    fifo = _replay(device, trace, "fifo", budget)
    srtf = _replay(device, trace, "srtf", budget)
    say(f"jct: {len(trace)} jobs, mean JCT FIFO {fifo['mean_jct_s']:.3f} s, SRTF {srtf['mean_jct_s']:.3f} s")
    return Figure("jct", "average JCT of a mixed trace: shared device under SRTF vs FIFO with the device to each job",
                  srtf["mean_jct_s"], fifo["mean_jct_s"], "s", target=TARGETS["jct"]), \
        {"trace": trace, "step_s": step_s, "fifo": fifo, "srtf": srtf}


# -- utilization -------------------------------------------------------------------------------------------------

class HostBoundSession(WorkloadSession):
    """A workload whose next batch takes ``host_s`` of host time (a sleep standing for reading and decoding)."""

    def __init__(self, *args, host_s: float, pool: ThreadPoolExecutor, **kwargs):
        super().__init__(*args, **kwargs)
        self.host_s, self.pool = host_s, pool
        self._ready = threading.Event()
        self._ready.set()

    def ready(self) -> bool:
        return self._ready.is_set()

    def step(self, should_yield=None) -> Progress:
        progress = super().step()
        if progress is not Progress.DONE:
            self._ready.clear()
            self.pool.submit(self._prepare)
        return progress

    def _prepare(self) -> None:
        time.sleep(self.host_s)
        self._ready.set()
        self._wakeup()


def utilization(device: torch.device, sizes: dict[str, Any], budget: int, say) -> tuple[Figure, dict[str, Any]]:
    grid = [(64, 0.003), (128, 0.001), (256, 0.003), (128, 0.01), (64, 0.01), (256, 0.001)]
    jobs = [{"job_id": f"sweep-{i}", "hidden": grid[i % len(grid)][0], "lr": grid[i % len(grid)][1], "seed": i}
            for i in range(sizes["pack_jobs"])]
    request = MemoryRequest(64 * MiB, 64 * MiB)

    def session(job, pool):
        spec = _spec("mlp-digits", hidden=job["hidden"], lr=job["lr"], seed=job["seed"])
        return HostBoundSession(lambda: builtin_workload("mlp-digits"), spec, steps=sizes["pack_steps"],
                                host_s=sizes["host_ms"] / 1000, pool=pool)

    with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="host") as pool:
        exclusive_busy = exclusive_device = 0.0
        for job in jobs:
            with DeviceExecutor(device, budget, "pack", measure_iterations=0,
                                enforce_memory_fraction=False) as executor:
                executor.submit(job["job_id"], session(job, pool), request)
                status = executor.wait(job["job_id"], 600)
                exclusive_busy += executor.status()["counters"]["busy_s"]
                exclusive_device += status["jct_s"]
        with DeviceExecutor(device, budget, "pack", measure_iterations=0, enforce_memory_fraction=False) as executor:
            began = time.perf_counter()
            for job in jobs:
                executor.submit(job["job_id"], session(job, pool), request)
            for job in jobs:
                executor.wait(job["job_id"], 600)
            packed_device = time.perf_counter() - began
            packed_busy = executor.status()["counters"]["busy_s"]
    exclusive_util, packed_util = exclusive_busy / exclusive_device, packed_busy / packed_device
    say(f"utilization: exclusive {exclusive_util:.1%}, packed {packed_util:.1%}")
    return Figure("utilization", "device utilization of small host-bound jobs: packed on one device vs one each",
                  packed_util, exclusive_util, "busy fraction", lower_is_better=False, target=TARGETS["utilization"]), \
        {"jobs": jobs, "exclusive_device_s": exclusive_device, "exclusive_busy_s": exclusive_busy,
         "packed_device_s": packed_device, "packed_busy_s": packed_busy}


# -- inference p99 next to training -----------------------------------------------------------------------------

def _deep(layers: int):
    return type("DeepTinyGPT", (TinyGPTWorkload,), {"layers": layers})


def _served(device: torch.device):
    workload = builtin_workload("tiny-gpt")
    workload.setup(_spec("tiny-gpt"), device)
    return workload.model.eval()


def _schedule(count: int, interval_s: float, seed: int = 11) -> list[float]:
    rng = random.Random(seed)
    moments, now = [], 0.0
    for _ in range(count):
        now += rng.expovariate(1 / interval_s)
        moments.append(now)
    return moments


def _executor_variant(device, staged: bool, schedule, request, sizes, budget) -> dict[str, Any]:
    deep = _deep(sizes["deep_layers"])
    spec = _spec("tiny-gpt", **sizes["train_spec"])
    training = (StagedWorkloadSession(deep, spec, stages=2 * deep.layers + 2, steps=10**6) if staged
                else WorkloadSession(deep, spec, steps=10**6))
    with DeviceExecutor(device, budget, "pack", measure_iterations=1, enforce_memory_fraction=False) as executor:
        executor.serve("lm", InferenceSession(_served(device)), MemoryRequest(8 * MiB, 8 * MiB))
        executor.submit("train", training, MemoryRequest(64 * MiB, 256 * MiB))
        while executor.job_status("train")["steps"] < 3:
            time.sleep(0.005)
        steps_before, began = executor.job_status("train")["steps"], time.perf_counter()
        done: dict[int, float] = {}
        sent = []
        for moment in schedule:
            delay = began + moment - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            future = executor.infer("lm", request)
            key = id(future)
            future.add_done_callback(lambda _f, k=key: done.__setitem__(k, time.perf_counter()))
            sent.append((time.perf_counter(), future))
        for _, future in sent:
            future.result(60)
        window = time.perf_counter() - began
        steps = executor.job_status("train")["steps"] - steps_before
        executor.cancel("train")
    return {"latencies": [done[id(future)] - moment for moment, future in sent], "train_steps_per_s": steps / window}


def _naive_variant(device, schedule, request, sizes) -> dict[str, Any]:
    deep = _deep(sizes["deep_layers"])()
    deep.setup(_spec("tiny-gpt", **sizes["train_spec"]), device)
    model = _served(device)
    stop, warm = threading.Event(), threading.Event()
    counter = {"steps": 0}

    def train():
        index = 0
        while not stop.is_set():
            deep.train_step(deep.batch(*divmod(index, deep.steps_per_epoch())))
            index += 1
            counter["steps"] = index
            if index == 3:
                _sync(device)
                warm.set()

    trainer = threading.Thread(target=train, name="naive-train", daemon=True)
    trainer.start()
    warm.wait(300)
    latencies = []
    began, steps_before = time.perf_counter(), counter["steps"]
    with torch.inference_mode():
        for moment in schedule:
            delay = began + moment - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            sent = time.perf_counter()
            model(request.to(device))
            _sync(device)
            latencies.append(time.perf_counter() - sent)
    window = time.perf_counter() - began
    steps = counter["steps"] - steps_before
    stop.set()
    trainer.join(120)
    return {"latencies": latencies, "train_steps_per_s": steps / window}


def inference(device: torch.device, sizes: dict[str, Any], budget: int, say) -> tuple[Figure, dict[str, Any]]:
    schedule = _schedule(sizes["requests"], sizes["request_interval_ms"] / 1000)
    request = torch.randint(0, 95, (1, 64), generator=torch.Generator().manual_seed(0))
    variants = {"switchflow": _executor_variant(device, True, schedule, request, sizes, budget),
                "whole_graph_fifo": _executor_variant(device, False, schedule, request, sizes, budget),
                "naive": _naive_variant(device, schedule, request, sizes)}
    summary = {name: {"p50_s": percentile(item["latencies"], 0.5), "p99_s": percentile(item["latencies"], 0.99),
                      "max_s": max(item["latencies"]), "train_steps_per_s": item["train_steps_per_s"]}
               for name, item in variants.items()}
    for name, item in summary.items():
        say(f"inference {name}: p50 {item['p50_s'] * 1000:.2f} ms p99 {item['p99_s'] * 1000:.2f} ms, training "
            f"{item['train_steps_per_s']:.1f} it/s")
    return Figure("inference", "inference p99 next to training: SwitchFlow vs naive co-location (two threads)",
                  summary["switchflow"]["p99_s"], summary["naive"]["p99_s"], "s", target=TARGETS["inference"],
                  extra={"whole_graph_fifo_p99_s": summary["whole_graph_fifo"]["p99_s"]}), \
        {"requests": len(schedule), "variants": summary}
