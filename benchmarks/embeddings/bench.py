"""``strata bench embeddings``: Saec against the uncompressed model, the hashing trick, QR embeddings and full KMeans.

One run, per dataset (the synthetic CTR set, then MovieLens-100k) and per seed:

1. Train the uncompressed DLRM (Adam, the ``dlrm-*`` workloads' settings) and evaluate it: the reference AUC.
2. **Ratio ladder.** Compress its tables at each ratio of the ladder (Saec: KMeans on the head, the tail to the
   nearest centroid); the figure is the largest ratio whose AUC stays within ``TOLERANCE`` (0.005) of the
   reference. Each compressed model is then fine-tuned (its centroids, ``FINETUNE_STEPS`` steps) and evaluated
   again: recorded beside it.
3. **Same bytes.** At the target ratio (20x), train a hashing-trick model and a quotient-remainder model from scratch
   with exactly Saec's bytes per field (the same epochs, batch, optimizer and seed as the reference) and compare
   AUCs.
4. **Clustering time.** Cluster the reference tables at the target ratio's plan with Saec's head-first method and
   with scikit-learn's ``KMeans`` (its defaults) over every feature, count-weighted (the baseline), after one
   untimed warm-up. On the large set Saec is also timed with plain k-means++ seeding of the head
   (``local_trials=1``; ``saec_plain_seeding``, with its AUC), reported beside the default. Reported for both datasets; the target applies to **ctr-large**, a synthetic set with larger
   fields (``LARGE_SIZES``: 100,000, 40,000, 10,000 and 1,000 features, 600,000 rows, one epoch), since
   clustering only costs anything on large tables (production tables have millions of features per field).

Targets apply to the synthetic CTR set; MovieLens-100k's figures are reported. Figures are medians over the seeds
(ranges in the JSON). ``--quick`` uses one seed and a smaller CTR set.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import torch

from benchmarks.benchkit import Figure, document, figures_table, progress, write

TOLERANCE = 0.005
TARGET_RATIO = 20.0
LADDERS = {"ctr-synthetic": (10, 15, 20, 25, 30, 40, 50, 60), "movielens-100k": (2, 3, 4, 6, 8, 10, 12)}
EPOCHS = {"ctr-synthetic": 2, "movielens-100k": 4}
FINETUNE_STEPS = 200
FINETUNE_LR = 0.001
TIMING_RUNS = 1  # per seed, on the large set (3 seeds: 3 timings of each method)
HIDDEN = 64
# The clustering-time figure's tables: larger fields (as real CTR tables are, and more), where clustering costs.
LARGE_SIZES = (100_000, 40_000, 10_000, 1_000)
LARGE_ROWS = (600_000, 50_000)
QUICK_LARGE_SIZES = (30_000, 10_000, 1_000)
QUICK_LARGE_ROWS = (200_000, 20_000)
DEVICE = "cpu"  # main() sets it: CUDA when there is a GPU (training and evaluation; clustering runs on the CPU)
QUICK_SIZES = (8000, 3000, 1000, 300, 50, 5)
QUICK_ROWS = (60_000, 20_000)  # training, held out


def _data(name: str, seed: int, quick: bool):
    from components.embeddings.datasets import movielens_100k, synthetic_ctr

    if name == "movielens-100k":
        return movielens_100k(seed)
    if quick:
        return synthetic_ctr(seed, sizes=QUICK_SIZES, rows=QUICK_ROWS[0], test_rows=QUICK_ROWS[1])
    return synthetic_ctr(seed)


def _on_device(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [tensor.to(DEVICE) for tensor in tensors]


def _synchronize() -> None:
    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def _reference(data, seed: int, epochs: int):
    from components.embeddings.model import fit
    from components.embeddings.workload import DLRMWorkload, dlrm_config

    config = dlrm_config(data, HIDDEN)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = DLRMWorkload.from_config(config)
    with torch.no_grad():
        for embedding, counts in zip(model.embeddings, data.counts(), strict=True):
            embedding.counts.copy_(counts)
    model.to(DEVICE)
    started = time.perf_counter()
    fit(model, *_on_device(data.x_train, data.y_train), epochs=epochs, seed=seed)
    _synchronize()
    for embedding in model.embeddings:
        embedding.refresh_fallback()
    return model.eval(), config, time.perf_counter() - started


def _ladder(model, config, data, ratios, seed: int, reference: float, say) -> list[dict[str, Any]]:
    from components.embeddings.compress import Settings, centroid_parameters, compress_model
    from components.embeddings.model import evaluate, fit

    rows = []
    for target in ratios:
        result = compress_model(model, config, Settings(ratio=float(target), seed=seed))
        result.model.to(DEVICE)
        plain = evaluate(result.model, data.x_test, data.y_test)
        fit(result.model, *_on_device(data.x_train, data.y_train), epochs=100, max_steps=FINETUNE_STEPS,
            lr=FINETUNE_LR, seed=seed, parameters=centroid_parameters(result.model))
        tuned = evaluate(result.model, data.x_test, data.y_test)
        rows.append({"target": target, "ratio": result.ratio, "bytes": result.bytes_after,
                     "auc": plain["auc"], "logloss": plain["logloss"], "auc_finetuned": tuned["auc"],
                     "logloss_finetuned": tuned["logloss"], "clustering_s": result.seconds,
                     "fields": [field.as_dict() for field in result.fields]})
        say(f"  {target:>3}x: reached {result.ratio:5.1f}x, AUC {plain['auc']:.4f} ({plain['auc'] - reference:+.4f}), "
            f"fine-tuned {tuned['auc']:.4f} ({tuned['auc'] - reference:+.4f}), clustering {result.seconds:.2f}s")
    return rows


def _best_ratio(rows: list[dict[str, Any]], reference: float, key: str) -> float:
    """The largest ratio reached whose AUC (``key``) is within TOLERANCE of the reference (1: none is)."""
    good = [row["ratio"] for row in rows if reference - row[key] <= TOLERANCE]
    return max(good, default=1.0)


def _same_bytes(config, data, budgets: list[int], seed: int, epochs: int, say) -> dict[str, Any]:
    from benchmarks.embeddings.baselines import baseline_model
    from components.embeddings.model import evaluate, fit

    answer = {}
    for kind in ("hashing", "qr"):
        model = baseline_model(kind, config["fields"], int(config["dim"]), HIDDEN, budgets, seed=seed).to(DEVICE)
        fit(model, *_on_device(data.x_train, data.y_train), epochs=epochs, seed=seed)
        metrics = evaluate(model, data.x_test, data.y_test)
        answer[kind] = {**metrics, "bytes": model.embedding_bytes()}
        say(f"  {kind}: {model.embedding_bytes():,} bytes, AUC {metrics['auc']:.4f}, log loss {metrics['logloss']:.4f}")
    return answer


def _timing(model, config, seed: int, say, plain: bool = False) -> dict[str, Any]:
    from components.embeddings.compress import Settings, compress_model, full_kmeans

    settings = Settings(ratio=TARGET_RATIO, seed=seed)
    compress_model(model, config, settings)  # warm scikit-learn's thread pools and caches: timed runs only after
    times: dict[str, Any] = {"saec": [], "kmeans": [], "fields": []}
    plain_settings = Settings(ratio=TARGET_RATIO, seed=seed, local_trials=1)
    if plain:
        times["saec_plain_seeding"] = []
        compress_model(model, config, plain_settings)  # its warm-up
    for run in range(TIMING_RUNS):
        if plain:
            one = compress_model(model, config, plain_settings)
            times["saec_plain_seeding"].append(sum(field.seconds for field in one.fields))
            times["saec_plain_seeding_model"] = one.model
        ours = compress_model(model, config, settings)
        full = compress_model(model, config, settings, clusterer=lambda v, c, k, _: full_kmeans(v, c, k, seed))
        ours_s = sum(field.seconds for field in ours.fields)
        full_s = sum(field.seconds for field in full.fields)
        times["saec"].append(ours_s)
        times["kmeans"].append(full_s)
        times["fields"].append([{"name": a.name, "features": a.features, "seen": a.seen, "clusters": a.clusters,
                                 "head": a.head, "saec_s": a.seconds, "kmeans_s": b.seconds}
                                for a, b in zip(ours.fields, full.fields, strict=True)])
        say(f"  timing run {run + 1}: head-first {ours_s:.3f}s, KMeans over every feature {full_s:.3f}s "
            f"({full_s / ours_s:.1f}x)" + (f"; head seeded by plain k-means++ {times['saec_plain_seeding'][-1]:.3f}s "
                                           f"({full_s / times['saec_plain_seeding'][-1]:.1f}x)" if plain else ""))
    times["saec_model"], times["kmeans_model"] = ours.model, full.model
    return times


def run_timing(seeds: list[int], quick: bool, say) -> dict[str, Any]:
    """The clustering-time figure: a larger synthetic set, its DLRM trained one epoch, both clusterings timed."""
    from components.embeddings.datasets import synthetic_ctr
    from components.embeddings.model import evaluate

    sizes, rows = (QUICK_LARGE_SIZES, QUICK_LARGE_ROWS) if quick else (LARGE_SIZES, LARGE_ROWS)
    runs = []
    for seed in seeds:
        data = synthetic_ctr(seed, sizes=sizes, rows=rows[0], test_rows=rows[1])
        say(f"ctr-large, seed {seed}: {len(data.x_train):,} training rows, fields {list(data.sizes)}")
        model, config, train_s = _reference(data, seed, 1)
        reference = evaluate(model, data.x_test, data.y_test)
        say(f"  uncompressed: {model.embedding_bytes():,} bytes, AUC {reference['auc']:.4f} (trained in "
            f"{train_s:.1f}s)")
        times = _timing(model, config, seed, say, plain=True)
        ours, full = times.pop("saec_model"), times.pop("kmeans_model")
        one = times.pop("saec_plain_seeding_model")
        times["auc"] = {"reference": reference["auc"], "saec": evaluate(ours, data.x_test, data.y_test)["auc"],
                        "kmeans": evaluate(full, data.x_test, data.y_test)["auc"],
                        "saec_plain_seeding": evaluate(one, data.x_test, data.y_test)["auc"]}
        say(f"  AUC after: head-first {times['auc']['saec']:.4f}, KMeans over every feature "
            f"{times['auc']['kmeans']:.4f}")
        runs.append({"seed": seed, "sizes": list(sizes), "rows": rows[0], **times})
    return {"dataset": "ctr-large", "runs": runs}


def run_dataset(name: str, seeds: list[int], quick: bool, say) -> dict[str, Any]:
    from components.embeddings.compress import Settings, compress_model
    from components.embeddings.model import evaluate

    runs = []
    for seed in seeds:
        data = _data(name, seed, quick)
        say(f"{name}, seed {seed}: {len(data.x_train):,} training rows, fields {list(data.sizes)}")
        model, config, train_s = _reference(data, seed, EPOCHS[name])
        reference = evaluate(model, data.x_test, data.y_test)
        say(f"  uncompressed: {model.embedding_bytes():,} bytes, AUC {reference['auc']:.4f}, "
            f"log loss {reference['logloss']:.4f} (trained in {train_s:.1f}s)")
        ladder = _ladder(model, config, data, LADDERS[name], seed, reference["auc"], say)
        run: dict[str, Any] = {"seed": seed, "reference": {**reference, "bytes": model.embedding_bytes()},
                               "ladder": ladder,
                               "best_ratio": _best_ratio(ladder, reference["auc"], "auc"),
                               "best_ratio_finetuned": _best_ratio(ladder, reference["auc"], "auc_finetuned")}
        at_target = compress_model(model, config, Settings(ratio=TARGET_RATIO, seed=seed))
        saec = evaluate(at_target.model, data.x_test, data.y_test)
        say(f"  saec at {at_target.ratio:.1f}x: {at_target.bytes_after:,} bytes, AUC {saec['auc']:.4f}")
        run["same_bytes"] = {"saec": {**saec, "bytes": at_target.bytes_after, "ratio": at_target.ratio},
                             **_same_bytes(config, data, [field.bytes_after for field in at_target.fields],
                                           seed, EPOCHS[name], say)}
        timing = _timing(model, config, seed, say)
        timing.pop("saec_model"), timing.pop("kmeans_model")
        run["timing"] = timing
        runs.append(run)
    return {"dataset": name, "runs": runs}


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def _spread(values: list[float]) -> dict[str, Any]:
    return {"runs": len(values), "range": [min(values), max(values)], "values": values}


def dataset_figures(key: str, label: str, runs: list[dict[str, Any]], targets: bool) -> list[Figure]:
    """The figures of one dataset's runs; ``targets``: the issue's targets apply (the synthetic CTR set)."""
    out = []
    plain = [run["best_ratio"] for run in runs]
    tuned = [run["best_ratio_finetuned"] for run in runs]
    out.append(Figure(f"{key}_ratio", f"{label}: embedding bytes, smaller by, at AUC within {TOLERANCE} of the "
                                      "uncompressed model", _median(plain), 1.0, "x", lower_is_better=False,
                      target=TARGET_RATIO if targets else None, mechanism_text=f"{_median(plain):.1f}x smaller",
                      baseline_text="uncompressed (1x)",
                      extra={**_spread(plain), "with_finetuning": {"median": _median(tuned), **_spread(tuned)}}))
    for kind, name in (("hashing", "the hashing trick"), ("qr", "quotient-remainder embeddings")):
        ours = [run["same_bytes"]["saec"]["auc"] for run in runs]
        theirs = [run["same_bytes"][kind]["auc"] for run in runs]
        deltas = [a - b for a, b in zip(ours, theirs, strict=True)]
        reached = _median([run["same_bytes"]["saec"]["ratio"] for run in runs])
        out.append(Figure(f"{key}_auc_vs_{kind}", f"{label}: AUC at the same bytes ({reached:.1f}x smaller), Saec "
                                                  f"vs {name}", _median(ours), _median(theirs), "AUC",
                          lower_is_better=False, target=1.0 if targets else None,
                          mechanism_text=f"AUC {_median(ours):.4f}", baseline_text=f"AUC {_median(theirs):.4f}",
                          extra={"delta_auc": _spread(deltas), "bytes": runs[0]["same_bytes"]["saec"]["bytes"],
                                 "baseline_bytes": runs[0]["same_bytes"][kind]["bytes"]}))
    out.append(timing_figure(f"{key}_clustering_time", f"{label}: clustering time at {TARGET_RATIO:g}x, head-first "
                                                       "vs KMeans over every feature",
                             [run["timing"] for run in runs], None))  # the target is the larger set's
    return out


def timing_figure(key: str, label: str, runs: list[dict[str, Any]], target: float | None) -> Figure:
    ours_s = [value for run in runs for value in run["saec"]]
    full_s = [value for run in runs for value in run["kmeans"]]
    speedups = [f / o for f, o in zip(full_s, ours_s, strict=True)]
    extra = {"speedup": _spread(speedups), "saec_s": _spread(ours_s), "kmeans_s": _spread(full_s)}
    plain = [value for run in runs for value in run.get("saec_plain_seeding", [])]
    if plain:
        extra["saec_plain_seeding_s"] = _spread(plain)
        extra["speedup_plain_seeding"] = _spread([f / o for f, o in zip(full_s, plain, strict=True)])
        extra["auc"] = {key: _spread([run["auc"][key] for run in runs])
                        for key in ("reference", "saec", "saec_plain_seeding", "kmeans")}
    return Figure(key, label, _median(ours_s), _median(full_s), "s", lower_is_better=True, target=target,
                  extra=extra)


def figures(results: dict[str, Any]) -> list[Figure]:
    out = []
    if "ctr-synthetic" in results:
        out += dataset_figures("ctr", "CTR", results["ctr-synthetic"]["runs"], targets=True)
    if "ctr-large" in results:
        sizes = results["ctr-large"]["runs"][0]["sizes"]
        out.append(timing_figure("clustering_time", f"CTR-large ({sum(sizes):,} features, largest field "
                                                    f"{max(sizes):,}): clustering time at {TARGET_RATIO:g}x, "
                                                    "head-first vs KMeans over every feature",
                                 results["ctr-large"]["runs"], 10.0))
    if "movielens-100k" in results:
        out += dataset_figures("movielens", "MovieLens-100k", results["movielens-100k"]["runs"], targets=False)
    return out


def main(quick: bool = False, output: str | None = None, seeds: int | None = None,
         datasets: tuple[str, ...] = ("ctr-synthetic", "movielens-100k", "ctr-large"), device: str | None = None
         ) -> int:
    global DEVICE
    say = progress("[embeddings] ")
    DEVICE = device or ("cuda" if torch.cuda.is_available() else "cpu")
    say(f"device: {DEVICE}" + (f" ({torch.cuda.get_device_name(0)})" if DEVICE.startswith("cuda") else ""))
    count = seeds or (1 if quick else 3)
    results = {name: run_timing(list(range(count)), quick, say) if name == "ctr-large"
               else run_dataset(name, list(range(count)), quick, say) for name in datasets}
    doc = document("embeddings", quick, figures(results), details=results,
                   settings={"tolerance": TOLERANCE, "target_ratio": TARGET_RATIO, "finetune_steps": FINETUNE_STEPS,
                             "ladders": LADDERS, "epochs": EPOCHS, "hidden": HIDDEN, "seeds": count,
                             "large_sizes": QUICK_LARGE_SIZES if quick else LARGE_SIZES, "device": DEVICE})
    write(doc, output)
    print(figures_table(doc))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output")
    parser.add_argument("--seeds", type=int)
    parser.add_argument("--datasets", default="ctr-synthetic,movielens-100k,ctr-large")
    parser.add_argument("--device", help="cpu or cuda (default: cuda when there is a GPU)")
    arguments = parser.parse_args()
    sys.exit(main(arguments.quick, arguments.output, arguments.seeds, tuple(arguments.datasets.split(",")),
                  arguments.device))
