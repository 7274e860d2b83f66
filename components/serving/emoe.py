"""eMoE for served mixture-of-experts models: only the experts upcoming requests are predicted to need stay on the
device, within a byte budget.

An :class:`ExpertPlacement` takes the experts out of a model's MoE layers (modules with ``experts``, ``layer``
and a ``placement`` hook, e.g. ``components.train.workloads.MoEFeedForward``) and keeps them in host memory. The
rest of the model goes to the device as usual; the experts are copied there one by one:

- **Prediction** (:meth:`ExpertPlacement.prepare`, before every batch): each layer's routing history is kept as an
  exponentially weighted share of the tokens each expert received (``decay`` per batch). The predicted set is the
  experts with the largest shares, taken greedily until the byte budget is full. Resident experts outside it are
  dropped, and predicted ones are loaded (prefetched) before the batch runs.
- **A miss** (a token routed to an expert that is not resident): with ``miss="load"`` (the default) the expert is
  loaded on demand, evicting the least recently used residents to stay within the budget, so outputs are exactly
  those of the full model. With ``miss="reroute"`` the token goes to its best-scoring resident expert of that layer
  instead (no load: faster, approximate); that is what trades memory for perplexity.
- **Accounting**: resident bytes never exceed the budget (asserted after every change), token hits and misses,
  on-demand loads and prefetches, rerouted tokens.

The experts' own weights are never changed; a copy on the device is a real copy of the host tensors.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from typing import Any

import torch
from torch import nn

MISS_POLICIES = ("load", "reroute")


def _bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters()) + sum(
        b.numel() * b.element_size() for b in module.buffers())


def moe_layers(model: nn.Module) -> list[nn.Module]:
    """The model's MoE layers: modules with an ``experts`` list, a ``layer`` index and a ``placement`` hook."""
    return [module for module in model.modules()
            if hasattr(module, "placement") and isinstance(getattr(module, "experts", None), nn.ModuleList)]


class ExpertPlacement:
    """Keeps ``model``'s experts in host memory and at most ``budget_bytes`` of them on ``device``."""

    def __init__(self, model: nn.Module, budget_bytes: int, *, miss: str = "load", decay: float = 0.9):
        if miss not in MISS_POLICIES:
            raise ValueError(f"unknown miss policy {miss!r}: use one of {', '.join(MISS_POLICIES)}")
        self.layers = moe_layers(model)
        if not self.layers:
            raise ValueError("the model has no mixture-of-experts layers: eMoE applies to moe-gpt models only")
        self.miss = miss
        self.decay = float(decay)
        self.device = torch.device("cpu")
        self.host: dict[tuple[int, int], nn.Module] = {}
        for layer in self.layers:
            for index, expert in enumerate(layer.experts):
                self.host[(layer.layer, index)] = expert.eval()
            layer.experts = nn.ModuleList()  # off the model: model.to(device) no longer moves them
            layer.placement = self
        self.expert_bytes = {key: _bytes(module) for key, module in self.host.items()}
        self.total_bytes = sum(self.expert_bytes.values())
        largest = max(self.expert_bytes.values())
        if budget_bytes < largest:
            raise ValueError(f"the expert budget of {budget_bytes} bytes cannot hold one expert ({largest} bytes)")
        self.budget_bytes = int(budget_bytes)
        self.resident: OrderedDict[tuple[int, int], nn.Module] = OrderedDict()  # least recently used first
        self.shares = {layer.layer: torch.full((layer.count,), 1.0 / layer.count) for layer in self.layers}
        self._batch_counts: dict[int, torch.Tensor] = {}
        self._lock = threading.Lock()
        self.hits = self.misses = self.loads = self.prefetches = self.rerouted = 0
        self.peak_bytes = 0  # the most ever resident at once

    # -- residency ---------------------------------------------------------------------------------------------
    @property
    def resident_bytes(self) -> int:
        return sum(self.expert_bytes[key] for key in self.resident)

    def __deepcopy__(self, memo: dict) -> ExpertPlacement:
        # A copy of the model (a memory profile's, say) consults the same experts: they are not the module's.
        return self

    def to_device(self, device: Any) -> None:
        """Serve on ``device`` (the executor's): residents are copied there anew, and the counts start over (a
        memory profile may have run the model before)."""
        with self._lock:
            self.device = torch.device(device)
            self.resident.clear()
            self._batch_counts = {}
            self.hits = self.misses = self.loads = self.prefetches = self.rerouted = 0
            self.peak_bytes = 0

    def _load(self, key: tuple[int, int]) -> nn.Module:
        while self.resident and self.resident_bytes + self.expert_bytes[key] > self.budget_bytes:
            self.resident.popitem(last=False)
        module = copy.deepcopy(self.host[key]).to(self.device)
        self.resident[key] = module
        resident = self.resident_bytes
        assert resident <= self.budget_bytes
        self.peak_bytes = max(self.peak_bytes, resident)
        return module

    def predicted(self) -> list[tuple[int, int]]:
        """The experts to keep: the largest predicted shares of their layer's tokens, until the budget is full."""
        ranked = sorted(((float(share), (layer, index)) for layer, shares in self.shares.items()
                         for index, share in enumerate(shares)), reverse=True)
        chosen, used = [], 0
        for _, key in ranked:
            if used + self.expert_bytes[key] <= self.budget_bytes:
                chosen.append(key)
                used += self.expert_bytes[key]
        return chosen

    def prepare(self) -> None:
        """Before a batch: fold the last batch's routing into the shares, then make the predicted set resident."""
        with self._lock:
            for layer, counts in self._batch_counts.items():
                total = float(counts.sum())
                if total > 0:
                    self.shares[layer] = self.decay * self.shares[layer] + (1 - self.decay) * counts / total
            self._batch_counts = {}
            wanted = self.predicted()
            for key in [key for key in self.resident if key not in wanted]:
                del self.resident[key]
            for key in wanted:
                if key not in self.resident:
                    self._load(key)
                    self.prefetches += 1

    # -- the layer's hooks ---------------------------------------------------------------------------------------
    def route(self, layer: nn.Module, choice: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        counts = torch.bincount(choice.detach().cpu(), minlength=layer.count).float()
        with self._lock:
            self._batch_counts[layer.layer] = self._batch_counts.get(layer.layer, torch.zeros(layer.count)) + counts
            here = [index for (number, index) in self.resident if number == layer.layer]
        present = torch.zeros(layer.count, dtype=torch.bool, device=choice.device)
        if here:
            present[torch.tensor(here, device=choice.device)] = True
        hit = present[choice]
        hits = int(hit.sum())
        self.hits += hits
        self.misses += int(choice.numel()) - hits
        if self.miss == "reroute" and here and hits < choice.numel():
            masked = probs.masked_fill(~present.unsqueeze(0), float("-inf"))
            best = masked.argmax(dim=-1)
            self.rerouted += int(choice.numel()) - hits
            choice = torch.where(hit, choice, best)
        return choice

    def expert(self, layer: nn.Module, index: int) -> nn.Module:
        key = (layer.layer, index)
        with self._lock:
            module = self.resident.get(key)
            if module is not None:
                self.resident.move_to_end(key)
                return module
            self.loads += 1
            return self._load(key)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            resident = sorted(self.resident)
            tokens = self.hits + self.misses
            return {"resident_bytes": self.resident_bytes, "budget_bytes": self.budget_bytes,
                    "peak_bytes": self.peak_bytes,
                    "total_bytes": self.total_bytes, "resident_fraction": self.resident_bytes / self.total_bytes,
                    "resident_experts": len(resident), "experts": len(self.host),
                    "resident": [list(key) for key in resident],
                    "hit_rate": self.hits / tokens if tokens else None, "hits": self.hits, "misses": self.misses,
                    "loads": self.loads, "prefetches": self.prefetches, "rerouted": self.rerouted,
                    "miss_policy": self.miss}


class Perplexity:
    """Running perplexity of a language model's requests under the served model: each row's own next tokens
    (``tokens[:, 1:]``) scored by the logits it got (``logits[:, :-1]``)."""

    def __init__(self):
        self.nll = 0.0
        self.tokens = 0
        self._lock = threading.Lock()

    def add(self, tokens: torch.Tensor, logits: torch.Tensor) -> None:
        if tokens.dim() != 2 or tokens.shape[1] < 2:
            return
        scores = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        nll = -scores.gather(-1, tokens[:, 1:].unsqueeze(-1).to(scores.device)).sum()
        with self._lock:
            self.nll += float(nll)
            self.tokens += int(tokens[:, 1:].numel())

    @property
    def value(self) -> float | None:
        import math

        with self._lock:
            return math.exp(self.nll / self.tokens) if self.tokens else None


__all__ = ["MISS_POLICIES", "ExpertPlacement", "Perplexity", "moe_layers"]
