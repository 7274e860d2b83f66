"""Saec: compress a recommendation model's embedding tables by sharing one vector among similar features.

Features of one field describe one attribute (all city ids, all movie ids), and many behave alike. For each field,
Saec clusters the feature vectors and keeps one vector per cluster: a centroid table plus a feature-to-cluster
index. Clustering every feature is slow (the tables are huge) and wasted on the long tail of features seen a few
times, whose vectors barely trained. Feature frequencies are heavy-tailed, so Saec clusters only the frequent
*head* and assigns the *tail* to the nearest centroid, one matrix product per block of features.

Per field (:func:`cluster_field`):

1. Features the training rows never held (count 0) carry untrained vectors: they get the field's fallback
   centroid, as any id outside the field does at serving time.
2. Exact duplicates are merged first (their counts add up). When a field has no more distinct vectors than its
   cluster budget, the distinct vectors *are* the centroids: compression is lossless.
3. The head -- the ``head`` fraction (default 10 %) of seen features with the highest counts (at least 3 per
   cluster, at most all of them) -- is clustered with scikit-learn's ``KMeans`` (``method: kmeans``, the default:
   Lloyd on a head this small converges in a few passes) or ``MiniBatchKMeans`` (``method: minibatch``, for heads
   of millions), each feature weighted by its count, so frequent features keep vectors close to their own.
   Seeding is scikit-learn's greedy k-means++ (the best of ``2 + ln k`` draws per centre) by default; with
   ``local_trials: 1`` it is Arthur and Vassilvitskii's plain k-means++ (one draw per centre, scikit-learn's
   ``kmeans_plusplus``). A head holds only about 3 features per cluster, so seeding, quadratic in the clusters, is
   most of its time (2.1 of 2.7 s in a probe on a head of the benchmark's 100,000-feature field); one draw
   takes about half as long, and the head's clustering about 30 % less.
4. The tail is assigned to the nearest head centroid (squared Euclidean distance), in blocks.
5. The fallback centroid is the source's fallback vector (the frequency-weighted mean of the field's vectors).

How many clusters each field gets (:func:`plan_clusters`): the embedding bytes must shrink ``ratio`` times,
counting centroids and index. Every field gets the same fraction of its distinct vectors (found by bisection),
but at least ``min(distinct, 32)`` clusters, so a small field (a handful of genders or age bands) keeps what
distinguishes its few values. A field whose compressed form would not be smaller stays a full table.

:func:`full_kmeans` is the baseline the benchmark times: weighted ``KMeans`` over every feature of the field.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from components.embeddings.model import DLRM, ClusteredEmbedding, FullEmbedding, index_dtype

METHODS = ("kmeans", "minibatch")
MIN_CLUSTERS = 32  # a field keeps at least min(distinct vectors, this) clusters
HEAD_PER_CLUSTER = 3  # the head holds at least this many features per cluster (when the field has them)
ASSIGN_BLOCK = 8192  # tail features assigned per matrix product


@dataclass
class Settings:
    """How to compress: the target ``ratio`` of embedding bytes, the ``head`` fraction clustered, the
    clustering ``method``, the ``seed`` and the mini-batch size."""

    ratio: float = 20.0
    head: float = 0.1
    method: str = "kmeans"
    seed: int = 0
    batch_size: int = 4096
    local_trials: int | None = None  # k-means++ draws per centre for the head (None: scikit-learn's 2 + ln k)

    def __post_init__(self) -> None:
        if not self.ratio >= 1:
            raise ValueError(f"ratio must be >= 1, not {self.ratio}")
        if not 0 < self.head <= 1:
            raise ValueError(f"head must lie in (0, 1], not {self.head}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, not {self.method!r}")
        if self.local_trials is not None and not (isinstance(self.local_trials, int) and self.local_trials >= 1):
            raise ValueError(f"local_trials must be a positive integer or None, not {self.local_trials!r}")


@dataclass
class Clustering:
    """One field, compressed: ``centroids`` ``(clusters + 1, dim)`` (the last row is the fallback) and
    ``index`` ``(size,)``, each feature's centroid row."""

    centroids: torch.Tensor
    index: torch.Tensor

    @property
    def clusters(self) -> int:
        return len(self.centroids) - 1

    def vectors(self) -> torch.Tensor:
        return self.centroids[self.index.long()]


@dataclass
class FieldResult:
    """What compressing one field did (what the panel shows, per field)."""

    name: str
    features: int
    seen: int
    distinct: int
    clusters: int | None  # None: kept as a full table
    head: int
    bytes_before: int
    bytes_after: int
    seconds: float
    lossless: bool
    distortion: float  # frequency-weighted mean squared distance to the assigned centroid / weighted variance
    delta_auc: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def compressed_bytes(size: int, clusters: int, dim: int, element_size: int = 4) -> int:
    """Embedding bytes of a clustered field: centroids (with the fallback) and the index."""
    rows = clusters + 1
    return rows * dim * element_size + size * torch.empty((), dtype=index_dtype(rows)).element_size()


def plan_clusters(sizes: list[int], distinct: list[int], dim: int | list[int], ratio: float,
                  element_size: int = 4) -> list[int | None]:
    """Clusters per field so that the embedding bytes shrink ``ratio`` times (see the module's docstring).

    ``sizes``: features per field; ``distinct``: distinct seen vectors per field; ``dim``: the vector width, one
    for all fields or one per field. None keeps a field full. When even the fewest clusters miss the target, the
    fewest are used (the caller reports the ratio reached).
    """
    dims = list(dim) if isinstance(dim, list | tuple) else [int(dim)] * len(sizes)
    full = [size * width * element_size for size, width in zip(sizes, dims, strict=True)]
    budget = sum(full) / ratio

    def plan(fraction: float) -> list[int | None]:
        chosen: list[int | None] = []
        for size, count, width, whole in zip(sizes, distinct, dims, full, strict=True):
            clusters = min(count, max(min(count, MIN_CLUSTERS), math.ceil(fraction * count)))
            clusters = max(clusters, 1)
            chosen.append(clusters if compressed_bytes(size, clusters, width, element_size) < whole else None)
        return chosen

    def cost(chosen: list[int | None]) -> int:
        return sum(whole if clusters is None else compressed_bytes(size, clusters, width, element_size)
                   for size, clusters, width, whole in zip(sizes, chosen, dims, full, strict=True))

    low, high = 0.0, 1.0
    if cost(plan(high)) <= budget:
        return plan(high)
    for _ in range(40):
        middle = (low + high) / 2
        if cost(plan(middle)) <= budget:
            low = middle
        else:
            high = middle
    return plan(low)


def _weighted_distortion(vectors: np.ndarray, assigned: np.ndarray, weights: np.ndarray) -> float:
    if weights.sum() <= 0:
        return 0.0
    mean = np.average(vectors, axis=0, weights=weights)
    spread = np.average(((vectors - mean) ** 2).sum(1), weights=weights)
    error = np.average(((vectors - assigned) ** 2).sum(1), weights=weights)
    return float(error / spread) if spread > 0 else 0.0


def nearest(vectors: np.ndarray, centroids: np.ndarray, block: int = ASSIGN_BLOCK) -> np.ndarray:
    """The row of the nearest centroid (squared Euclidean distance) of each vector, block by block."""
    centroid_norms = (centroids ** 2).sum(1)
    rows = np.empty(len(vectors), dtype=np.int64)
    for start in range(0, len(vectors), block):
        part = vectors[start:start + block]
        distances = centroid_norms[None, :] - 2.0 * part @ centroids.T
        rows[start:start + block] = distances.argmin(1)
    return rows


def _kmeans(method: str, clusters: int, seed: int, batch_size: int, init: Any = "k-means++"):
    from sklearn.cluster import KMeans, MiniBatchKMeans

    if method == "kmeans":
        return KMeans(n_clusters=clusters, init=init, n_init=1, random_state=seed)
    return MiniBatchKMeans(n_clusters=clusters, init=init, n_init=1, random_state=seed, batch_size=batch_size,
                           max_no_improvement=10, reassignment_ratio=0.0)


def cluster_field(vectors: torch.Tensor, counts: torch.Tensor, clusters: int, *, head: float = 0.1,
                  method: str = "kmeans", seed: int = 0, fallback: torch.Tensor | None = None,
                  batch_size: int = 4096, local_trials: int | None = None) -> tuple[Clustering, dict[str, Any]]:
    """Cluster one field's ``vectors`` ``(size, dim)`` with their training ``counts`` into at most ``clusters``
    shared vectors (the steps of the module's docstring). ``fallback`` is the vector unknown and unseen ids get
    (default: the count-weighted mean). Returns the clustering and facts about it (``seen``, ``distinct``, ``head``,
    ``lossless``, ``distortion``). ``local_trials``: k-means++ draws per centre when seeding the head (None:
    scikit-learn's default, ``2 + ln k``)."""
    data = vectors.detach().to(torch.float32).cpu().numpy()
    weights_all = counts.detach().cpu().numpy().astype(np.float64)
    size, dim = data.shape
    seen = np.flatnonzero(weights_all > 0)
    if fallback is None:
        fallback_vector = (np.average(data[seen], axis=0, weights=weights_all[seen]) if len(seen)
                           else data.mean(0) if size else np.zeros(dim, dtype=np.float32))
    else:
        fallback_vector = fallback.detach().to(torch.float32).cpu().numpy()
    facts = {"seen": int(len(seen)), "distinct": 0, "head": 0, "lossless": True, "distortion": 0.0}
    if len(seen) == 0:  # nothing trained: every feature reads the fallback
        centroids = np.asarray(fallback_vector, dtype=np.float32)[None, :]
        index = np.zeros(size, dtype=np.int64)
        return _clustering(centroids, index), facts
    unique, inverse = np.unique(data[seen], axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    unique_weights = np.bincount(inverse, weights=weights_all[seen], minlength=len(unique))
    facts["distinct"] = int(len(unique))
    if len(unique) <= clusters:  # few enough distinct vectors: they are the centroids, nothing is lost
        centroids, member_rows = unique.astype(np.float32), inverse
        facts["head"] = int(len(unique))
    else:
        facts["lossless"] = False
        order = np.argsort(-unique_weights, kind="stable")
        head_size = min(len(unique), max(math.ceil(head * len(unique)), HEAD_PER_CLUSTER * clusters))
        head_rows = order[:head_size]
        facts["head"] = int(head_size)
        head_vectors, head_weights = unique[head_rows], unique_weights[head_rows]
        init: Any = "k-means++"
        if local_trials is not None:
            from sklearn.cluster import kmeans_plusplus

            init, _ = kmeans_plusplus(head_vectors, clusters, sample_weight=head_weights, random_state=seed,
                                      n_local_trials=local_trials)
        model = _kmeans(method, clusters, seed, batch_size, init)
        model.fit(head_vectors, sample_weight=head_weights)
        centroids = model.cluster_centers_.astype(np.float32)
        unique_rows = np.empty(len(unique), dtype=np.int64)
        unique_rows[head_rows] = model.labels_ if hasattr(model, "labels_") else nearest(unique[head_rows], centroids)
        tail_rows = order[head_size:]
        if len(tail_rows):
            unique_rows[tail_rows] = nearest(unique[tail_rows], centroids)
        member_rows = unique_rows[inverse]
        used = np.unique(unique_rows)  # drop centroids no feature chose (they would be dead bytes)
        if len(used) < len(centroids):
            renumber = np.full(len(centroids), -1, dtype=np.int64)
            renumber[used] = np.arange(len(used))
            centroids, member_rows = centroids[used], renumber[member_rows]
        facts["distortion"] = _weighted_distortion(data[seen], centroids[member_rows], weights_all[seen])
    index = np.full(size, len(centroids), dtype=np.int64)  # unseen features: the fallback row
    index[seen] = member_rows
    table = np.concatenate([centroids, np.asarray(fallback_vector, dtype=np.float32)[None, :]])
    return _clustering(table, index), facts


def _clustering(centroids: np.ndarray, index: np.ndarray) -> Clustering:
    table = torch.from_numpy(np.ascontiguousarray(centroids, dtype=np.float32))
    return Clustering(table, torch.from_numpy(index).to(index_dtype(len(table))))


def full_kmeans(vectors: torch.Tensor, counts: torch.Tensor, clusters: int, seed: int = 0
                ) -> tuple[Clustering, dict[str, Any]]:
    """The baseline: scikit-learn's ``KMeans`` with its defaults (Lloyd, k-means++, one initialisation, up to 300
    iterations) over every feature of the field, each weighted by its count: no head, no tail, no merging of
    duplicates. (Features never seen weigh nothing but are clustered like the others; every feature reads its
    nearest centroid.) What Saec's head-first clustering is timed against."""
    from sklearn.cluster import KMeans

    data = vectors.detach().to(torch.float32).cpu().numpy()
    weights = counts.detach().cpu().numpy().astype(np.float64)
    seen = weights > 0
    model = KMeans(n_clusters=min(clusters, len(data)), n_init=1, random_state=seed)
    model.fit(data, sample_weight=weights if seen.any() else None)
    centroids = model.cluster_centers_.astype(np.float32)
    fallback = np.average(data[seen], axis=0, weights=weights[seen]) if seen.any() else data.mean(0)
    table = np.concatenate([centroids, fallback.astype(np.float32)[None, :]])
    labels = model.labels_.astype(np.int64)
    facts = {"seen": int(seen.sum()), "distinct": int(len(data)), "head": int(len(data)), "lossless": False,
             "distortion": _weighted_distortion(data[seen], centroids[labels[seen]], weights[seen])
             if seen.any() else 0.0}
    return _clustering(table, labels), facts


@dataclass
class ModelCompression:
    """A compressed DLRM, its model config, and what happened per field."""

    model: DLRM
    config: dict[str, Any]
    fields: list[FieldResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def bytes_before(self) -> int:
        return sum(result.bytes_before for result in self.fields)

    @property
    def bytes_after(self) -> int:
        return sum(result.bytes_after for result in self.fields)

    @property
    def ratio(self) -> float:
        return self.bytes_before / max(1, self.bytes_after)


def compress_model(model: DLRM, config: dict[str, Any], settings: Settings,
                   progress: Callable[[str], None] | None = None, clusterer: Callable[..., Any] | None = None
                   ) -> ModelCompression:
    """Compress every field of an uncompressed DLRM ``model`` (of model config ``config``) per ``settings``.

    The MLP is copied unchanged. ``clusterer(vectors, counts, clusters, field_index)`` replaces the head-first
    clustering (the benchmark passes :func:`full_kmeans` to time the baseline on the same plan).
    """
    embeddings = list(model.embeddings)
    if not all(isinstance(embedding, FullEmbedding) for embedding in embeddings):
        raise ValueError("only a model whose fields are all full tables can be compressed")
    dim = int(config["dim"])
    distinct = []
    for embedding in embeddings:
        seen = embedding.counts > 0
        distinct.append(int(torch.unique(embedding.vectors()[seen].detach(), dim=0).shape[0]) if bool(seen.any())
                        else 0)
    sizes = [embedding.size for embedding in embeddings]
    plan = plan_clusters(sizes, [max(1, count) for count in distinct], dim, settings.ratio,
                         embeddings[0].weight.element_size())
    started = time.perf_counter()
    modules, results, fields = [], [], []
    for position, (embedding, clusters, spec) in enumerate(zip(embeddings, plan, config["fields"], strict=True)):
        name = spec.get("name", f"field{position}")
        before = embedding.table_bytes()
        tick = time.perf_counter()
        if clusters is None:
            copy = FullEmbedding(embedding.size, dim)
            copy.load_state_dict(embedding.state_dict())
            modules.append(copy)
            fields.append({**spec, "clusters": None})
            results.append(FieldResult(name, embedding.size, int((embedding.counts > 0).sum()), distinct[position],
                                       None, 0, before, before, 0.0, True, 0.0))
            continue
        vectors, counts = embedding.vectors().detach(), embedding.counts
        if clusterer is None:
            clustering, facts = cluster_field(vectors, counts, clusters, head=settings.head, method=settings.method,
                                              seed=settings.seed, fallback=embedding.weight[embedding.size].detach(),
                                              batch_size=settings.batch_size, local_trials=settings.local_trials)
        else:
            clustering, facts = clusterer(vectors, counts, clusters, position)
        seconds = time.perf_counter() - tick
        compressed = ClusteredEmbedding(embedding.size, clustering.clusters, dim)
        with torch.no_grad():
            compressed.centroids.copy_(clustering.centroids)
            compressed.index.copy_(clustering.index)
        modules.append(compressed)
        fields.append({**spec, "clusters": clustering.clusters})
        results.append(FieldResult(name, embedding.size, facts["seen"], facts["distinct"], clustering.clusters,
                                   facts["head"], before, compressed.table_bytes(), seconds, facts["lossless"],
                                   facts["distortion"]))
        if progress is not None:
            progress(f"{name}: {embedding.size} features ({facts['seen']} seen) -> {clustering.clusters} clusters "
                     f"in {seconds:.2f}s ({before / max(1, compressed.table_bytes()):.1f}x smaller)")
    compressed_config = {**config, "fields": fields}
    result = DLRM(fields, dim, int(config["hidden"]), embeddings=modules)
    result.top.load_state_dict(model.top.state_dict())
    return ModelCompression(result.eval(), compressed_config, results, time.perf_counter() - started)


def hybrid(model: DLRM, compressed: DLRM, position: int) -> DLRM:
    """``model`` with only field ``position``'s embedding taken from ``compressed`` (per-field ΔAUC)."""
    modules = [compressed.embeddings[index] if index == position else embedding
               for index, embedding in enumerate(model.embeddings)]
    fields = [{"name": f"field{index}", "size": getattr(module, "size", 0)} for index, module in enumerate(modules)]
    mixed = DLRM(fields, model.dim, model.hidden, embeddings=modules)
    mixed.top.load_state_dict(model.top.state_dict())
    return mixed.eval()


def centroid_parameters(model: DLRM) -> list[torch.nn.Parameter]:
    """The centroid tables of a compressed model's clustered fields (what fine-tuning trains)."""
    return [embedding.centroids for embedding in model.embeddings if isinstance(embedding, ClusteredEmbedding)]


__all__ = ["Clustering", "FieldResult", "METHODS", "ModelCompression", "Settings", "centroid_parameters",
           "cluster_field", "compress_model", "compressed_bytes", "full_kmeans", "hybrid", "nearest",
           "plan_clusters"]
