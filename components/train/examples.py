"""Example user code for ``train`` jobs given as ``entrypoint``.

Two styles:

``entrypoint: "components.train.examples:linear_workload"``
    The function returns a :class:`Workload`; Strata drives it step by step (metrics, checkpoints, resume,
    stop requests and the ``model.pt`` artifact come for free). Options come from ``ctx.spec["options"]``.

``entrypoint: "components.train.examples:fit_line"``
    The function trains by itself and returns None. It must do its own reporting, checkpointing and stop
    handling through ``ctx``; this one shows how.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from components.runtime.contract.context import Context
from components.train.workloads import TorchWorkload, generator, make_optimizer


class LinearRegression(TorchWorkload):
    """Fit ``y = x @ w + b`` (``w``, ``b`` drawn from the seed) to noisy samples; reports mean squared error."""

    name: ClassVar[str] = "linear-regression"

    def __init__(self, features: int = 8, samples: int = 1024, noise: float = 0.1):
        self.features, self.samples, self.noise = features, samples, noise

    def setup(self, spec: dict[str, Any], device: torch.device) -> None:
        self.spec, self.device = spec, torch.device(device)
        rng = generator(spec["seed"], "data")
        self.true_weight = torch.randn(self.features, 1, generator=rng)
        self.true_bias = torch.randn(1, generator=rng)
        x = torch.randn(self.samples, self.features, generator=rng)
        y = x @ self.true_weight + self.true_bias + self.noise * torch.randn(self.samples, 1, generator=rng)
        self.x, self.y = x.to(self.device), y.to(self.device)
        self.batch_size = spec["batch_size"]
        self.model = self.init_model(spec, lambda: nn.Linear(self.features, 1))
        self.optimizer = make_optimizer(self.model.parameters(), spec)

    def steps_per_epoch(self) -> int:
        return math.ceil(self.samples / self.batch_size)

    def batch(self, epoch: int, index: int):
        order = torch.randperm(self.samples, generator=generator(self.spec["seed"], "order", epoch))
        rows = order[index * self.batch_size : (index + 1) * self.batch_size].to(self.device)
        return self.x[rows], self.y[rows]

    def train_step(self, batch) -> dict[str, Any]:
        inputs, targets = batch
        loss = F.mse_loss(self.model(inputs), targets)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return {"loss": loss.detach(), "samples": len(targets)}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        return {"test_loss": float(F.mse_loss(self.model(self.x), self.y))}


def linear_workload(ctx: Context) -> LinearRegression:
    """Entrypoint returning a Workload; ``options.features`` / ``options.samples`` size the problem."""
    options = ctx.spec.get("options") or {}
    return LinearRegression(
        features=int(options.get("features", 8)), samples=int(options.get("samples", 1024))
    )


def fit_line(ctx: Context) -> None:
    """Entrypoint that trains by itself: full-batch gradient descent on ``y = 2x - 1``, resumable."""
    spec = ctx.spec
    rng = generator(spec["seed"], "data")
    x = torch.linspace(-1, 1, 256).view(-1, 1)
    y = 2 * x - 1 + 0.05 * torch.randn(x.shape, generator=rng)
    weight = torch.zeros(1, requires_grad=True)
    bias = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.SGD([weight, bias], lr=spec["lr"])
    steps = spec["max_steps"] or 100 * spec["epochs"]

    step = 0
    state = ctx.restore()
    if state is not None:
        with torch.no_grad():
            weight.copy_(state["weight"])
            bias.copy_(state["bias"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
        ctx.log(f"resumed at step {step}")

    def save() -> None:
        state = {"weight": weight.detach(), "bias": bias.detach(), "optimizer": optimizer.state_dict()}
        ctx.checkpoint({**state, "step": step})

    while step < steps:
        if ctx.should_stop():
            save()
            return
        loss = F.mse_loss(x * weight + bias, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step % spec["log_every"] == 0 or step == steps:
            ctx.metrics({"loss": float(loss.detach())}, step)
        if step % spec["checkpoint_every"] == 0:
            save()
    ctx.log(f"fit y = {weight.item():.3f} x + {bias.item():.3f} in {steps} steps")
