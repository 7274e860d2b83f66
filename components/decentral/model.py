"""The model a swarm trains and the text it reads (node side: torch).

The model is train's :class:`~components.train.workloads.TinyGPT` (a GPT-style character model); a swarm runs it
as a list of **layers** -- the input embedding, each transformer block, the head -- which is the unit that
layer swapping (:mod:`components.decentral.swap`) moves between host and device memory and that the
pipeline-parallel baseline splits into stages. The text is the corpus bundled with train (CPython docstrings),
last 10 % held out; each peer reads its own random windows, drawn from ``(seed, peer, step)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from components.train.workloads import (
    CORPUS_PATH,
    VOCABULARY,
    Head,
    InputEmbedding,
    TinyGPT,
    derive_seed,
    encode,
)

# Model sizes by name: width, heads, layers (context 64, the 96-character vocabulary).
SIZES: dict[str, dict[str, int]] = {
    "tiny": {"width": 64, "heads": 4, "layers": 2},
    "small": {"width": 128, "heads": 4, "layers": 4},
    "medium": {"width": 256, "heads": 8, "layers": 6},
    "large": {"width": 384, "heads": 8, "layers": 8},
}
CONTEXT = 64


@dataclass(frozen=True)
class ModelConfig:
    width: int = 64
    heads: int = 4
    layers: int = 2
    context: int = CONTEXT
    vocabulary: int = len(VOCABULARY)

    @classmethod
    def named(cls, size: str, **overrides: Any) -> ModelConfig:
        if size not in SIZES:
            raise ValueError(f"unknown model size {size!r}; one of {', '.join(SIZES)}")
        return cls(**{**SIZES[size], **overrides})

    def as_dict(self) -> dict[str, int]:
        return {"width": self.width, "heads": self.heads, "layers": self.layers, "context": self.context,
                "vocabulary": self.vocabulary}


def build_model(config: ModelConfig, seed: int = 0) -> TinyGPT:
    """The model with weights drawn from ``seed`` (every peer of a swarm starts from the same weights)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "init"))
        return TinyGPT(config.vocabulary, config.context, config.width, config.heads, config.layers)


def model_layers(model: TinyGPT) -> list[nn.Module]:
    """The model as its swap units, in order: embedding, each block, head. They share the model's parameters,
    and their composition is ``model.forward``."""
    return [InputEmbedding(model.tokens, model.positions), *model.blocks, Head(model.norm, model.head)]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class Corpus:
    """The bundled text as token windows: ``batch(peer, step, size)`` is a pure function of
    ``(seed, peer, step)``; :meth:`heldout` is a fixed evaluation batch from the last 10 %."""

    test_fraction = 0.1

    def __init__(self, seed: int = 0, context: int = CONTEXT, device: torch.device | str = "cpu"):
        self.seed, self.context, self.device = int(seed), int(context), torch.device(device)
        tokens = encode(CORPUS_PATH.read_text(encoding="utf-8"))
        split = int(len(tokens) * (1 - self.test_fraction))
        self.train_tokens, self.test_tokens = tokens[:split], tokens[split:]

    def _windows(self, text: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = starts.view(-1, 1) + torch.arange(self.context + 1)
        chunk = text[rows]
        return chunk[:, :-1].to(self.device), chunk[:, 1:].to(self.device)

    def batch(self, peer: str | int, step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = torch.Generator().manual_seed(derive_seed(self.seed, "batch", str(peer), int(step)))
        starts = torch.randint(0, len(self.train_tokens) - self.context - 1, (int(size),), generator=rng)
        return self._windows(self.train_tokens, starts)

    def heldout(self, windows: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
        available = (len(self.test_tokens) - 1) // self.context
        starts = self.context * torch.arange(min(available, int(windows)))
        return self._windows(self.test_tokens, starts)


@torch.no_grad()
def evaluate(model: nn.Module, corpus: Corpus, windows: int = 64) -> float:
    """Held-out loss (nats per character) of ``model``."""
    was_training = model.training
    model.eval()
    inputs, targets = corpus.heldout(windows)
    loss = float(lm_loss(model(inputs), targets))
    model.train(was_training)
    return loss


def parameter_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())
