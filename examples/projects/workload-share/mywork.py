"""A team's own model as a Strata `Workload`: Strata's loop drives it one optimizer step at a time, so it
checkpoints, resumes after a preemption and reports metrics without code of its own, on a share of a GPU.

    strata submit job.yaml --wait       # one job on half a GPU (code: . ships this directory)
    strata submit sweep.yaml --wait     # a tune sweep of it: Fluid water-fills the trials' shares
    strata submit sms.yaml --wait       # DigitsClassification on two workers, one slowed, under SMS

The Workload API (components.train.workloads.Workload) is what the research mechanisms that step the training
need (docs/projects.md lists which); a plain script runs as a command job instead (../ddp-torchrun).
"""

from __future__ import annotations

from typing import Any

import torch
from sklearn.datasets import load_digits
from torch import nn

from components.train.workloads import ClassificationWorkload, Workload, generator, make_optimizer


class DigitsWorkload(Workload):
    """A two-layer network on scikit-learn's bundled handwritten digits."""

    name = "team-digits"

    def setup(self, spec: dict[str, Any], device: torch.device) -> None:
        self.spec, self.device = spec, torch.device(device)
        digits = load_digits()
        x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
        y = torch.tensor(digits.target)
        order = torch.randperm(len(x), generator=generator(spec["seed"], "split"))
        train, test = order[:1500], order[1500:]
        self.x, self.y = x[train].to(self.device), y[train].to(self.device)
        self.x_test, self.y_test = x[test].to(self.device), y[test].to(self.device)
        width = spec.get("hidden") or 96
        self.model = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 10)).to(self.device)
        self.optimizer = make_optimizer(self.model.parameters(), spec)
        self.batch_size = spec["batch_size"]

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
        digits = load_digits()
        x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
        y = torch.tensor(digits.target)
        order = torch.randperm(len(x), generator=generator(spec["seed"], "split"))
        train, test = order[:1500], order[1500:]
        return x[train], y[train], x[test], y[test]

    def build_model(self, spec: dict[str, Any], x_train: torch.Tensor, classes: int) -> nn.Module:
        width = spec.get("hidden") or 96
        return nn.Sequential(nn.Linear(x_train.shape[1], width), nn.ReLU(), nn.Linear(width, classes))
