"""A team's own model as a Strata `Workload`: Strata's loop drives it one optimizer step at a time, so it
checkpoints, resumes after a preemption and reports metrics without code of its own, on a share of a GPU.

    strata submit job.yaml --wait       # one job on half a GPU (code: . ships this directory)
    strata submit sweep.yaml --wait     # a tune sweep of it: Fluid water-fills the trials' shares
    strata submit sms.yaml --wait       # DigitsClassification on two workers, one slowed, under SMS
    strata submit stanza.yaml --wait    # DigitsCNN on two workers under Stanza (convolutions | FC layers)
    strata submit serve.yaml --wait     # job.yaml's model served over gRPC (put its id in serve.yaml first)

The Workload API (components.train.workloads.Workload) is what the research mechanisms that step the training
need (docs/projects.md lists which); a plain script runs as a command job instead (../ddp-torchrun).

Serving: ``DigitsWorkload.serving_input`` says what one row of its model takes, so Strata exports the trained
model into ``model.pt`` (torch.export) and a serve job serves it without importing this file (serve.yaml). Every
``ClassificationWorkload`` does that by itself. ``DigitsModel`` is the other way, for a model torch.export cannot
trace: a loader class of your own that the serve job imports from this bundle (serve-loader.yaml).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn

from components.train.workloads import ClassificationWorkload, Workload, generator, make_optimizer


def digits(spec: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """scikit-learn's bundled 8x8 digits, pixels in [0, 1]: 1500 rows to train on and 297 held out, split by the
    job's seed."""
    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target)
    order = torch.randperm(len(x), generator=generator(spec["seed"], "split"))
    train, test = order[:1500], order[1500:]
    return x[train], y[train], x[test], y[test]


def digits_net(width: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 10))


class DigitsWorkload(Workload):
    """A two-layer network on scikit-learn's bundled handwritten digits."""

    name = "team-digits"

    def setup(self, spec: dict[str, Any], device: torch.device) -> None:
        self.spec, self.device = spec, torch.device(device)
        x_train, y_train, x_test, y_test = digits(spec)
        self.x, self.y = x_train.to(self.device), y_train.to(self.device)
        self.x_test, self.y_test = x_test.to(self.device), y_test.to(self.device)
        self.model = digits_net(spec.get("hidden") or 96).to(self.device)
        self.optimizer = make_optimizer(self.model.parameters(), spec)
        self.batch_size = spec["batch_size"]

    def serving_input(self) -> dict[str, Any]:
        """One row of what the model takes: 64 pixels. With it, model.pt holds the exported model."""
        return {"shape": [64], "dtype": "float32", "limit": 0}

    def steps_per_epoch(self) -> int:
        return len(self.x) // self.batch_size

    def batch(self, epoch: int, index: int):
        order = torch.randperm(len(self.x), generator=generator(self.spec["seed"], "order", epoch))
        rows = order[index * self.batch_size:(index + 1) * self.batch_size].to(self.device)
        return self.x[rows], self.y[rows]

    def train_step(self, batch) -> dict[str, Any]:
        inputs, targets = batch
        logits = self.model(inputs)
        loss = nn.functional.cross_entropy(logits, targets)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return {"loss": loss.detach(), "accuracy": (logits.argmax(1) == targets).float().mean().detach(),
                "samples": len(targets)}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        logits = self.model(self.x_test)
        return {"test_loss": float(nn.functional.cross_entropy(logits, self.y_test)),
                "test_accuracy": float((logits.argmax(1) == self.y_test).float().mean())}

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


class DigitsClassification(ClassificationWorkload):
    """The same data as a ClassificationWorkload: its step is split at the gradient exchange (``backward`` /
    ``apply_gradients``), which the straggler strategies (SMS, Stanza) need."""

    name = "team-digits-classification"

    def load_data(self, spec: dict[str, Any]):
        return digits(spec)

    def build_model(self, spec: dict[str, Any], x_train: torch.Tensor, classes: int) -> nn.Module:
        width = spec.get("hidden") or 96
        return nn.Sequential(nn.Linear(x_train.shape[1], width), nn.ReLU(), nn.Linear(width, classes))


class DigitsCNN(ClassificationWorkload):
    """The digits as 1x8x8 images through a small CNN: an ``nn.Sequential`` whose convolutions and fully connected
    layers meet at an ``nn.Flatten``, which is what Stanza's layer separation needs (conv workers run up to the
    Flatten, FC workers the rest)."""

    name = "team-digits-cnn"

    def load_data(self, spec: dict[str, Any]):
        x_train, y_train, x_test, y_test = digits(spec)
        return x_train.reshape(-1, 1, 8, 8), y_train, x_test.reshape(-1, 1, 8, 8), y_test

    def build_model(self, spec: dict[str, Any], x_train: torch.Tensor, classes: int) -> nn.Module:
        channels, width = 8, spec.get("hidden") or 64
        return nn.Sequential(nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(), nn.Flatten(),
                             nn.Linear(channels * 8 * 8, width), nn.ReLU(), nn.Linear(width, classes))


class DigitsModel:
    """A loader class of the team's own for a serve job (``model.entrypoint: "mywork:DigitsModel"``, with
    ``code: .``): it reads DigitsWorkload's weights from model.pt and answers with numpy. Only needed for a model
    that torch.export cannot trace; DigitsWorkload's is served without it (serve.yaml)."""

    input_shape = (64,)
    input_dtype = "float32"
    output_shape = (10,)

    def load(self, path: Path) -> None:
        state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
        self.model = digits_net(int(state["0.weight"].shape[0]))
        self.model.load_state_dict(state)
        self.model.eval()

    def predict(self, batch: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.model(torch.from_numpy(np.asarray(batch, dtype=np.float32))).numpy()
