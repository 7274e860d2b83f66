"""gpu-check part ``serving``: the serving endpoint on a CUDA device, through the real gRPC path.

The models are ``model.pt`` files of built-in train workloads, trained for a few steps and stored exactly as a train
job stores them (:func:`benchmarks.serving.slabench.make_model`), served by
:func:`components.serving.endpoint.start_serving` in front of a :class:`~components.gpushare.executor.DeviceExecutor`
on the device, in a server process of its own; the load comes from the SLA benchmark's client process
(:func:`benchmarks.serving.slabench._client_main`: open-loop non-blocking gRPC calls, each with its SLO as the
call's deadline). Two measurements:

- **overhead**: one row of the static model (``mlp-digits``): a gRPC call's p50 on an idle endpoint against a direct
  call of the same module in the server process (synchronized), against the 0.5 ms budget;
- **finish rate**: the dynamic model (``tiny-gpt``, short and long requests), each kind's SLO = 1.5 x its latency
  alone through gRPC; Poisson arrivals at 2 x (dry: 1.5 x) the rate one-at-a-time calls through gRPC could
  be answered at (from the same calibration: batching must help), at most 2,000 a second (what one Python gRPC
  server process takes), one fresh server per policy (Orloj, FIFO dynamic batching, EDF with a mean
  estimate), warmed up first; the calibration runs on the first, idle, before its warm-up. Finish rate = answered within the SLO / sent.

The server is the SLA benchmark's (:func:`benchmarks.serving.slabench._server_main`, which serves on the CPU as a
virtual GPU by default) with the device passed through and no core pinned.
"""

from __future__ import annotations

import multiprocessing
import statistics
import tempfile
from pathlib import Path

from benchmarks.benchkit import Figure, percentile

DRY = {"model_steps": 2, "width": 64, "requests": 40, "warmup": 10, "calibration": 5, "overhead_calls": 20,
       "max_batch": 8, "max_queue_delay_ms": 0.1, "long_share": 0.2, "short_len": 8, "long_len": 64,
       "multiplier": 1.5, "load": 1.5, "burst_mean": 4.0, "max_rate_rps": 2000.0}
GPU = {**DRY, "model_steps": 20, "width": 384, "requests": 1500, "warmup": 200, "calibration": 40,
       "overhead_calls": 300, "load": 2.0}
POLICIES = ("orloj", "fifo", "edf")
OVERHEAD_BUDGET_S = 0.0005
TARGET_VS_FIFO = 1.5
TARGET_VS_EDF = 1.0


def run(rec) -> None:
    from benchmarks.serving import slabench
    from benchmarks.serving.harness import STARTUP_TIMEOUT_S, _Child

    sizes = rec.size(DRY, GPU)
    rec.detail("sizes", sizes)
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="strata-gpu-check-serving-") as directory:
        models = rec.step("models", lambda: {
            "static": slabench.make_model(Path(directory), "mlp-digits", sizes["model_steps"], hidden=256),
            "dynamic": slabench.make_model(Path(directory), "tiny-gpt", sizes["model_steps"], hidden=sizes["width"])})
        if models is None:
            return
        client = _Child(context, "gpu-check-client", slabench._client_main, None)
        try:
            def server(model, batching):
                child = _Child(context, "gpu-check-server", slabench._server_main, None, model["path"], batching,
                               rec.device)
                return child, child.receive(STARTUP_TIMEOUT_S)["address"]

            def overhead():
                model = models["static"]
                inputs = slabench.request_inputs(model, sizes)["row"]
                child, address = server(model, {"policy": "fifo", "max_batch": 1, "max_queue_delay_s": 0.0})
                try:
                    client.call(("sequential", address, inputs, 10), STARTUP_TIMEOUT_S)
                    calls = sizes["overhead_calls"]
                    grpc_p50 = percentile(client.call(("sequential", address, inputs, calls), 300), 0.5)
                    child.call(("direct", inputs, 10), 120)
                    direct_p50 = child.call(("direct", inputs, calls), 300)
                finally:
                    child.close()
                found = {"grpc_p50_s": grpc_p50, "direct_p50_s": direct_p50, "overhead_p50_s": grpc_p50 - direct_p50}
                rec.say(f"overhead: gRPC p50 {grpc_p50 * 1000:.3f} ms, direct {direct_p50 * 1000:.3f} ms")
                rec.details["overhead"] = found
                rec.figure(Figure("overhead_p50", "per-request overhead of a gRPC call over a direct model call, p50, "
                                  "against the 0.5 ms budget", max(found["overhead_p50_s"], 1e-9), OVERHEAD_BUDGET_S,
                                  "s", target=1.0))

            def finish_rates():
                model = models["dynamic"]
                inputs = slabench.request_inputs(model, sizes)
                share = sizes["long_share"]
                rec.details["finish"] = {"runs": {}}
                base: dict[str, float] = {}
                plan = warm_plan = None
                moments: list[float] = []
                for policy in POLICIES:
                    batching = {"policy": policy, "max_batch": sizes["max_batch"],
                                "max_queue_delay_s": sizes["max_queue_delay_ms"] / 1000, "max_queue": 4096}
                    child, address = server(model, batching)
                    try:
                        if not base:  # calibration on the first, idle server: calls one at a time (batches of 1)
                            for kind in sorted(inputs):
                                client.call(("sequential", address, inputs[kind], 5), STARTUP_TIMEOUT_S)
                                base[kind] = statistics.median(
                                    client.call(("sequential", address, inputs[kind], sizes["calibration"]), 120))
                            rate = min(sizes["load"] / ((1 - share) * base["short"] + share * base["long"]),
                                       sizes["max_rate_rps"])  # what one Python gRPC server process can take
                            kinds = slabench.request_kinds(sorted(inputs), sizes["requests"], share, 5)
                            moments = slabench.arrivals("poisson", sizes["requests"], rate, sizes["burst_mean"], 6)
                            plan = slabench._plan(kinds, moments, base, sizes["multiplier"])
                            warm_kinds = slabench.request_kinds(sorted(inputs), sizes["warmup"], share, 99)
                            warm = slabench.arrivals("poisson", sizes["warmup"], rate, sizes["burst_mean"], 98)
                            warm_plan = slabench._plan(warm_kinds, warm, base, 10.0)
                            rec.details["finish"].update({"calibration_s": base, "rate_rps": rate})
                            rec.say(f"finish rate: alone short {base['short'] * 1000:.2f} ms, long "
                                    f"{base['long'] * 1000:.2f} ms; {sizes['requests']} requests at {rate:.0f}/s, "
                                    f"SLO {sizes['multiplier']}x")
                        client.call(("run", address, inputs, warm_plan), 300)
                        outcome = slabench._finish(client.call(("run", address, inputs, plan),
                                                               moments[-1] + slabench.DRAIN_S + 60), plan)
                    finally:
                        child.close()
                    rec.details["finish"]["runs"][policy] = outcome
                    rec.say(f"finish rate {policy}: {outcome['finish_rate']:.3f} ({outcome['on_time']}/"
                            f"{outcome['requests']})")
                    rec.flush()
                runs = rec.details["finish"]["runs"]
                for key, baseline, target in (("finish_rate_vs_fifo", "fifo", TARGET_VS_FIFO),
                                              ("finish_rate_vs_edf", "edf", TARGET_VS_EDF)):
                    rec.figure(Figure(key, f"finish rate within the SLO ({sizes['multiplier']}x alone), dynamic model, "
                                      f"Orloj against {baseline.upper()}", runs["orloj"]["finish_rate"],
                                      runs[baseline]["finish_rate"], "share", lower_is_better=False, target=target))

            rec.step("overhead", overhead)
            rec.step("finish_rate", finish_rates)
        finally:
            client.close()
