"""Stanza: layer separation for CNNs whose parameters sit in their fully connected layers (Wu et al., IEEE TSC 2020).

Most ranks (*conv workers*) train only the convolutional part of the model, the rest (*FC workers*, the
``fc_workers`` option) only its fully connected part. One step:

1. Each conv worker runs its batch through the conv part and sends the activations, with the targets, to the FC
   worker that serves it (conv rank ``c`` is served by FC rank ``n_conv + c % fc_workers``).
2. Each FC worker runs the FC part on the activations of all the conv workers it serves at once, with the loss
   of the *whole* step's batch (the union of every conv worker's batch: its sum over the FC worker's rows divided
   by the union's size, which FC workers agree on with a tiny all-reduce when there are several). It sends every
   conv worker the gradient of that loss with respect to its activations, together with the step's loss and
   accuracy; FC workers sum their FC gradients (an all-reduce among FC workers only) and step.
3. Each conv worker back-propagates the received gradient through the conv part, the conv workers sum their conv
   gradients (an all-reduce among conv workers only) and step.

The activation gradients are already those of the union batch's loss, so the summed conv gradients, like the
summed FC gradients, are exactly the gradients of single-process training on the union batch: a Stanza step is a
synchronous SGD step (any per-parameter optimizer: SGD with momentum, Adam), only the traffic differs. Activations
(``batch x width`` floats each way per conv worker) and the small conv gradients cross the network; the large FC
gradients never do. :func:`stanza_bytes` and :func:`ddp_bytes` give both sides' bytes per iteration.

Every rank keeps the whole workload model (so the loop's evaluation and checkpoints work on rank 0); the parts
share its layers. :meth:`StanzaRuntime.synchronize` sends the FC part and its optimizer state from the first FC
worker to rank 0 (a conv worker, whose conv part is current), and merges both parts' optimizer state into the
workload's optimizer: a checkpoint is then a plain one of the whole model, resumable by Stanza (rank 0's model
and optimizer state are broadcast, and split, at the first step), by a single worker or by data parallelism.
"""

from __future__ import annotations

import collections
import time
from typing import Any, ClassVar

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from components.runtime.contract.distributed import StrategyRuntime, ring_allreduce_bytes
from components.straggler.stanza_strategy import DEFAULT_FC_WORKERS, roles

SPLIT_ERROR = "stanza needs a CNN with fully connected layers after a Flatten, e.g. cnn-fc"
HEATMAP_STEPS = 256  # rows of the step-time heat map in the report
RECENT_STEPS = 20  # the report's per-rank step_ms: mean over this many recent steps
HEADER = 3  # int64 values before a conv worker's activations: rows, width, 1 when per-sample weights follow
# float values after an FC worker's activation gradients: loss, correct, samples, its previous step's work ms
# and wall ms, its bytes sent this step, its FC compute ms, 1 when the previous step's times are known
META = 8
TELEMETRY = 3  # per rank, riding on the conv all-reduce: previous step's work ms and wall ms, this step's bytes
STATS = 4  # float64 values FC workers all-reduce: weighted loss sum, correct, weight sum, samples


def split_model(model: nn.Module) -> tuple[nn.Sequential, nn.Sequential]:
    """``(conv, fc)``: an ``nn.Sequential`` cut after its first ``nn.Flatten`` (the conv part ends with it). The
    parts share the model's layers (training them trains the model). Raises ValueError for any other model."""
    if not isinstance(model, nn.Sequential):
        raise ValueError(f"{SPLIT_ERROR}; this model is a {type(model).__name__}, not an nn.Sequential")
    layers = list(model)
    cut = next((index for index, layer in enumerate(layers) if isinstance(layer, nn.Flatten)), None)
    if cut is None:
        raise ValueError(f"{SPLIT_ERROR}; this nn.Sequential has no nn.Flatten")
    conv, fc = nn.Sequential(*layers[: cut + 1]), nn.Sequential(*layers[cut + 1 :])
    if not any(True for _ in conv.parameters()):
        raise ValueError(f"{SPLIT_ERROR}; nothing before its Flatten has parameters")
    if not any(True for _ in fc.parameters()):
        raise ValueError(f"{SPLIT_ERROR}; nothing after its Flatten has parameters")
    return conv, fc


def parameter_bytes(module: nn.Module) -> int:
    """Bytes of ``module``'s parameters (what a data-parallel all-reduce of its gradients carries)."""
    return sum(parameter.numel() * parameter.element_size() for parameter in module.parameters())


def ddp_bytes(model_bytes: int, world_size: int) -> int:
    """Bytes all ranks send in one data-parallel iteration: a ring all-reduce of every gradient on each rank."""
    return world_size * ring_allreduce_bytes(model_bytes, world_size)


def stanza_bytes(*, batch_size: int, width: int, conv_bytes: int, fc_bytes: int, world_size: int,
                 fc_workers: int = DEFAULT_FC_WORKERS, element: int = 4, weighted: bool = False) -> int:
    """Bytes all ranks send in one Stanza iteration with ``batch_size`` rows per conv worker and activations
    ``width`` wide (what :class:`StanzaRuntime` sends, exactly): per conv worker a header, its activations,
    targets (and weights) and its share of the conv all-reduce (gradients and a few telemetry values); per conv
    worker served, an FC worker's activation gradients and step metrics; per FC worker, when there are several,
    its share of the FC all-reduces (loss statistics and FC gradients)."""
    conv_count = world_size - fc_workers
    per_rows = width + 1 + int(weighted)
    conv_payload = conv_bytes + TELEMETRY * world_size * element
    conv_side = HEADER * 8 + batch_size * per_rows * element + ring_allreduce_bytes(conv_payload, conv_count)
    replies = (batch_size * width + META) * element
    fc_side = ring_allreduce_bytes(STATS * 8, fc_workers) + ring_allreduce_bytes(fc_bytes, fc_workers)
    return conv_count * (conv_side + replies) + fc_workers * fc_side


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([tensor.detach().reshape(-1) for tensor in tensors])


def _unflat(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    offset = 0
    for tensor in tensors:
        count = tensor.numel()
        tensor.copy_(flat[offset : offset + count].view_as(tensor))
        offset += count


def _state_bytes(state: Any) -> int:
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(_state_bytes(value) for value in state.values())
    if isinstance(state, list | tuple):
        return sum(_state_bytes(value) for value in state)
    return 8


class StanzaRuntime(StrategyRuntime):
    """One rank of a Stanza gang (see the module docstring): a conv worker (ranks ``0 .. W - fc_workers - 1``) or
    an FC worker (the rest)."""

    plugin: ClassVar[str | None] = "straggler"

    def __init__(self, ctx: Any, options: dict[str, Any], gang: Any):
        super().__init__(ctx, options, gang)
        self.fc_workers = int(options.get("fc_workers", DEFAULT_FC_WORKERS))
        self.conv_ranks, self.fc_ranks, self.server = roles(self.world_size, self.fc_workers)
        self.conv_count = len(self.conv_ranks)
        self.is_conv = self.rank < self.conv_count
        self.role = "conv" if self.is_conv else "fc"
        self.clients = [conv for conv, fc in self.server.items() if fc == self.rank]  # conv ranks an FC rank serves
        self.steps = 0
        self.width: int | None = None
        self._started = False
        self._waited = 0.0  # seconds of this step spent in communication calls (waiting for peers included)
        self._exchange = 0.0  # seconds of this step spent sending, receiving and all-reducing (link time included)
        self._sent = 0  # bytes this rank sent this step
        self._previous: tuple[float, float] | None = None  # this rank's last step: (work ms, wall ms)
        self._since: list[tuple[float, float]] = []  # this rank's steps since the last rank_metrics call
        self._heat: collections.deque[tuple[int, list[float]]] = collections.deque(maxlen=HEATMAP_STEPS)
        self._walls: collections.deque[list[float]] = collections.deque(maxlen=RECENT_STEPS)
        self._rank_bytes: list[int] | None = None  # every rank's bytes at the last step (rank 0)
        self._phases: collections.deque[tuple[float, float, float]] = collections.deque(maxlen=HEATMAP_STEPS)

    # -- setup -----------------------------------------------------------------------------------------------
    def setup(self, workload: Any) -> None:
        model = getattr(workload, "model", None)
        if not isinstance(model, nn.Module):
            raise ValueError(f"{SPLIT_ERROR}; this workload has no model")
        self.model = model
        self.conv, self.fc = split_model(model)
        self.part = self.conv if self.is_conv else self.fc
        self.optimizer = self._part_optimizer(workload, self.part)
        first = next(model.parameters())
        self.device, self.dtype = first.device, first.dtype
        self.element = first.element_size()
        self.conv_bytes, self.fc_bytes = parameter_bytes(self.conv), parameter_bytes(self.fc)
        linear = next((layer for layer in self.fc if isinstance(layer, nn.Linear)), None)
        self.width = int(linear.in_features) if linear is not None else None
        spec = getattr(workload, "spec", None) or getattr(self.ctx, "spec", None) or {}
        self.batch_size = int(getattr(workload, "batch_size", spec.get("batch_size", 1)))
        # Collective: every rank creates every group, in the same order.
        self.conv_group = dist.new_group(self.conv_ranks) if self.conv_count > 1 else None
        self.fc_group = dist.new_group(self.fc_ranks) if self.fc_workers > 1 else None

    def _part_optimizer(self, workload: Any, part: nn.Module) -> torch.optim.Optimizer:
        """An optimizer of ``part`` built like the workload's (its class and constructor settings), else the
        spec's (:func:`components.train.workloads.make_optimizer`)."""
        optimizer = getattr(workload, "optimizer", None)
        if isinstance(optimizer, torch.optim.Optimizer):
            return type(optimizer)(part.parameters(), **optimizer.defaults)
        from components.train.workloads import make_optimizer

        return make_optimizer(part.parameters(), getattr(workload, "spec", None) or self.ctx.spec)

    def _global_index(self, workload: Any) -> dict[int, int]:
        """``id(parameter)`` to its index in the workload optimizer's state (model order without one)."""
        optimizer = getattr(workload, "optimizer", None)
        if isinstance(optimizer, torch.optim.Optimizer):
            params = [param for group in optimizer.param_groups for param in group["params"]]
        else:
            params = list(self.model.parameters())
        return {id(param): index for index, param in enumerate(params)}

    def _ensure_started(self, workload: Any) -> None:
        """Collective, once: every rank takes rank 0's model (resumed or fresh) and its part of rank 0's optimizer
        state, so that a resume needs rank 0's checkpoint only."""
        if self._started:
            return
        self._started = True
        tensors = [param.data for param in self.model.parameters()]
        tensors += [buffer for buffer in self.model.buffers() if buffer.is_floating_point()]
        flat = _flat(tensors)
        dist.broadcast(flat, 0)
        if self.rank != 0:
            with torch.no_grad():
                _unflat(flat, tensors)
        optimizer = getattr(workload, "optimizer", None)
        state = [optimizer.state_dict() if self.rank == 0 and isinstance(optimizer, torch.optim.Optimizer)
                 and optimizer.state else None]
        dist.broadcast_object_list(state, src=0)
        if state[0] is not None:
            index = self._global_index(workload)
            mine = {index[id(param)]: local for local, param in enumerate(self.part.parameters())}
            own = self.optimizer.state_dict()
            self.optimizer.load_state_dict({
                "state": {mine[key]: value for key, value in state[0]["state"].items() if key in mine},
                "param_groups": own["param_groups"],
            })

    # -- the gang's data -------------------------------------------------------------------------------------
    def steps_per_epoch(self, steps: int) -> int:
        """Each step consumes one batch per conv worker (FC workers read no data)."""
        return max(1, steps // self.conv_count)

    def batch(self, workload: Any, epoch: int, index: int) -> Any:
        """A conv worker's batch: the workload's batch ``index * n_conv + rank``; an FC worker's: None (it gets
        the targets with the activations)."""
        if not self.is_conv:
            return None
        local = workload.steps_per_epoch()
        return workload.batch(epoch, min(index * self.conv_count + self.rank, local - 1))

    # -- a step ----------------------------------------------------------------------------------------------
    def train_step(self, workload: Any, batch: Any) -> dict[str, Any]:
        self._ensure_started(workload)
        began = time.perf_counter()
        self._waited = self._exchange = 0.0
        self._sent = 0
        values = self._conv_step(batch) if self.is_conv else self._fc_step()
        wall = time.perf_counter() - began
        self._previous = (1000 * (wall - self._waited), 1000 * wall)
        self._since.append(self._previous)
        self.steps += 1
        return values

    def _send(self, tensor: torch.Tensor, peer: int) -> None:
        self._transfer(tensor.numel() * tensor.element_size(), dist.send, tensor, peer)

    def _recv(self, tensor: torch.Tensor, peer: int) -> None:
        began = time.perf_counter()
        dist.recv(tensor, peer)
        self._account_wait(began)

    def _all_reduce(self, tensor: torch.Tensor, group: Any, members: int) -> None:
        nbytes = ring_allreduce_bytes(tensor.numel() * tensor.element_size(), members)
        self._transfer(nbytes, dist.all_reduce, tensor, group=group)

    def _transfer(self, nbytes: int, call, *args, **kwargs) -> None:
        began = time.perf_counter()
        self._sent += nbytes
        self.link.send(nbytes)  # the emulated link's time is this rank's own (work), not waiting
        sent = time.perf_counter()
        self._exchange += sent - began
        call(*args, **kwargs)
        self._account_wait(sent)

    def _account_wait(self, began: float) -> None:
        seconds = time.perf_counter() - began
        self._waited += seconds
        self._exchange += seconds

    def _conv_step(self, batch: Any) -> dict[str, Any]:
        inputs, targets, *rest = batch
        weights = rest[0] if rest else None
        rows = len(targets)
        self.slowdown.advance()
        self.slowdown.delay(rows)
        cpu, began = time.process_time(), time.perf_counter()
        self.conv.train()
        activations = self.conv(inputs)
        activations = activations.reshape(rows, -1)
        width = activations.shape[1]
        self.width = width
        cpu_forward, forward = time.process_time() - cpu, time.perf_counter() - began
        server = self.server[self.rank]
        header = torch.tensor([rows, width, int(weights is not None)], dtype=torch.int64, device=self.device)
        parts = [activations.detach().reshape(-1).to(self.dtype), targets.to(self.dtype)]
        if weights is not None:
            parts.append(weights.to(self.dtype))
        self._send(header, server)
        self._send(torch.cat(parts), server)
        reply = torch.empty(rows * width + META, dtype=self.dtype, device=self.device)
        self._recv(reply, server)
        meta = reply[rows * width :].tolist()
        cpu, began = time.process_time(), time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        activations.backward(reply[: rows * width].view_as(activations).to(activations.dtype))
        self.slowdown.observe(cpu_forward + time.process_time() - cpu, rows)
        conv_ms = 1000 * (forward + time.perf_counter() - began)

        params = list(self.conv.parameters())
        grads = [param.grad if param.grad is not None else torch.zeros_like(param) for param in params]
        telemetry = torch.zeros(self.world_size, TELEMETRY, dtype=self.dtype, device=self.device)
        payload = sum(grad.numel() for grad in grads) + telemetry.numel()
        own_bytes = self._sent + ring_allreduce_bytes(payload * self.element, self.conv_count)
        if self._previous is not None:
            telemetry[self.rank, :2] = torch.tensor(self._previous)
        telemetry[self.rank, 2] = own_bytes
        if self.clients_of(server)[0] == self.rank:  # the first conv worker an FC worker serves carries its telemetry
            if meta[7] > 0:
                telemetry[server, :2] = torch.tensor(meta[3:5])
            telemetry[server, 2] = meta[5]
        if self.conv_group is not None:
            flat = torch.cat([*(grad.reshape(-1) for grad in grads), telemetry.reshape(-1)])
            self._all_reduce(flat, self.conv_group, self.conv_count)
            for param, grad in zip(params, grads, strict=True):
                if param.grad is None:
                    param.grad = grad
            _unflat(flat[: payload - telemetry.numel()], [param.grad for param in params])
            telemetry = flat[payload - telemetry.numel() :].view(self.world_size, TELEMETRY)
        self.optimizer.step()
        if self.rank == 0:
            self._record(telemetry.tolist(), conv_ms, meta[6])
        samples = int(round(meta[2]))
        return {"loss": torch.tensor(meta[0]), "accuracy": meta[1] / max(samples, 1), "samples": samples}

    def clients_of(self, fc_rank: int) -> list[int]:
        """The conv ranks ``fc_rank`` serves."""
        return [conv for conv, fc in self.server.items() if fc == fc_rank]

    def _fc_step(self) -> dict[str, Any]:
        self.slowdown.advance()
        received = []
        for conv in self.clients:
            header = torch.empty(HEADER, dtype=torch.int64, device=self.device)
            self._recv(header, conv)
            rows, width, weighted = header.tolist()
            payload = torch.empty(rows * (width + 1 + weighted), dtype=self.dtype, device=self.device)
            self._recv(payload, conv)
            activations = payload[: rows * width].view(rows, width)
            targets = payload[rows * width : rows * (width + 1)].long()
            weights = payload[rows * (width + 1) :] if weighted else None
            received.append((activations, targets, weights))
        self.width = received[0][0].shape[1]
        counts = [len(targets) for _, targets, _ in received]
        total = sum(counts)
        self.slowdown.delay(total)
        cpu, began = time.process_time(), time.perf_counter()
        inputs = torch.cat([activations for activations, _, _ in received]).requires_grad_()
        targets = torch.cat([targets for _, targets, _ in received])
        self.fc.train()
        logits = self.fc(inputs)
        losses = F.cross_entropy(logits, targets, reduction="none")
        if any(weights is not None for _, _, weights in received):
            weights = torch.cat([weights if weights is not None else torch.ones(len(targets), dtype=self.dtype,
                                                                                  device=self.device)
                                 for _, targets, weights in received]).to(losses.dtype)
            loss_sum, weight_sum = (losses * weights).sum(), weights.sum().detach()
        else:
            loss_sum, weight_sum = losses.sum(), torch.tensor(float(total), device=self.device)
        correct = (logits.detach().argmax(dim=1) == targets).sum()
        stats = torch.stack([loss_sum.detach().double(), correct.double(), weight_sum.double(),
                             torch.tensor(float(total), dtype=torch.float64, device=self.device)])
        cpu_forward, forward = time.process_time() - cpu, time.perf_counter() - began
        if self.fc_group is not None:  # the union batch's size, over every FC worker
            self._all_reduce(stats, self.fc_group, self.fc_workers)
        cpu, began = time.process_time(), time.perf_counter()
        loss = loss_sum / stats[2].to(loss_sum.dtype)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.slowdown.observe(cpu_forward + time.process_time() - cpu, total)
        fc_ms = 1000 * (forward + time.perf_counter() - began)

        params = list(self.fc.parameters())
        fc_payload = sum(param.numel() for param in params) * self.element
        own_bytes = self._sent + sum((rows * self.width + META) * self.element for rows in counts)
        if self.fc_group is not None:
            own_bytes += ring_allreduce_bytes(fc_payload, self.fc_workers)
        loss_value, correct_all, samples = float(stats[0] / stats[2]), float(stats[1]), float(stats[3])
        work, wall = self._previous if self._previous is not None else (0.0, 0.0)
        meta = torch.tensor([loss_value, correct_all, samples, work, wall, own_bytes, fc_ms,
                             float(self._previous is not None)], dtype=self.dtype, device=self.device)
        gradients = inputs.grad.split(counts)
        for conv, gradient in zip(self.clients, gradients, strict=True):
            self._send(torch.cat([gradient.reshape(-1), meta]), conv)
        if self.fc_group is not None:
            grads = [param.grad if param.grad is not None else torch.zeros_like(param) for param in params]
            flat = _flat(grads)
            self._all_reduce(flat, self.fc_group, self.fc_workers)
            for param, grad in zip(params, grads, strict=True):
                if param.grad is None:
                    param.grad = grad
            _unflat(flat, [param.grad for param in params])
        self.optimizer.step()
        return {"loss": torch.tensor(loss_value), "accuracy": correct_all / max(samples, 1.0),
                "samples": int(round(samples))}

    def _record(self, telemetry: list[list[float]], conv_ms: float, fc_ms: float) -> None:
        """Rank 0: keep every rank's previous step time (the heat map) and this step's bytes and phases."""
        self._rank_bytes = [int(round(row[2])) for row in telemetry]
        if self._previous is not None:  # every rank has stepped in this process: the previous step's row is whole
            self._heat.append((self.steps - 1, [float(values[0]) for values in telemetry]))
        exchange_ms = max(0.0, 1000 * self._exchange - fc_ms)
        self._phases.append((conv_ms, fc_ms, exchange_ms))

    # -- the whole model on rank 0 ---------------------------------------------------------------------------
    def synchronize(self, workload: Any) -> None:
        """Collective: the first FC worker sends rank 0 the FC part and its optimizer state; rank 0 loads them
        into its workload's model and merges both parts' optimizer state into the workload's optimizer (so its
        checkpoint resumes exactly)."""
        self._ensure_started(workload)
        first_fc = self.fc_ranks[0]
        tensors = [param.data for param in self.fc.parameters()]
        tensors += [buffer for buffer in self.fc.buffers() if buffer.is_floating_point()]
        if self.rank == first_fc:
            flat = _flat(tensors)
            state = self.optimizer.state_dict()
            self.link.send(flat.numel() * flat.element_size() + _state_bytes(state["state"]))
            dist.send(flat, 0)
            dist.send_object_list([state], dst=0)
        elif self.rank == 0:
            flat = torch.empty(sum(tensor.numel() for tensor in tensors), dtype=self.dtype, device=self.device)
            dist.recv(flat, first_fc)
            with torch.no_grad():
                _unflat(flat, tensors)
            received: list[Any] = [None]
            dist.recv_object_list(received, src=first_fc)
            self._merge_optimizer(workload, received[0])

    def _merge_optimizer(self, workload: Any, fc_state: dict[str, Any]) -> None:
        optimizer = getattr(workload, "optimizer", None)
        if not isinstance(optimizer, torch.optim.Optimizer):
            return
        index = self._global_index(workload)
        merged: dict[int, Any] = {}
        for part, state in ((self.conv, self.optimizer.state_dict()), (self.fc, fc_state)):
            params = list(part.parameters())
            for key, value in state["state"].items():
                merged[index[id(params[key])]] = value
        optimizer.load_state_dict({"state": merged, "param_groups": optimizer.state_dict()["param_groups"]})

    def state_dict(self) -> dict[str, Any]:
        """The step count; the optimizer state is in the workload's own checkpoint (merged by synchronize)."""
        return {"steps": self.steps, "fc_workers": self.fc_workers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state.get("steps", 0))

    # -- figures ---------------------------------------------------------------------------------------------
    def bytes_per_iteration(self) -> int:
        """Bytes all ranks sent in the last step (rank 0, once it has stepped), else :func:`stanza_bytes` for the
        spec's batch size."""
        if self._rank_bytes is not None:
            return sum(self._rank_bytes)
        return stanza_bytes(batch_size=self.batch_size, width=self.width or 0, conv_bytes=self.conv_bytes,
                            fc_bytes=self.fc_bytes, world_size=self.world_size, fc_workers=self.fc_workers,
                            element=self.element)

    def ddp_bytes_per_iteration(self) -> int:
        """What data parallelism of the same model over the same ranks sends per iteration (all ranks)."""
        return ddp_bytes(self.conv_bytes + self.fc_bytes, self.world_size)

    def rank_metrics(self) -> dict[str, float]:
        """This rank's mean ``step_ms`` (its own work: compute, injected slowdown, emulated link; waiting for
        peers excluded) and ``wall_ms`` since the last call, and ``role`` (0 conv worker, 1 FC worker)."""
        if not self._since:
            return {}
        count = len(self._since)
        work = sum(item[0] for item in self._since) / count
        wall = sum(item[1] for item in self._since) / count
        self._since = []
        return {"step_ms": work, "wall_ms": wall, "role": 0.0 if self.is_conv else 1.0}

    def report(self) -> dict[str, Any] | None:
        if self.rank != 0:
            return None
        recent = list(self._heat)[-RECENT_STEPS:]
        nodes = list(getattr(self.gang, "nodes", None) or [])
        ranks = []
        for rank in range(self.world_size):
            times = [row[rank] for _, row in recent]
            ranks.append({"rank": rank, "node": str(nodes[rank]) if rank < len(nodes) else "",
                          "step_ms": round(sum(times) / len(times), 3) if times else 0.0, "keep": 1.0})
        phases = list(self._phases)
        count = max(len(phases), 1)
        return {
            "strategy": "stanza",
            "world_size": self.world_size,
            "step": self.steps,
            "ranks": ranks,
            "heatmap": {"steps": [step for step, _ in self._heat],
                        "ms": [[round(value, 3) for value in row] for _, row in self._heat]},
            "stragglers": {"predicted": [], "actual": [], "precision": None, "recall": None},
            "dropped_samples": 0,
            "bytes_sent": int(self.bytes_per_iteration()),
            "bytes_skipped": 0,
            "bytes_full": int(self.ddp_bytes_per_iteration()),
            "phases": {name: round(sum(item[column] for item in phases) / count, 3)
                       for column, name in enumerate(("conv_ms", "fc_ms", "exchange_ms"))},
        }
