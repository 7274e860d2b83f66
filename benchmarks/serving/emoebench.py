"""``strata bench serving``, eMoE part: how few of a mixture-of-experts model's experts need to stay on the device
for its perplexity to stay within 1 % of the full model's.

A ``moe-gpt`` model (8 experts per layer, top-1 routing) is trained here by the built-in workload for
``steps`` steps on the bundled corpus and stored as a train job stores it. The held-out tenth of the corpus,
cut into ``windows`` windows of 64 characters, is the request stream, in batches of ``batch`` windows:

- **full**: every expert resident: the reference perplexity;
- **eMoE, reroute**: for each budget (a share of all experts' bytes), :class:`~components.serving.emoe.ExpertPlacement`
  predicts from the routing of the batches before which experts to keep, and a token routed elsewhere goes to its
  best resident expert (no load). The predictor is warmed up on ``warmup`` batches of training text first;
- **eMoE, load** at the 40 % budget: misses are loaded on demand (evicting the least recently used), so
  perplexity equals the full model's; the peak resident bytes, hit rate, loads and prefetches per batch say what
  that costs.

Two figures: the peak resident share with loads (at perplexity within 1 %), and the smallest rerouting budget (in
steps of ``step``) whose perplexity is within 1 % of the full model's.
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.benchkit import Figure

FULL = {"steps": 300, "hidden": 64, "windows": 256, "batch": 8, "warmup": 16, "step": 0.05}
QUICK = {**FULL, "steps": 60, "windows": 64, "warmup": 4, "step": 0.1}
TARGET_FRACTION = 0.40  # resident bytes at perplexity within 1 % of all experts (the target)
TOLERANCE = 0.01


def _windows(tokens, count: int, context: int, offset: int = 0):
    import torch

    available = (len(tokens) - 1) // context
    starts = offset + context * torch.arange(min(count, available))
    return torch.stack([tokens[start: start + context] for start in starts.tolist()])


def _perplexity(module, batches, placement=None) -> float:
    import torch

    nll, count = 0.0, 0
    with torch.inference_mode():
        for batch in batches:
            if placement is not None:
                placement.prepare()
            logits = module(batch)
            scores = torch.log_softmax(logits[:, :-1], dim=-1)
            nll -= float(scores.gather(-1, batch[:, 1:].unsqueeze(-1)).sum())
            count += batch[:, 1:].numel()
    return math.exp(nll / count)


def run(quick: bool = False, *, say=None, sizes: dict[str, Any] | None = None) -> dict[str, Any]:
    import torch

    from benchmarks.serving.harness import SOURCE_JOB
    from components.runtime.contract.context import LocalContext
    from components.serving.emoe import ExpertPlacement
    from components.serving.model import load_served_model
    from components.train.loop import TrainLoop
    from components.train.spec import TrainSpec
    from components.train.workloads import CORPUS_PATH, builtin_workload, encode

    say = say or (lambda line: print(line, flush=True))
    sizes = {**(QUICK if quick else FULL), **(sizes or {})}
    began = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory(prefix="strata-emoe-bench-") as directory:
            spec = TrainSpec().validate({"workload": "moe-gpt", "hidden": sizes["hidden"], "max_steps": sizes["steps"],
                                         "batch_size": 16, "seed": 4})
            ctx = LocalContext(job_id=SOURCE_JOB, attempt_id="emoe", spec=dict(spec), workdir=Path(directory))
            TrainLoop(builtin_workload("moe-gpt"), spec, ctx, owns_process=False).run()
            path = ctx.artifacts["model.pt"]
            tokens = encode(CORPUS_PATH.read_text(encoding="utf-8"))
            split = int(len(tokens) * 0.9)
            context = load_served_model(path).input_shape[0]
            test = _windows(tokens[split:], sizes["windows"], context)
            train = _windows(tokens[:split], sizes["warmup"] * sizes["batch"], context, offset=7)
            batches = list(test.split(sizes["batch"]))
            warm = list(train.split(sizes["batch"]))
            full = _perplexity(load_served_model(path).module, batches)
            say(f"  eMoE: moe-gpt trained {sizes['steps']} steps; perplexity with every expert {full:.4f} "
                f"({len(batches)} batches of {sizes['batch']} held-out windows)")
            rows = []
            budget = sizes["step"]
            while budget <= 1.0 + 1e-9:
                served = load_served_model(path)
                placement = ExpertPlacement(served.module, 1 << 60, miss="reroute")  # sized below
                total = placement.total_bytes
                placement.budget_bytes = max(max(placement.expert_bytes.values()), int(budget * total))
                placement.to_device("cpu")
                _perplexity(served.module, warm, placement)  # the predictor learns from earlier traffic
                placement.to_device("cpu")
                perplexity = _perplexity(served.module, batches, placement)
                stats = placement.stats()
                row = {"budget": round(budget, 4), "resident_fraction": placement.budget_bytes / total,
                       "perplexity": perplexity, "relative": perplexity / full - 1, "hit_rate": stats["hit_rate"],
                       "rerouted": stats["rerouted"]}
                rows.append(row)
                say(f"  eMoE reroute, budget {budget:.2f}: perplexity {perplexity:.4f} ({row['relative'] * 100:+.2f} %), "
                    f"hit rate {stats['hit_rate']:.3f}")
                budget += sizes["step"]
            within = [row for row in rows if row["relative"] <= TOLERANCE]
            chosen = min(within, key=lambda row: row["resident_fraction"]) if within else None
            # As eMoE is specified here: misses are loaded, at the target's budget.
            served = load_served_model(path)
            placement = ExpertPlacement(served.module, 1 << 60, miss="load")
            placement.budget_bytes = max(max(placement.expert_bytes.values()),
                                         int(TARGET_FRACTION * placement.total_bytes))
            placement.to_device("cpu")
            _perplexity(served.module, warm, placement)
            placement.to_device("cpu")
            perplexity = _perplexity(served.module, batches, placement)
            stats = placement.stats()
            load = {"budget": TARGET_FRACTION, "perplexity": perplexity, "relative": perplexity / full - 1,
                    "peak_fraction": stats["peak_bytes"] / placement.total_bytes, "hit_rate": stats["hit_rate"],
                    "loads_per_batch": stats["loads"] / len(batches),
                    "prefetches_per_batch": stats["prefetches"] / len(batches)}
            say(f"  eMoE load, budget {TARGET_FRACTION:.2f}: perplexity {perplexity:.4f} "
                f"({load['relative'] * 100:+.2f} %), peak resident {load['peak_fraction'] * 100:.1f} % of the "
                f"experts' bytes, hit rate {stats['hit_rate']:.3f}, {load['loads_per_batch']:.1f} on-demand loads "
                f"and {load['prefetches_per_batch']:.1f} prefetches per batch")
    finally:
        torch.set_num_threads(threads)
    return {"sizes": sizes, "full_perplexity": full, "budgets": rows, "chosen": chosen, "load": load,
            "seconds": time.perf_counter() - began}


def figures(results: dict[str, Any]) -> list[Figure]:
    load, chosen = results.get("load") or {}, results.get("chosen")
    exact = load.get("relative") is not None and load["relative"] <= TOLERANCE
    return [
        Figure("emoe_resident_fraction", "eMoE (misses loaded on demand): peak share of all experts' bytes resident, "
               "at perplexity within 1 % of loading all experts, against the 40 % target",
               load.get("peak_fraction") if exact else None, TARGET_FRACTION, "share", target=1.0),
        Figure("emoe_resident_fraction_no_loads", "eMoE without loads (misses rerouted to a resident expert): the "
               "smallest budget at perplexity within 1 % of all experts, against 40 %",
               chosen["resident_fraction"] if chosen else None, TARGET_FRACTION, "share", target=1.0),
    ]
