"""Training workloads: a model, its data and its optimizer, advanced one step at a time.

A :class:`Workload` keeps all of its state in the object -- its own random generators included, never the
process-global ones -- so that a runtime can interleave the steps of several jobs in one process (on one GPU)
and still give each job exactly the results it would get alone. Data order is a pure function of
``(seed, epoch)``, which makes a run resumed from a checkpoint bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import abc
import hashlib
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from components.runtime.contract.data import prepare

CORPUS_PATH = Path(__file__).with_name("data") / "corpus.txt"


def derive_seed(seed: int, *parts: object) -> int:
    """A stable 63-bit seed for the random stream named by ``parts`` (e.g. ``("order", epoch)``)."""
    digest = hashlib.blake2b(repr((int(seed), *parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def generator(seed: int, *parts: object) -> torch.Generator:
    """A CPU generator seeded for the random stream named by ``parts``."""
    return torch.Generator().manual_seed(derive_seed(seed, *parts))


class Workload(abc.ABC):
    """One job's training state, advanced one optimizer step at a time.

    Lifecycle, driven by :class:`components.train.loop.TrainLoop`:

    1. ``Workload()`` -- cheap; nothing is built yet.
    2. :meth:`setup` once, with the normalized spec and the torch device: load or generate data, build the
       model and optimizer. Use generators seeded from ``spec["seed"]`` (see :func:`generator`), not the global
       RNG, so interleaved jobs do not disturb each other.
    3. :meth:`load_state_dict` when resuming from a checkpoint.
    4. Repeatedly ``train_step(batch(epoch, index))`` for ``index`` in ``range(steps_per_epoch())``;
       :meth:`evaluate` at the end of each epoch and of the run.
    5. :meth:`state_dict` whenever the loop checkpoints, :meth:`model_state` for the final model artifact.

    A workload also owns its model's two outside views: :meth:`stages` (the model as stage modules, for
    stage-preemptible training on a shared GPU) and :meth:`model_config` / :meth:`from_config` /
    :meth:`describe_io` (the architecture recorded in ``model.pt``, see :mod:`components.train.model_format`).

    ``batch(epoch, index)`` must depend only on ``(seed, epoch, index)``: that is what lets a resumed run pick
    up exactly where the checkpoint left off.
    """

    name: ClassVar[str] = "custom"
    # True when the model also takes shorter rows than the recorded input shape: any length from 1 to
    # ``input.shape[0]`` along the first row dimension, the output's first row dimension following it, and a row
    # right-padded to a longer length giving the same outputs on its own positions (a causal model). A server
    # may then batch rows of different lengths by padding them (components/serving).
    variable_length: ClassVar[bool] = False

    @abc.abstractmethod
    def setup(self, spec: dict[str, Any], device: torch.device) -> None:
        """Build data, model and optimizer on ``device``."""

    @abc.abstractmethod
    def steps_per_epoch(self) -> int:
        """Optimizer steps in one epoch (constant for the whole run)."""

    @abc.abstractmethod
    def batch(self, epoch: int, index: int) -> Any:
        """The ``index``-th batch of ``epoch``, already on the device."""

    @abc.abstractmethod
    def train_step(self, batch: Any) -> dict[str, Any]:
        """Run one optimizer step on ``batch``.

        Returns metrics as floats or 0-dim tensors (tensors avoid a device sync on every step): ``loss``,
        optionally ``accuracy``, and ``samples``, the number of examples in the batch.
        """

    def evaluate(self) -> dict[str, float]:
        """Held-out metrics (e.g. ``test_loss``, ``test_accuracy``). None by default."""
        return {}

    def end_epoch(self, epoch: int, evaluation: dict[str, float]) -> dict[str, float]:
        """Called by the loop after epoch ``epoch`` (0-based) was evaluated; returns more metrics to report for
        it (e.g. where its data came from). None by default."""
        return {}

    def finished(self) -> bool:
        """True ends the run early, after the current epoch (e.g. a target metric was reached). False by default;
        the answer must survive a resume (keep what decides it in :meth:`state_dict`)."""
        return False

    def close(self) -> None:  # noqa: B027 -- optional hook
        """Free what :meth:`setup` started (loader processes, open files); called once the run ends."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: model and optimizer state, any other mutable state."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def model_state(self) -> dict[str, Any]:
        """The trained weights saved as the ``model.pt`` artifact."""
        model = getattr(self, "model", None)
        return model.state_dict() if isinstance(model, nn.Module) else self.state_dict()

    # -- the model as stages (GPU sharing) --------------------------------------------------------------
    def stages(self) -> list[nn.Module]:
        """``self.model`` as an ordered list of stage modules whose composition is its forward.

        The stages share the model's layers (no copies), so training them trains the model; a runtime may
        cut them into contiguous groups and preempt the job between two of them
        (:mod:`components.gpushare.stages`). By default: what :func:`model_stages` gives.
        """
        model = getattr(self, "model", None)
        if not isinstance(model, nn.Module):
            raise TypeError(f"{type(self).__name__} has no model to split into stages")
        return model_stages(model)

    # -- the model as a self-describing artifact (components.train.model_format) ------------------------
    def model_config(self) -> dict[str, Any] | None:
        """The architecture of the set-up model: plain values (ints, strings, lists) from which
        :meth:`from_config` rebuilds it without the training data. None (the default): the model cannot be
        rebuilt outside this workload."""
        return None

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> nn.Module:
        """A fresh (untrained) model of the architecture ``config`` returned by :meth:`model_config`."""
        raise NotImplementedError(f"{cls.__name__} cannot rebuild its model from a config")

    @classmethod
    def describe_io(cls, config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """What one row of the model of ``config`` takes and gives: ``({"shape", "dtype", "limit"},
        {"shape", "dtype"})``, shapes without the batch dimension as lists, dtypes "float32" or "int64",
        ``limit`` the exclusive bound of int64 inputs (0 when there is none)."""
        raise NotImplementedError(f"{cls.__name__} does not describe its model's inputs")

    def serving_input(self) -> dict[str, Any] | None:
        """What one row of the set-up model (``self.model``) takes, for a model :meth:`from_config` cannot
        rebuild (a team's own): ``{"shape": [...], "dtype": "float32" | "int64", "limit": 0}`` (no batch
        dimension; ``limit`` the exclusive bound of int64 inputs, 0 when there is none). Given it, the train loop
        exports the trained model into ``model.pt`` (``torch.export``,
        :func:`components.train.model_format.export_program`), so that it is served without this class. None
        (the default): not exported."""
        return None

    @classmethod
    def config_from_weights(cls, state: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The :meth:`model_config` of a model whose weights are ``state``, read from their names and shapes.

        Only for ``model.pt`` files written before the format recorded the config (format 1); raises
        ValueError when the weights are not those of this workload's model.
        """
        raise ValueError(f"{cls.__name__} cannot infer its architecture from weights")


def model_stages(model: nn.Module) -> list[nn.Module]:
    """``model`` as stage modules: what its own ``stages()`` method returns if its class defines one, the
    layers of an ``nn.Sequential``, or else the whole model as one stage."""
    method = getattr(type(model), "stages", None)
    if callable(method) and not isinstance(method, nn.Module):
        return list(model.stages())
    if isinstance(model, nn.Sequential):
        return list(model)
    return [model]


def _weight_shape(state: dict[str, torch.Tensor], key: str, dims: int) -> tuple[int, ...]:
    tensor = state.get(key)
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != dims:
        raise ValueError(f"the weights have no {dims}-d tensor {key!r}")
    return tuple(tensor.shape)


def make_optimizer(parameters, spec: dict[str, Any]) -> torch.optim.Optimizer:
    """The optimizer named by ``spec["optimizer"]``: Adam, or SGD with momentum 0.9."""
    if spec["optimizer"] == "sgd":
        return torch.optim.SGD(parameters, lr=spec["lr"], momentum=0.9)
    if spec["optimizer"] == "adam":
        return torch.optim.Adam(parameters, lr=spec["lr"])
    raise ValueError(f"unknown optimizer {spec['optimizer']!r}")


class TorchWorkload(Workload):
    """A workload with one ``self.model`` and one ``self.optimizer``; subclasses build them in :meth:`setup`."""

    model: nn.Module
    optimizer: torch.optim.Optimizer

    def init_model(self, spec: dict[str, Any], build) -> nn.Module:
        """Call ``build()`` with the global RNG seeded from the spec, then restore the global RNG.

        Initialising on the CPU and then moving makes the initial weights the same on every device.
        """
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(spec["seed"], "init"))
            model = build()
        return model.to(self.device)

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "optimizer_class": type(self.optimizer).__name__}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the weights and the optimizer's state. The spec's hyperparameters win over the checkpoint's:
        the learning rate is this run's, and a checkpoint of another optimizer (a population-based-training
        trial that took another trial's weights with an explored config) gives the weights only."""
        self.model.load_state_dict(state["model"])
        if state.get("optimizer_class", type(self.optimizer).__name__) != type(self.optimizer).__name__:
            return
        rates = [group["lr"] for group in self.optimizer.param_groups]
        self.optimizer.load_state_dict(state["optimizer"])
        for group, rate in zip(self.optimizer.param_groups, rates, strict=True):
            group["lr"] = rate


class ClassificationWorkload(TorchWorkload):
    """Supervised classification of in-memory tensors, shuffled per epoch from ``(seed, epoch)``.

    Subclasses implement :meth:`load_data`, and either :meth:`build_model` or -- to make the model rebuildable
    from ``model.pt`` without the data -- :meth:`architecture`, :meth:`from_config` and :meth:`describe_io`.
    """

    eval_batch_size: ClassVar[int] = 1024

    @abc.abstractmethod
    def load_data(
        self, spec: dict[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return ``(x_train, y_train, x_test, y_test)`` on the CPU, deterministically from the spec."""

    def recipe(self, spec: dict[str, Any]) -> dict[str, Any] | None:
        """What :meth:`load_data` prepares for ``spec``, as a recipe (:mod:`components.runtime.contract.data`): jobs with
        equal recipes share one preparation (a sweep's trials, the jobs one device service hosts) and a data
        provider the job opted into (``spec.data``) may serve it. None (the default): prepared by each job."""
        return None

    def architecture(self, spec: dict[str, Any], x_train: torch.Tensor, classes: int) -> dict[str, Any] | None:
        """The :meth:`model_config` of the model for inputs shaped like ``x_train[0]``; None by default."""
        return None

    def build_model(self, spec: dict[str, Any], x_train: torch.Tensor, classes: int) -> nn.Module:
        """Build the (CPU) model for inputs shaped like ``x_train[0]``: by default ``from_config`` of
        :meth:`architecture`."""
        config = self.architecture(spec, x_train, classes)
        if config is None:
            raise NotImplementedError(f"{type(self).__name__} implements neither build_model nor architecture")
        return self.from_config(config)

    def model_config(self) -> dict[str, Any] | None:
        return getattr(self, "_config", None)

    def serving_input(self) -> dict[str, Any] | None:
        """One row of what the model takes: a training sample after :meth:`model_inputs` (its shape and dtype),
        so a team's own classifier is exported into ``model.pt`` and served without its class."""
        x_train = getattr(self, "x_train", None)
        if not isinstance(x_train, torch.Tensor) or len(x_train) == 0:
            return None
        row = self.model_inputs(x_train[:1])
        dtype = {torch.float32: "float32", torch.int64: "int64"}.get(row.dtype)
        return None if dtype is None else {"shape": list(row.shape[1:]), "dtype": dtype, "limit": 0}

    def setup(self, spec: dict[str, Any], device: torch.device) -> None:
        self.spec = spec
        self.device = torch.device(device)
        # Shared with every job that prepares the same recipe: read only.
        x_train, y_train, x_test, y_test = prepare(self.recipe(spec), lambda: self.load_data(spec),
                                                   spec.get("data"))
        classes = int(max(y_train.max(), y_test.max())) + 1
        self.x_train, self.y_train = x_train.to(self.device), y_train.to(self.device)
        self.x_test, self.y_test = x_test.to(self.device), y_test.to(self.device)
        self.batch_size = spec["batch_size"]
        # A subclass that builds its own model has no config that describes it.
        own_builder = type(self).build_model is not ClassificationWorkload.build_model
        self._config = None if own_builder else self.architecture(spec, x_train, classes)
        self.model = self.init_model(spec, lambda: self.build_model(spec, x_train, classes))
        self.optimizer = make_optimizer(self.model.parameters(), spec)
        self._order: tuple[int, torch.Tensor] | None = None

    def steps_per_epoch(self) -> int:
        return math.ceil(len(self.x_train) / self.batch_size)

    def _epoch_order(self, epoch: int) -> torch.Tensor:
        if self._order is None or self._order[0] != epoch:
            order = torch.randperm(len(self.x_train), generator=generator(self.spec["seed"], "order", epoch))
            self._order = (epoch, order.to(self.device))
        return self._order[1]

    def batch(self, epoch: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self._epoch_order(epoch)[index * self.batch_size : (index + 1) * self.batch_size]
        return self.x_train[rows], self.y_train[rows]

    def model_inputs(self, stored: torch.Tensor) -> torch.Tensor:
        """What the model takes for stored samples (by default the samples themselves; e.g. images kept as
        uint8 are scaled to floats here, per batch)."""
        return stored

    def train_step(self, batch: tuple[torch.Tensor, ...]) -> dict[str, Any]:
        values = self.backward(batch)
        self.apply_gradients()
        return values

    def backward(self, batch: tuple[torch.Tensor, ...]) -> dict[str, Any]:
        """The first half of :meth:`train_step`: forward and backward on ``batch``, leaving the gradients in the
        parameters (a distributed strategy exchanges them before :meth:`apply_gradients`). ``batch`` is
        ``(inputs, targets)`` or ``(inputs, targets, weights)``: with per-sample weights the loss is the weighted
        mean, so a batch reduced to representatives weighted by what each stands for estimates the full batch."""
        inputs, targets, *rest = batch
        self.model.train()
        logits = self.model(inputs)
        if rest:
            weights = rest[0].to(logits.dtype)
            loss = (F.cross_entropy(logits, targets, reduction="none") * weights).sum() / weights.sum()
        else:
            loss = F.cross_entropy(logits, targets)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        accuracy = (logits.detach().argmax(dim=1) == targets).float().mean()
        return {"loss": loss.detach(), "accuracy": accuracy, "samples": len(targets)}

    def apply_gradients(self) -> None:
        """The second half of :meth:`train_step`: the optimizer step."""
        self.optimizer.step()

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        self.model.eval()
        loss_sum = torch.zeros((), device=self.device)
        correct = torch.zeros((), device=self.device)
        for start in range(0, len(self.x_test), self.eval_batch_size):
            inputs = self.model_inputs(self.x_test[start : start + self.eval_batch_size])
            targets = self.y_test[start : start + self.eval_batch_size]
            logits = self.model(inputs)
            loss_sum += F.cross_entropy(logits, targets, reduction="sum")
            correct += (logits.argmax(dim=1) == targets).sum()
        count = len(self.x_test)
        return {"test_loss": float(loss_sum) / count, "test_accuracy": float(correct) / count}


class MLPDigits(ClassificationWorkload):
    """A two-hidden-layer MLP on scikit-learn's bundled 8x8 digits (1797 images), 20% held out."""

    name: ClassVar[str] = "mlp-digits"
    test_fraction: ClassVar[float] = 0.2

    def recipe(self, spec):
        return {"dataset": "sklearn-digits", "pipeline": "pixels / 16", "version": 1,
                "split": {"seed": spec["seed"], "test_fraction": self.test_fraction}}

    def load_data(self, spec):
        from sklearn.datasets import load_digits  # bundled with scikit-learn: no download

        digits = load_digits()
        features = torch.tensor(digits.data, dtype=torch.float32) / 16.0
        labels = torch.tensor(digits.target, dtype=torch.long)
        rows = torch.randperm(len(labels), generator=generator(spec["seed"], "split"))
        test_count = int(len(labels) * self.test_fraction)
        test, train = rows[:test_count], rows[test_count:]
        return features[train], labels[train], features[test], labels[test]

    def architecture(self, spec, x_train, classes):
        return {"features": int(x_train.shape[1]), "hidden": int(spec["hidden"]), "classes": int(classes)}

    @classmethod
    def from_config(cls, config):
        features, hidden, classes = (int(config[key]) for key in ("features", "hidden", "classes"))
        return nn.Sequential(
            nn.Linear(features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, classes),
        )

    @classmethod
    def describe_io(cls, config):
        return ({"shape": [int(config["features"])], "dtype": "float32", "limit": 0},
                {"shape": [int(config["classes"])], "dtype": "float32"})

    @classmethod
    def config_from_weights(cls, state):
        hidden, features = _weight_shape(state, "0.weight", 2)
        classes, _ = _weight_shape(state, "4.weight", 2)
        return {"features": features, "hidden": hidden, "classes": classes}


SHAPE_CLASSES: tuple[str, ...] = (
    "horizontal-stripes",
    "vertical-stripes",
    "diagonal-stripes",
    "disc",
    "square",
    "cross",
)


def synthetic_shapes(count: int, size: int, rng: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` noisy ``size``x``size`` grey images of :data:`SHAPE_CLASSES`, and their labels.

    Each image has a random frequency and phase (stripes) or centre and radius (shapes), a random contrast and
    Gaussian noise; all drawn from ``rng``, so the set is a pure function of the generator's seed.
    """

    def uniform(low: float, high: float) -> torch.Tensor:
        return low + (high - low) * torch.rand(count, 1, 1, generator=rng)

    labels = torch.randint(0, len(SHAPE_CLASSES), (count,), generator=rng)
    coords = (torch.arange(size, dtype=torch.float32) + 0.5) / size
    y, x = coords.view(1, size, 1), coords.view(1, 1, size)
    frequency, phase = uniform(1.5, 4.0), uniform(0.0, 2 * math.pi)
    cx, cy, radius = uniform(0.3, 0.7), uniform(0.3, 0.7), uniform(0.15, 0.3)
    dx, dy = (x - cx).abs(), (y - cy).abs()
    arm = radius / 3
    candidates = torch.stack(
        torch.broadcast_tensors(
            torch.sin(2 * math.pi * frequency * y + phase) > 0,
            torch.sin(2 * math.pi * frequency * x + phase) > 0,
            torch.sin(2 * math.pi * frequency * (x + y) / math.sqrt(2) + phase) > 0,
            dx**2 + dy**2 < radius**2,
            torch.maximum(dx, dy) < radius * 0.85,
            ((dx < arm) & (dy < radius)) | ((dy < arm) & (dx < radius)),
        )
    )  # (classes, count, size, size)
    images = candidates[labels, torch.arange(count)].float()
    images = images * uniform(0.6, 1.4) + 0.35 * torch.randn(count, size, size, generator=rng)
    return images.unsqueeze(1), labels


class CNNSynthetic(ClassificationWorkload):
    """A small two-block CNN on procedurally drawn stripes and shapes (6 classes, 16x16, generated in memory)."""

    name: ClassVar[str] = "cnn-synthetic"
    image_size: ClassVar[int] = 16
    train_count: ClassVar[int] = 4096
    test_count: ClassVar[int] = 512

    def recipe(self, spec):
        return {"dataset": "synthetic-shapes", "version": 1, "size": self.image_size, "seed": spec["seed"],
                "train": self.train_count, "test": self.test_count}

    def load_data(self, spec):
        x_train, y_train = synthetic_shapes(
            self.train_count, self.image_size, generator(spec["seed"], "train")
        )
        x_test, y_test = synthetic_shapes(self.test_count, self.image_size, generator(spec["seed"], "test"))
        return x_train, y_train, x_test, y_test

    def architecture(self, spec, x_train, classes):
        return {"in_channels": int(x_train.shape[1]), "size": int(x_train.shape[-1]), "hidden": int(spec["hidden"]),
                "classes": int(classes)}

    @classmethod
    def from_config(cls, config):
        in_channels, size, channels, classes = (
            int(config[key]) for key in ("in_channels", "size", "hidden", "classes")
        )
        return nn.Sequential(*cls.features(in_channels, channels), nn.Linear(2 * channels * (size // 4) ** 2, classes))

    @staticmethod
    def features(in_channels: int, channels: int) -> list[nn.Module]:
        """The convolutional part, up to and including the Flatten: two conv-ReLU-pool blocks."""
        return [nn.Conv2d(in_channels, channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten()]

    @classmethod
    def describe_io(cls, config):
        size = int(config["size"])
        return ({"shape": [int(config["in_channels"]), size, size], "dtype": "float32", "limit": 0},
                {"shape": [int(config["classes"])], "dtype": "float32"})

    @classmethod
    def config_from_weights(cls, state):
        channels, in_channels, _, _ = _weight_shape(state, "0.weight", 4)
        classes, _ = _weight_shape(state, "7.weight", 2)
        # The image size leaves no unambiguous trace in the weights; it is fixed by the workload.
        return {"in_channels": in_channels, "size": cls.image_size, "hidden": channels, "classes": classes}


class CNNWideFC(CNNSynthetic):
    """cnn-synthetic's data and convolutions under large fully connected layers (VGG/AlexNet-like: most
    parameters, and so most gradient traffic, sit in the FC layers, most computation in the convolutions).
    ``options``-free: ``hidden`` sets the first conv's channels; the FC layers are ``fc_width`` wide."""

    name: ClassVar[str] = "cnn-fc"
    fc_width: ClassVar[int] = 512

    def architecture(self, spec, x_train, classes):
        return {**super().architecture(spec, x_train, classes), "fc": self.fc_width}

    @classmethod
    def from_config(cls, config):
        in_channels, size, channels, classes, width = (
            int(config[key]) for key in ("in_channels", "size", "hidden", "classes", "fc")
        )
        return nn.Sequential(
            *cls.features(in_channels, channels),
            nn.Linear(2 * channels * (size // 4) ** 2, width),
            nn.ReLU(),
            nn.Linear(width, width),
            nn.ReLU(),
            nn.Linear(width, classes),
        )

    @classmethod
    def config_from_weights(cls, state):
        channels, in_channels, _, _ = _weight_shape(state, "0.weight", 4)
        width, _ = _weight_shape(state, "7.weight", 2)
        classes, _ = _weight_shape(state, "11.weight", 2)
        return {"in_channels": in_channels, "size": cls.image_size, "hidden": channels, "classes": classes,
                "fc": width}


# Characters of the tiny-gpt vocabulary: newline and printable ASCII. Anything else maps to "?".
VOCABULARY = "\n" + "".join(chr(code) for code in range(32, 127))


def encode(text: str) -> torch.Tensor:
    index = {ch: i for i, ch in enumerate(VOCABULARY)}
    unknown = index["?"]
    return torch.tensor([index.get(ch, unknown) for ch in text], dtype=torch.long)


def decode(tokens) -> str:
    return "".join(VOCABULARY[int(token)] for token in tokens)


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, width = x.shape
        q, k, v = self.qkv(x).view(batch, time, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(attended.transpose(1, 2).reshape(batch, time, width))


class Residual(nn.Module):
    """``x + inner(norm(x))``: one pre-norm residual half of a :class:`Block`, as a stage of its own.

    It holds the block's own layers (shared, not copied), so it computes exactly what the block does.
    """

    def __init__(self, norm: nn.Module, inner: nn.Module):
        super().__init__()
        self.norm, self.inner = norm, inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.inner(self.norm(x))


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = CausalSelfAttention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))

    def stages(self) -> list[nn.Module]:
        """The attention half and the feed-forward half, each ``x + f(norm(x))``: their composition is
        :meth:`forward`."""
        return [Residual(self.norm1, self.attention), Residual(self.norm2, self.mlp)]


def _embed(tokens: nn.Embedding, positions: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    steps = torch.arange(ids.shape[1], device=ids.device)
    return tokens(ids) + positions(steps)


class InputEmbedding(nn.Module):
    """The first stage of :class:`TinyGPT`: token plus position embeddings (the model's own layers)."""

    def __init__(self, tokens: nn.Embedding, positions: nn.Embedding):
        super().__init__()
        self.tokens, self.positions = tokens, positions

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return _embed(self.tokens, self.positions, ids)


class Head(nn.Module):
    """The last stage of :class:`TinyGPT`: the final norm and the output projection (the model's own layers)."""

    def __init__(self, norm: nn.Module, head: nn.Module):
        super().__init__()
        self.norm, self.head = norm, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(x))


class TinyGPT(nn.Module):
    """A GPT-style character model: token and position embeddings, pre-norm causal transformer blocks."""

    def __init__(self, vocabulary: int, context: int, width: int, heads: int, layers: int):
        super().__init__()
        self.context = context
        self.tokens = nn.Embedding(vocabulary, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocabulary)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = _embed(self.tokens, self.positions, tokens)
        return self.head(self.norm(self.blocks(x)))

    def stages(self) -> list[nn.Module]:
        """The model as stages sharing its layers: the embedding, each block's attention and feed-forward
        halves (finer stages, shorter preemption waits), the head. Their composition is :meth:`forward`."""
        halves = [stage for block in self.blocks for stage in block.stages()]
        return [InputEmbedding(self.tokens, self.positions), *halves, Head(self.norm, self.head)]

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, count: int, rng: torch.Generator | None = None) -> torch.Tensor:
        """Sample ``count`` tokens after the 1-D ``prompt``."""
        tokens = prompt.view(1, -1)
        for _ in range(count):
            logits = self(tokens[:, -self.context :])[0, -1]
            probabilities = torch.softmax(logits.float().cpu(), dim=0)
            following = torch.multinomial(probabilities, 1, generator=rng).to(tokens.device)
            tokens = torch.cat([tokens, following.view(1, 1)], dim=1)
        return tokens[0]


class TinyGPTWorkload(TorchWorkload):
    """Next-character prediction on ``data/corpus.txt`` (CPython docstrings), last 10% held out.

    An epoch visits every non-overlapping ``context``-long window of the training text once, in an order and
    with an offset drawn from ``(seed, epoch)``. ``accuracy`` is next-character accuracy.
    """

    name: ClassVar[str] = "tiny-gpt"
    variable_length: ClassVar[bool] = True  # causal: any context up to 64 tokens, padding on the right is exact
    context: ClassVar[int] = 64
    heads: ClassVar[int] = 4
    layers: ClassVar[int] = 2
    test_fraction: ClassVar[float] = 0.1
    eval_windows: ClassVar[int] = 128

    def setup(self, spec: dict[str, Any], device: torch.device) -> None:
        self.spec = spec
        self.device = torch.device(device)
        tokens = encode(CORPUS_PATH.read_text(encoding="utf-8"))
        split = int(len(tokens) * (1 - self.test_fraction))
        self.train_tokens = tokens[:split].to(self.device)
        self.test_tokens = tokens[split:].to(self.device)
        # Every epoch has the same number of windows, whatever its random offset.
        self.windows = (len(self.train_tokens) - 1) // self.context - 1
        if self.windows < 1:
            raise ValueError(f"corpus {CORPUS_PATH} is too short for a context of {self.context}")
        self.batch_size = spec["batch_size"]
        self._config = self.architecture(spec)
        self.model = self.init_model(spec, lambda: self.from_config(self._config))
        self.optimizer = make_optimizer(self.model.parameters(), spec)
        self._starts: tuple[int, torch.Tensor] | None = None

    def architecture(self, spec: dict[str, Any]) -> dict[str, Any]:
        """The model's config for ``spec`` (what ``model.pt`` records and :meth:`from_config` builds)."""
        return {"vocabulary": len(VOCABULARY), "context": self.context, "width": int(spec["hidden"]),
                "heads": self.heads, "layers": self.layers}

    def model_config(self) -> dict[str, Any] | None:
        return getattr(self, "_config", None)

    @classmethod
    def from_config(cls, config):
        return TinyGPT(*(int(config[key]) for key in ("vocabulary", "context", "width", "heads", "layers")))

    @classmethod
    def describe_io(cls, config):
        vocabulary, context = int(config["vocabulary"]), int(config["context"])
        return ({"shape": [context], "dtype": "int64", "limit": vocabulary},
                {"shape": [context, vocabulary], "dtype": "float32"})

    @classmethod
    def config_from_weights(cls, state):
        vocabulary, width = _weight_shape(state, "tokens.weight", 2)
        context, _ = _weight_shape(state, "positions.weight", 2)
        blocks = {int(key.split(".")[1]) for key in state if key.startswith("blocks.") and key.split(".")[1].isdigit()}
        # The head count leaves no trace in the weights' shapes; it is fixed by the workload.
        return {"vocabulary": vocabulary, "context": context, "width": width, "heads": cls.heads,
                "layers": 1 + max(blocks, default=-1)}

    def steps_per_epoch(self) -> int:
        return math.ceil(self.windows / self.batch_size)

    def _epoch_starts(self, epoch: int) -> torch.Tensor:
        if self._starts is None or self._starts[0] != epoch:
            rng = generator(self.spec["seed"], "order", epoch)
            offset = int(torch.randint(0, self.context, (1,), generator=rng))
            starts = offset + self.context * torch.randperm(self.windows, generator=rng)
            self._starts = (epoch, starts.to(self.device))
        return self._starts[1]

    def _windows(self, text: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = starts.view(-1, 1) + torch.arange(self.context + 1, device=self.device)
        chunk = text[rows]
        return chunk[:, :-1], chunk[:, 1:]

    def batch(self, epoch: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        starts = self._epoch_starts(epoch)[index * self.batch_size : (index + 1) * self.batch_size]
        return self._windows(self.train_tokens, starts)

    def train_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, Any]:
        inputs, targets = batch
        self.model.train()
        logits = self.model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        accuracy = (logits.detach().argmax(dim=-1) == targets).float().mean()
        return {"loss": loss.detach(), "accuracy": accuracy, "samples": len(targets)}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        self.model.eval()
        available = (len(self.test_tokens) - 1) // self.context
        starts = self.context * torch.arange(min(available, self.eval_windows), device=self.device)
        loss_sum = torch.zeros((), device=self.device)
        correct = torch.zeros((), device=self.device)
        for first in range(0, len(starts), self.batch_size):
            inputs, targets = self._windows(self.test_tokens, starts[first : first + self.batch_size])
            logits = self.model(inputs)
            loss_sum += F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum"
            )
            correct += (logits.argmax(dim=-1) == targets).sum()
        count = len(starts) * self.context
        return {"test_loss": float(loss_sum) / count, "test_accuracy": float(correct) / count}

    def sample(self, prompt: str, count: int = 200, seed: int = 0) -> str:
        """Generate ``count`` characters after ``prompt`` (for a quick look at what the model learned)."""
        tokens = self.model.generate(
            encode(prompt).to(self.device), count, torch.Generator().manual_seed(seed)
        )
        return decode(tokens)


class MoEFeedForward(nn.Module):
    """A top-1 routed mixture of feed-forward experts (Switch Transformer style).

    Each token goes to the expert its router scores highest, and the expert's output is scaled by that gate
    probability. ``aux_loss`` (after a forward) is the load-balancing loss ``experts * sum(fraction * mean prob)``;
    ``last_choice`` the expert each token went to.

    ``placement`` (None: every expert is this module's own) lets a server keep experts elsewhere:
    ``placement.route(self, choice, probs)`` may change the choice of a token (to an expert it has at hand) and
    ``placement.expert(self, index)`` returns the module to run for expert ``index`` (see
    ``components.serving.emoe``). ``layer`` is this module's index among the model's MoE layers.
    """

    def __init__(self, width: int, experts: int, layer: int = 0):
        super().__init__()
        self.layer = layer
        self.router = nn.Linear(width, experts)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
                                     for _ in range(experts))
        self.count = experts
        self.placement: Any = None
        self.aux_loss = torch.zeros(())
        self.last_choice = torch.zeros(0, dtype=torch.long)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        probs = torch.softmax(self.router(flat), dim=-1)
        gate, choice = probs.max(dim=-1)
        if self.placement is not None:
            choice = self.placement.route(self, choice, probs)
            gate = probs.gather(1, choice.view(-1, 1)).view(-1)
        out = torch.zeros_like(flat)
        for index in torch.unique(choice).tolist():
            rows = (choice == index).nonzero().view(-1)
            expert = self.experts[index] if self.placement is None else self.placement.expert(self, index)
            out.index_copy_(0, rows, expert(flat.index_select(0, rows)) * gate.index_select(0, rows).unsqueeze(1))
        if self.training:
            fraction = torch.bincount(choice, minlength=self.count).float() / max(1, choice.numel())
            self.aux_loss = self.count * (fraction * probs.mean(dim=0)).sum()
        self.last_choice = choice.detach()
        return out.view_as(x)


class MoEBlock(nn.Module):
    def __init__(self, width: int, heads: int, experts: int, layer: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = CausalSelfAttention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.moe = MoEFeedForward(width, experts, layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.moe(self.norm2(x))

    def stages(self) -> list[nn.Module]:
        return [Residual(self.norm1, self.attention), Residual(self.norm2, self.moe)]


class MoEGPT(TinyGPT):
    """:class:`TinyGPT` whose blocks' feed-forward halves are :class:`MoEFeedForward` mixtures of ``experts``."""

    def __init__(self, vocabulary: int, context: int, width: int, heads: int, layers: int, experts: int):
        super().__init__(vocabulary, context, width, heads, 0)
        self.blocks = nn.Sequential(*(MoEBlock(width, heads, experts, layer) for layer in range(layers)))

    def moe_layers(self) -> list[MoEFeedForward]:
        return [block.moe for block in self.blocks]


class MoEGPTWorkload(TinyGPTWorkload):
    """:class:`TinyGPTWorkload` with a mixture-of-experts model (:class:`MoEGPT`, ``experts`` experts per layer,
    top-1 routing): next-character prediction on the bundled corpus, plus ``aux_weight`` times the experts' load-
    balancing loss. Its ``model.pt`` is served like tiny-gpt's, and the serving plugin can keep only the experts
    that upcoming requests need on the device (eMoE)."""

    name: ClassVar[str] = "moe-gpt"
    experts: ClassVar[int] = 8
    aux_weight: ClassVar[float] = 0.01

    def architecture(self, spec: dict[str, Any]) -> dict[str, Any]:
        return {**super().architecture(spec), "experts": self.experts}

    @classmethod
    def from_config(cls, config):
        return MoEGPT(*(int(config[key]) for key in ("vocabulary", "context", "width", "heads", "layers", "experts")))

    @classmethod
    def config_from_weights(cls, state):
        config = super().config_from_weights(state)
        experts = {int(key.split(".")[4]) for key in state if ".moe.experts." in key}
        return {**config, "experts": 1 + max(experts, default=0)}

    def train_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, Any]:
        inputs, targets = batch
        self.model.train()
        logits = self.model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        aux = sum(layer.aux_loss for layer in self.model.moe_layers())
        self.optimizer.zero_grad(set_to_none=True)
        (loss + self.aux_weight * aux).backward()
        self.optimizer.step()
        accuracy = (logits.detach().argmax(dim=-1) == targets).float().mean()
        return {"loss": loss.detach(), "accuracy": accuracy, "samples": len(targets), "aux_loss": aux.detach()}


class CNNDataset(ClassificationWorkload):
    """A small CNN over a dataset the data seam streams (``spec.data.dataset``), augmented afresh each epoch.

    The epochs come from :func:`components.runtime.contract.data.open_epochs`: the data provider that owns the
    ``dataset`` option decides where each epoch's samples come from (preprocessed now by loader workers, read
    from a node cache, or a cached epoch reused: PerFect). Samples arrive as uint8 images and are scaled to
    [-1, 1] per batch on the device.
    """

    name: ClassVar[str] = "cnn-dataset"

    def setup(self, spec: dict[str, Any], device: torch.device) -> None:
        from components.runtime.contract.data import open_epochs

        self.spec = spec
        self.device = torch.device(device)
        self.batch_size = spec["batch_size"]
        self.log = getattr(self, "log", None)
        self.source = open_epochs(spec.get("data"), {"seed": spec["seed"], "epochs": spec["epochs"],
                                                     "device": str(self.device), "log": self.log})
        x_test, y_test = self.source.test()
        self.x_test, self.y_test = x_test.to(self.device), y_test.to(self.device)
        classes = int(self.source.classes)
        self._config = self.architecture(spec, x_test, classes)
        self.model = self.init_model(spec, lambda: self.from_config(self._config))
        self.optimizer = make_optimizer(self.model.parameters(), spec)
        self._order = None
        self._epoch_data: tuple[int, torch.Tensor, torch.Tensor] | None = None
        self._epoch_began: float | None = None
        self._eval_began: float | None = None
        self._waited = 0.0
        self._finished = False
        self._train_count = None

    def _data(self, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._epoch_data is None or self._epoch_data[0] != epoch:
            import time

            began = time.perf_counter()
            x, y = self.source.epoch(epoch)
            scale = float(self.source.lr_scale(epoch))
            for group in self.optimizer.param_groups:  # the source's schedule (PerFect's fine-tune phase)
                group["lr"] = self.spec["lr"] * scale
            self._epoch_data = (epoch, x.to(self.device), y.to(self.device))
            self._train_count = len(x)
            self._waited = time.perf_counter() - began
            self._epoch_began = time.perf_counter()
        return self._epoch_data[1], self._epoch_data[2]

    def steps_per_epoch(self) -> int:
        if self._train_count is None:
            x, _ = self._data(0) if self._epoch_data is None else self._epoch_data[1:]
            self._train_count = len(x)
        return math.ceil(self._train_count / self.batch_size)

    def _epoch_order(self, epoch: int) -> torch.Tensor:
        if self._order is None or self._order[0] != epoch:
            order = torch.randperm(self._train_count, generator=generator(self.spec["seed"], "order", epoch))
            self._order = (epoch, order.to(self.device))
        return self._order[1]

    def model_inputs(self, stored: torch.Tensor) -> torch.Tensor:
        return stored.float().div_(127.5).sub_(1.0)  # uint8 images to [-1, 1]

    def batch(self, epoch: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self._data(epoch)
        rows = self._epoch_order(epoch)[index * self.batch_size : (index + 1) * self.batch_size]
        return self.model_inputs(x[rows]), y[rows]

    def evaluate(self) -> dict[str, float]:
        import time

        self._eval_began = time.perf_counter()  # the epoch's compute ends here
        return super().evaluate()

    def end_epoch(self, epoch: int, evaluation: dict[str, float]) -> dict[str, float]:
        import time

        end = self._eval_began or time.perf_counter()
        compute = max(end - (self._epoch_began or end), 0.0)
        if self.source.after_epoch(epoch, compute, evaluation):
            self._finished = True
        return self.source.metrics(epoch)

    def finished(self) -> bool:
        return self._finished

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "source": self.source.state_dict(), "finished": self._finished}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.source.load_state_dict(state.get("source") or {})
        self._finished = bool(state.get("finished", False))

    def close(self) -> None:
        source = getattr(self, "source", None)
        if source is not None:
            source.close()

    def architecture(self, spec, x_train, classes):
        return {"in_channels": int(x_train.shape[1]), "size": int(x_train.shape[-1]), "hidden": int(spec["hidden"]),
                "classes": int(classes)}

    @classmethod
    def from_config(cls, config):
        in_channels, channels, classes = (int(config[key]) for key in ("in_channels", "hidden", "classes"))

        def block(inputs: int, outputs: int) -> list[nn.Module]:
            return [nn.Conv2d(inputs, outputs, 3, padding=1), nn.BatchNorm2d(outputs), nn.ReLU()]

        return nn.Sequential(
            *block(in_channels, channels), *block(channels, channels), nn.MaxPool2d(2),
            *block(channels, 2 * channels), *block(2 * channels, 2 * channels), nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * channels, classes),
        )

    @classmethod
    def describe_io(cls, config):
        size = int(config["size"])
        return ({"shape": [int(config["in_channels"]), size, size], "dtype": "float32", "limit": 0},
                {"shape": [int(config["classes"])], "dtype": "float32"})

    def load_data(self, spec):  # the data comes from the stream of epochs (setup), never from here
        raise NotImplementedError("cnn-dataset reads its data from spec.data.dataset's stream of epochs")


# Workloads other plugins build on this module's classes (the embeddings plugin's DLRMs), by "module:attribute"
# of a {name: Workload class} dict. Imported on first use of the table, never here: they import this module.
PLUGIN_WORKLOADS: tuple[str, ...] = ("components.embeddings.workload:WORKLOADS",)


class WorkloadTable(Mapping[str, type[Workload]]):
    """The built-in workloads by name: this module's, and on first use those :data:`PLUGIN_WORKLOADS` names."""

    def __init__(self, own: tuple[type[Workload], ...], plugins: tuple[str, ...]):
        self._table = {workload.name: workload for workload in own}
        self._plugins = plugins
        self._loaded = False

    def _all(self) -> dict[str, type[Workload]]:
        if not self._loaded:
            from components.runtime.contract.registry import import_path

            for path in self._plugins:
                for name, workload in import_path(path).items():
                    self._table.setdefault(name, workload)
            self._loaded = True
        return self._table

    def __getitem__(self, name: str) -> type[Workload]:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


BUILTIN_WORKLOADS: Mapping[str, type[Workload]] = WorkloadTable(
    (MLPDigits, CNNSynthetic, TinyGPTWorkload, MoEGPTWorkload, CNNDataset, CNNWideFC), PLUGIN_WORKLOADS)


def builtin_workload(name: str) -> Workload:
    try:
        return BUILTIN_WORKLOADS[name]()
    except KeyError:
        raise ValueError(
            f"unknown workload {name!r}; built-in: {', '.join(sorted(BUILTIN_WORKLOADS))}"
        ) from None
