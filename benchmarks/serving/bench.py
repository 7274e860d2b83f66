"""``strata bench serving``: end-to-end gRPC inference latency next to a training job on the same device.

``run(quick)`` returns a dict and prints a table; ``main(quick, output)`` is the ``strata bench`` entry point
(``output`` also writes the JSON). ``python -m benchmarks.serving.bench [--quick] [--output F]`` runs it
directly.

The figure is gpushare's figure d taken through the platform's real serving path: a ``model.pt`` of a
``tiny-gpt`` train job (trained for a few steps here and stored by :class:`~components.train.loop.TrainLoop`
exactly as a train job stores it), rebuilt by :func:`~components.serving.model.load_served_model` and served
by :func:`~components.serving.endpoint.start_serving` (a real gRPC server on 127.0.0.1 in front of a
:class:`~components.gpushare.executor.DeviceExecutor`). A client in a separate process sends one 64-token
context per request on a Poisson schedule with :func:`~components.serving.client.predict_timed` (one
channel per call, as ``strata infer`` does) and measures each call's latency. The training job is figure d's:
tiny-gpt with 8 transformer blocks (``gpushare.bench.DeepTinyGPT``, ``TRAIN_SPEC``).

**One virtual device = one CPU core.** Every device-side process and thread (executor, gRPC server, training)
is pinned to one core with ``os.sched_setaffinity``, with one torch thread; the client process is pinned to
the other core, so it does not steal the device's time. Naive co-location is then honest OS time-slicing of
one device. (On a one-core machine the client shares the device's core; the output says so.) The variants,
all in one run, each in fresh processes:

- ``switchflow`` (what the platform does for a serve job on a GPU share): one process, one executor, the
  endpoint plus a :class:`~components.gpushare.stages.StagedWorkloadSession` training job (one stage per
  layer, operator-level preemption on, the default): a request is served at the next operator boundary;
- ``switchflow_stages_only`` (for information): the same with operator-level preemption off, so a request
  waits for the next stage boundary (``operator_preemption: False``; the platform's ``TrainLoopSession``
  serves between operators too, by default);
- ``whole_graph_fifo``: the same executor with an unstaged ``WorkloadSession``: requests wait for the end
  of the running iteration;
- ``naive``: two processes on the device's core: a plain ``train_step`` loop (a child-process train attempt)
  and the endpoint on a private executor of its own (what ``ServeComponent`` does): OS time-slicing only.

Also measured: inference alone (the endpoint with no training next to it: the floor of this path), and
training throughput in each variant's process before the requests start (alone) and while they arrive.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.benchkit import Figure, document, percentile, table, write
from benchmarks.serving.harness import (
    SOURCE_JOB,
    STARTUP_TIMEOUT_S,
    _Child,
    _cores,
    _pin,
    answering,
    child_context,
)

BUDGET = 2 * 2**30
TARGET = 5.0  # naive p99 / SwitchFlow p99
PAPER = "SwitchFlow: up to 10x"
CLIENT_WORKERS = 16  # calls the client can have in flight: requests are sent open-loop, on schedule
CALL_TIMEOUT_S = 60.0

QUICK = {"model_steps": 10, "requests": 150, "request_interval_ms": 30.0, "warmup_requests": 5,
         "train_alone_s": 1.0}
FULL = {"model_steps": 20, "requests": 400, "request_interval_ms": 30.0, "warmup_requests": 10,
        "train_alone_s": 3.0}

# name -> (device-side processes, their options). "shared": executor with the endpoint and a training job;
# "serve": the endpoint alone on a private executor; "train": a plain train_step loop.
VARIANTS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "inference_alone": [("serve", {})],
    "switchflow": [("shared", {"staged": True, "operator_preemption": True})],
    "switchflow_stages_only": [("shared", {"staged": True, "operator_preemption": False})],
    "whole_graph_fifo": [("shared", {"staged": False})],
    "naive": [("train", {}), ("serve", {})],
}
DESCRIPTIONS = {
    "inference_alone": "endpoint alone, no training",
    "switchflow": "one executor: endpoint + staged training, served between operators",
    "switchflow_stages_only": "same, served at stage boundaries only (operator preemption off)",
    "whole_graph_fifo": "one executor: endpoint + unstaged training (waits for the iteration)",
    "naive": "two processes on one core: train loop + endpoint on a private executor",
}


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f} ms"


def _ratio(baseline: float | None, mechanism: float | None) -> float | None:
    if not baseline or not mechanism:
        return None
    return baseline / mechanism


_percentile = percentile  # the harness's one definition


# -- the served model -------------------------------------------------------------------------------------

def make_model(directory: Path, steps: int) -> dict[str, Any]:
    """Train the built-in tiny-gpt for ``steps`` steps and store its ``model.pt`` as a train job does
    (``TrainLoop.finish`` -> ``_store_results``); returns its path and what it serves."""
    import torch

    from components.runtime.contract.context import LocalContext
    from components.serving.model import load_served_model
    from components.train.loop import TrainLoop
    from components.train.spec import TrainSpec
    from components.train.workloads import builtin_workload

    spec = TrainSpec().validate({"workload": "tiny-gpt", "max_steps": steps, "seed": 1})
    ctx = LocalContext(job_id=SOURCE_JOB, attempt_id="bench", spec=dict(spec), workdir=directory)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        TrainLoop(builtin_workload("tiny-gpt"), spec, ctx, owns_process=False).run()
    finally:
        torch.set_num_threads(threads)
    path = ctx.artifacts["model.pt"]
    served = load_served_model(path)
    return {"path": str(path), "workload": served.workload, "steps": steps, "bytes": path.stat().st_size,
            "input_shape": list(served.input_shape), "input_dtype": served.input_dtype,
            "output_shape": list(served.output_shape), "input_limit": served.input_limit}


def request_rows(context: int, limit: int, seed: int = 0) -> list[list[int]]:
    """One request: a single ``context``-token row of token ids in ``[0, limit)``."""
    import random

    rng = random.Random(seed)
    return [[rng.randrange(limit) for _ in range(context)]]


# -- the device side (child processes pinned to the device's core) ---------------------------------------

class _DeviceSide:
    """What one device-side process runs: ``role`` is ``shared``, ``serve`` or ``train``."""

    def __init__(self, role: str, model_path: str, options: dict[str, Any]):
        self.role = role
        self.model_path = model_path
        self.options = options
        self.executor = None
        self.handle = None
        self.session = None
        self.address = None
        self._steps = 0
        self._stop = threading.Event()
        self._trainer: threading.Thread | None = None
        self._failure: list[str] = []

    def start(self) -> None:
        import torch

        from benchmarks.gpushare.bench import TRAIN_SPEC, DeepTinyGPT
        from components.gpushare.executor import DeviceExecutor
        from components.gpushare.lanes import MemoryRequest
        from components.gpushare.sessions import WorkloadSession
        from components.gpushare.stages import StagedWorkloadSession
        from components.serving.endpoint import start_serving
        from components.serving.model import load_served_model
        from components.serving.spec import ServeSpec
        from components.train.spec import TrainSpec

        spec = TrainSpec().validate({"workload": "tiny-gpt", **TRAIN_SPEC})
        if self.role == "train":
            # A child-process train attempt: a plain loop of train_step, nothing else in the process.
            workload = DeepTinyGPT()
            workload.setup(spec, torch.device("cpu"))
            warm = threading.Event()

            def train() -> None:
                try:
                    index = 0
                    while not self._stop.is_set():
                        workload.train_step(workload.batch(*divmod(index, workload.steps_per_epoch())))
                        index += 1
                        self._steps = index
                        if index == 3:
                            warm.set()
                except BaseException:
                    self._failure.append(traceback.format_exc())
                    warm.set()

            self._trainer = threading.Thread(target=train, name="bench-train", daemon=True)
            self._trainer.start()
            warm.wait(STARTUP_TIMEOUT_S)
            if self._failure:
                raise RuntimeError(self._failure[0])
            return
        serve = ServeSpec().validate({"model": {"job": SOURCE_JOB}})  # the serve kind's defaults
        served = load_served_model(self.model_path)
        # "shared" mirrors the device's GPU-sharing service (its default policy, fair); "serve" mirrors
        # ServeComponent's private executor (fifo: the endpoint is its only job).
        policy = "fair" if self.role == "shared" else "fifo"
        self.executor = DeviceExecutor("cpu", BUDGET, policy)
        self.handle = start_serving(self.executor, "lm", served, host="127.0.0.1", port=0,
                                    request_timeout_s=serve["request_timeout_s"], max_rows=serve["max_rows"],
                                    source_job=SOURCE_JOB)
        self.address = self.handle.address
        if self.role == "shared":
            layers = DeepTinyGPT.layers
            if self.options.get("staged", True):
                # Every layer its own stage: the embedding, two halves per block, the head (as figure d).
                self.session = StagedWorkloadSession(
                    DeepTinyGPT, spec, stages=2 * layers + 2, steps=10**6,
                    operator_preemption=self.options.get("operator_preemption", True))
            else:
                self.session = WorkloadSession(DeepTinyGPT, spec, steps=10**6)
            self.executor.submit("train", self.session, MemoryRequest(64 * 2**20, 256 * 2**20))
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while self.steps()["steps"] < 3:
                status = self.executor.job_status("train")
                if status["state"] in ("failed", "cancelled", "rejected") or time.monotonic() > deadline:
                    raise RuntimeError(f"the training job did not start: {status['state']} {status['error']}")
                time.sleep(0.01)

    def steps(self) -> dict[str, Any]:
        if self._failure:
            raise RuntimeError(self._failure[0])
        if self.role == "train":
            steps = self._steps
        elif self.role == "shared":
            steps = self.executor.job_status("train")["steps"]
        else:
            steps = 0
        return {"steps": steps, "at": time.perf_counter()}

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = {}
        if self.handle is not None:
            endpoint = self.handle.stats()
            stats["endpoint"] = {key: endpoint[key] for key in
                                 ("requests", "errors", "errors_by_status", "p50_ms", "p99_ms", "state")}
        if self.role == "shared":
            counters = self.executor.status()["counters"]
            stats["preemptions"] = counters["preemptions"]
            stats["preemption_latency"] = counters["preemption_latency"]
            stats["longest_stage_s"] = getattr(self.session, "longest_action_s", None)
            stats["served_between_operators"] = getattr(self.session, "inline_points", None)
        return stats

    def stop(self) -> None:
        self._stop.set()
        if self.handle is not None:
            self.handle.stop(1.0)
        if self.executor is not None:
            self.executor.shutdown(cancel=True, timeout=10)
        if self._trainer is not None:
            self._trainer.join(10)


def _device_main(conn, role: str, core: int | None, model_path: str, options: dict[str, Any]) -> None:
    """Entry point of a device-side process: start, say ``ready``, answer ``steps``/``stats`` until ``stop``."""
    _pin(core)
    import torch

    torch.set_num_threads(1)
    side = _DeviceSide(role, model_path, options)
    try:
        with answering(conn):
            side.start()
            conn.send({"ready": True, "address": side.address, "pid": os.getpid()})
            while True:
                message = conn.recv()
                if message == "stop":
                    break
                try:
                    conn.send(side.steps() if message == "steps" else side.stats())
                except Exception:
                    conn.send({"error": traceback.format_exc()})
    finally:
        side.stop()
        try:
            conn.send({"stopped": True})
        except OSError:
            pass


# -- the client (a child process pinned to the other core) ------------------------------------------------

def _call(address: str, inputs, moment: float, began: float) -> tuple[float, float, float | None, str | None]:
    """One Predict call as ``strata infer`` makes it: ``(lag behind schedule, latency, server_ms, error)``."""
    from components.serving.client import ServingError, predict_timed

    start = time.perf_counter()
    try:
        _, server_ms = predict_timed(address, inputs, timeout=CALL_TIMEOUT_S)
        error = None
    except ServingError as fault:
        server_ms, error = None, fault.code.name
    return start - began - moment, time.perf_counter() - start, server_ms, error


def _client_main(conn, core: int | None) -> None:
    """Entry point of the client process: ``("warm", address, rows, count)`` sends ``count`` calls one after
    another; ``("run", address, rows, schedule)`` sends a call at each moment of ``schedule`` (seconds from
    the start, open loop) and answers one ``(lag_s, latency_s, server_ms, error)`` per call."""
    _pin(core)
    import numpy as np

    import components.serving.client  # noqa: F401 -- grpc's import cost out of the first call

    pool = ThreadPoolExecutor(max_workers=CLIENT_WORKERS, thread_name_prefix="bench-client")
    try:
        while True:
            message = conn.recv()
            if message == "stop":
                break
            command, address, rows = message[:3]
            inputs = np.asarray(rows, dtype=np.int64)
            try:
                if command == "warm":
                    outcomes = [_call(address, inputs, 0.0, time.perf_counter()) for _ in range(message[3])]
                else:
                    schedule = message[3]
                    began = time.perf_counter()
                    futures = []
                    for moment in schedule:
                        delay = began + moment - time.perf_counter()
                        if delay > 0:
                            time.sleep(delay)
                        futures.append(pool.submit(_call, address, inputs, moment, began))
                    outcomes = [future.result() for future in futures]
                conn.send(outcomes)
            except Exception:
                conn.send({"error": traceback.format_exc()})
    except EOFError:
        pass
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


# -- the harness --------------------------------------------------------------------------------------------

def _schedule(count: int, interval_s: float, seed: int = 11) -> list[float]:
    from benchmarks.gpushare.bench import _schedule as poisson

    return poisson(count, interval_s, seed)


def _summarize(outcomes: list[tuple[float, float, float | None, str | None]]) -> dict[str, Any]:
    latencies = [latency for _, latency, _, error in outcomes if error is None]
    server = [server_ms / 1000 for _, _, server_ms, error in outcomes if error is None and server_ms is not None]
    errors = Counter(error for *_, error in outcomes if error is not None)
    return {
        "requests": len(outcomes), "answered": len(latencies), "errors": dict(errors),
        "p50_s": _percentile(latencies, 0.5), "p99_s": _percentile(latencies, 0.99),
        "max_s": max(latencies) if latencies else None,
        "mean_s": statistics.mean(latencies) if latencies else None,
        "server_p50_s": _percentile(server, 0.5), "server_p99_s": _percentile(server, 0.99),
        "client_lag_max_s": max((lag for lag, *_ in outcomes), default=0.0),
    }


def _rate(before: dict[str, Any], after: dict[str, Any]) -> float:
    return (after["steps"] - before["steps"]) / max(after["at"] - before["at"], 1e-9)


def run_variant(name: str, context, cores: tuple[int | None, int | None], client: _Child, model: dict[str, Any],
                rows: list[list[int]], schedule: list[float], sizes: dict[str, Any]) -> dict[str, Any]:
    """One variant in fresh device-side processes: warm up, training alone, then the request stream."""
    device_core = cores[0]
    children: list[_Child] = []
    try:
        for role, options in VARIANTS[name]:
            children.append(_Child(context, f"{name}-{role}", _device_main, role, device_core, model["path"],
                                   options))
        for child in children:
            child.ready = child.receive(STARTUP_TIMEOUT_S)
        server = next(child for child in children if child.ready.get("address"))
        trainer = next((child for child in children if not child.name.endswith("-serve")), None)
        address = server.ready["address"]
        client.call(("warm", address, rows, sizes["warmup_requests"]), STARTUP_TIMEOUT_S)
        result: dict[str, Any] = {"description": DESCRIPTIONS[name], "address": address}
        if trainer is not None:
            first = trainer.call("steps")
            time.sleep(sizes["train_alone_s"])
            result["train_alone_steps_per_s"] = _rate(first, trainer.call("steps"))
            before = trainer.call("steps")
        outcomes = client.call(("run", address, rows, schedule), schedule[-1] + 2 * CALL_TIMEOUT_S)
        if trainer is not None:
            result["train_steps_per_s"] = _rate(before, trainer.call("steps"))
            result["train_slowdown"] = _ratio(result["train_alone_steps_per_s"], result["train_steps_per_s"])
        result.update(_summarize(outcomes))
        result.update(server.call("stats"))
        return result
    finally:
        for child in children:
            child.close()


def run(quick: bool = False, *, say: Callable[[str], None] | None = None, sizes: dict[str, Any] | None = None,
        variants: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark (``quick``: small sizes); print and return the results.

    ``sizes`` overrides entries of the size table (tests use tiny ones); ``variants`` picks some of
    :data:`VARIANTS` (``switchflow`` and ``naive`` are needed for the ratio).
    """
    import torch

    say = say or (lambda line: print(line, flush=True))
    sizes = {**(QUICK if quick else FULL), **(sizes or {})}
    names = [name for name in VARIANTS if variants is None or name in variants]
    cores = _cores()
    started = datetime.now(UTC)
    machine = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
               "torch": torch.__version__, "device": "virtual GPU = one CPU core, torch threads 1",
               "device_core": cores[0], "client_core": cores[1],
               "client_shares_device_core": cores[0] is not None and cores[0] == cores[1]}
    pinning = ("no CPU affinity on this platform: nothing pinned" if cores[0] is None else
               f"device core {cores[0]}, client core {cores[1]}"
               + (" (only one core: the client shares it)" if machine["client_shares_device_core"] else ""))
    say(f"strata bench serving{' --quick' if quick else ''}: {started:%Y-%m-%d %H:%M} UTC, "
        f"{machine['cpus']} CPUs, torch {machine['torch']}; {pinning}")
    results: dict[str, Any] = {"quick": quick, "date": started.isoformat(), "machine": machine, "sizes": sizes,
                               "variants": {}}
    began = time.perf_counter()
    context = child_context()  # no fork of this process: the children run gRPC and torch threads
    with tempfile.TemporaryDirectory(prefix="strata-serving-bench-") as directory:
        model = make_model(Path(directory), sizes["model_steps"])
        results["model"] = {key: value for key, value in model.items() if key != "path"}
        rows = request_rows(model["input_shape"][0], model["input_limit"] or 2)
        schedule = _schedule(sizes["requests"], sizes["request_interval_ms"] / 1000)
        results["requests"] = len(schedule)
        say(f"  served model: {model['workload']} trained {model['steps']} steps, model.pt "
            f"{model['bytes'] / 2**20:.1f} MiB; requests: {len(schedule)} x {len(rows)} row of "
            f"{model['input_shape'][0]} tokens, Poisson, mean every {sizes['request_interval_ms']:.0f} ms, "
            f"through gRPC from a separate process")
        client = _Child(context, "client", _client_main, cores[1])
        try:
            for name in names:
                variant_began = time.perf_counter()
                item = run_variant(name, context, cores, client, model, rows, schedule, sizes)
                item["seconds"] = time.perf_counter() - variant_began
                results["variants"][name] = item
                say(_variant_line(name, item))
        finally:
            client.close()
    variants_done = results["variants"]
    mechanism = variants_done.get("switchflow", {}).get("p99_s")
    results["ratio"] = _ratio(variants_done.get("naive", {}).get("p99_s"), mechanism)
    results["ratio_vs_whole_graph_fifo"] = _ratio(variants_done.get("whole_graph_fifo", {}).get("p99_s"), mechanism)
    results["ratio_vs_stages_only"] = _ratio(variants_done.get("switchflow_stages_only", {}).get("p99_s"), mechanism)
    results["ratio_p50"] = _ratio(variants_done.get("naive", {}).get("p50_s"),
                                  variants_done.get("switchflow", {}).get("p50_s"))
    results["ratio_server_p99"] = _ratio(variants_done.get("naive", {}).get("server_p99_s"),
                                         variants_done.get("switchflow", {}).get("server_p99_s"))
    results["training_alone_steps_per_s"] = variants_done.get("naive", {}).get("train_alone_steps_per_s")
    results["target"] = f">= {TARGET:.0f}x ({PAPER})"
    results["met"] = bool(results["ratio"] and results["ratio"] >= TARGET)
    results["seconds"] = time.perf_counter() - began
    say("")
    say(format_table(results))
    return results


def _variant_line(name: str, item: dict[str, Any]) -> str:
    line = (f"  {name:23s} p50 {_ms(item['p50_s']):>10s}  p99 {_ms(item['p99_s']):>10s}  "
            f"({item['answered']}/{item['requests']} answered")
    line += f", errors {item['errors']})" if item["errors"] else ")"
    if "train_steps_per_s" in item:
        line += (f"  training {item['train_steps_per_s']:.1f} it/s (alone {item['train_alone_steps_per_s']:.1f})")
    return line


def format_table(results: dict[str, Any]) -> str:
    rows = [("variant", "p50", "p99", "max", "server p50/p99", "answered", "training alone", "training loaded",
             "slowdown")]
    for name, item in results["variants"].items():
        trains = "train_steps_per_s" in item
        rows.append((
            name, _ms(item["p50_s"]), _ms(item["p99_s"]), _ms(item["max_s"]),
            f"{_ms(item['server_p50_s'])} / {_ms(item['server_p99_s'])}",
            f"{item['answered']}/{item['requests']}",
            f"{item['train_alone_steps_per_s']:.1f} it/s" if trains else "-",
            f"{item['train_steps_per_s']:.1f} it/s" if trains else "-",
            f"{item['train_slowdown']:.2f}x" if trains and item.get("train_slowdown") else "-",
        ))
    lines = table(rows[1:], rows[0]).splitlines()
    ratio = results.get("ratio")
    if ratio is not None:
        lines.append(f"naive p99 / SwitchFlow p99: {ratio:.2f}x (target {results['target']}): "
                     + ("met" if results["met"] else "MISSED"))
    for key, label in (("ratio_vs_whole_graph_fifo", "whole-graph FIFO p99 / SwitchFlow p99"),
                       ("ratio_vs_stages_only", "stage-boundary-only p99 / SwitchFlow p99"),
                       ("ratio_p50", "naive p50 / SwitchFlow p50"),
                       ("ratio_server_p99", "naive p99 / SwitchFlow p99 inside the server (server_ms)")):
        if results.get(key) is not None:
            lines.append(f"{label}: {results[key]:.2f}x")
    lines.append(f"total {results['seconds']:.1f} s")
    return "\n".join(lines)


def main(quick: bool = False, output: str | None = None, parts: tuple[str, ...] = ("sla", "emoe", "switchflow"),
         peers: bool = False, runs: int = 1, models: tuple[str, ...] | None = None) -> int:
    """``strata bench serving`` entry point: the SLA part (finish rates of Orloj, FIFO and EDF batching through the
    gRPC endpoint, and the per-request overhead; :mod:`benchmarks.serving.slabench`), the eMoE part
    (:mod:`benchmarks.serving.emoebench`) and SwitchFlow's inference latency next to training (this module), one
    after the other on this machine; prints each, optionally writes the common JSON; 0 on success. ``runs``
    repeats the SLA part (its figures are then the medians, with every run's values and their ranges);
    ``models`` picks the SLA part's models (``dynamic``, ``static``, ``early-exit``; default all)."""
    from benchmarks.serving import emoebench, slabench

    if peers:
        from benchmarks.benchkit import peers_python

        peers_python()  # fail in one line before anything runs
        peers_python("triton")
    found: list[Figure] = []
    details: dict[str, Any] = {}
    machine = None
    if "sla" in parts:
        print("== SLA serving: finish rates within the SLO (Orloj, FIFO dynamic batching, EDF) ==", flush=True)
        sizes = {"models": list(models)} if models else None
        every = []
        for index in range(runs):
            if runs > 1:
                print(f"-- run {index + 1} of {runs}", flush=True)
            result = slabench.run(quick, peers=peers, sizes=sizes)
            print(slabench.format_table(result), flush=True)
            every.append(result)
        details["sla"] = every[0] if runs == 1 else {"runs": every}
        found += slabench.figures(every[0]) if runs == 1 else slabench.combine(
            [slabench.figures(result) for result in every])
    if "emoe" in parts:
        print("== eMoE: experts resident on the device ==", flush=True)
        details["emoe"] = emoebench.run(quick)
        found += emoebench.figures(details["emoe"])
    if "switchflow" in parts:
        print("== SwitchFlow: inference latency through gRPC next to training ==", flush=True)
        details["switchflow"] = run(quick)
        machine = details["switchflow"]["machine"]
        found += figures(details["switchflow"])
    doc = document("serving", quick, found, details=details, machine=machine)
    from benchmarks.benchkit import figures_table

    print(figures_table(doc))
    write(doc, output)
    return 0


def figures(results: dict[str, Any]) -> list[Figure]:
    """The common figures: SwitchFlow's p99 against each baseline variant measured in the same run."""
    variants = results["variants"]
    ours = variants.get("switchflow", {})
    found = []
    for key, name, label, target in (("inference_p99", "naive", "naive co-location (OS threads)", TARGET),
                                     ("inference_p99_vs_fifo", "whole_graph_fifo", "whole-graph FIFO", None),
                                     ("inference_p99_vs_stages", "switchflow_stages_only", "stage boundaries only",
                                      None)):
        if name in variants:
            found.append(Figure(key, f"inference p99 through gRPC next to training, against {label}",
                                ours.get("p99_s"), variants[name].get("p99_s"), "s", target=target))
    return found


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output")
    parser.add_argument("--parts", default="sla,emoe,switchflow", help="comma-separated: sla, emoe, switchflow")
    parser.add_argument("--runs", type=int, default=1, help="repeat the SLA part (figures: median and range)")
    parser.add_argument("--models", help="the SLA part's models, comma-separated: dynamic, static, early-exit")
    arguments = parser.parse_args()
    sys.exit(main(arguments.quick, arguments.output, tuple(arguments.parts.split(",")), runs=arguments.runs,
                  models=tuple(arguments.models.split(",")) if arguments.models else None))
