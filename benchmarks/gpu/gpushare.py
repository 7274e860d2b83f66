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
- **jct**: a seeded Poisson trace of small, medium and large training jobs (step times calibrated on the device)
  at about 80 % offered load: FIFO with the device to each job in turn, against SRTF with per-iteration switching
  (JCT = finish - arrival).
- **utilization**: small sweep jobs whose input takes a fixed host time per batch: each alone on the device
  (exclusive) against all packed on one (PACK); utilization = time in iterations / device time.
- **inference**: a training job (tiny-gpt, 8 blocks) and a served tiny-gpt on one device, requests on a Poisson
  schedule: SwitchFlow (staged training, requests served between operators) against naive co-location (a training
  thread and a serving thread issuing kernels with no coordination) and whole-graph FIFO (the executor, unstaged).

Switch, JCT, utilization and inference are the gpushare benchmark's own measurements
(:mod:`benchmarks.gpushare.bench`, whose functions take ``device``: ``"cpu"``, its virtual GPU, by default) with the
CUDA device passed through; on a real device the inference variants run without the virtual GPU's kernel lock.
This part adds admission with real allocations and maps each result onto its figure.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from benchmarks.benchkit import Figure
from benchmarks.gpushare import bench
from components.gpushare.executor import DeviceExecutor
from components.gpushare.lanes import MemoryRequest
from components.gpushare.sessions import Progress, Session

MiB = 2**20
# Sizes of the gpushare benchmark's figures (its QUICK/FULL keys; ``deep_layers`` and ``train_spec`` size figure
# d's training job), plus admission's.
DRY = {"switch_steps": 8, "checkpoint_switches": 6, "alloc_mib": 4, "alloc_jobs": 4, "alloc_steps": 4,
       "trace_jobs": 4, "trace_scale": 0.1, "load": 0.8, "pack_jobs": 2, "pack_steps": 6, "host_ms": 4.0,
       "requests": 20, "request_interval_ms": 15.0, "train_alone_s": 0.2,
       "train_spec": {"hidden": 32, "batch_size": 4}, "deep_layers": 2}
GPU = {"switch_steps": 200, "checkpoint_switches": 100, "alloc_mib": 2048, "alloc_jobs": 6, "alloc_steps": 20,
       "trace_jobs": 16, "trace_scale": 1.0, "load": 0.8, "pack_jobs": 6, "pack_steps": 150, "host_ms": 4.0,
       "requests": 400, "request_interval_ms": 10.0, "train_alone_s": 1.0,
       "train_spec": {"hidden": 256, "batch_size": 64}, "deep_layers": 8}
TARGETS = bench.TARGETS
_sync = bench._sync


def run(rec) -> None:
    sizes = rec.size(DRY, GPU)
    device = torch.device(rec.device)
    rec.detail("sizes", sizes)
    budget = (torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 8 * 2**30)
    rec.detail("device_memory", budget)
    rec.step("warm-up", bench.warm_up, device)
    for name, function in (("switch", switch), ("admission", admission), ("jct", jct),
                           ("utilization", utilization), ("inference", inference)):
        result = rec.step(name, function, device, sizes, budget, rec.say)
        if result is not None:
            figure, details = result
            rec.details[name] = details
            rec.figure(figure)


# -- switch -------------------------------------------------------------------------------------------------------

def switch(device: torch.device, sizes: dict[str, Any], budget: int, say) -> tuple[Figure, dict[str, Any]]:
    result = bench.bench_switch(sizes, say, device, budget)
    details = {key: result[key] for key in ("switches", "switch_p50_s", "switch_p99_s", "checkpoint_switches",
                                            "checkpoint_p50_s", "checkpoint_p99_s")}
    return Figure("switch", "switch latency between two training jobs (p50), iteration boundary vs checkpoint",
                  result["switch_p50_s"], result["checkpoint_p50_s"], "s", target=TARGETS["switch"],
                  extra={"p99_s": result["switch_p99_s"], "checkpoint_p99_s": result["checkpoint_p99_s"]}), details


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

def jct(device: torch.device, sizes: dict[str, Any], budget: int, say) -> tuple[Figure, dict[str, Any]]:
    result = bench.bench_jct(sizes, say, device, budget)
    fifo, srtf = result["fifo"], result["srtf"]
    return Figure("jct", "average JCT of a mixed trace: shared device under SRTF vs FIFO with the device to each job",
                  srtf["mean_jct_s"], fifo["mean_jct_s"], "s", target=TARGETS["jct"]), \
        {"trace": result["trace"], "step_s": {kind: item["step_s"] for kind, item in result["calibration"].items()},
         "fifo": fifo, "srtf": srtf}


# -- utilization -------------------------------------------------------------------------------------------------

def utilization(device: torch.device, sizes: dict[str, Any], budget: int, say) -> tuple[Figure, dict[str, Any]]:
    result = bench.bench_utilization(sizes, say, device, budget)
    return Figure("utilization", "device utilization of small host-bound jobs: packed on one device vs one each",
                  result["packed_utilization"], result["exclusive_utilization"], "busy fraction",
                  lower_is_better=False, target=TARGETS["utilization"]), \
        {"jobs": result["jobs"], "exclusive_device_s": result["exclusive_device_s"],
         "exclusive_busy_s": sum(item["busy_s"] for item in result["exclusive"]),
         "packed_device_s": result["packed_device_s"], "packed_busy_s": result["packed_busy_s"]}


# -- inference p99 next to training -----------------------------------------------------------------------------

def inference(device: torch.device, sizes: dict[str, Any], budget: int, say) -> tuple[Figure, dict[str, Any]]:
    result = bench.bench_inference(sizes, say, device, budget)
    summary = result["variants"]
    return Figure("inference", "inference p99 next to training: SwitchFlow vs naive co-location (two threads)",
                  summary["switchflow"]["p99_s"], summary["naive"]["p99_s"], "s", target=TARGETS["inference"],
                  extra={"whole_graph_fifo_p99_s": summary["whole_graph_fifo"]["p99_s"]}), \
        {"requests": result["requests"], "variants": summary}
