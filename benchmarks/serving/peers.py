"""Real Ray Serve on the SLA benchmark's load: ``strata bench serving --peers`` runs this module with the peers'
interpreter (``make bench-peers`` builds ``.venv-peers`` with ``ray[serve]==2.60.0``; Ray is never in ``make test``'s
install).

    python -m benchmarks.serving.peers --model model.pt --plan plan.json --output result.json

One Ray Serve deployment serves the same ``model.pt`` (rebuilt by the same loader) with ``@serve.batch``, as Ray's
docs advise for batching: ``max_batch_size`` the benchmark's, ``batch_wait_timeout_s`` its FIFO queue delay, and
``max_ongoing_requests`` large enough for the queue to form (``max_batch_size`` x 16). Variable-length rows are
right-padded to the longest of the batch, exactly as Strata's endpoint does. One replica, one torch thread.

Requests go through a ``DeploymentHandle`` from the driver (Ray's in-cluster call path, no HTTP): open loop, each
at its moment from the plan, each awaited with its SLO as the timeout (``asyncio.wait_for``; a late one is
cancelled). This is Ray Serve's fastest path, so its figures are a best case for Ray: Strata's are measured
through gRPC. The per-request overhead is the p50 of sequential handle calls minus that of a direct model call in
the replica.

Ray's defaults are changed only where this machine needs it: its head listens on loopback, token authentication
is off (a local, single-user instance) and usage statistics are not sent anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any


def run_ray_serve(model_path: str, plans: dict[str, Any], *, max_batch: int, wait_s: float,
                  calls: int) -> dict[str, Any]:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    import numpy as np
    import ray
    from ray import serve

    ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=2, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": 0})

    @serve.deployment(num_replicas=1, max_ongoing_requests=max_batch * 16, ray_actor_options={"num_cpus": 1})
    class Model:
        def __init__(self, path: str):
            import torch

            torch.set_num_threads(1)
            from components.serving.model import load_served_model

            self.served = load_served_model(path)

        @serve.batch(max_batch_size=max_batch, batch_wait_timeout_s=wait_s)
        async def __call__(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
            import torch

            served = self.served
            tensors = [torch.as_tensor(row) for row in inputs]
            lengths = [served.length(t) for t in tensors]
            longest = max(lengths)
            batch = torch.cat([served.pad_to(t, longest) if served.variable_length else t for t in tensors])
            with torch.inference_mode():
                output = served.module(batch)
            answers, start = [], 0
            for tensor, length in zip(tensors, lengths, strict=True):
                part = output[start:start + tensor.shape[0]]
                start += tensor.shape[0]
                answers.append((part[:, :length] if served.variable_length else part).numpy())
            return answers

        def direct_p50(self, row: np.ndarray, count: int) -> float:
            import torch

            times = []
            with torch.inference_mode():
                for _ in range(count):
                    began = time.perf_counter()
                    self.served.module(torch.as_tensor(row))
                    times.append(time.perf_counter() - began)
            return sorted(times)[len(times) // 2]

    handle = serve.run(Model.bind(model_path), name="strata-bench", route_prefix=None)
    inputs = {kind: np.asarray(rows, dtype=plans["dtype"]) for kind, rows in plans["inputs"].items()}
    results: dict[str, Any] = {"runs": {}}

    async def one(kind: str, slo: float) -> str | None:
        response = handle.remote(inputs[kind])
        try:
            await asyncio.wait_for(response, timeout=slo)
            return None
        except TimeoutError:
            response.cancel()
            return "DEADLINE_EXCEEDED"
        except Exception as error:  # noqa: BLE001 -- any failure is a request not answered in time
            return type(error).__name__

    async def run_plan(plan: list[list[Any]]) -> list[str | None]:
        began = time.perf_counter()
        tasks = []
        for moment, kind, slo in plan:
            delay = began + moment - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(kind, slo)))
        return await asyncio.gather(*tasks)

    loop = asyncio.new_event_loop()
    try:
        for _ in range(10):  # warm up
            for kind in inputs:
                handle.remote(inputs[kind]).result()
        loop.run_until_complete(run_plan(plans["warmup"]))
        for key, plan in plans["runs"].items():
            statuses = loop.run_until_complete(run_plan(plan))
            on_time = sum(1 for status in statuses if status is None)
            results["runs"][key] = {"requests": len(plan), "on_time": on_time, "finish_rate": on_time / len(plan),
                                    "statuses": {s: statuses.count(s) for s in set(statuses) if s is not None}}
            print(f"  ray-serve {key:24s} finish rate {on_time / len(plan):.3f}", flush=True)
        if "overhead_row" in plans:
            row = np.asarray(plans["overhead_row"], dtype="float32")
            latencies = []
            for _ in range(calls):
                began = time.perf_counter()
                handle.remote(row).result()
                latencies.append(time.perf_counter() - began)
            direct = handle.direct_p50.remote(row, calls).result()
            p50 = sorted(latencies)[len(latencies) // 2]
            results["overhead"] = {"call_p50_s": p50, "direct_p50_s": direct, "overhead_p50_s": p50 - direct}
    finally:
        loop.close()
        serve.shutdown()
        ray.shutdown()
    return results


def _triton_load(conn, core: int | None, url: str, model: str, inputs: dict, dtype: str, plans: dict,
                 calls: int) -> None:
    """The load generator for Triton, in its own process: open-loop ``async_infer`` calls, each with its SLO as the
    gRPC deadline (``client_timeout``), like Strata's generator."""
    import threading

    import numpy as np
    import tritonclient.grpc as triton

    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})
    client = triton.InferenceServerClient(url)
    arrays = {kind: np.asarray(rows, dtype=dtype) for kind, rows in inputs.items()}

    def request(kind: str):
        tensor = triton.InferInput("x", list(arrays[kind].shape), "FP32" if dtype == "float32" else "INT64")
        tensor.set_data_from_numpy(arrays[kind])
        return [tensor]

    def run_plan(plan: list) -> list[str | None]:
        statuses: list[str | None] = [None] * len(plan)
        done = threading.Semaphore(0)

        def finished(index, result, error):
            statuses[index] = None if error is None else (error.status() or type(error).__name__)
            done.release()

        began = time.perf_counter()
        for index, (moment, kind, slo) in enumerate(plan):
            delay = began + moment - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            client.async_infer(model, request(kind), callback=lambda result, error, i=index: finished(i, result, error),
                               client_timeout=slo)
        for _ in plan:
            done.acquire(timeout=60)
        return statuses

    results: dict[str, Any] = {"runs": {}}
    for kind in arrays:  # warm up
        for _ in range(10):
            client.infer(model, request(kind))
    run_plan(plans["warmup"])
    for key, plan in plans["runs"].items():
        statuses = run_plan(plan)
        on_time = sum(1 for status in statuses if status is None)
        results["runs"][key] = {"requests": len(plan), "on_time": on_time, "finish_rate": on_time / len(plan),
                                "statuses": {s: statuses.count(s) for s in set(statuses) if s is not None}}
    if "overhead_row" in plans:
        row = np.asarray(plans["overhead_row"], dtype="float32")
        arrays["overhead"] = row
        latencies = []
        for _ in range(calls):
            began = time.perf_counter()
            client.infer(model, request("overhead"))
            latencies.append(time.perf_counter() - began)
        results["call_p50_s"] = sorted(latencies)[len(latencies) // 2]
    client.close()
    conn.send(results)


def run_triton(model_path: str, plans: dict[str, Any], *, max_batch: int, wait_s: float, calls: int) -> dict[str, Any]:
    """The same plans on real Triton (nvidia-pytriton 0.7.0, which bundles the Triton server): the model bound with
    pytriton's ``@batch``, Triton's dynamic batcher with ``max_batch_size`` and ``max_queue_delay_microseconds`` the
    benchmark's FIFO settings (as Triton's docs advise for a latency budget of milliseconds: a small delay). Triton
    batches only requests of the same shape, so rows of different lengths go in different batches. The inference
    function runs in this process, pinned to core 0 with one torch thread; the load generator in another process on
    core 1, over Triton's gRPC endpoint on 127.0.0.1."""
    import multiprocessing

    import numpy as np
    import torch
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    from components.serving.model import load_served_model

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    torch.set_num_threads(1)
    served = load_served_model(model_path)
    dtype = np.float32 if served.input_dtype == "float32" else np.int64

    @batch
    def infer(x):
        with torch.inference_mode():
            return {"y": served.module(torch.as_tensor(x)).numpy()}

    input_shape = (-1,) if served.variable_length else tuple(served.input_shape)
    output_shape = (-1, *served.output_shape[1:]) if served.variable_length else tuple(served.output_shape)
    grpc_port = _free_port()
    config = TritonConfig(http_port=_free_port(), grpc_port=grpc_port, metrics_port=_free_port(),
                          log_verbose=0)
    direct = []
    row = plans.get("overhead_row")
    if row is not None:
        with torch.inference_mode():
            sample = torch.as_tensor(np.asarray(row, dtype=np.float32))
            for _ in range(calls):
                began = time.perf_counter()
                served.module(sample)
                direct.append(time.perf_counter() - began)
    with Triton(config=config) as triton:
        triton.bind(model_name="strata", infer_func=infer,
                    inputs=[Tensor(name="x", dtype=dtype, shape=input_shape)],
                    outputs=[Tensor(name="y", dtype=np.float32, shape=output_shape)],
                    config=ModelConfig(max_batch_size=max_batch,
                                       batcher=DynamicBatcher(max_queue_delay_microseconds=int(wait_s * 1e6))))
        triton.run()
        context = multiprocessing.get_context("spawn")
        mine, theirs = context.Pipe()
        process = context.Process(target=_triton_load, args=(theirs, 1, f"127.0.0.1:{grpc_port}", "strata",
                                                             plans["inputs"], plans["dtype"], plans, calls))
        process.start()
        try:
            results = mine.recv()
        finally:
            process.join(30)
            if process.is_alive():
                process.kill()
    if direct and "call_p50_s" in results:
        results["overhead"] = {"call_p50_s": results["call_p50_s"], "direct_p50_s": sorted(direct)[len(direct) // 2],
                               "overhead_p50_s": results["call_p50_s"] - sorted(direct)[len(direct) // 2]}
    for key, outcome in results["runs"].items():
        print(f"  triton {key:24s} finish rate {outcome['finish_rate']:.3f}", flush=True)
    return results


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--plan", required=True, help="JSON: {dtype, inputs, warmup, runs, overhead_row?}")
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--wait-s", type=float, default=0.0001)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--output", required=True)
    parser.add_argument("--system", choices=["ray-serve", "triton"], default="ray-serve")
    args = parser.parse_args(argv)
    with open(args.plan) as handle:
        plans = json.load(handle)
    run = run_ray_serve if args.system == "ray-serve" else run_triton
    result = run(args.model, plans, max_batch=args.max_batch, wait_s=args.wait_s, calls=args.calls)
    with open(args.output, "w") as handle:
        json.dump(result, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
