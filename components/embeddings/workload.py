"""The DLRM-style CTR workloads of the ``train`` kind: ``dlrm-ctr`` (the synthetic set) and ``dlrm-movielens``.

They are train workloads like any other (``spec.workload: dlrm-ctr``): the train loop drives them step by step,
checkpoints and resumes them, and their ``model.pt`` describes itself (the fields, their sizes, the embedding
width and the MLP width), so the serving plugin rebuilds and serves it. Each field's table keeps the training
frequency of every feature (``embeddings.<f>.counts``), which ``compress-embeddings`` jobs read to tell the
frequent head from the long tail. A compressed model (same workload, ``clusters`` set per field) is rebuilt the
same way.

Held-out metrics: ``test_loss`` (log loss), ``test_auc`` and ``test_logloss``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from components.embeddings.datasets import CTRData, load_dataset
from components.embeddings.model import DLRM, evaluate, step
from components.runtime.contract.data import prepare
from components.train.workloads import TorchWorkload, generator, make_optimizer

EMBEDDING_DIM = 32


def dlrm_config(data: CTRData, hidden: int, dim: int = EMBEDDING_DIM) -> dict[str, Any]:
    """The model config of an uncompressed DLRM for ``data``."""
    return {"dataset": data.name, "dim": int(dim), "hidden": int(hidden),
            "fields": [{"name": name, "size": int(size), "clusters": None}
                       for name, size in zip(data.fields, data.sizes, strict=True)]}


class DLRMWorkload(TorchWorkload):
    """A DLRM on a CTR dataset (:attr:`dataset`); ``hidden`` is the MLP's width."""

    name: ClassVar[str] = "dlrm"
    dataset: ClassVar[str] = "ctr-synthetic"
    eval_batch_size: ClassVar[int] = 8192

    def load(self, spec: dict[str, Any]) -> CTRData:
        return prepare({"dataset": self.dataset, "seed": int(spec["seed"]), "version": 1},
                       lambda: load_dataset(self.dataset, int(spec["seed"])), spec.get("data"))

    def setup(self, spec: dict[str, Any], device: torch.device) -> None:
        self.spec = spec
        self.device = torch.device(device)
        self.data = self.load(spec)  # shared with other jobs of the same recipe: read only
        self._config = dlrm_config(self.data, spec["hidden"])
        self.model = self.init_model(spec, lambda: self.from_config(self._config))
        with torch.no_grad():
            for embedding, counts in zip(self.model.embeddings, self.data.counts(), strict=True):
                embedding.counts.copy_(counts)
        self.optimizer = make_optimizer(self.model.parameters(), spec)
        self.x_train, self.y_train = self.data.x_train.to(self.device), self.data.y_train.to(self.device)
        self.batch_size = spec["batch_size"]
        self._order: tuple[int, torch.Tensor] | None = None

    def model_config(self) -> dict[str, Any] | None:
        return getattr(self, "_config", None)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> DLRM:
        return DLRM(list(config["fields"]), int(config["dim"]), int(config["hidden"]))

    @classmethod
    def describe_io(cls, config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        # Any int64 id is accepted: an id a field does not know gets that field's fallback vector.
        return ({"shape": [len(config["fields"])], "dtype": "int64", "limit": 0},
                {"shape": [1], "dtype": "float32"})

    def steps_per_epoch(self) -> int:
        return math.ceil(len(self.x_train) / self.batch_size)

    def batch(self, epoch: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._order is None or self._order[0] != epoch:
            order = torch.randperm(len(self.x_train), generator=generator(self.spec["seed"], "order", epoch))
            self._order = (epoch, order.to(self.device))
        rows = self._order[1][index * self.batch_size:(index + 1) * self.batch_size]
        return self.x_train[rows], self.y_train[rows]

    def train_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, Any]:
        ids, clicks = batch
        loss, logits = step(self.model, self.optimizer, ids, clicks)
        accuracy = ((logits.detach() > 0).float() == clicks).float().mean()
        return {"loss": loss.detach(), "accuracy": accuracy, "samples": len(clicks)}

    def evaluate(self) -> dict[str, float]:
        self.refresh_fallbacks()
        metrics = evaluate(self.model, self.data.x_test, self.data.y_test)
        return {"test_loss": metrics["logloss"], "test_logloss": metrics["logloss"], "test_auc": metrics["auc"]}

    def refresh_fallbacks(self) -> None:
        for embedding in self.model.embeddings:
            if hasattr(embedding, "refresh_fallback"):
                embedding.refresh_fallback()

    def model_state(self) -> dict[str, Any]:
        self.refresh_fallbacks()
        return self.model.state_dict()


class DLRMSynthetic(DLRMWorkload):
    """The DLRM on the seeded synthetic CTR set (8 Zipf fields, 37,625 features, 200,000 training rows)."""

    name: ClassVar[str] = "dlrm-ctr"
    dataset: ClassVar[str] = "ctr-synthetic"


class DLRMMovieLens(DLRMWorkload):
    """The DLRM on MovieLens-100k (8 fields, 2,625 users and movies, a rating of 4 or 5 is a click)."""

    name: ClassVar[str] = "dlrm-movielens"
    dataset: ClassVar[str] = "movielens-100k"


WORKLOADS = {workload.name: workload for workload in (DLRMSynthetic, DLRMMovieLens)}

__all__ = ["DLRMMovieLens", "DLRMSynthetic", "DLRMWorkload", "EMBEDDING_DIM", "WORKLOADS", "dlrm_config"]
