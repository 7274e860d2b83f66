"""A small DLRM-style CTR model whose embedding tables may be full or compressed, and its metrics.

Each field has one embedding module; a row of feature ids (one per field) becomes one vector per field; the
model concatenates them with their pairwise dot products (DLRM's interaction) and a small MLP gives the click's
log-odds. ``forward`` answers click probabilities, ``(rows, 1)``, which is what a served model returns.

Two embedding modules share one contract (``ids -> vectors``, ``table_bytes()``):

- :class:`FullEmbedding`: a table of ``size`` vectors and one *fallback* vector (the last row) that every id
  outside ``[0, size)`` gets, so a served model has a defined answer for an id it never knew. It keeps the
  training frequency of every feature (the ``counts`` buffer), which the compressor reads.
- :class:`ClusteredEmbedding` (Saec): ``clusters`` centroids plus a fallback centroid, and an index mapping
  each of the ``size`` features to its centroid (uint8, int16 or int32, the narrowest that holds the centroid
  count). An id outside ``[0, size)`` gets the fallback centroid, as do features the training rows never
  held.

Only the vectors count as embedding bytes for a full table; for a clustered one, the centroids and the index.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def index_dtype(rows: int) -> torch.dtype:
    """The narrowest integer dtype that holds row numbers ``0 .. rows - 1``."""
    if rows <= 256:
        return torch.uint8
    if rows <= 2**15:
        return torch.int16
    return torch.int32


class FullEmbedding(nn.Module):
    """``size`` trainable vectors of ``dim`` floats, a fallback vector for unknown ids and the features' counts."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.size, self.dim = int(size), int(dim)
        self.weight = nn.Parameter(torch.empty(self.size + 1, self.dim))
        self.register_buffer("counts", torch.zeros(self.size, dtype=torch.int64))
        if not self.weight.is_meta:
            nn.init.normal_(self.weight, std=1.0 / math.sqrt(self.dim))

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.where((ids >= 0) & (ids < self.size), ids, self.size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(self.rows(ids), self.weight)

    def vectors(self) -> torch.Tensor:
        """The ``(size, dim)`` feature vectors (without the fallback)."""
        return self.weight[: self.size]

    @torch.no_grad()
    def refresh_fallback(self) -> None:
        """Make the fallback vector the frequency-weighted mean of the feature vectors (what an unknown id most
        likely resembles); the mean of all vectors when no counts are known."""
        counts = self.counts.to(self.weight.dtype)
        if float(counts.sum()) > 0:
            self.weight[self.size] = (counts[:, None] * self.vectors()).sum(0) / counts.sum()
        else:
            self.weight[self.size] = self.vectors().mean(0)

    def table_bytes(self) -> int:
        return self.size * self.dim * self.weight.element_size()


class ClusteredEmbedding(nn.Module):
    """``clusters`` shared vectors (+ a fallback) and a feature-to-cluster index of ``size`` entries."""

    def __init__(self, size: int, clusters: int, dim: int):
        super().__init__()
        if not 1 <= int(clusters):
            raise ValueError(f"a clustered field needs at least one cluster, not {clusters}")
        self.size, self.clusters, self.dim = int(size), int(clusters), int(dim)
        self.centroids = nn.Parameter(torch.zeros(self.clusters + 1, self.dim))
        self.register_buffer("index", torch.full((self.size,), self.clusters, dtype=index_dtype(self.clusters + 1)))

    @property
    def fallback(self) -> int:
        """The row of the fallback centroid (the last one)."""
        return self.clusters

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        known = (ids >= 0) & (ids < self.size)
        mapped = self.index[ids.clamp(0, max(self.size - 1, 0))].long()
        return torch.where(known, mapped, self.fallback)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(self.rows(ids), self.centroids)

    def vectors(self) -> torch.Tensor:
        """What every feature now reads: ``(size, dim)``."""
        return self.centroids[self.index.long()]

    def table_bytes(self) -> int:
        return self.centroids.numel() * self.centroids.element_size() + self.index.numel() * self.index.element_size()


class DLRM(nn.Module):
    """Embeddings per field, their pairwise dot products, and an MLP over both; ``forward`` gives ``P(click)``.

    ``fields`` is the config's list: ``{"name", "size", "clusters"}`` (``clusters`` None: a full table).
    """

    def __init__(self, fields: list[dict[str, Any]], dim: int, hidden: int,
                 embeddings: list[nn.Module] | None = None):
        super().__init__()
        self.dim, self.hidden = int(dim), int(hidden)
        if embeddings is None:
            embeddings = [FullEmbedding(field["size"], dim) if field.get("clusters") is None
                          else ClusteredEmbedding(field["size"], field["clusters"], dim) for field in fields]
        elif len(embeddings) != len(fields):
            raise ValueError(f"{len(embeddings)} embedding modules for {len(fields)} fields")
        # Any module mapping (rows,) int64 ids to (rows, dim) vectors, with table_bytes(), fits (the baselines do).
        self.embeddings = nn.ModuleList(embeddings)
        count = len(fields)
        self.pairs = count * (count - 1) // 2
        rows, columns = torch.triu_indices(count, count, offset=1, device="cpu")  # never on meta: not loaded
        self.register_buffer("pair_rows", rows, persistent=False)
        self.register_buffer("pair_columns", columns, persistent=False)
        self.top = nn.Sequential(nn.Linear(count * self.dim + self.pairs, self.hidden), nn.ReLU(),
                                 nn.Linear(self.hidden, max(1, self.hidden // 2)), nn.ReLU(),
                                 nn.Linear(max(1, self.hidden // 2), 1))

    def vectors(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.stack([embedding(ids[:, column]) for column, embedding in enumerate(self.embeddings)], dim=1)

    def features(self, ids: torch.Tensor) -> torch.Tensor:
        """What the MLP reads: the fields' vectors, concatenated, and their pairwise dot products."""
        vectors = self.vectors(ids)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, self.pair_rows, self.pair_columns]
        return torch.cat([vectors.flatten(1), dots], dim=1)

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        """The click log-odds of ``ids`` (``(rows, fields)`` int64): ``(rows,)``."""
        return self.top(self.features(ids)).squeeze(1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.top(self.features(ids)))

    def stages(self) -> list[nn.Module]:
        """The interaction, each MLP layer and the sigmoid: stages whose composition is :meth:`forward` (for
        stage-preemptible training on a shared GPU), sharing this model's layers."""
        return [Interaction(self), *self.top, nn.Sigmoid()]

    def embedding_bytes(self) -> int:
        return sum(embedding.table_bytes() for embedding in self.embeddings)


class Interaction(nn.Module):
    """The first stage of a :class:`DLRM`: ids to :meth:`DLRM.features`, with the model's own embeddings."""

    def __init__(self, model: DLRM):
        super().__init__()
        self.embeddings = model.embeddings  # shared, not copied
        self._features = model.features

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self._features(ids)


def step(model: DLRM, optimizer: torch.optim.Optimizer, ids: torch.Tensor, clicks: torch.Tensor
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step of binary cross-entropy on a batch; returns ``(loss, logits)``, detached."""
    model.train()
    logits = model.logits(ids)
    loss = F.binary_cross_entropy_with_logits(logits, clicks)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach(), logits.detach()


def fit(model: DLRM, x: torch.Tensor, y: torch.Tensor, *, epochs: int, batch_size: int = 1024, lr: float = 0.003,
        seed: int = 0, parameters: Any = None, max_steps: int | None = None,
        progress: Any = None) -> dict[str, float]:
    """Train ``model`` with Adam on ``(x, y)`` for ``epochs`` seeded shuffles (or ``max_steps`` steps), as the
    ``dlrm-*`` workloads train; ``parameters`` (default: all of the model's) are the ones that learn. Returns
    ``{"steps", "loss"}`` (the last step's). ``progress(epoch, loss)`` is called after each epoch."""
    optimizer = torch.optim.Adam(model.parameters() if parameters is None else parameters, lr=lr)
    steps, loss = 0, float("nan")
    for epoch in range(epochs):
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)).to(x.device)
        for start in range(0, len(x), batch_size):
            rows = order[start:start + batch_size]
            value, _ = step(model, optimizer, x[rows], y[rows])
            steps += 1
            if max_steps is not None and steps >= max_steps:
                return {"steps": steps, "loss": float(value)}
        loss = float(value)
        if progress is not None:
            progress(epoch, loss)
    return {"steps": steps, "loss": loss}


def roc_auc(scores: Any, labels: Any) -> float:
    """The area under the ROC curve: the chance that a random positive scores above a random negative, ties
    counting one half (the Mann-Whitney statistic, with average ranks for tied scores). Raises ValueError when
    the labels hold only one class."""
    scores = np.asarray(torch.as_tensor(scores).detach().cpu().double().numpy()).ravel()
    labels = np.asarray(torch.as_tensor(labels).detach().cpu().numpy()).ravel().astype(bool)
    if scores.shape != labels.shape:
        raise ValueError(f"{scores.size} scores for {labels.size} labels")
    positives = int(labels.sum())
    negatives = labels.size - positives
    if positives == 0 or negatives == 0:
        raise ValueError("AUC needs both clicks and non-clicks among the labels")
    order = np.argsort(scores, kind="mergesort")
    _, inverse, counts = np.unique(scores[order], return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    average_rank = (ends - counts + 1 + ends) / 2.0  # ranks start at 1
    rank_sum = average_rank[inverse][labels[order]].sum()
    return float((rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives))


def log_loss(probabilities: Any, labels: Any, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy of click probabilities (clipped to ``[eps, 1 - eps]``)."""
    p = torch.as_tensor(probabilities).detach().double().ravel().clamp(eps, 1 - eps)
    y = torch.as_tensor(labels).detach().double().ravel()
    return float(-(y * p.log() + (1 - y) * (1 - p).log()).mean())


@torch.no_grad()
def predict(model: DLRM, ids: torch.Tensor, batch: int = 8192) -> torch.Tensor:
    """Click probabilities of ``ids``, ``(rows,)``, in eval mode, batch by batch."""
    model.eval()
    device = next(model.parameters()).device
    parts = [torch.sigmoid(model.logits(ids[start:start + batch].to(device))).cpu()
             for start in range(0, len(ids), batch)]
    return torch.cat(parts) if parts else torch.zeros(0)


def evaluate(model: DLRM, ids: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """``{"auc", "logloss"}`` of ``model`` on ``(ids, labels)``."""
    probabilities = predict(model, ids)
    return {"auc": roc_auc(probabilities, labels), "logloss": log_loss(probabilities, labels)}


__all__ = ["DLRM", "ClusteredEmbedding", "FullEmbedding", "evaluate", "fit", "index_dtype", "log_loss", "predict",
           "roc_auc", "step"]
