"""``strata bench serving``, SLA part: the share of requests answered within their SLO, deadline-aware batching
(Orloj) against Triton-style FIFO dynamic batching and EDF, through the real gRPC endpoint.

Everything runs on this machine, in one run, over 127.0.0.1:

- **The models**, each a ``model.pt`` trained here for a few steps by the built-in ``train`` workloads and served
  by :func:`~components.serving.endpoint.start_serving`: the *dynamic* model is ``tiny-gpt`` (width
  ``width``) over variable-length inputs, whose run time grows with the longest input of a batch; the *static*
  model is ``mlp-digits``, whose run time does not depend on its input.
- **The requests**: one row each. On the dynamic model ``long_share`` of them are ``long_len`` tokens long and
  the rest ``short_len``. Each request's SLO is ``multiplier`` times its own latency through gRPC on an idle
  endpoint (measured first, p50 of ``calibration`` sequential calls per kind), sent as the call's gRPC deadline.
- **The early-exit model** (``early-exit``, :mod:`components.serving.earlyexit`): an MLP of ``exit_width`` with 4
  confidence-thresholded exits, trained ``exit_steps`` steps on corrupted digits; requests are single held-out rows
  drawn from a pool of ``exit_pool``. Every request has the same shape, so nothing the policies see tells a row
  that leaves at the first exit from one that runs all four. Its SLO is ``multiplier`` times the *mean* latency
  alone over the pool (the client cannot know a row's depth either), and its load is ``exit_load`` times the
  rate of one request at a time (1 / that mean), so the setting scales with the machine.
- **The load**: an open-loop generator in a separate process pinned to the other core sends ``requests`` calls
  at ``rate_rps`` on average, Poisson, or *bursty* (bursts of a geometric number of requests, mean
  ``burst_mean``, arriving together at ``rate_rps / burst_mean`` bursts per second). Non-blocking gRPC futures:
  the sender never waits for an answer.
- **The policies**, each in a fresh server process pinned to one core (the virtual device; one torch thread),
  warmed up with ``warmup`` requests of the same mix before any figure is taken: ``orloj``; ``fifo`` (Triton's
  dynamic batcher, ``max_queue_delay_ms``); ``edf`` (earliest deadline first, mean estimate). The same
  ``max_batch`` for all.

A request *finishes* when its answer arrives at the client within its SLO (an OK status: the SLO is the call's
gRPC deadline, which the client enforces). The figures are finish rates at the
tightest multiplier; the table has every multiplier. The per-request overhead figure compares a gRPC call on an
idle endpoint with a direct call of the same model in the server process (p50 of each, one row).
"""

from __future__ import annotations

import os
import random
import statistics
import tempfile
import threading
import time
import traceback
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.benchkit import Figure, percentile, table
from benchmarks.serving.harness import (
    SOURCE_JOB,
    STARTUP_TIMEOUT_S,
    _Child,
    _cores,
    _pin,
    answering,
    child_context,
)

POLICIES = ("orloj", "fifo", "edf")
FULL = {"model_steps": 20, "width": 384, "requests": 600, "rate_rps": 200.0, "burst_mean": 4.0,
        "multipliers": [1.5, 2.0, 3.0, 5.0], "static_multipliers": [1.5, 3.0], "patterns": ["poisson", "bursty"],
        "warmup": 300, "calibration": 40, "max_batch": 8, "max_queue_delay_ms": 0.1, "long_share": 0.2,
        "short_len": 8, "long_len": 64, "overhead_calls": 300,
        "models": ["dynamic", "static", "early-exit"], "exit_width": 1536, "exit_steps": 200, "exit_pool": 256,
        "exit_load": 1.5}
QUICK = {**FULL, "requests": 200, "multipliers": [1.5, 3.0], "static_multipliers": [1.5], "warmup": 100,
         "calibration": 20, "overhead_calls": 100}
EARLY_EXIT = "early-exit"  # the model whose run time the input does not reveal (components.serving.earlyexit)
TARGET_DYNAMIC = 1.5  # Orloj against FIFO on the dynamic model at a tight SLO (the paper: 51-80 % more)
TARGET_STATIC = 1.0  # no worse than FIFO on the static model
TARGET_EXIT_EDF = 1.0  # Orloj no worse than EDF with a mean estimate where the input does not reveal the run time
OVERHEAD_BUDGET_S = 0.0005  # per-request overhead over a direct model call, p50
DRAIN_S = 30.0  # after the last send: time for every answer (or status) to come back


# -- models ---------------------------------------------------------------------------------------------------

def make_model(directory: Path, workload: str, steps: int, **fields: Any) -> dict[str, Any]:
    """Train built-in ``workload`` for ``steps`` steps and store its ``model.pt`` as a train job does."""
    import torch

    from components.runtime.contract.context import LocalContext
    from components.serving.model import load_served_model
    from components.train.loop import TrainLoop
    from components.train.spec import TrainSpec
    from components.train.workloads import builtin_workload

    if workload == EARLY_EXIT:  # trained as a team's entry point would be; served from the serving zoo
        from components.serving.earlyexit import ENTRYPOINT, EarlyExitDigits

        spec = TrainSpec().validate({"entrypoint": ENTRYPOINT, "max_steps": steps, "seed": 1, "batch_size": 64,
                                     "lr": 0.001, **fields})
        instance = EarlyExitDigits()
    else:
        spec = TrainSpec().validate({"workload": workload, "max_steps": steps, "seed": 1, **fields})
        instance = builtin_workload(workload)
    ctx = LocalContext(job_id=SOURCE_JOB, attempt_id=f"bench-{workload}", spec=dict(spec),
                       workdir=directory / workload)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        TrainLoop(instance, spec, ctx, owns_process=False).run()
    finally:
        torch.set_num_threads(threads)
    path = ctx.artifacts["model.pt"]
    served = load_served_model(path)
    return {"path": str(path), "workload": workload, "steps": steps, "fields": fields,
            "input_shape": list(served.input_shape), "input_dtype": served.input_dtype,
            "input_limit": served.input_limit, "variable_length": served.variable_length}


def request_inputs(model: dict[str, Any], sizes: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """The rows of each request kind: ``short`` and ``long`` token rows, or one ``row`` of features."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if model["workload"] == EARLY_EXIT:
        # Held-out corrupted digits (never trained on): what a request is tells nothing of how deep it goes.
        from components.serving.earlyexit import EarlyExitDigits

        x_test = EarlyExitDigits().load_data({"seed": 1})[2].numpy()
        rows = rng.choice(len(x_test), size=min(sizes["exit_pool"], len(x_test)), replace=False)
        return {f"x{index:03d}": x_test[row:row + 1].astype(np.float32) for index, row in enumerate(rows)}
    if model["variable_length"]:
        limit = model["input_limit"]
        return {"short": rng.integers(0, limit, size=(1, sizes["short_len"])).astype(np.int64),
                "long": rng.integers(0, limit, size=(1, sizes["long_len"])).astype(np.int64)}
    return {"row": rng.random((1, *model["input_shape"]), dtype=np.float32)}


def arrivals(pattern: str, count: int, rate_rps: float, burst_mean: float, seed: int) -> list[float]:
    """``count`` send moments (seconds from the start): Poisson at ``rate_rps``, or bursts of a geometric number
    of requests (mean ``burst_mean``) sent together, the bursts Poisson at ``rate_rps / burst_mean``."""
    rng = random.Random(seed)
    moments: list[float] = []
    now = 0.0
    while len(moments) < count:
        if pattern == "poisson":
            now += rng.expovariate(rate_rps)
            moments.append(now)
            continue
        now += rng.expovariate(rate_rps / burst_mean)
        size = 1
        while rng.random() > 1 / burst_mean:
            size += 1
        moments.extend([now] * min(size, count - len(moments)))
    return moments


def request_kinds(kinds: list[str], count: int, long_share: float, seed: int) -> list[str]:
    rng = random.Random(seed)
    if kinds == ["row"]:
        return ["row"] * count
    if "short" not in kinds:  # a pool of rows (the early-exit model): drawn uniformly
        return [rng.choice(kinds) for _ in range(count)]
    return ["long" if rng.random() < long_share else "short" for _ in range(count)]


# -- the server (a child process pinned to the device's core) ------------------------------------------------

def _server_main(conn, core: int | None, model_path: str, batching: dict[str, Any], device: str = "cpu") -> None:
    """Serve ``model_path`` with ``batching`` on ``device`` (the CPU, one thread, unless the gpu-check names a
    CUDA device); answers ``"stats"``, ``("direct", kind_rows, calls)`` (p50 of a direct model call, synchronized
    on CUDA, the inputs' copy to the device included) until ``"stop"``."""
    _pin(core)
    handle = executor = None
    try:
        with answering(conn):
            import torch

            cuda = device.startswith("cuda")
            if not cuda:
                torch.set_num_threads(1)
            from components.gpushare.executor import DeviceExecutor
            from components.serving.endpoint import Batching, start_serving
            from components.serving.model import load_served_model

            served = load_served_model(model_path)
            executor = DeviceExecutor(device, 2 * 2**30, "fifo", name="bench-device", enforce_memory_fraction=False)
            handle = start_serving(executor, "bench", served, max_rows=64, request_timeout_s=30.0,
                                   batching=Batching(**batching))
            conn.send({"address": handle.address})
            while True:
                message = conn.recv()
                if message == "stop":
                    break
                if message == "stats":
                    conn.send({"stats": handle.stats()})  # wrapped: the stats have an "error" key of their own
                elif message[0] == "direct":
                    module = served.module.to(device).eval()
                    inputs = torch.as_tensor(message[1])
                    times = []
                    with torch.inference_mode():
                        for _ in range(message[2]):
                            began = time.perf_counter()
                            if cuda:
                                module(inputs.to(device))
                                torch.cuda.synchronize(device)
                            else:
                                module(inputs)
                            times.append(time.perf_counter() - began)
                    conn.send(percentile(times, 0.5))
    finally:
        if handle is not None:
            handle.stop(1.0)
        if executor is not None:
            executor.shutdown(cancel=True, timeout=5.0)


# -- the load generator (a child process pinned to the other core) -------------------------------------------

def _client_main(conn, core: int | None) -> None:
    """``("sequential", address, rows, calls)`` -> latencies of calls one after another;
    ``("run", address, inputs, plan)`` with plan ``[(moment, kind, slo_s)]`` -> ``[(kind, latency_s, status)]``
    per request (status None for an answer), sent open loop."""
    _pin(core)
    import grpc

    from components.serving import serving_pb2, serving_pb2_grpc
    from components.serving.client import encode

    channels: dict[str, tuple[Any, Any]] = {}

    def stub(address: str):
        if address not in channels:
            channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 64 * 2**20)])
            channels[address] = channel, serving_pb2_grpc.InferenceStub(channel)
        return channels[address][1]

    try:
        while True:
            message = conn.recv()
            if message == "stop":
                break
            try:
                command, address = message[:2]
                predict = stub(address).Predict
                if command == "sequential":
                    request = serving_pb2.PredictRequest(input=encode(message[2]))
                    latencies = []
                    for _ in range(message[3]):
                        began = time.perf_counter()
                        predict(request, timeout=30)
                        latencies.append(time.perf_counter() - began)
                    conn.send(latencies)
                    continue
                requests = {kind: serving_pb2.PredictRequest(input=encode(rows)) for kind, rows in message[2].items()}
                plan = message[3]
                outcomes: list[Any] = [None] * len(plan)
                done = threading.Semaphore(0)

                def finished(future, index, kind, sent, outcomes=outcomes, done=done):
                    latency = time.perf_counter() - sent
                    code = future.code()
                    outcomes[index] = (kind, latency, None if code == grpc.StatusCode.OK else code.name)
                    done.release()

                began = time.perf_counter()
                for index, (moment, kind, slo_s) in enumerate(plan):
                    delay = began + moment - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                    sent = time.perf_counter()
                    future = predict.future(requests[kind], timeout=slo_s)
                    future.add_done_callback(lambda f, i=index, k=kind, s=sent: finished(f, i, k, s))
                deadline = time.monotonic() + DRAIN_S
                for _ in plan:
                    if not done.acquire(timeout=max(0.0, deadline - time.monotonic())):
                        break
                conn.send([outcome or (plan[i][1], None, "NO_ANSWER") for i, outcome in enumerate(outcomes)])
            except Exception:
                conn.send({"error": traceback.format_exc()})
    except EOFError:
        pass
    finally:
        for channel, _ in channels.values():
            channel.close()


# -- the harness ------------------------------------------------------------------------------------------------

def _finish(outcomes: list[tuple[str, float | None, str | None]], plan: list[tuple[float, str, float]]) -> dict[str, Any]:
    # The SLO is the call's gRPC deadline, which the client's gRPC enforces: an answer (status OK) arrived
    # within it. (The latency measured in the completion callback also holds the callback's own delay.)
    on_time = sum(1 for _, _, status in outcomes if status is None)
    statuses: dict[str, int] = {}
    for _, _, status in outcomes:
        if status is not None:
            statuses[status] = statuses.get(status, 0) + 1
    latencies = [latency for _, latency, status in outcomes if status is None and latency is not None]
    return {"requests": len(plan), "on_time": on_time, "finish_rate": on_time / len(plan) if plan else 0.0,
            "statuses": statuses, "p50_s": percentile(latencies, 0.5), "p99_s": percentile(latencies, 0.99)}


def _plan(kinds: list[str], moments: list[float], base: dict[str, float], multiplier: float):
    return [(moment, kind, multiplier * base[kind]) for moment, kind in zip(moments, kinds, strict=True)]


PEERS = ("triton", "ray-serve")  # (d) real Triton through nvidia-pytriton, (e) real Ray Serve


def peer(system: str, model: dict[str, Any], inputs: dict[str, Any], plans: dict[str, list], warmup: list,
         sizes: dict[str, Any], overhead_row: Any = None) -> dict[str, Any]:
    """A real peer system (``triton`` or ``ray-serve``) on the same plans, in the peers' interpreter
    (:mod:`benchmarks.serving.peers`)."""
    import json
    import subprocess

    from benchmarks.benchkit import peers_python

    python = peers_python("triton" if system == "triton" else "peers")
    with tempfile.TemporaryDirectory(prefix=f"strata-{system}-") as directory:
        plan_path, output = Path(directory) / "plan.json", Path(directory) / "result.json"
        body = {"dtype": model["input_dtype"], "inputs": {kind: rows.tolist() for kind, rows in inputs.items()},
                "warmup": warmup, "runs": plans}
        if overhead_row is not None:
            body["overhead_row"] = overhead_row.tolist()
        plan_path.write_text(json.dumps(body))
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        done = subprocess.run([python, "-m", "benchmarks.serving.peers", "--system", system, "--model", model["path"], "--plan",
                               str(plan_path), "--output", str(output), "--max-batch", str(sizes["max_batch"]),
                               "--wait-s", str(sizes["max_queue_delay_ms"] / 1000),
                               "--calls", str(sizes["overhead_calls"])],
                              env=env, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise RuntimeError(f"{system} failed ({done.returncode}): {done.stderr[-2000:]}")
        return json.loads(output.read_text())


def run(quick: bool = False, *, say: Callable[[str], None] | None = None, sizes: dict[str, Any] | None = None,
        policies: tuple[str, ...] = POLICIES, peers: bool = False) -> dict[str, Any]:
    """Run the SLA part; return its results (``models``, ``calibration``, ``runs``, ``overhead``; with ``peers``,
    real Triton's and Ray Serve's on the same plans as policies ``triton`` and ``ray-serve``)."""
    say = say or (lambda line: print(line, flush=True))
    sizes = {**(QUICK if quick else FULL), **(sizes or {})}
    cores = _cores()
    context = child_context()
    results: dict[str, Any] = {"sizes": sizes, "models": {}, "calibration": {}, "runs": {}, "overhead": {}}
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="strata-sla-bench-") as directory:
        makers = {
            "dynamic": lambda: make_model(Path(directory), "tiny-gpt", sizes["model_steps"], hidden=sizes["width"]),
            "static": lambda: make_model(Path(directory), "mlp-digits", sizes["model_steps"], hidden=256),
            EARLY_EXIT: lambda: make_model(Path(directory), EARLY_EXIT, sizes["exit_steps"],
                                           hidden=sizes["exit_width"]),
        }
        models = {name: makers[name]() for name in sizes["models"]}
        results["models"] = {name: {k: v for k, v in model.items() if k != "path"} for name, model in models.items()}
        client = _Child(context, "sla-client", _client_main, cores[1])
        try:
            for name, model in models.items():
                inputs = request_inputs(model, sizes)
                kinds_available = sorted(inputs)
                # Calibration: each kind's latency alone, through gRPC, on an idle endpoint serving one at a time.
                server = _Child(context, f"{name}-calibration", _server_main, cores[0], model["path"],
                                {"policy": "fifo", "max_batch": 1, "max_queue_delay_s": 0.0})
                try:
                    address = server.receive(STARTUP_TIMEOUT_S)["address"]
                    base = {}
                    if name == EARLY_EXIT:
                        # The client cannot know how deep a row goes: one SLO for every request, from the mean
                        # latency alone over the pool (each row's median of 3 calls; one warm-up call each).
                        alone = []
                        for kind in kinds_available:
                            latencies = client.call(("sequential", address, inputs[kind], 4), STARTUP_TIMEOUT_S)
                            alone.append(statistics.median(latencies[1:]))
                        base = dict.fromkeys(kinds_available, statistics.mean(alone))
                        results["calibration_spread"] = {"p10_s": percentile(alone, 0.1),
                                                         "p50_s": percentile(alone, 0.5),
                                                         "p90_s": percentile(alone, 0.9)}
                    for kind in kinds_available if name != EARLY_EXIT else ():
                        client.call(("sequential", address, inputs[kind], 10), STARTUP_TIMEOUT_S)
                        latencies = client.call(("sequential", address, inputs[kind], sizes["calibration"]), 120)
                        base[kind] = statistics.median(latencies)
                    if name == "static":
                        calls = sizes["overhead_calls"]
                        grpc_p50 = percentile(client.call(("sequential", address, inputs["row"], calls), 300), 0.5)
                        direct_p50 = server.call(("direct", inputs["row"], calls), 300)
                        results["overhead"] = {"grpc_p50_s": grpc_p50, "direct_p50_s": direct_p50,
                                               "overhead_p50_s": grpc_p50 - direct_p50,
                                               "server_p50_s": server.call("stats")["stats"]["p50_ms"] / 1000}
                finally:
                    server.close()
                results["calibration"][name] = base if name != EARLY_EXIT else {
                    "mean": next(iter(base.values())), **results.pop("calibration_spread")}
                say(f"  {name} model ({model['workload']}): alone through gRPC "
                    + ", ".join(f"{kind} {seconds * 1000:.2f} ms" for kind, seconds in results["calibration"][name].items()))
                patterns = sizes["patterns"] if name != "static" else ["poisson"]
                multipliers = sizes["static_multipliers"] if name == "static" else sizes["multipliers"]
                # The early-exit model's load follows the machine: exit_load times the rate one endpoint serving
                # one request at a time could sustain (1 / the mean latency alone), so a slower machine gets the
                # same overload, as its SLOs follow its latencies.
                rate = sizes["exit_load"] / base[next(iter(base))] if name == EARLY_EXIT else sizes["rate_rps"]
                results.setdefault("rates_rps", {})[name] = rate
                plans: dict[str, list] = {}
                for policy in policies:
                    batching = {"policy": policy, "max_batch": sizes["max_batch"],
                                "max_queue_delay_s": sizes["max_queue_delay_ms"] / 1000, "max_queue": 4096}
                    server = _Child(context, f"{name}-{policy}", _server_main, cores[0], model["path"], batching)
                    try:
                        address = server.receive(STARTUP_TIMEOUT_S)["address"]
                        warm_kinds = request_kinds(kinds_available, sizes["warmup"], sizes["long_share"], 99)
                        warm = arrivals("poisson", sizes["warmup"], rate, sizes["burst_mean"], 98)
                        client.call(("run", address, inputs, _plan(warm_kinds, warm, base, 10.0)), 300)
                        for pattern in patterns:
                            for multiplier in multipliers:
                                seed = zlib.crc32(f"{pattern}/{multiplier:g}".encode()) % 10_000
                                kinds = request_kinds(kinds_available, sizes["requests"], sizes["long_share"], seed)
                                moments = arrivals(pattern, sizes["requests"], rate, sizes["burst_mean"], seed + 1)
                                plan = _plan(kinds, moments, base, multiplier)
                                outcome = _finish(client.call(("run", address, inputs, plan),
                                                              moments[-1] + DRAIN_S + 60), plan)
                                key = f"{name}/{pattern}/{multiplier:g}"
                                plans[key] = plan
                                results["runs"].setdefault(key, {})[policy] = outcome
                                say(f"  {key:24s} {policy:6s} finish rate {outcome['finish_rate']:.3f} "
                                    f"({outcome['on_time']}/{outcome['requests']}; {outcome['statuses'] or 'all answered'})")
                        stats = server.call("stats")["stats"]
                        results["runs"].setdefault(f"{name}/endpoint", {})[policy] = {
                            key: stats.get(key) for key in ("batches", "mean_batch", "batch_sizes", "dropped_early",
                                                            "exit_depths") if key in stats}
                    finally:
                        server.close()
                for system in PEERS if peers else ():
                    warm_kinds = request_kinds(kinds_available, sizes["warmup"], sizes["long_share"], 99)
                    warm = arrivals("poisson", sizes["warmup"], rate, sizes["burst_mean"], 98)
                    say(f"  {name}: real {system} on the same requests ...")
                    found = peer(system, model, inputs, plans, _plan(warm_kinds, warm, base, 10.0), sizes,
                                 overhead_row=inputs.get("row"))
                    for key, outcome in found["runs"].items():
                        results["runs"][key][system] = outcome
                        say(f"  {key:24s} {system:9s} finish rate {outcome['finish_rate']:.3f}")
                    if found.get("overhead"):
                        results["overhead"][system.replace("-", "_")] = found["overhead"]
        finally:
            client.close()
    results["seconds"] = time.perf_counter() - began
    return results


def tight(results: dict[str, Any], name: str, multiplier: float | None = None) -> dict[str, float]:
    """Per policy, the finish rate at ``multiplier`` (by default the tightest) on model ``name``, over its
    patterns (mean)."""
    sizes = results["sizes"]
    if multiplier is None:
        multiplier = min(sizes["static_multipliers"] if name == "static" else sizes["multipliers"])
    rates: dict[str, list[float]] = {}
    for key, by_policy in results["runs"].items():
        parts = key.split("/")
        if parts[0] == name and len(parts) == 3 and float(parts[2]) == multiplier:
            for policy, outcome in by_policy.items():
                rates.setdefault(policy, []).append(outcome["finish_rate"])
    return {policy: statistics.mean(values) for policy, values in rates.items()}


FINISH_FIGURES = (  # (key, model, baseline policy, its description, target)
    ("finish_rate_dynamic_vs_fifo", "dynamic", "fifo", "FIFO dynamic batching (Triton-style)", TARGET_DYNAMIC),
    ("finish_rate_dynamic_vs_edf", "dynamic", "edf", "EDF with a mean estimate", None),
    ("finish_rate_dynamic_vs_triton", "dynamic", "triton", "real Triton (nvidia-pytriton, dynamic batcher)",
     TARGET_DYNAMIC),
    ("finish_rate_dynamic_vs_ray_serve", "dynamic", "ray-serve", "real Ray Serve (@serve.batch, handle calls)",
     TARGET_DYNAMIC),
    ("finish_rate_static_vs_fifo", "static", "fifo", "FIFO dynamic batching", TARGET_STATIC),
)


def figures(results: dict[str, Any]) -> list[Figure]:
    found = []
    rates = {name: tight(results, name) for name in ("dynamic", "static")}
    for key, model, baseline, label, target in FINISH_FIGURES:
        if "orloj" in rates[model] and baseline in rates[model]:
            found.append(Figure(key, f"finish rate within the SLO, {model} model, tightest SLO, Orloj against {label}",
                                rates[model]["orloj"], rates[model][baseline], "share", lower_is_better=False,
                                target=target))
    if EARLY_EXIT in results.get("models", {}):  # every multiplier: where the input does not reveal the run time
        for multiplier in results["sizes"]["multipliers"]:
            at = tight(results, EARLY_EXIT, multiplier)
            for baseline, label, target in (("fifo", "FIFO dynamic batching (Triton-style)", TARGET_DYNAMIC),
                                            ("edf", "EDF with a mean estimate", TARGET_EXIT_EDF)):
                if "orloj" in at and baseline in at:
                    found.append(Figure(f"finish_rate_exit_{multiplier:g}x_vs_{baseline}".replace(".", "_"),
                                        f"finish rate within the SLO, early-exit model, SLO {multiplier:g}x the mean "
                                        f"latency alone, Orloj against {label}", at["orloj"], at[baseline], "share",
                                        lower_is_better=False, target=target))
    overhead = results.get("overhead") or {}
    for system, label in (("triton", "Triton through its gRPC endpoint"), ("ray_serve", "Ray Serve through a handle")):
        theirs = overhead.get(system) or {}
        if theirs.get("overhead_p50_s") is not None and overhead.get("overhead_p50_s") is not None:
            found.append(Figure(f"overhead_p50_vs_{system}", "per-request overhead over a direct model call, p50: "
                                f"Strata through gRPC against {label}", max(overhead["overhead_p50_s"], 1e-9),
                                max(theirs["overhead_p50_s"], 1e-9), "s"))
    if overhead.get("overhead_p50_s") is not None:
        found.append(Figure("overhead_p50", "per-request overhead of a gRPC call over a direct model call, p50, "
                            "against the 0.5 ms budget", max(overhead["overhead_p50_s"], 1e-9), OVERHEAD_BUDGET_S,
                            "s", target=1.0))
    return found


def format_table(results: dict[str, Any]) -> str:
    policies = [policy for policy in (*POLICIES, *PEERS) if any(policy in runs for runs in results["runs"].values())]
    rows = []
    for key, by_policy in results["runs"].items():
        if key.endswith("/endpoint"):
            continue
        rows.append((key, *(f"{by_policy[policy]['finish_rate']:.3f}" if policy in by_policy else "-"
                             for policy in policies)))
    lines = [table(rows, ("model/pattern/SLO multiplier", *policies))]
    for key, by_policy in results["runs"].items():
        if key.endswith("/endpoint"):
            lines.append(f"{key}: " + "; ".join(f"{policy} mean batch {stats['mean_batch'] or 0:.2f}, "
                                                f"{stats['dropped_early']} answered early"
                                                + (f", rows per exit {stats['exit_depths']}" if "exit_depths" in stats
                                                   else "")
                                                for policy, stats in by_policy.items()))
    overhead = results.get("overhead") or {}
    if overhead:
        lines.append(f"one row of the static model: gRPC p50 {overhead['grpc_p50_s'] * 1000:.3f} ms, direct call "
                     f"p50 {overhead['direct_p50_s'] * 1000:.3f} ms, overhead {overhead['overhead_p50_s'] * 1000:.3f} ms")
    return "\n".join(lines)


def combine(runs: list[list[Figure]]) -> list[Figure]:
    """The figures of several runs as one: each the median of its runs' mechanism and baseline, with every
    run's values and ratio, and their ranges, under ``runs`` and ``range`` (a figure some run lacks is left
    out)."""
    combined = []
    for first in runs[0]:
        same = [next((figure for figure in found if figure.key == first.key), None) for found in runs]
        if any(figure is None for figure in same):
            continue
        mechanisms = [figure.mechanism for figure in same]
        baselines = [figure.baseline for figure in same]
        ratios = [figure.ratio for figure in same]
        values = {"mechanism": mechanisms, "baseline": baselines, "ratio": ratios}
        known = {key: [value for value in found if value is not None] for key, found in values.items()}
        combined.append(Figure(
            first.key, f"{first.figure} (median of {len(runs)} runs)",
            percentile(known["mechanism"], 0.5) if known["mechanism"] else None,
            percentile(known["baseline"], 0.5) if known["baseline"] else None, first.unit,
            lower_is_better=first.lower_is_better, target=first.target,
            extra={"runs": values, "range": {key: [min(found), max(found)] if found else None
                                             for key, found in known.items()},
                   "ratio_median": percentile(known["ratio"], 0.5) if known["ratio"] else None,
                   "met_runs": sum(1 for ratio in known["ratio"] if first.target is not None
                                   and ratio >= first.target)}))
    return combined
