"""The floor under the serving endpoint's per-request overhead: what Python gRPC itself costs on this machine.

``python -m benchmarks.serving.grpcfloor [--calls N]`` times sequential unary calls of one row of the static model
(mlp-digits' 64 float32 features, as the SLA part's overhead figure sends) through three servers, each in a
process pinned to the device's core, with the client (grpcio's synchronous stub, as the SLA part's) on the other:

- ``sync echo``: grpcio's synchronous server (a thread pool), a handler that parses the ``PredictRequest`` and
  answers a ``PredictReply`` of 10 floats at once: no model, no queue;
- ``asyncio echo``: the same handler on ``grpc.aio`` (the handler runs on the event loop: no worker thread);
- ``endpoint``: :func:`~components.serving.endpoint.start_serving` serving the static model (FIFO, batches of one):
  the full path (checks, queue, batcher thread, executor thread, the model).

The endpoint's overhead over a direct model call is the SLA part's ``overhead_p50`` figure; the echo servers show
how much of it no server written in Python gRPC can avoid.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from benchmarks.benchkit import percentile
from benchmarks.serving.harness import STARTUP_TIMEOUT_S, _Child, _cores, _pin, answering, child_context

METHOD = "/strata.serving.v1.Inference/Predict"


def _reply_bytes() -> bytes:
    import numpy as np

    from components.serving import serving_pb2
    from components.serving.client import encode

    return serving_pb2.PredictReply(output=encode(np.zeros((1, 10), dtype=np.float32)), server_ms=0.0)\
        .SerializeToString()


def _echo_main(conn, core: int | None, kind: str) -> None:
    _pin(core)
    with answering(conn):
        import concurrent.futures

        import grpc

        from components.serving import serving_pb2

        reply = _reply_bytes()

        def handle(request: bytes, context) -> bytes:
            serving_pb2.PredictRequest.FromString(request)
            return reply

        async def handle_async(request: bytes, context) -> bytes:
            return handle(request, context)

        if kind == "sync":
            server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8))
            handler = grpc.unary_unary_rpc_method_handler(handle)
            server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
                "strata.serving.v1.Inference", {"Predict": handler}),))
            port = server.add_insecure_port("127.0.0.1:0")
            server.start()
            conn.send({"address": f"127.0.0.1:{port}"})
            conn.recv()
            server.stop(None)
            return
        import asyncio

        async def serve() -> None:
            server = grpc.aio.server()
            handler = grpc.unary_unary_rpc_method_handler(handle_async)
            server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
                "strata.serving.v1.Inference", {"Predict": handler}),))
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            conn.send({"address": f"127.0.0.1:{port}"})
            await asyncio.get_running_loop().run_in_executor(None, conn.recv)
            await server.stop(None)

        asyncio.run(serve())


def _endpoint_main(conn, core: int | None, model_path: str) -> None:
    from benchmarks.serving.slabench import _server_main

    _server_main(conn, core, model_path, {"policy": "fifo", "max_batch": 1, "max_queue_delay_s": 0.0})


def _client_main(conn, core: int | None) -> None:
    _pin(core)
    with answering(conn):
        import grpc
        import numpy as np

        from components.serving import serving_pb2
        from components.serving.client import encode

        request = serving_pb2.PredictRequest(input=encode(np.random.default_rng(0).random((1, 64), dtype=np.float32)))
        data = request.SerializeToString()
        while True:
            message = conn.recv()
            if message == "stop":
                return
            address, calls = message
            with grpc.insecure_channel(address) as channel:
                call = channel.unary_unary(METHOD)
                for _ in range(50):
                    call(data, timeout=30)
                times = []
                for _ in range(calls):
                    began = time.perf_counter()
                    call(data, timeout=30)
                    times.append(time.perf_counter() - began)
            conn.send(times)


def run(calls: int = 2000) -> dict[str, Any]:
    import tempfile
    from pathlib import Path

    from benchmarks.serving.slabench import make_model

    context = child_context()
    server_core, client_core = _cores()
    results: dict[str, Any] = {"calls": calls}
    with tempfile.TemporaryDirectory(prefix="strata-grpcfloor-") as directory:
        model = make_model(Path(directory), "mlp-digits", 20, hidden=256)
        client = _Child(context, "client", _client_main, client_core)
        try:
            for name, target, args in (("sync_echo", _echo_main, ("sync",)), ("asyncio_echo", _echo_main, ("aio",)),
                                       ("endpoint", _endpoint_main, (model["path"],))):
                server = _Child(context, name, target, server_core, *args)
                try:
                    address = server.receive(STARTUP_TIMEOUT_S)["address"]
                    times = client.call((address, calls), 600)
                    results[name] = {"p50_s": percentile(times, 0.5), "p90_s": percentile(times, 0.9),
                                     "p99_s": percentile(times, 0.99)}
                    if name == "endpoint":
                        import numpy as np

                        row = np.random.default_rng(0).random((1, 64), dtype=np.float32)
                        results[name]["direct_p50_s"] = server.call(("direct", row, calls), 300)
                        results[name]["server_p50_s"] = server.call("stats")["stats"]["p50_ms"] / 1000
                finally:
                    server.close()
        finally:
            client.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--output")
    arguments = parser.parse_args()
    every = []
    for index in range(arguments.runs):
        found = run(arguments.calls)
        every.append(found)
        print(f"run {index + 1}: " + "; ".join(
            f"{name} p50 {found[name]['p50_s'] * 1000:.3f} ms" for name in ("sync_echo", "asyncio_echo", "endpoint"))
            + f"; direct model call p50 {found['endpoint']['direct_p50_s'] * 1000:.3f} ms"
            + f"; inside the endpoint p50 {found['endpoint']['server_p50_s'] * 1000:.3f} ms", flush=True)
    if arguments.output:
        with open(arguments.output, "w") as handle:
            json.dump({"benchmark": "serving-grpc-floor", "runs": every}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
