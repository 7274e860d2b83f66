"""The stream of epochs a job reads, and PerFect's two phases.

:class:`DatasetEpochs` serves ``epoch(n)`` for a job: the training samples of that epoch, preprocessed by the
dataset's pipeline in the job's loader workers, or read from the node's cache when any job on the node already
computed them. Each epoch reads one **variant** of the pipeline (variant ``v``: every sample augmented with
randomness drawn from ``(pipeline, v, sample)``).

- Plain (``perfect`` off): epoch ``n`` reads variant ``n``: fresh augmentation every epoch, as a DataLoader does.
  With ``cache: true`` every variant is cached, so the trials of a sweep (or any jobs on the node reading the
  same pipeline) preprocess each variant once between them.
- PerFect: phase 1 (epochs ``0 .. switch-1``) reads variant ``n // reuse``: each preprocessed variant is reused
  ``reuse`` times, so training stops waiting on the CPU pipeline. Phase 2 (epochs ``switch ..``) fine-tunes on
  fresh variants (variant ``n``, never reused in the job) to recover the accuracy, until the ``target`` metric
  is reached or the epochs run out.

``reuse`` and ``switch`` are chosen automatically (``"auto"``, the default) from measured throughput, after the
first epoch: with ``rho`` = the seconds to preprocess one variant divided by the seconds to train one epoch
(each measured alone: variant 0 is built before training starts and nothing is prefetched during epoch 0, so
on a machine where loader workers and training share cores neither figure is inflated by the other), ``reuse = clamp(round(rho), 1, 8)`` makes
preprocessing of the next variant hide behind the ``reuse`` epochs that reuse the current one, and the fine-tune
phase gets ``ceil(epochs / (reuse + 1))`` epochs, which would give it as much wall time as phase 1 if a
reuse epoch cost only its training (a phase-2 epoch waits on preprocessing, ``rho`` times longer).
``switch: "gain"`` instead lets each reuse epoch measure what it really took (on shared cores the next variant's
preprocessing slows it) and moves the switch to give phase 2 ``ceil(epochs / (gain + 1))`` epochs, ``gain`` being
a fresh variant's build time over the mean reuse epoch: on a machine where the loader and training share few
cores the gain is small and phase 2 long (measured in docs/benchmarks.md), so it is not the default.
``rho <= 1.5`` means preprocessing keeps up: nothing is reused. Both can be set (``reuse: 3``, ``switch: 0.7``
as a fraction of the epochs). The decision is kept in the checkpoint, so a resumed job reads the same epochs.

The fine-tune phase also gets what fine-tuning needs: :meth:`DatasetEpochs.lr_scale` drops the learning rate at
the switch to ``fine_tune_lr`` of its value and decays it along a half cosine over phase 2. ``"auto"`` (the
default) takes phase 2's share of the epochs: a short fine-tune phase starts lower, so it settles in the few
epochs it has (3 of 12 epochs start at 0.25).

The loader work runs in ``workers`` spawned processes, one variant ahead of training and never more (the next
variant after the one being read is built while the current epochs train).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from components.datacache import pipeline as pipelines
from components.datacache.datasets import pipeline_id
from components.datacache.store import CacheStore
from components.runtime.contract.data import EpochSource, recipe_key

log = logging.getLogger("strata.datacache")

MAX_REUSE = 8
RHO_NO_REUSE = 1.5


class Plan:
    """Which variant each epoch reads: PerFect's reuse factor and switch epoch, once decided."""

    def __init__(self, epochs: int, perfect: dict[str, Any] | None):
        self.epochs = max(int(epochs), 1)
        self.perfect = perfect is not None
        perfect = perfect or {}
        self.reuse_setting = perfect.get("reuse", "auto")
        self.switch_setting = perfect.get("switch", "auto")
        self.target = perfect.get("target")
        self.metric = perfect.get("metric", "test_accuracy")
        self.fine_tune_lr = perfect.get("fine_tune_lr", "auto")
        self.reuse = 1
        self.switch = 0
        self.rho: float | None = None
        self.decided = not self.perfect
        if self.perfect and self.reuse_setting != "auto" and self.switch_setting != "auto":
            self.decide(None)

    def decide(self, rho: float | None) -> None:
        self.rho = rho
        if self.reuse_setting != "auto":
            reuse = int(self.reuse_setting)
        elif rho is None or rho <= RHO_NO_REUSE:
            reuse = 1
        else:
            reuse = max(1, min(MAX_REUSE, int(math.floor(rho + 0.5))))
        self.reuse = reuse
        if self.switch_setting not in ("auto", "gain"):
            switch = int(round(float(self.switch_setting) * self.epochs))
        elif reuse <= 1:
            switch = 0
        else:
            switch = self.epochs - max(1, math.ceil(self.epochs / (reuse + 1)))
        self.switch = max(0, min(self.epochs, switch))
        self.decided = True

    def revise(self, epoch: int, gain: float) -> bool:
        """Move a ``"gain"`` switch by the measured reuse gain, after phase-1 epoch ``epoch``: ``gain`` is what a
        fresh epoch costs over what a reuse epoch took, so phase 2 gets ``ceil(epochs / (gain + 1))`` epochs,
        as much wall time as phase 1 at the measured rates (the first guess, from ``rho`` alone, assumed the
        reuse epochs cost only training). True when the switch moved; the switch never moves to a trained epoch."""
        if self.switch_setting != "gain" or self.reuse <= 1 or not self.decided or epoch + 1 >= self.switch \
                or not math.isfinite(gain) or gain <= 0:
            return False
        fine_tune = max(1, math.ceil(self.epochs / (gain + 1)))
        switch = max(epoch + 1, self.epochs - fine_tune)
        if switch == self.switch:
            return False
        self.switch = switch
        return True

    def lr_scale(self, epoch: int) -> float:
        """PerFect's fine-tune schedule: 1.0 until the switch; from it, the starting rate (:meth:`fine_tune_start`)
        decaying along a half cosine over the phase-2 epochs (the model trained on reused variants settles on fresh
        data at a lower rate). A plain run (nothing reused) keeps 1.0."""
        if not self.perfect or not self.decided or self.reuse <= 1 or epoch < self.switch:
            return 1.0
        length = max(1, self.epochs - self.switch)
        return self.fine_tune_start() * 0.5 * (1.0 + math.cos(math.pi * min(epoch - self.switch, length) / length))

    def fine_tune_start(self) -> float:
        """The rate's factor at the switch: ``fine_tune_lr``, or with ``"auto"`` phase 2's share of the epochs
        (at least 0.1): the fewer fresh epochs the fine-tune phase has, the lower it starts."""
        if self.fine_tune_lr != "auto":
            return float(self.fine_tune_lr)
        return max(0.1, min(1.0, (self.epochs - self.switch) / self.epochs))

    def phase(self, epoch: int) -> int:
        """1: training on reused cached variants; 2: fresh data (the fine-tune phase, or all of a plain run)."""
        if not self.perfect:
            return 2
        if not self.decided:
            return 1
        return 1 if epoch < self.switch and self.reuse > 1 else 2

    def variant(self, epoch: int) -> int:
        if self.perfect and (not self.decided or (epoch < self.switch and self.reuse > 1)):
            return epoch // self.reuse if self.decided else 0
        return epoch

    def state(self) -> dict[str, Any]:
        return {"reuse": self.reuse, "switch": self.switch, "rho": self.rho, "decided": self.decided}

    def load(self, state: dict[str, Any]) -> None:
        if state.get("decided"):
            self.reuse, self.switch, self.rho = int(state["reuse"]), int(state["switch"]), state.get("rho")
            self.decided = True


class DatasetEpochs(EpochSource):
    """The epochs of one job reading one dataset pipeline (see the module docstring)."""

    def __init__(self, definition: dict[str, Any], *, epochs: int, cache: bool, perfect: dict[str, Any] | None,
                 workers: int, store: CacheStore | None = None, log_line=None):
        import torch  # the stream hands tensors to the workload

        self._torch = torch
        self.definition = definition
        self.pipeline = pipeline_id(definition)
        self.store = (store or CacheStore()) if cache else None
        self.workers = max(0, int(workers))
        self.plan = Plan(epochs, perfect)
        self.log = log_line or (lambda message: log.info("%s", message))
        self.pool = pipelines.worker_pool(self.workers)
        self._builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="datacache-build")
        self._variants: dict[int, Future] = {}
        self._progress: dict[int, pipelines.Progress] = {}
        self._lock = threading.Lock()
        self._stop = False
        self._epoch_info: dict[int, dict[str, float]] = {}
        self._reuse_seconds: list[float] = []  # wall seconds of the phase-1 epochs after the first (the gain)
        self.prep_cpu_seconds = 0.0  # loader CPU seconds this job spent (cache hits cost none)
        self.cache_hits = 0
        self.builds = 0
        self.raw = pipelines.load_raw(definition, self._cached if self.store is not None else None, self.pool)
        self.classes = int(self.raw.classes)
        test = self._get(pipelines.TEST_VARIANT, "test")["arrays"]
        self._test = (torch.from_numpy(np.asarray(test["x"])), torch.from_numpy(np.asarray(test["y"])))

    # -- building and caching variants --------------------------------------------------------------------
    @staticmethod
    def _key_of(definition: dict[str, Any], part: str) -> str:
        """The cache key of one part (``raw``, ``test``, ``variant-N``) of a pipeline."""
        return recipe_key({"pipeline": definition, "part": part})

    def _key(self, part: str) -> str:
        return self._key_of(self.definition, part)

    def _cached(self, part: str, build) -> dict[str, np.ndarray]:
        arrays, hit = self.store.get(self._key(part), build, {"dataset": self.definition["dataset"],
                                                              "pipeline": self.pipeline, "part": part})
        return arrays

    def _get(self, variant: int, part: str | None = None) -> dict[str, Any]:
        """Variant ``variant``'s arrays, from the cache or built now, with how they were obtained."""
        part = part or f"variant-{variant}"
        progress = self._progress.setdefault(variant, pipelines.Progress(1))
        began = time.perf_counter()

        def build() -> dict[str, np.ndarray]:
            progress.started = time.perf_counter()
            return pipelines.build_variant(self.raw, self.definition, variant, self.pool, self.workers, progress)

        if self.store is not None:
            arrays, hit = self.store.get(self._key(part), build, {"dataset": self.definition["dataset"],
                                                                  "pipeline": self.pipeline, "part": part})
        else:
            arrays, hit = build(), False
        seconds = time.perf_counter() - began
        if hit:
            self.cache_hits += 1
            meta = self.store.meta(self._key(part)) or {}
            build_seconds = float(meta.get("build_seconds") or 0.0)  # what computing it cost whoever did
        else:
            self.builds += 1
            self.prep_cpu_seconds += float(np.asarray(arrays["cpu"]).reshape(-1)[0])
            build_seconds = seconds
        progress.done = progress.chunks
        return {"arrays": arrays, "hit": hit, "seconds": seconds, "build_seconds": build_seconds,
                "samples": int(len(arrays["y"]))}

    def _request(self, variant: int) -> Future:
        with self._lock:
            future = self._variants.get(variant)
            if future is None:
                future = self._builder.submit(self._get, variant)
                self._variants[variant] = future
            return future

    def _prefetch_after(self, epoch: int) -> None:
        """Start building the next variant after the one ``epoch`` reads, if it is not built or being built:
        double buffering, one variant ahead and never more, so loader work does not run ahead into the epochs
        that reuse the current variant (on shared cores it would only slow them down)."""
        with self._lock:
            if any(not f.done() for f in self._variants.values()):
                return
        if not self.plan.decided:
            return  # epoch 0 trains alone: its time is half of what the decision measures
        current = self.plan.variant(epoch)
        for later in range(epoch + 1, self.plan.epochs):
            variant = self.plan.variant(later)
            if variant == current:
                continue
            if variant not in self._variants:
                self._request(variant)
            return

    def _forget_before(self, epoch: int) -> None:
        keep = {self.plan.variant(later) for later in range(epoch, min(epoch + 2 * MAX_REUSE, self.plan.epochs))}
        with self._lock:
            for variant in [v for v, f in self._variants.items() if v not in keep and f.done()]:
                del self._variants[variant]

    # -- the EpochSource protocol -------------------------------------------------------------------------
    def test(self):
        return self._test

    def epoch(self, epoch: int):
        variant = self.plan.variant(epoch)
        began = time.perf_counter()
        got = self._request(variant).result()
        waited = time.perf_counter() - began
        self._forget_before(epoch)
        self._prefetch_after(epoch)
        arrays = got["arrays"]
        info = self._epoch_info.setdefault(epoch, {})
        info.update({"data_variant": float(variant), "data_wait_s": round(waited, 4),
                     "data_cache_hit": 1.0 if got["hit"] else 0.0})
        if got["build_seconds"] > 0:
            info["data_samples_per_s"] = round(got["samples"] / got["build_seconds"], 2)
        torch = self._torch
        return torch.from_numpy(np.asarray(arrays["x"])), torch.from_numpy(np.asarray(arrays["y"]))

    def metrics(self, epoch: int) -> dict[str, float]:
        """What epoch ``epoch`` read, reported once it is trained (so the phase and reuse are the decided ones)."""
        return {**self._epoch_info.get(epoch, {}), "data_phase": float(self.plan.phase(epoch)),
                "data_reuse": float(self.plan.reuse), "data_prep_cpu_s": round(self.prep_cpu_seconds, 3),
                "data_lr_scale": round(self.plan.lr_scale(epoch), 4)}

    def after_epoch(self, epoch: int, compute_seconds: float, evaluation: dict[str, float]) -> bool:
        info = self._epoch_info.setdefault(epoch, {})
        samples = len(self.raw.train)
        if compute_seconds > 0:
            info["compute_samples_per_s"] = round(samples / compute_seconds, 2)
        if not self.plan.decided:
            self.plan.decide(self._measured_rho(compute_seconds))
            rho = "unknown" if self.plan.rho is None else f"{self.plan.rho:.2f}"
            if self.plan.reuse > 1:
                self.log(f"PerFect: preprocessing one epoch takes {rho}x the time of training one: reusing each "
                         f"preprocessed epoch {self.plan.reuse} times for epochs 1-{self.plan.switch}, then fresh "
                         f"data for epochs {self.plan.switch + 1}-{self.plan.epochs}")
            else:
                self.log(f"PerFect: preprocessing keeps up with training (rho {rho}): fresh data every epoch, "
                         "nothing reused")
        elif self.plan.phase(epoch) == 1 and epoch >= 1:
            self._revise(epoch, compute_seconds + info.get("data_wait_s", 0.0))
        target = self.plan.target
        if target is not None and evaluation.get(self.plan.metric) is not None \
                and evaluation[self.plan.metric] >= float(target):
            self.log(f"PerFect: {self.plan.metric} {evaluation[self.plan.metric]:.4f} reached the target {target} "
                     f"after epoch {epoch + 1}: done")
            self._stop = True
        self._prefetch_after(epoch)
        return self._stop

    def _revise(self, epoch: int, seconds: float) -> None:
        """After phase-1 epoch ``epoch`` (``seconds`` of wall time, training and waiting for data): the reuse gain
        measured so far, a fresh variant's build time over the mean reuse epoch, moves the automatic switch."""
        self._reuse_seconds.append(seconds)
        first = self._variants.get(0)
        if first is None or not first.done() or first.exception():
            return
        mean = sum(self._reuse_seconds) / len(self._reuse_seconds)
        gain = first.result()["build_seconds"] / mean if mean > 0 else float("inf")
        if self.plan.revise(epoch, gain):
            self.log(f"PerFect: reuse epochs take {mean:.2f} s, a fresh variant {gain:.2f}x that: fresh data from "
                     f"epoch {self.plan.switch + 1} of {self.plan.epochs}")

    def lr_scale(self, epoch: int) -> float:
        return self.plan.lr_scale(epoch)

    def _measured_rho(self, compute_seconds: float) -> float | None:
        """Seconds to preprocess one variant over seconds to train one epoch, each measured alone: variant 0 was
        built before training started (or, when a peer had cached it, what building it cost that peer) and
        nothing was prefetched during epoch 0, so neither figure is inflated by the other competing for the
        same cores."""
        first = self._variants.get(0)
        if compute_seconds <= 0 or first is None or not first.done() or first.exception():
            return None
        return first.result()["build_seconds"] / compute_seconds

    def state_dict(self) -> dict[str, Any]:
        return {"plan": self.plan.state(), "stop": self._stop}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.plan.load(state.get("plan") or {})
        self._stop = bool(state.get("stop", False))

    def close(self) -> None:
        self._builder.shutdown(wait=False, cancel_futures=True)
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None
