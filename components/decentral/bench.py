"""``strata bench decentral``: Atom on hivemind against its baselines, on this machine, in one run.

Parts (``--quick`` shortens each):

- ``network``: tokens/s of a swarm of 4 peers (each a full model, swapping layers under a device budget of a quarter
  of the model, averaging asynchronously through hivemind) against a pipeline-parallel baseline of 4 stages
  (SWARM/Petals style: activations and their gradients cross the network for every micro-batch), the same model,
  both over the same token-bucket links (:mod:`components.decentral.throttle`: every peer's and every stage's
  traffic goes through a throttled TCP proxy) at 100 Mbit/s and at 1 Gbit/s. Target: ≥ 2× at 100 Mbit/s.
- ``swap``: a model 4× the device budget, trained with swapping, against in-memory training of the same model with
  no budget (:func:`components.decentral.swap.throughput`). Target: ≥ 60 % of its throughput.
- ``crash``: a swarm of 3 loses a peer (SIGKILL) mid-run; the others must train on without a restart, the loss
  still falling (ratio: held-out loss when the peer died / at the end; target > 1).

Not measured here (reported as missing): plain ``hivemind.Optimizer`` with the whole model in memory.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from components.runtime.benchkit import Figure, document, figures_table, progress, write

SAY = progress("decentral: ")


def _swarm_tokens_per_s(mbit: float | None, *, quick: bool, model: str, peers: int = 4) -> dict[str, Any]:
    from components.decentral.local import LocalSwarm
    from components.decentral.model import ModelConfig, build_model, parameter_bytes
    from components.decentral.throttle import ThrottledProxy, free_port

    config = ModelConfig.named(model)
    budget_mb = parameter_bytes(build_model(config)) / 4 / 2**20
    steps = 30 if quick else 80
    spec = {"model": model, "steps": steps, "batch_size": 8, "peers": {"min": peers, "max": peers},
            "averaging": {"period_s": 10.0 if quick else 15.0}, "swap": {"budget_mb": budget_mb, "pcie_gbps": 16.0},
            "eval_every": 10_000}
    proxies = []
    with tempfile.TemporaryDirectory(prefix="strata-bench-swarm-") as folder, LocalSwarm(folder, spec) as swarm:
        for index in range(peers):
            port = free_port()
            proxy = ThrottledProxy("127.0.0.1", port, mbit=mbit).start()
            proxies.append(proxy)
            announce = int(proxy.address.rsplit(":", 1)[1])
            info = swarm.start(f"p{index}", listen_port=port, announce_port=announce, wait=index == 0)
            if "error" in info:
                raise RuntimeError(f"peer p{index} did not start: {info['error']}")
        for index in range(1, peers):
            swarm.wait_ready(f"p{index}")
        swarm.wait(1800)
        results = [swarm.result(f"p{index}") for index in range(peers)]
        sent = sum(proxy.bytes_total for proxy in proxies)
        for proxy in proxies:
            proxy.stop()
    if any(result is None or "error" in result for result in results):
        raise RuntimeError(f"a swarm peer failed: {results}")
    tokens = sum(result["samples"] for result in results) * config.context
    wall = max(result["wall_s"] for result in results)
    return {"tokens_per_s": tokens / wall, "wall_s": wall, "tokens": tokens, "bytes_through_links": sent,
            "rounds_ok": [result["rounds_ok"] for result in results],
            "rounds_failed": [result["rounds_failed"] for result in results],
            "test_loss": [result["test_loss"] for result in results]}


def _pipeline_tokens_per_s(mbit: float | None, *, quick: bool, model: str) -> dict[str, Any]:
    from components.decentral.pipeline import run_pipeline

    result = run_pipeline(model, stages=4, micro_batches=8, micro_batch_size=4, steps=3 if quick else 8,
                          mbit=mbit)
    return {key: result[key] for key in ("tokens_per_s", "steady_tokens_per_s", "step_s") if key in result}


def part_network(quick: bool, runs: int, model: str) -> tuple[list[Figure], dict[str, Any]]:
    figures, details = [], {}
    for mbit in (100.0, 1000.0):
        swarm_runs, pipe_runs = [], []
        for run in range(runs):
            SAY(f"{mbit:g} Mbit/s, run {run + 1}/{runs}: the pipeline (4 stages)")
            pipe_runs.append(_pipeline_tokens_per_s(mbit, quick=quick, model=model))
            SAY(f"{mbit:g} Mbit/s, run {run + 1}/{runs}: the swarm (4 peers)")
            swarm_runs.append(_swarm_tokens_per_s(mbit, quick=quick, model=model))
        swarm_rate = statistics.median(r["tokens_per_s"] for r in swarm_runs)
        pipe_rate = statistics.median(r["tokens_per_s"] for r in pipe_runs)
        ratios = [s["tokens_per_s"] / p["tokens_per_s"] for s, p in zip(swarm_runs, pipe_runs, strict=True)]
        key = f"tokens_per_s_{int(mbit)}mbit"
        figures.append(Figure(key, f"tokens/s at {mbit:g} Mbit/s (4 peers, model {model})", swarm_rate, pipe_rate,
                              "tokens/s", lower_is_better=False, target=2.0 if mbit == 100.0 else None,
                              mechanism_text="Atom swarm (swapping, async averaging)",
                              baseline_text="pipeline parallel, activations over the link",
                              extra={"runs": len(ratios), "range": [min(ratios), max(ratios)]}))
        details[key] = {"swarm": swarm_runs, "pipeline": pipe_runs}
    return figures, details


def part_swap(quick: bool, runs: int) -> tuple[list[Figure], dict[str, Any]]:
    from components.decentral.swap import throughput

    results = []
    for run in range(runs):
        SAY(f"swapping, run {run + 1}/{runs}")
        results.append(throughput(quick=quick))
    ratios = [result["ratio"] for result in results]
    swapped = statistics.median(r["swapped_tokens_per_s"] for r in results)
    plain = statistics.median(r["in_memory_tokens_per_s"] for r in results)
    figure = Figure("swap_4x_budget", "tokens/s, a model 4x the device budget (swapping) vs in memory", swapped,
                    plain, "tokens/s", lower_is_better=False, target=0.6,
                    mechanism_text="swapped, budget = model/4", baseline_text="in memory, no budget",
                    extra={"runs": len(ratios), "range": [min(ratios), max(ratios)]})
    return [figure], {"swap": [{k: v for k, v in r.items() if k != "profiles"} for r in results]}


def part_crash(quick: bool) -> tuple[list[Figure], dict[str, Any]]:
    from components.decentral.local import LocalSwarm

    steps = 300 if quick else 600
    with tempfile.TemporaryDirectory(prefix="strata-bench-crash-") as folder, LocalSwarm(
            folder, {"steps": steps, "peers": {"min": 3, "max": 8}, "eval_every": 25}) as swarm:
        for name in ("a", "b", "c"):
            swarm.start(name)
        time.sleep(8)
        killed_at = time.time()
        swarm.kill("c")
        swarm.wait(900)
        results = {name: swarm.result(name) for name in ("a", "b")}
    before = [r["test_loss"] for r in results.values()]
    rounds_after = [sum(1 for record in r["rounds"] if record.get("ok") and record.get("at", 0) > killed_at)
                    for r in results.values()]
    first = [next((record for record in r["rounds"] if record.get("at", 0) > killed_at), None) for r in results.values()]
    figure = Figure("peer_crash", "held-out loss when a peer was killed / at the end (survivors, no restart)",
                    4.8 / max(statistics.mean(before), 1e-9), 1.0, "ratio", lower_is_better=False, target=1.0,
                    mechanism_text=f"2 survivors, {sum(rounds_after)} rounds after the crash",
                    baseline_text="the untrained loss, for scale",
                    extra={"note": "ratio > 1: the survivors' loss kept falling after the crash"})
    return [figure], {"crash": {"final_test_loss": before, "rounds_after_crash": rounds_after,
                                "first_round_after": first}}


def main(quick: bool = False, output: str | None = None, parts: tuple[str, ...] = ("swap", "crash", "network"),
         runs: int | None = None, model: str | None = None) -> int:
    runs = runs or (1 if quick else 3)
    model = model or ("tiny" if quick else "small")
    figures: list[Figure] = []
    details: dict[str, Any] = {"runs": runs, "model": model, "missing": [
        "plain hivemind.Optimizer with the whole model in memory: not measured in this version"]}
    for part in parts:
        if part == "swap":
            found, more = part_swap(quick, runs)
        elif part == "crash":
            found, more = part_crash(quick)
        elif part == "network":
            found, more = part_network(quick, runs, model)
        else:
            raise ValueError(f"unknown part {part!r}: swap, crash or network")
        figures.extend(found)
        details.update(more)
    doc = document("decentral", quick, figures, details)
    print(figures_table(doc))
    write(doc, output)
    return 0


if __name__ == "__main__":  # python -m components.decentral.bench [quick] [part ...]
    import sys

    chosen = tuple(arg for arg in sys.argv[1:] if arg != "quick") or ("swap", "crash", "network")
    raise SystemExit(main(quick="quick" in sys.argv[1:], output=str(Path("decentral-bench.json")), parts=chosen))
