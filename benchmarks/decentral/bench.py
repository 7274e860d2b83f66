"""``strata bench decentral``: Atom on hivemind against its baselines, on this machine, in one run.

Parts (``--quick`` shortens each):

- ``network``: tokens/s of a swarm of 4 peers (each a full model, swapping layers under a device budget of a quarter
  of the model, averaging asynchronously through hivemind) against a pipeline-parallel baseline of 4 stages
  (SWARM/Petals style: activations and their gradients cross the network for every micro-batch), the same model,
  both over the same token-bucket links (:mod:`benchmarks.decentral.throttle`: every peer's and every stage's
  traffic goes through a throttled TCP proxy) at **the link scaled to this machine's compute**
  (:mod:`benchmarks.decentral.scale`: the link at which a pipeline stage here waits on its link, relative to its
  compute, as long as a GPT-3 XL stage on a consumer GPU does over 100 Mbit/s Ethernet -- Atom's setting; the rate
  is measured at the start of the part, under the same lock), and as they are at 100 Mbit/s and at 1 Gbit/s.
  Target: ≥ 2× at the scaled link; 100 Mbit/s and 1 Gbit/s are reported.
- ``swap``: a model 4× the device budget, trained with swapping, against in-memory training of the same model with
  no budget (:func:`components.decentral.swap.throughput`). Target: ≥ 60 % of its throughput.
- ``crash``: a swarm of 3 loses a peer (SIGKILL) mid-run; the others must train on without a restart, the loss
  still falling (ratio: held-out loss when the peer died / at the end; target > 1).

- at 100 Mbit/s also plain ``hivemind.Optimizer`` (4 peers, whole model in memory, hivemind's quickstart settings:
  local updates, matchmaking_time 3 s, averaging_timeout 10 s): the ratio is reported (no target).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.benchkit import Figure, document, figures_table, progress, write

SAY = progress("decentral: ")


def _swarm_tokens_per_s(mbit: float | None, *, quick: bool, model: str, peers: int = 4) -> dict[str, Any]:
    from benchmarks.decentral.local import LocalSwarm
    from benchmarks.decentral.throttle import throttled_mesh
    from components.decentral.model import ModelConfig

    config = ModelConfig.named(model)
    budget_mb = _swarm_budget_mb(config, batch=32)
    steps = 30 if quick else 80
    # 32 windows a peer a step: 4 peers take the 128 windows one pipeline step does (16 micro-batches of 8).
    spec = {"model": model, "steps": steps, "batch_size": 32, "peers": {"min": peers, "max": peers},
            "averaging": {"period_s": 5.0 if quick else 10.0}, "swap": {"budget_mb": budget_mb, "pcie_gbps": 16.0},
            "eval_every": 10_000}
    with tempfile.TemporaryDirectory(prefix="strata-bench-swarm-") as folder, \
            throttled_mesh(peers, mbit) as mesh, LocalSwarm(folder, spec) as swarm:
        for index, link in enumerate(mesh):
            info = swarm.start(f"p{index}", listen_port=link.listen_port, announce_port=link.proxy.port,
                               wait=index == 0)
            if "error" in info:
                raise RuntimeError(f"peer p{index} did not start: {info['error']}")
        for index in range(1, peers):
            swarm.wait_ready(f"p{index}")
        swarm.wait(1800)
        results = [swarm.result(f"p{index}") for index in range(peers)]
        sent = sum(link.bytes_sent for link in mesh)
    if any(result is None or "error" in result for result in results):
        raise RuntimeError(f"a swarm peer failed: {results}")
    tokens = sum(result["samples"] for result in results) * config.context
    wall = max(result["train_s"] or result["wall_s"] for result in results)  # from the start of training
    return {"tokens_per_s": tokens / wall, "wall_s": wall, "tokens": tokens, "bytes_through_links": sent,
            "device_budget_mb": budget_mb,
            "rounds_ok": [result["rounds_ok"] for result in results],
            "rounds_failed": [result["rounds_failed"] for result in results],
            "test_loss": [result["test_loss"] for result in results]}


def _swarm_budget_mb(config, batch: int) -> float:
    """Each Atom peer's device budget: a quarter of the model's parameters, or the smallest budget any swap plan
    fits when that is larger (a pair of neighbouring layers, their gradients and activations must fit)."""
    import torch

    from components.decentral import swap
    from components.decentral.model import Corpus, build_model, lm_loss, model_layers, parameter_bytes

    model = build_model(config)
    quarter = parameter_bytes(model) / 4
    inputs, targets = Corpus(0, config.context).batch("probe", 0, batch)
    profiles = swap.profile_layers(model_layers(model), inputs, device=torch.device("cpu"),
                                   link=swap.HostLink(torch.device("cpu"), 16e9 / 8), targets=targets, loss_fn=lm_loss)
    return max(quarter, swap.minimum_budget(profiles) * 1.02) / 2**20


def _optimizer_peer(index: int, model: str, steps: int, batch: int, peers: int, listen_port: int, announce_port: int,
                    initial: list[str], queue, out: str, barrier=None) -> None:
    """One peer of the plain hivemind.Optimizer baseline, configured as hivemind's quickstart advises (local
    updates, matchmaking_time 3 s, averaging_timeout 10 s), with the whole model in memory."""
    import json
    from functools import partial

    import hivemind
    import torch

    from components.decentral.model import Corpus, ModelConfig, build_model, lm_loss

    torch.set_num_threads(1)
    config = ModelConfig.named(model)
    net = build_model(config, 0)
    corpus = Corpus(0, config.context)
    dht = hivemind.DHT(initial_peers=initial or None, host_maddrs=[f"/ip4/127.0.0.1/tcp/{listen_port}"],
                       announce_maddrs=[f"/ip4/127.0.0.1/tcp/{announce_port}"], start=True, use_relay=False)
    if index == 0:
        for _ in range(peers - 1):
            queue.put([str(a) for a in dht.get_visible_maddrs()])
    optimizer = hivemind.Optimizer(dht=dht, run_id="strata-bench", batch_size_per_step=batch,
                                   target_batch_size=peers * batch * max(1, steps // 6), optimizer=partial(torch.optim.Adam, lr=3e-3),
                                   params=net.parameters(), use_local_updates=True, matchmaking_time=3.0,
                                   averaging_timeout=10.0, verbose=False)
    if barrier is not None:
        barrier.wait(timeout=600)  # start together, as the swarm's peers do (they wait for peers.min)
    started = time.time()
    for step in range(steps):
        inputs, targets = corpus.batch(index, step, batch)
        optimizer.zero_grad()
        loss = lm_loss(net(inputs), targets)
        loss.backward()
        optimizer.step()
    wall = time.time() - started
    Path(out).write_text(json.dumps({"samples": steps * batch, "wall_s": wall, "epoch": optimizer.local_epoch}))
    optimizer.shutdown()
    dht.shutdown()


def _optimizer_tokens_per_s(mbit: float | None, *, quick: bool, model: str, peers: int = 4) -> dict[str, Any]:
    import json
    import multiprocessing as mp

    from benchmarks.decentral.throttle import throttled_mesh
    from components.decentral.model import ModelConfig

    steps = 30 if quick else 80
    context = mp.get_context("fork")
    queue = context.Queue()
    barrier = context.Barrier(peers)
    processes = []
    with tempfile.TemporaryDirectory(prefix="strata-bench-hm-") as folder, throttled_mesh(peers, mbit) as mesh:
        try:
            for index, link in enumerate(mesh):
                initial = [] if index == 0 else queue.get(timeout=120)
                process = context.Process(target=_optimizer_peer, args=(
                    index, model, steps, 32, peers, link.listen_port, link.proxy.port, initial, queue,
                    f"{folder}/{index}.json", barrier))
                process.start()
                processes.append(process)
            for process in processes:
                process.join(1800)
            results = [json.loads(Path(f"{folder}/{index}.json").read_text()) for index in range(peers)]
        finally:
            for process in processes:
                if process.is_alive():
                    process.kill()
                    process.join(10)
    context_len = ModelConfig.named(model).context
    tokens = sum(result["samples"] for result in results) * context_len
    wall = max(result["wall_s"] for result in results)
    return {"tokens_per_s": tokens / wall, "wall_s": wall, "epochs": [result["epoch"] for result in results]}


def _pipeline_tokens_per_s(mbit: float | None, *, quick: bool, model: str) -> dict[str, Any]:
    from benchmarks.decentral.pipeline import run_pipeline

    # GPipe's rule of thumb (micro-batches >= 4 x stages), 8 windows each; the eager schedule (the strongest of
    # the three the baseline has: activations and gradients use a link both ways at once).
    result = run_pipeline(model, stages=4, micro_batches=16, micro_batch_size=8, steps=3 if quick else 8,
                          mbit=mbit)
    return {key: result[key] for key in ("tokens_per_s", "steady_tokens_per_s", "step_s") if key in result}


def scaled_link(model: str) -> dict[str, Any]:
    """This machine's compute rate on ``model`` and the links it makes equivalent to Atom's setting
    (:func:`benchmarks.decentral.scale.scaled_links`)."""
    import os

    from benchmarks.decentral.scale import measure_compute, scaled_links

    return scaled_links(measure_compute(model), cores=os.cpu_count() or 1)


LINKS = ("scaled", "100", "1000")


def part_network(quick: bool, runs: int, model: str, links: tuple[str, ...] = LINKS,
                 optimizer: bool = True) -> tuple[list[Figure], dict[str, Any]]:
    figures, details = [], {}
    for link in links:
        if link == "scaled":
            scaling = scaled_link(model)
            details["scaling"] = scaling
            mbit = round(scaling["at_setting_link"]["emulated_link_mbit"], 1)
            SAY(f"scaled link: {mbit:g} Mbit/s here = {scaling['setting']['model']} on an "
                f"{scaling['setting']['gpu']} over {scaling['setting']['link_mbit']:g} Mbit/s "
                f"(GPU {scaling['at_setting_link']['gpu_vs_machine_compute']:.0f}x this machine's compute)")
        else:
            mbit = float(link)
        swarm_runs, pipe_runs = [], []
        for run in range(runs):
            SAY(f"{mbit:g} Mbit/s, run {run + 1}/{runs}: the pipeline (4 stages)")
            pipe_runs.append(_pipeline_tokens_per_s(mbit, quick=quick, model=model))
            SAY(f"{mbit:g} Mbit/s, run {run + 1}/{runs}: the swarm (4 peers)")
            swarm_runs.append(_swarm_tokens_per_s(mbit, quick=quick, model=model))
        if mbit == 100.0 and optimizer:
            optimizer_runs = []
            for run in range(runs):
                SAY(f"{mbit:g} Mbit/s, run {run + 1}/{runs}: plain hivemind.Optimizer (4 peers, model in memory)")
                optimizer_runs.append(_optimizer_tokens_per_s(mbit, quick=quick, model=model))  # ~6 epochs a run
            details["hivemind_optimizer_100mbit"] = optimizer_runs
            plain = statistics.median(r["tokens_per_s"] for r in optimizer_runs)
            ours = statistics.median(r["tokens_per_s"] for r in swarm_runs)
            figures.append(Figure("vs_hivemind_optimizer_100mbit", "tokens/s at 100 Mbit/s vs plain hivemind.Optimizer",
                                  ours, plain, "tokens/s", lower_is_better=False, target=None,
                                  mechanism_text="Atom swarm (model swapped, budget model/4)",
                                  baseline_text="hivemind.Optimizer, whole model in memory (quickstart settings)",
                                  extra={"runs": runs}))
        swarm_rate = statistics.median(r["tokens_per_s"] for r in swarm_runs)
        pipe_rate = statistics.median(r["tokens_per_s"] for r in pipe_runs)
        ratios = [s["tokens_per_s"] / p["tokens_per_s"] for s, p in zip(swarm_runs, pipe_runs, strict=True)]
        if link == "scaled":
            setting = details["scaling"]["setting"]
            key = "tokens_per_s_scaled_link"
            label = (f"tokens/s at {mbit:g} Mbit/s = {setting['model']} on {setting['gpu']}s over "
                     f"{setting['link_mbit']:g} Mbit/s, scaled to this machine (4 peers, model {model})")
        else:
            key = f"tokens_per_s_{int(mbit)}mbit"
            label = f"tokens/s at {mbit:g} Mbit/s (4 peers, model {model})"
        figures.append(Figure(key, label, swarm_rate, pipe_rate,
                              "tokens/s", lower_is_better=False, target=2.0 if link == "scaled" else None,
                              mechanism_text="Atom swarm (swapping, async averaging)",
                              baseline_text="pipeline parallel, activations over the link",
                              extra={"runs": len(ratios), "range": [min(ratios), max(ratios)], "mbit": mbit,
                                     "ratios": ratios}))
        details[key] = {"mbit": mbit, "swarm": swarm_runs, "pipeline": pipe_runs}
    return figures, details


def part_swap(quick: bool, runs: int, device: str = "cpu", batch: int | None = None
              ) -> tuple[list[Figure], dict[str, Any]]:
    """The swap figure on ``device`` (``"cuda"`` on a GPU machine: real copies from pinned memory on side streams,
    the optimizer stepped per segment on the host as gradients land; see ``components.decentral.swap``)."""
    from components.decentral.swap import throughput

    results = []
    for run in range(runs):
        SAY(f"swapping on {device}, run {run + 1}/{runs}")
        # CPU: one thread, steadier on a shared 2-core machine; CUDA: the host's threads for the host-side Adam.
        results.append(throughput(quick=quick, threads=1 if device == "cpu" else None, device=device, batch=batch))
    ratios = [result["ratio"] for result in results]
    swapped = statistics.median(r["swapped_tokens_per_s"] for r in results)
    plain = statistics.median(r["in_memory_tokens_per_s"] for r in results)
    figure = Figure("swap_4x_budget", "tokens/s, a model 4x the device budget (swapping) vs in memory", swapped,
                    plain, "tokens/s", lower_is_better=False, target=0.6,
                    mechanism_text="swapped, budget = model/4", baseline_text="in memory, no budget",
                    extra={"runs": len(ratios), "range": [min(ratios), max(ratios)], "device": device,
                           "max_loss_difference": max(r["max_loss_difference"] for r in results)})
    return [figure], {"swap": [{k: v for k, v in r.items() if k != "profiles"} for r in results]}


def part_crash(quick: bool) -> tuple[list[Figure], dict[str, Any]]:
    from benchmarks.decentral.local import LocalSwarm

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
    final = [r["test_loss"] for r in results.values()]
    at_kill = []
    for result in results.values():
        earlier = [loss for moment, _step, loss in result.get("history") or [] if moment <= killed_at]
        at_kill.append(earlier[-1] if earlier else 4.8)
    rounds_after = [sum(1 for record in r["rounds"] if record.get("ok") and record.get("at", 0) > killed_at)
                    for r in results.values()]
    figure = Figure("peer_crash", "survivors' held-out loss when a peer was killed, against at the end (no restart)",
                    statistics.mean(final), statistics.mean(at_kill), "nats/char", lower_is_better=True, target=1.0,
                    mechanism_text=f"at the end: 2 survivors, {sum(rounds_after)} rounds after the crash",
                    baseline_text="when the peer was killed",
                    extra={"note": "ratio > 1: the survivors' loss kept falling after the crash, without a restart"})
    return [figure], {"crash": {"final_test_loss": final, "test_loss_at_kill": at_kill,
                                "rounds_after_crash": rounds_after}}


def main(quick: bool = False, output: str | None = None, parts: tuple[str, ...] = ("swap", "crash", "network"),
         runs: int | None = None, model: str | None = None, links: tuple[str, ...] = LINKS,
         optimizer: bool = True, device: str = "cpu", swap_batch: int | None = None) -> int:
    runs = runs or (1 if quick else 3)
    model = model or ("tiny" if quick else "small")
    figures: list[Figure] = []
    details: dict[str, Any] = {"runs": runs, "model": model}
    for part in parts:
        if part == "swap":
            found, more = part_swap(quick, runs, device, swap_batch)
        elif part == "crash":
            found, more = part_crash(quick)
        elif part == "network":
            found, more = part_network(quick, runs, model, links, optimizer)
        else:
            raise ValueError(f"unknown part {part!r}: swap, crash or network")
        figures.extend(found)
        details.update(more)
    doc = document("decentral", quick, figures, details)
    print(figures_table(doc))
    write(doc, output)
    return 0


if __name__ == "__main__":  # python -m benchmarks.decentral.bench [--quick] [--parts ...] [--links ...]
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--parts", default="swap,crash,network", help="swap, crash, network (comma-separated)")
    parser.add_argument("--links", default=",".join(LINKS),
                        help="the network part's links: 'scaled' and/or Mbit/s values (comma-separated)")
    parser.add_argument("--no-optimizer", action="store_true", help="skip plain hivemind.Optimizer at 100 Mbit/s")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu", help="the swap part's device: cpu, or cuda on a GPU machine")
    parser.add_argument("--swap-batch", type=int, default=None,
                        help="the swap part's windows per step (default 2; a GPU needs more to leave launch-bound)")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    raise SystemExit(main(quick=args.quick, output=args.output, parts=tuple(args.parts.split(",")), runs=args.runs,
                          model=args.model, links=tuple(args.links.split(",")), optimizer=not args.no_optimizer,
                          device=args.device, swap_batch=args.swap_batch))
