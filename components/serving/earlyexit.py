"""An early-exit network for the serving zoo: a model whose run time depends on what the input *is*, not on its
shape (Orloj's premise: BranchyNet, DeeBERT and the like skip layers for easy inputs).

:class:`EarlyExitMLP` is a stack of ``blocks`` residual blocks of width ``hidden``, with a classifier (an *exit*)
after each. In training every exit learns (the loss is the mean of the exits' losses). In inference a row leaves
at the first exit whose softmax confidence reaches ``threshold`` (the last exit answers the rest), and only the
rows still inside run the next block: a batch takes as long as its deepest row. Every request is 64 features,
so no feature of the request tells how deep it will go; only running it does.

:class:`EarlyExitDigits` trains it on scikit-learn's bundled digits, each image corrupted by a hidden severity
(:data:`SEVERITIES`: clean, noisy, or noisy and partly blanked) drawn per sample from the seed. Clean digits
leave at the first exit, heavily corrupted ones run to the last, so the exit depth, and with it the run time, is
multi-modal. Train it with ``entrypoint: "components.serving.earlyexit:early_exit_workload"``; a ``serve`` job
rebuilds it from its ``model.pt`` like a built-in workload (:data:`ZOO`, used by
:func:`components.serving.model.load_served_model`): no code of the team's runs.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from components.train.workloads import ClassificationWorkload, _weight_shape, generator

NAME = "early-exit-digits"
ENTRYPOINT = "components.serving.earlyexit:early_exit_workload"
# (share of the samples, Gaussian noise sigma, share of the pixels blanked): the hidden difficulty of a sample.
SEVERITIES: tuple[tuple[float, float, float], ...] = ((0.5, 0.0, 0.0), (0.2, 0.45, 0.0), (0.3, 0.9, 0.5))
DEFAULTS = {"hidden": 1536, "blocks": 4, "threshold": 0.9}


class EarlyExitMLP(nn.Module):
    """``features`` -> ``hidden`` (the stem), then ``blocks`` residual blocks each followed by an exit classifier
    to ``classes``. ``forward`` in training mode gives the last exit's logits (:meth:`exits` gives all); in eval
    mode each row leaves at its first exit with confidence >= ``threshold`` (see the module's doc), and
    :attr:`depths` counts the rows that left at each exit since the last :meth:`reset_depths`."""

    def __init__(self, features: int, hidden: int, classes: int, blocks: int, threshold: float):
        super().__init__()
        if blocks < 1:
            raise ValueError(f"blocks must be at least 1, got {blocks}")
        self.stem = nn.Linear(features, hidden)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, hidden), nn.GELU())
                                    for _ in range(blocks))
        self.heads = nn.ModuleList(nn.Linear(hidden, classes) for _ in range(blocks))
        self.threshold = float(threshold)
        self.depths = [0] * blocks

    def reset_depths(self) -> None:
        self.depths = [0] * len(self.blocks)

    def exits(self, inputs: torch.Tensor) -> list[torch.Tensor]:
        """Every exit's logits for every row (training, and to study the exits)."""
        h = F.gelu(self.stem(inputs))
        found = []
        for block, head in zip(self.blocks, self.heads, strict=True):
            h = h + block(h)
            found.append(head(h))
        return found

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.training:
            return self.exits(inputs)[-1]
        h = F.gelu(self.stem(inputs))
        output = torch.empty((inputs.shape[0], self.heads[0].out_features), dtype=h.dtype, device=h.device)
        rows = torch.arange(inputs.shape[0], device=h.device)
        last = len(self.blocks) - 1
        for depth, (block, head) in enumerate(zip(self.blocks, self.heads, strict=True)):
            h = h + block(h)
            logits = head(h)
            if depth == last:
                output[rows] = logits
                self.depths[depth] += int(rows.numel())
                break
            leave = logits.softmax(dim=1).amax(dim=1) >= self.threshold
            count = int(leave.sum())  # one synchronization per exit: the rows that stay decide the next block
            if count:
                output[rows[leave]] = logits[leave]
                self.depths[depth] += count
                if count == rows.numel():
                    break
                stay = ~leave
                rows, h = rows[stay], h[stay]
        return output


def corrupt(features: torch.Tensor, rng: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``features`` (pixels in [0, 1]) each corrupted by a severity drawn from :data:`SEVERITIES`; also returns
    each row's severity index (what no request carries: for the benchmark's study of the exits only)."""
    shares = torch.tensor([share for share, _, _ in SEVERITIES])
    severity = torch.multinomial(shares, len(features), replacement=True, generator=rng)
    sigma = torch.tensor([noise for _, noise, _ in SEVERITIES])[severity].unsqueeze(1)
    blank = torch.tensor([blanked for _, _, blanked in SEVERITIES])[severity].unsqueeze(1)
    noise = torch.randn(features.shape, generator=rng)
    kept = (torch.rand(features.shape, generator=rng) >= blank).to(features.dtype)
    return ((features * kept + sigma * noise).clamp(-2.0, 3.0)).to(torch.float32), severity


class EarlyExitDigits(ClassificationWorkload):
    """:class:`EarlyExitMLP` on corrupted digits (:func:`corrupt`), 20 % of the images held out; the width is
    the spec's ``hidden``, the depth and the exits' confidence threshold the constructor's."""

    name: ClassVar[str] = NAME
    test_fraction: ClassVar[float] = 0.2
    copies: ClassVar[int] = 4  # each image appears with this many corruptions (7,188 samples)

    def __init__(self, blocks: int = DEFAULTS["blocks"], threshold: float = DEFAULTS["threshold"]):
        self.blocks, self.threshold = int(blocks), float(threshold)

    def load_data(self, spec):
        from sklearn.datasets import load_digits  # bundled with scikit-learn: no download

        digits = load_digits()
        clean = torch.tensor(digits.data, dtype=torch.float32) / 16.0
        labels = torch.tensor(digits.target, dtype=torch.long)
        order = torch.randperm(len(labels), generator=generator(spec["seed"], "split"))
        test_count = int(len(labels) * self.test_fraction)
        parts = []
        for part, rows in (("test", order[:test_count]), ("train", order[test_count:])):
            rng = generator(spec["seed"], "corrupt", part)
            images = clean[rows].repeat(self.copies, 1)
            features, _ = corrupt(images, rng)
            parts.append((features, labels[rows].repeat(self.copies)))
        (x_test, y_test), (x_train, y_train) = parts
        return x_train, y_train, x_test, y_test

    def architecture(self, spec, x_train, classes):
        return {"features": int(x_train.shape[1]), "hidden": int(spec["hidden"]), "classes": int(classes),
                "blocks": self.blocks, "threshold": self.threshold}

    @classmethod
    def from_config(cls, config):
        return EarlyExitMLP(int(config["features"]), int(config["hidden"]), int(config["classes"]),
                            int(config["blocks"]), float(config["threshold"]))

    @classmethod
    def describe_io(cls, config):
        return ({"shape": [int(config["features"])], "dtype": "float32", "limit": 0},
                {"shape": [int(config["classes"])], "dtype": "float32"})

    @classmethod
    def config_from_weights(cls, state):
        hidden, features = _weight_shape(state, "stem.weight", 2)
        classes, _ = _weight_shape(state, "heads.0.weight", 2)
        blocks = len({name.split(".")[1] for name in state if name.startswith("heads.")})
        return {"features": features, "hidden": hidden, "classes": classes, "blocks": blocks,
                "threshold": DEFAULTS["threshold"]}

    def backward(self, batch):
        """Every exit learns: the loss is the mean of the exits' cross-entropies."""
        inputs, targets, *_ = batch
        self.model.train()
        exits = self.model.exits(inputs)
        loss = sum(F.cross_entropy(logits, targets) for logits in exits) / len(exits)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        accuracy = (exits[-1].detach().argmax(dim=1) == targets).float().mean()
        return {"loss": loss.detach(), "accuracy": accuracy, "samples": len(targets)}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """The early-exit inference's accuracy and mean depth (in blocks) on the held-out samples."""
        values = super().evaluate()
        model: EarlyExitMLP = self.model  # type: ignore[assignment]
        model.reset_depths()
        model.eval()
        for start in range(0, len(self.x_test), self.eval_batch_size):
            model(self.x_test[start:start + self.eval_batch_size])
        total = max(1, sum(model.depths))
        values["mean_exit"] = sum((depth + 1) * count for depth, count in enumerate(model.depths)) / total
        model.reset_depths()
        return values


def early_exit_workload(ctx) -> EarlyExitDigits:
    """The ``train`` entrypoint: ``options.blocks`` (default 4) and ``options.threshold`` (default 0.9); the
    width is the spec's ``hidden``."""
    options = ctx.spec.get("options") or {}
    return EarlyExitDigits(blocks=int(options.get("blocks", DEFAULTS["blocks"])),
                           threshold=float(options.get("threshold", DEFAULTS["threshold"])))


# The serving side's own zoo: model.pt workload names (the workload's, or the entrypoint a train job ran) whose
# model this component rebuilds from the file's config, as the train component does for its built-in ones.
ZOO: dict[str, type[ClassificationWorkload]] = {NAME: EarlyExitDigits, ENTRYPOINT: EarlyExitDigits}


def mean_depth(depths: list[int]) -> float:
    total = sum(depths)
    return math.nan if not total else sum((index + 1) * count for index, count in enumerate(depths)) / total
