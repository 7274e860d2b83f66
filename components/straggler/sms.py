"""SMS at run time: data-parallel training that shrugs off stragglers (node side; imports torch).

SMS ("Proactive, Accuracy-aware Straggler Mitigation in ML Clusters", Tairin, Shen, Iyer) has three mechanisms,
each here as a piece that works (and is tested) on its own, and :class:`SMSRuntime` drives them once per step:

1. **Prediction** (:class:`StragglerPredictor`). Every rank measures its own compute time per sample (the time
   of its forward/backward, injected slowdown included, divided by the samples it processed) and its load (wall
   over CPU time of that compute). The ranks exchange these, so every rank holds the same history and predicts,
   identically, each rank's per-sample time for the *next* step: Holt's linear smoothing (level + trend) times a
   load term. A rank whose prediction exceeds ``(1 + threshold)`` x the median is a predicted straggler and keeps
   ``median / predicted`` of its batch (at least ``min_keep``), so it is predicted to finish with the others.
   Normalizing by samples keeps a straggler whose batch shrank from looking fast (and oscillating).
2. **Batch shrinking by deduplication** (:func:`shrink_batch`). A predicted straggler clusters its batch in a
   cheap feature space (inputs through a fixed random projection, plus a code of the label so that clusters do
   not mix classes) into ``ceil(keep x B)`` clusters (k-means++ then a few Lloyd iterations; exact and near
   duplicates collapse into one cluster), and keeps one sample per cluster, picked uniformly at random within
   it, weighted by the cluster's size. The workload's weighted-mean loss is then an unbiased (Horvitz-Thompson)
   estimate of the full batch's mean loss, and so is its gradient.
3. **Gradient transfer control** (:class:`GradientControl`). The flat gradient is cut into chunks; a chunk whose
   candidate (gradient + error-feedback residual) moved less than ``eps`` x the norm of what this rank last sent
   for it is not sent by this rank. The ranks agree (a MAX all-reduce of the per-chunk flags, folded into the
   stats exchange of 1, one small collective); the chunks any rank needs are all-reduced, the others reuse their
   last average, and what was not delivered is carried in the residual, so no gradient mass is lost.

The ring re-ordering of the paper (by measured link speed) is not done: gloo and NCCL pick their own rings.
"""

from __future__ import annotations

import hashlib
import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from components.runtime.contract.distributed import StrategyRuntime, ring_allreduce_bytes
from components.straggler.strategies import SMSStrategy

PROJECTION_DIMS = 32
PROJECTION_SEED = 0x53_4D_53  # "SMS": the same projection on every rank and every run
LABEL_DIMS = 8
LABEL_TABLE = 1024
LABEL_SCALE = 3.0  # label codes this many batch spreads apart: clusters rarely mix classes
DUPLICATE_TOL = 1e-3  # points closer than this x the batch spread are duplicates (one cluster)
LLOYD_ITERATIONS = 4
MAX_PAIRS = 512  # (step, rank) pairs kept of predicted and actual stragglers
HEATMAP_STEPS = 256
STATS = 6  # per-rank stats exchanged each step: per-sample s, load, compute ms, last step ms, samples, dropped

_projections: dict[tuple[int, str, torch.dtype], torch.Tensor] = {}
_label_codes: dict[tuple[str, torch.dtype], torch.Tensor] = {}


# -- 1. prediction -----------------------------------------------------------------------------------------------
def lower_median(values: Sequence[float]) -> float:
    """The lower median (of two ranks, the faster one: the time the others are waiting to match)."""
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2] if ordered else 0.0


class StragglerPredictor:
    """Predicts each rank's per-sample time for the next step from every rank's history; deterministic, so
    every rank that observed the same (all-gathered) values holds the same predictions and keep fractions.

    Per rank: the median of its last ``window`` (3) per-sample times x (one-step hiccups of a busy machine are
    ignored; a lasting change shows after two steps), smoothed by Holt's linear method (``level = alpha x +
    (1-alpha)(level + trend)``, ``trend = beta (level - level') + (1-beta) trend``), times ``1 + load_weight x
    max(0, load - usual load)`` with ``load`` the median of its last ``window`` loads and ``usual load`` a slow
    moving average of it (a rank whose contention just rose is expected to slow down before its smoothed time
    shows it).
    """

    def __init__(self, world_size: int, threshold: float = 0.2, min_keep: float = 0.25, *, alpha: float = 0.5,
                 beta: float = 0.2, load_weight: float = 0.5, load_alpha: float = 0.05, window: int = 3):
        self.world_size = int(world_size)
        self.window = max(1, int(window))
        self.recent: list[deque[tuple[float, float]]] = [deque(maxlen=self.window) for _ in range(self.world_size)]
        self.threshold, self.min_keep = float(threshold), float(min_keep)
        self.alpha, self.beta, self.load_weight, self.load_alpha = alpha, beta, load_weight, load_alpha
        self.level: list[float | None] = [None] * self.world_size
        self.trend = [0.0] * self.world_size
        self.load_level: list[float | None] = [None] * self.world_size
        self.load_now = [0.0] * self.world_size
        self.predicted: list[float] = []  # per-sample seconds predicted for the next step (empty: no history)
        self.keeps = [1.0] * self.world_size  # the fraction of its batch each rank keeps in the next step
        self.flagged: list[int] = []  # predicted stragglers of the next step
        self.steps = 0
        self.true_positives = self.predicted_count = self.actual_count = 0
        self.predicted_pairs: deque[tuple[int, int]] = deque(maxlen=MAX_PAIRS)
        self.actual_pairs: deque[tuple[int, int]] = deque(maxlen=MAX_PAIRS)

    def keep(self, rank: int) -> float:
        return self.keeps[rank]

    def stragglers(self) -> list[int]:
        """The ranks predicted to straggle in the next step."""
        return list(self.flagged)

    def observe(self, step: int, per_sample: Sequence[float], load: Sequence[float] | None = None) -> list[int]:
        """Record step ``step``'s measured per-sample times (and loads) of every rank: score the prediction made
        for it, update the model and predict the next step. Returns the actual stragglers of ``step``."""
        if len(per_sample) != self.world_size:
            raise ValueError(f"expected {self.world_size} per-sample times, got {len(per_sample)}")
        load = list(load) if load is not None else [0.0] * self.world_size
        measured = [float(value) for value in per_sample]
        valid = [value for value in measured if value > 0 and math.isfinite(value)]
        median = lower_median(valid)
        actual = [rank for rank, value in enumerate(measured)
                  if median > 0 and value > (1 + self.threshold) * median]
        predicted = set(self.flagged)
        self.predicted_count += len(predicted)
        self.actual_count += len(actual)
        self.true_positives += len(predicted.intersection(actual))
        self.predicted_pairs.extend((int(step), rank) for rank in sorted(predicted))
        self.actual_pairs.extend((int(step), rank) for rank in actual)
        for rank, value in enumerate(measured):
            if value > 0 and math.isfinite(value):
                self._update(rank, value, float(load[rank]))
        self.steps += 1
        self._predict()
        return actual

    def _update(self, rank: int, value: float, load: float) -> None:
        recent = self.recent[rank]
        recent.append((value, load))
        value = statistics.median(item[0] for item in recent)
        load = statistics.median(item[1] for item in recent)
        level = self.level[rank]
        if level is None:
            self.level[rank], self.trend[rank] = value, 0.0
        else:
            new = self.alpha * value + (1 - self.alpha) * (level + self.trend[rank])
            self.trend[rank] = self.beta * (new - level) + (1 - self.beta) * self.trend[rank]
            self.level[rank] = new
        usual = self.load_level[rank]
        self.load_now[rank] = load
        self.load_level[rank] = load if usual is None else (1 - self.load_alpha) * usual + self.load_alpha * load

    def _predict(self) -> None:
        loads = self.load_now
        predicted = []
        for rank in range(self.world_size):
            level = self.level[rank]
            if level is None:
                predicted.append(0.0)
                continue
            base = max(level + self.trend[rank], 0.1 * level)  # a falling trend never predicts ~zero time
            surge = max(0.0, loads[rank] - (self.load_level[rank] or 0.0))
            predicted.append(base * (1 + self.load_weight * surge))
        self.predicted = predicted
        median = lower_median([value for value in predicted if value > 0])
        self.flagged, self.keeps = [], [1.0] * self.world_size
        if median <= 0:
            return
        for rank, value in enumerate(predicted):
            if value > (1 + self.threshold) * median:
                self.flagged.append(rank)
                self.keeps[rank] = min(1.0, max(self.min_keep, median / value))

    @property
    def precision(self) -> float | None:
        """Of the predicted stragglers, the fraction that straggled (None: none predicted)."""
        return self.true_positives / self.predicted_count if self.predicted_count else None

    @property
    def recall(self) -> float | None:
        """Of the actual stragglers, the fraction that was predicted (None: none straggled)."""
        return self.true_positives / self.actual_count if self.actual_count else None

    def state_dict(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "level": list(self.level), "trend": list(self.trend),
                "load_level": list(self.load_level), "load_now": list(self.load_now),
                "recent": [[list(item) for item in recent] for recent in self.recent],
                "steps": self.steps, "true_positives": self.true_positives,
                "predicted_count": self.predicted_count, "actual_count": self.actual_count,
                "predicted_pairs": [list(pair) for pair in self.predicted_pairs],
                "actual_pairs": [list(pair) for pair in self.actual_pairs]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state or int(state.get("world_size", -1)) != self.world_size:
            return  # another gang size: start afresh
        self.level = list(state["level"])
        self.trend = [float(value) for value in state["trend"]]
        self.load_level = list(state["load_level"])
        self.load_now = [float(value) for value in state.get("load_now") or [0.0] * self.world_size]
        for recent, items in zip(self.recent, state.get("recent") or [[]] * self.world_size, strict=True):
            recent.clear()
            recent.extend((float(value), float(load)) for value, load in items)
        self.steps = int(state["steps"])
        self.true_positives = int(state["true_positives"])
        self.predicted_count, self.actual_count = int(state["predicted_count"]), int(state["actual_count"])
        self.predicted_pairs = deque((tuple(pair) for pair in state["predicted_pairs"]), maxlen=MAX_PAIRS)
        self.actual_pairs = deque((tuple(pair) for pair in state["actual_pairs"]), maxlen=MAX_PAIRS)
        self._predict()


# -- 2. batch shrinking --------------------------------------------------------------------------------------------
def _projection(dims_in: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    key = (dims_in, str(device), dtype)
    matrix = _projections.get(key)
    if matrix is None:
        rng = torch.Generator().manual_seed(PROJECTION_SEED + dims_in)
        matrix = torch.randn(dims_in, PROJECTION_DIMS, generator=rng) / math.sqrt(PROJECTION_DIMS)
        matrix = _projections[key] = matrix.to(device=device, dtype=dtype)
    return matrix


def _label_code(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    key = (str(device), dtype)
    table = _label_codes.get(key)
    if table is None:
        rng = torch.Generator().manual_seed(PROJECTION_SEED + 1)
        table = torch.nn.functional.normalize(torch.randn(LABEL_TABLE, LABEL_DIMS, generator=rng), dim=1)
        table = _label_codes[key] = table.to(device=device, dtype=dtype)
    return table


def batch_features(inputs: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
    """Cheap features of a batch for finding near-duplicates: the inputs flattened through a fixed seeded random
    projection to 32 dimensions (kept as they are when they have 32 or fewer), and for integer class labels a
    random unit code per label, scaled to 3 batch spreads, so that samples of different classes are far apart."""
    flat = inputs.detach().reshape(len(inputs), -1).float()
    features = flat if flat.shape[1] <= PROJECTION_DIMS else flat @ _projection(flat.shape[1], flat.device,
                                                                                 flat.dtype)
    if (targets is not None and targets.dim() == 1 and len(targets) == len(inputs)
            and not targets.is_floating_point() and not targets.is_complex()):
        spread = (features - features.mean(dim=0)).square().sum(dim=1).mean().sqrt().clamp_min(1e-6)
        codes = _label_code(features.device, features.dtype)[targets.remainder(LABEL_TABLE)]
        features = torch.cat([features, codes * (LABEL_SCALE * spread)], dim=1)
    return features


def near_duplicate_clusters(features: torch.Tensor, k: int, generator: torch.Generator | None = None, *,
                            iterations: int = LLOYD_ITERATIONS, tol: float = DUPLICATE_TOL) -> torch.Tensor:
    """Cluster the rows of ``features`` (B x d) into at most ``k`` clusters: k-means++ seeding (drawn from
    ``generator``) then up to ``iterations`` Lloyd iterations. Seeding stops early once every point lies within
    ``tol`` x the batch spread of a centre, so exact and near duplicates form one cluster even when ``k`` is larger.
    Returns each row's cluster, numbered 0..K-1 (K <= k), as a long tensor on the features' device.

    Small and sequential work (a batch is tens to hundreds of rows): done in NumPy on the CPU, about twice as fast
    as small torch ops; the random draws come from ``generator``, so a seeded generator gives the same clusters."""
    points = features.detach().cpu().double().numpy()
    count = len(points)
    if count == 0:
        return torch.zeros(0, dtype=torch.long, device=features.device)
    k = max(1, min(int(k), count))
    draws = torch.rand(k, generator=generator, dtype=torch.float64).numpy()
    norms = np.einsum("ij,ij->i", points, points)
    distances = np.maximum(norms[:, None] + norms[None, :] - 2.0 * (points @ points.T), 0.0)  # squared
    limit = float(tol) ** 2 * float(distances.mean()) / 2.0  # mean squared distance to the mean = spread^2
    chosen = [min(int(draws[0] * count), count - 1)]
    nearest = distances[chosen[0]].copy()
    for j in range(1, k):
        if nearest.max() <= limit:
            break  # every point is (nearly) a copy of a centre
        cdf = np.cumsum(nearest)
        pick = min(int(np.searchsorted(cdf, draws[j] * cdf[-1], side="right")), count - 1)
        while nearest[pick] <= 0 and pick > 0:  # never a point already at a centre
            pick -= 1
        chosen.append(pick)
        np.minimum(nearest, distances[pick], out=nearest)
    labels = distances[:, chosen].argmin(axis=1)
    for _ in range(iterations):
        sizes = np.bincount(labels, minlength=len(chosen))
        used = np.flatnonzero(sizes)
        onehot = np.zeros((count, len(sizes)))
        onehot[np.arange(count), labels] = 1.0
        centres = (onehot.T @ points)[used] / sizes[used, None]
        new = (norms[:, None] - 2.0 * (points @ centres.T) + np.einsum("ij,ij->i", centres, centres)).argmin(axis=1)
        if len(used) == len(sizes) and np.array_equal(new, labels):
            break
        labels, chosen = new, list(used)
    _, labels = np.unique(labels, return_inverse=True)
    return torch.from_numpy(labels.reshape(-1).astype(np.int64)).to(features.device)


def pick_representatives(labels: torch.Tensor, generator: torch.Generator | None = None,
                         weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One row per cluster, drawn within it uniformly (or, with ``weights``, in proportion to them), and the
    weight it carries: its cluster's size (or total weight). Returns ``(rows, weights)``."""
    count = len(labels)
    uniform = torch.rand(count, generator=generator).clamp_min(1e-12)
    if weights is None:
        keys = uniform
    else:  # exponential race: the smallest -log(u)/w of a cluster wins with probability w / W
        keys = -uniform.log() / weights.detach().float().cpu().clamp_min(1e-30)
    cpu_labels = labels.cpu()
    order = torch.argsort(keys)
    order = order[torch.argsort(cpu_labels[order], stable=True)]
    grouped = cpu_labels[order]
    first = torch.ones(count, dtype=torch.bool)
    first[1:] = grouped[1:] != grouped[:-1]
    rows = order[first]
    if weights is None:
        mass = torch.bincount(cpu_labels).to(torch.float32)
    else:
        mass = torch.zeros(int(cpu_labels.max()) + 1, dtype=torch.float64).index_add_(
            0, cpu_labels, weights.detach().double().cpu()).float()
    return rows.to(labels.device), mass[grouped[first]].to(labels.device)


def shrink_batch(inputs: torch.Tensor, targets: torch.Tensor, keep_fraction: float,
                 generator: torch.Generator | None = None, weights: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Shrink a batch to about ``keep_fraction`` of its samples, keeping its expected loss.

    Clusters the batch (:func:`batch_features`, :func:`near_duplicate_clusters` with ``k = ceil(keep x B)``) and
    keeps one sample per cluster, uniformly at random within it, weighted by the cluster's size: the weighted mean
    loss (the weights sum to B) is then an unbiased estimate of the full batch's mean loss. With ``weights`` (a
    batch already weighted) a sample is drawn in proportion to its weight and carries its cluster's total weight.
    Returns ``(inputs', targets', weights', dropped)``."""
    count = len(targets)
    k = math.ceil(float(keep_fraction) * count)
    if count == 0 or k >= count:
        full = weights if weights is not None else torch.ones(count, device=targets.device)
        return inputs, targets, full.float(), 0
    labels = near_duplicate_clusters(batch_features(inputs, targets), k, generator)
    rows, mass = pick_representatives(labels, generator, weights)
    return inputs[rows], targets[rows], mass, count - len(rows)


# -- 3. gradient transfer control ----------------------------------------------------------------------------------
class GradientControl:
    """Which gradient chunks this step sends, with error feedback (one per rank, over the flat gradient).

    Per chunk this rank keeps ``sent`` (the values it last all-reduced) and ``residual`` (gradient not yet
    delivered); all ranks share ``average`` (the last all-reduced mean). Each step:

    - :meth:`flags`: candidate ``c = g + residual``; the chunk needs sending here when ``||c - sent|| > eps x
      ||sent||`` (always when ``eps`` is 0, when disabled, and on the first step). The caller MAX-all-reduces
      the flags so that every rank agrees.
    - :meth:`pack` / :meth:`unpack` (or :meth:`sync` with an all-reduce function): the agreed chunks of ``c`` are
      summed over the ranks; their mean becomes ``average``, ``sent = c``, ``residual = 0``. A skipped chunk applies
      its previous ``average`` (the mean of the ranks' ``sent``), and ``residual = c - sent``.

    So for every chunk ``sum of applied + mean residual == sum of mean gradients`` at every step: what a skip did
    not deliver is delivered later. Byte counts are per rank, as a ring all-reduce sends them."""

    def __init__(self, numel: int, world_size: int, *, eps: float = 0.01, chunk: int = 256, enabled: bool = True,
                 device: torch.device | str = "cpu", link: Any = None):
        self.numel, self.world_size = int(numel), max(1, int(world_size))
        self.eps, self.chunk, self.enabled = float(eps), max(1, int(chunk)), bool(enabled)
        self.chunks = max(1, math.ceil(self.numel / self.chunk))
        self.padded = self.chunks * self.chunk
        self.device = torch.device(device)
        self.link = link
        zeros = lambda: torch.zeros(self.padded, dtype=torch.float32, device=self.device)  # noqa: E731
        self.sent, self.residual, self.average = zeros(), zeros(), zeros()
        self.primed = False  # False until a step sent every chunk
        self.lengths = torch.full((self.chunks,), self.chunk, dtype=torch.long)
        self.lengths[-1] = self.numel - self.chunk * (self.chunks - 1)
        self._candidate: torch.Tensor | None = None
        self.bytes_sent = self.bytes_skipped = self.bytes_full = 0
        self.chunks_sent = self.chunks_skipped = 0

    def _view(self, flat: torch.Tensor) -> torch.Tensor:
        return flat.view(self.chunks, self.chunk)

    def flags(self, grad: torch.Tensor) -> torch.Tensor:
        """This rank's need to send each chunk (float 0/1, ``chunks`` long) for gradient ``grad`` (flat)."""
        grad = grad.detach().reshape(-1)
        if grad.numel() != self.numel:
            raise ValueError(f"expected a gradient of {self.numel} elements, got {grad.numel()}")
        candidate = self.residual.clone()
        candidate[: self.numel] += grad.to(device=self.device, dtype=torch.float32)
        self._candidate = candidate
        if not self.enabled or self.eps <= 0 or not self.primed:
            return torch.ones(self.chunks, dtype=torch.float32, device=self.device)
        sent = self._view(self.sent)
        change = torch.linalg.vector_norm(self._view(candidate) - sent, dim=1)
        return (change > self.eps * torch.linalg.vector_norm(sent, dim=1)).float()

    def pack(self, flags: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The payload to sum over the ranks for the agreed ``flags``: ``(chunk indices, values)``."""
        if self._candidate is None:
            raise RuntimeError("call flags() first")
        chosen = torch.nonzero(flags.to(self.device) > 0.5).view(-1)
        if len(chosen) == self.chunks:
            return chosen, self._candidate.clone()
        return chosen, self._view(self._candidate).index_select(0, chosen).reshape(-1)

    def unpack(self, chosen: torch.Tensor, summed: torch.Tensor) -> torch.Tensor:
        """Finish the step with the summed payload; returns the gradient to apply (flat, ``numel`` long)."""
        candidate = self._candidate
        if candidate is None:
            raise RuntimeError("call flags() first")
        self._candidate = None
        elements = int(self.lengths[chosen.cpu()].sum()) if len(chosen) else 0
        if len(chosen) == self.chunks:
            self.average = summed / self.world_size
            self.sent = candidate
            self.residual.zero_()
            self.primed = True
        else:
            skipped = torch.ones(self.chunks, dtype=torch.bool, device=self.device)
            skipped[chosen] = False
            residual, sent, average = self._view(self.residual), self._view(self.sent), self._view(self.average)
            residual[skipped] = self._view(candidate)[skipped] - sent[skipped]
            if len(chosen):
                average[chosen] = summed.view(len(chosen), self.chunk) / self.world_size
                sent[chosen] = self._view(candidate)[chosen]
                residual[chosen] = 0
        sent_bytes = ring_allreduce_bytes(elements * 4, self.world_size)
        full_bytes = ring_allreduce_bytes(self.numel * 4, self.world_size)
        self.bytes_sent += sent_bytes
        self.bytes_full += full_bytes
        self.bytes_skipped += full_bytes - sent_bytes
        self.chunks_sent += len(chosen)
        self.chunks_skipped += self.chunks - len(chosen)
        if self.link is not None and sent_bytes:
            self.link.send(sent_bytes)
        return self.average[: self.numel].clone()

    def sync(self, grad: torch.Tensor, allreduce: Callable[[torch.Tensor], Any] | None = None,
             flags: torch.Tensor | None = None) -> torch.Tensor:
        """One whole step on one rank: ``flags`` (this rank's own unless the agreed ones are given), the payload
        summed in place by ``allreduce`` (nothing: a world of one), the gradient to apply."""
        own = self.flags(grad)
        chosen, payload = self.pack(own if flags is None else flags)
        if allreduce is not None and len(chosen):
            allreduce(payload)
        return self.unpack(chosen, payload)

    def state_dict(self) -> dict[str, Any]:
        """This rank's residual, the shared average and the byte counters (``sent`` is not needed: a restored
        control sends every chunk on its first step, which delivers the restored residual)."""
        return {"numel": self.numel, "chunk": self.chunk, "residual": self.residual[: self.numel].cpu().clone(),
                "average": self.average[: self.numel].cpu().clone(), "bytes_sent": self.bytes_sent,
                "bytes_skipped": self.bytes_skipped, "bytes_full": self.bytes_full}

    def load_state_dict(self, state: dict[str, Any], *, residual: bool = True) -> None:
        """Restore the average, the counters and (unless ``residual`` is False: then it restarts at zero) the
        residual. The next step sends every chunk (``c = g + residual``), so no restored mass is lost."""
        if not state or int(state.get("numel", -1)) != self.numel or int(state.get("chunk", -1)) != self.chunk:
            return
        self.bytes_sent, self.bytes_skipped = int(state["bytes_sent"]), int(state["bytes_skipped"])
        self.bytes_full = int(state["bytes_full"])
        self.average[: self.numel] = state["average"].to(self.device, torch.float32)
        self.residual.zero_()
        if residual and state.get("residual") is not None:
            self.residual[: self.numel] = state["residual"].to(self.device, torch.float32)
        self.sent.zero_()
        self.primed = False


# -- 4. the runtime --------------------------------------------------------------------------------------------------
class SMSRuntime(StrategyRuntime):
    """One rank's side of SMS (see the module docstring): predicts stragglers, shrinks a predicted straggler's
    batch and syncs gradients through :class:`GradientControl`, over the default process group."""

    plugin = "straggler"

    def __init__(self, ctx: Any, options: dict[str, Any], gang: Any):
        super().__init__(ctx, options, gang)
        strategy = SMSStrategy()
        own = {key: value for key, value in options.items() if key in strategy.options}
        problems = strategy.validate(own)
        if problems:
            raise ValueError("bad sms options: " + "; ".join(f"{key} {message}" for key, message in problems.items()))
        self.settings = strategy.defaults(own)
        self.threshold, self.min_keep = self.settings["threshold"], self.settings["min_keep"]
        self.dedup, self.transfer_control = self.settings["dedup"], self.settings["transfer_control"]
        self.predictor = StragglerPredictor(self.world_size, self.threshold, self.min_keep)
        spec = getattr(ctx, "spec", None) or {}
        digest = hashlib.blake2b(repr((int(spec.get("seed", 0)), "sms", self.rank)).encode(), digest_size=8).digest()
        self.generator = torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)  # this rank's draws
        self.control: GradientControl | None = None
        self.params: list[torch.nn.Parameter] = []
        self.step = 0
        self.dropped_samples = 0  # over all ranks
        self.dropped_local = 0  # by this rank
        self.bytes_control = 0  # this rank's bytes of the per-step stats exchange
        self.heatmap: deque[tuple[int, list[float]]] = deque(maxlen=HEATMAP_STEPS)
        self.last_keeps = [1.0] * self.world_size
        self._last_step_ms = 0.0
        self._window = {"step_ms": 0.0, "compute_ms": 0.0, "keep": 0.0, "steps": 0}
        self._gathered: tuple[int, list[torch.Tensor]] | None = None

    # -- set up ------------------------------------------------------------------------------------------
    def setup(self, workload: Any) -> None:
        for method in ("backward", "apply_gradients"):
            if not callable(getattr(workload, method, None)):
                raise TypeError(f"sms needs a workload with backward(batch) and apply_gradients() (its step split at "
                                f"the gradient exchange, like ClassificationWorkload); {type(workload).__name__} "
                                f"has no {method}()")
        model = getattr(workload, "model", None)
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"sms needs the workload's model as workload.model; {type(workload).__name__} has none")
        self.params = [param for param in model.parameters() if param.requires_grad]
        if not self.params:
            raise ValueError("sms: the model has no trainable parameters")
        self.device = self.params[0].device
        import torch.distributed as dist

        if dist.is_initialized() and self.world_size > 1:
            with torch.no_grad():  # every rank starts from rank 0's model
                for tensor in [*model.parameters(), *model.buffers()]:
                    dist.broadcast(tensor.data, src=0)
        numel = sum(param.numel() for param in self.params)
        self.control = GradientControl(numel, self.world_size, eps=self.settings["eps"],
                                       chunk=self.settings["chunk"], enabled=self.transfer_control,
                                       device=self.device, link=self.link)

    # -- one step -------------------------------------------------------------------------------------------
    def train_step(self, workload: Any, batch: Any) -> dict[str, Any]:
        import torch.distributed as dist

        if self.control is None:
            raise RuntimeError("call setup(workload) before train_step")
        began = time.perf_counter()
        self.slowdown.advance()
        keep = self.predictor.keep(self.rank)
        self.last_keeps = list(self.predictor.keeps)
        inputs, targets, *rest = batch
        full = len(targets)
        dropped = 0
        if self.dedup and keep < 1.0 and isinstance(inputs, torch.Tensor) and len(inputs) == full > 1:
            inputs, targets, weights, dropped = shrink_batch(inputs, targets, keep, self.generator,
                                                             rest[0] if rest else None)
            batch = (inputs, targets, weights)
        samples = len(targets)
        self.dropped_local += dropped
        compute_began = time.perf_counter()
        self.slowdown.delay(samples)
        cpu_began, wall_began = time.thread_time(), time.perf_counter()
        values = dict(workload.backward(batch))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        cpu = time.thread_time() - cpu_began
        ended = time.perf_counter()
        self.slowdown.observe(cpu, samples)
        compute = ended - compute_began
        load = max(0.0, (ended - wall_began) / cpu - 1.0) if cpu > 0 else 0.0

        flat = self._flat_gradient()
        flags = self.control.flags(flat)
        mine = [compute / max(samples, 1), min(load, 100.0), compute * 1e3, self._last_step_ms, samples, dropped]
        exchange = torch.zeros(self.world_size * STATS + self.control.chunks, dtype=torch.float32,
                               device=self.device)
        exchange[self.rank * STATS: (self.rank + 1) * STATS] = torch.tensor(mine, dtype=torch.float32)
        exchange[self.world_size * STATS:] = flags
        distributed = dist.is_initialized() and self.world_size > 1
        if distributed:  # one small collective: everyone's stats (the others' slots are 0) and the chunk flags
            dist.all_reduce(exchange, op=dist.ReduceOp.MAX)
            control = ring_allreduce_bytes(exchange.numel() * exchange.element_size(), self.world_size)
            self.bytes_control += control
            self.link.send(control)
        table = exchange[: self.world_size * STATS].view(self.world_size, STATS).cpu().tolist()
        agreed = exchange[self.world_size * STATS:].to(torch.float32)
        self.predictor.observe(self.step, [row[0] for row in table], [row[1] for row in table])
        self.heatmap.append((self.step, [round(row[2], 3) for row in table]))
        self.dropped_samples += int(sum(row[5] for row in table))

        chosen, payload = self.control.pack(agreed)
        if distributed and len(chosen):
            dist.all_reduce(payload, op=dist.ReduceOp.SUM)
        self._write_gradient(self.control.unpack(chosen, payload))
        workload.apply_gradients()

        step_ms = (time.perf_counter() - began) * 1e3
        self._last_step_ms = step_ms
        kept = samples / max(full, 1)
        window = self._window
        window["step_ms"] += step_ms
        window["compute_ms"] += compute * 1e3
        window["keep"] += kept
        window["steps"] += 1
        self.step += 1
        values["kept"] = kept
        return values

    def _flat_gradient(self) -> torch.Tensor:
        parts = [(param.grad.detach().reshape(-1).float() if param.grad is not None
                  else torch.zeros(param.numel(), dtype=torch.float32, device=param.device)) for param in self.params]
        return torch.cat(parts)

    def _write_gradient(self, flat: torch.Tensor) -> None:
        """The synced gradient into the parameters (allocating ``.grad`` for parameters that had none: a skipped
        chunk's stale average may be nonzero there)."""
        offset = 0
        for param in self.params:
            part = flat[offset: offset + param.numel()].view_as(param).to(param.dtype)
            offset += param.numel()
            if param.grad is None:
                param.grad = part.clone()
            else:
                param.grad.copy_(part)

    # -- synchronize, checkpoint ---------------------------------------------------------------------------
    def synchronize(self, workload: Any) -> None:
        """The parameters are equal on every rank already (equal synced gradients); this gathers every rank's
        error-feedback residual to rank 0 so that its checkpoint resumes every rank's (a collective; nothing to
        gather when no chunk is ever skipped)."""
        import torch.distributed as dist

        control = self.control
        if (control is None or not (dist.is_initialized() and self.world_size > 1) or not self.transfer_control
                or control.eps <= 0):
            return
        local = control.residual[: control.numel].contiguous()
        gathered = [torch.zeros_like(local) for _ in range(self.world_size)] if self.rank == 0 else None
        dist.gather(local, gathered, dst=0)
        self._gathered = (self.step, [item.cpu() for item in gathered]) if gathered is not None else None

    def state_dict(self) -> dict[str, Any]:
        """Rank 0's state: the predictor (the same on every rank), the gradient control's shared average and
        counters, and every rank's error-feedback residual when :meth:`synchronize` gathered them at this step
        (the loop synchronizes every rank before a checkpoint). Without that only rank 0's residual is kept and the
        other ranks restart theirs at zero on resume (losing at most ``eps`` x a chunk's norm of gradient each)."""
        state: dict[str, Any] = {"step": self.step, "world_size": self.world_size,
                                 "dropped_samples": self.dropped_samples, "bytes_control": self.bytes_control,
                                 "predictor": self.predictor.state_dict()}
        if self.control is not None:
            state["control"] = self.control.state_dict()
            gathered = self._gathered
            residuals = (gathered[1] if gathered is not None and gathered[0] == self.step
                         else [state["control"]["residual"]])
            state["residuals"] = residuals  # by rank
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Every rank loads rank 0's checkpoint and takes its own residual from it (zero when it holds none)."""
        if not state:
            return
        same_gang = int(state.get("world_size", -1)) == self.world_size
        self.step = int(state.get("step", 0))
        self.dropped_samples = int(state.get("dropped_samples", 0))
        self.bytes_control = int(state.get("bytes_control", 0))
        if same_gang:
            self.predictor.load_state_dict(state.get("predictor") or {})
        control = state.get("control")
        if self.control is not None and control:
            residuals = state.get("residuals") or []
            mine = residuals[self.rank] if same_gang and self.rank < len(residuals) else None
            self.control.load_state_dict({**control, "residual": mine}, residual=mine is not None)

    # -- reporting ---------------------------------------------------------------------------------------------
    def rank_metrics(self) -> dict[str, float]:
        window = self._window
        steps = window["steps"]
        if not steps:
            return {}
        metrics = {name: window[name] / steps for name in ("step_ms", "compute_ms", "keep")}
        self._window = {"step_ms": 0.0, "compute_ms": 0.0, "keep": 0.0, "steps": 0}
        return metrics

    def report(self) -> dict[str, Any] | None:
        if self.rank != 0:
            return None
        nodes = list(getattr(self.gang, "nodes", None) or [])
        recent = list(self.heatmap)[-32:]
        ranks = []
        for rank in range(self.world_size):
            times = [row[rank] for _, row in recent]
            ranks.append({"rank": rank, "node": str(nodes[rank]) if rank < len(nodes) else "",
                          "step_ms": round(sum(times) / len(times), 3) if times else 0.0,
                          "keep": round(float(self.last_keeps[rank]), 4)})
        control = self.control
        predictor = self.predictor
        return {
            "strategy": "sms",
            "world_size": self.world_size,
            "step": self.step,
            "ranks": ranks,
            "heatmap": {"steps": [step for step, _ in self.heatmap], "ms": [list(row) for _, row in self.heatmap]},
            "stragglers": {"predicted": [list(pair) for pair in predictor.predicted_pairs],
                           "actual": [list(pair) for pair in predictor.actual_pairs],
                           "precision": predictor.precision, "recall": predictor.recall},
            "dropped_samples": self.dropped_samples,
            "bytes_sent": (control.bytes_sent if control else 0) + self.bytes_control,
            "bytes_skipped": control.bytes_skipped if control else 0,
            "bytes_full": control.bytes_full if control else 0,
        }
