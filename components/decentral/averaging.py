"""hivemind's decentralized averaging, guarded (node side: torch and hivemind).

:class:`SwarmAverager` is a ``hivemind.averaging.DecentralizedAverager`` (butterfly all-reduce among the peers a
DHT-based matchmaking put in one group) with four changes, each a subclass hook of hivemind 1.1.12:

1. **Bad updates are dropped and their sender reported.** In a butterfly all-reduce each peer reduces a slice of
   the vector for everyone. :class:`GuardedReducer` checks every part a sender hands in before it is added: a
   part with NaN or infinite values, or one that is wildly out of scale (its distance from this peer's own
   values for the same slice is more than ``max_ratio`` times their norm), is not averaged, and the sender is
   banned from the rest of the round. :class:`GuardedContainer` checks what the *reducers* send back the same
   way, so a malicious reducer cannot poison its slice either: a rejected slice keeps this peer's own values.
   A sender's weight is clamped to at most 1. Every rejection is recorded with the offender's peer id.
2. **Only credentialed peers join a group.** A join request carries, in its gathered data, a credential the
   control plane signed for ``p2p:<the requester's libp2p peer id>`` (libp2p authenticates the id on the
   connection); a leader refuses a request without a valid one. State downloads are refused the same way to
   peers the swarm's signed progress records do not list.
3. **Deadlines adapt** (learning-at-home/hivemind#676): :meth:`SwarmAverager.set_deadlines` changes the
   all-reduce timeout, the sender/reducer timeouts, the request timeout and the target group size between rounds
   (the peer computes them from measured step times and round durations).
4. **The state a newcomer downloads** comes from a callback of the training loop (its live parameters and step),
   not from the averager's last averaged copy.

Pure parts (:class:`UpdateGuard`) have no hivemind import and are unit-tested alone.
"""

from __future__ import annotations

import asyncio
import logging
import math
import multiprocessing as mp
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

log = logging.getLogger(__name__)


class UpdateGuard:
    """Judges a slice of parameters another peer sent against this peer's own values for the same slice.

    ``check(part, reference)`` returns None for an acceptable part, else a one-line reason: non-finite values, a
    shape mismatch, or ``‖part - reference‖ > max_ratio * (‖reference‖ + eps * sqrt(n))``. Honest peers drift
    apart by a few local steps between rounds: a small fraction of the weights' norm, or, for a part whose values
    are near zero (a bias or a norm's shift at the start), a few hundredths per value, which the absolute floor
    ``eps`` (per value, RMS) covers. A ×1e6 update is orders of magnitude past either."""

    def __init__(self, max_ratio: float = 10.0, eps: float = 0.05):
        self.max_ratio = float(max_ratio)
        self.eps = float(eps)

    def check(self, part: torch.Tensor, reference: torch.Tensor | None) -> str | None:
        if not torch.isfinite(part).all():
            bad = int((~torch.isfinite(part)).sum())
            return f"{bad} non-finite values (NaN or infinite) in a part of {part.numel()}"
        if reference is None:
            return None
        if part.shape != reference.shape:
            return f"shape {tuple(part.shape)} where {tuple(reference.shape)} was expected"
        distance = float(torch.linalg.vector_norm(part.float() - reference.float()))
        scale = float(torch.linalg.vector_norm(reference.float())) + self.eps * math.sqrt(max(1, reference.numel()))
        if distance > self.max_ratio * scale:
            return f"out of scale: {distance / scale:.3g}x the norm of the local values (limit {self.max_ratio:g}x)"
        return None

    def check_delta(self, delta: torch.Tensor, local: torch.Tensor) -> str | None:
        """A reducer's answer is ``average - local``: judge ``local + delta`` against ``local``."""
        if not torch.isfinite(delta).all():
            return self.check(delta, None)
        return self.check(local + delta, local)


def _hivemind_classes():
    """The guarded subclasses, built on first use (hivemind is imported only where a swarm runs)."""
    from hivemind.averaging.allreduce import AllReduceRunner
    from hivemind.averaging.averager import DecentralizedAverager
    from hivemind.averaging.partition import BannedException, TensorPartContainer, TensorPartReducer
    from hivemind.proto import averaging_pb2

    class GuardedReducer(TensorPartReducer):
        def __init__(self, part_shapes, num_senders, *, reference, guard: UpdateGuard, on_reject):
            super().__init__(part_shapes, num_senders)
            self.reference, self.guard, self.on_reject = reference, guard, on_reject

        def _judge(self, part_index: int, part: torch.Tensor, weight: float) -> str | None:
            if not math.isfinite(weight) or weight < 0:
                return f"invalid averaging weight {weight!r}"
            reference = self.reference[part_index] if self.reference and part_index < len(self.reference) else None
            return self.guard.check(part, reference)

        async def accumulate_part(self, sender_index, part_index, tensor_part, weight=1.0):
            problem = self._judge(part_index, tensor_part, float(weight))
            if problem is None:
                return await super().accumulate_part(sender_index, part_index, tensor_part, weight=min(float(weight), 1.0))
            while part_index > self.current_part_index:
                await asyncio.wait({self.current_part_future, asyncio.create_task(self.finished.wait())},
                                   return_when=asyncio.FIRST_COMPLETED)
                if self.finished.is_set():
                    break
            self.on_reject(sender_index, problem)
            self.on_sender_failed(sender_index)
            raise BannedException(f"sender {sender_index} sent a bad update: {problem}")

        def on_sender_failed(self, sender_index):
            if self.sender_failed_after[sender_index] != float("inf"):
                return  # already excluded (a rejected part, then the runner's own ban)
            super().on_sender_failed(sender_index)

    class GuardedContainer(TensorPartContainer):
        def __init__(self, tensors, peer_fractions, *, own_index: int, guard: UpdateGuard, on_reject, **kwargs):
            super().__init__(tensors, peer_fractions, **kwargs)
            self.own_index, self.guard, self.on_reject = own_index, guard, on_reject
            self._local_parts = [tuple(part for part, _ in parts) for parts in self._input_parts_by_peer]

        def register_processed_part(self, peer_index, part_index, part):
            if peer_index != self.own_index and part_index < len(self._local_parts[peer_index]):
                local = self._local_parts[peer_index][part_index]
                problem = self.guard.check_delta(part, local)
                if problem is not None:
                    self.on_reject(peer_index, problem)
                    part = torch.zeros_like(local)  # keep our own values for that slice
                    self.failed_size += part.numel()
            super().register_processed_part(peer_index, part_index, part)

        def finalize(self):
            super().finalize()
            self._local_parts = []

    class GuardedAllReduceRunner(AllReduceRunner):
        def __init__(self, *, guard: UpdateGuard, on_reject, tensors, peer_fractions, ordered_peer_ids, **kwargs):
            super().__init__(tensors=tensors, peer_fractions=peer_fractions, ordered_peer_ids=ordered_peer_ids,
                             **kwargs)
            own = list(ordered_peer_ids).index(self.peer_id)
            container_kwargs = {key: value for key, value in kwargs.items()
                                if key in ("compression", "part_size_bytes", "tensor_infos", "prefetch")}
            self.tensor_part_container.finalize()
            self.tensor_part_reducer.finished.set()  # replaced before use: no "received 0%" warning from it
            self.tensor_part_container = GuardedContainer(
                tensors, peer_fractions, own_index=own, guard=guard, return_deltas=True,
                on_reject=lambda index, problem: on_reject(ordered_peer_ids[index], "reducer", problem),
                **container_kwargs)
            self.parts_for_local_averaging = self.tensor_part_container.get_raw_input_parts(own)
            self.tensor_part_reducer = GuardedReducer(
                tuple(part.shape for part in self.parts_for_local_averaging), len(self.sender_peer_ids),
                reference=self.parts_for_local_averaging, guard=guard,
                on_reject=lambda index, problem: on_reject(self.sender_peer_ids[index], "sender", problem))

    class SwarmAverager(DecentralizedAverager):
        """See the module docstring. ``authorize(peer_id_base58, gathered) -> None | reason`` decides joins;
        ``state_provider() -> (metadata, tensors)`` answers state downloads (in this, the host process)."""

        def __init__(self, averaged_tensors: Sequence[torch.Tensor], dht, *, guard: UpdateGuard,
                     authorize: Callable[[str, Any], str | None] | None = None,
                     known_peer: Callable[[str], bool] | None = None,
                     state_provider: Callable[[], tuple[Any, Sequence[torch.Tensor]]] | None = None,
                     **kwargs):
            self._guard = guard
            self._authorize = authorize
            self._known_peer = known_peer
            self._state_provider = state_provider
            self.rejections: mp.Queue = mp.get_context("fork").Queue()
            super().__init__(averaged_tensors, dht, **kwargs)

        # -- guarded all-reduce (runs in the averager's process) -------------------------------------------
        def _on_reject(self, peer_id, role: str, problem: str) -> None:
            text = peer_id.to_base58() if hasattr(peer_id, "to_base58") else str(peer_id)
            log.warning("dropped a bad update from %s %s: %s", role, text, problem)
            try:
                self.rejections.put_nowait({"peer": text, "role": role, "problem": problem, "at": time.time()})
            except Exception:  # noqa: BLE001 - a full or closed queue must not break the round
                pass

        async def _run_allreduce_inplace_(self, tensors, group_info, group_id=None, **kwargs):
            from hivemind.averaging.allreduce import AveragingMode
            from hivemind.utils.asyncio import as_aiter, azip
            from hivemind.utils.timed_storage import get_dht_time

            group_id = group_info.group_id if group_id is None else group_id
            runner = GuardedAllReduceRunner(
                p2p=self._p2p, servicer_type=type(self), prefix=self.prefix, tensors=tensors, group_id=group_id,
                ordered_peer_ids=group_info.peer_ids, guard=self._guard, on_reject=self._on_reject, **kwargs)
            assert group_id in self._running_groups, f"group {group_id} was not registered"
            self._running_groups[group_id].set_result(runner)
            if runner.modes[group_info.peer_ids.index(self.peer_id)] != AveragingMode.AUX:
                async for tensor, update in azip(as_aiter(*tensors), runner):
                    tensor.add_(update, alpha=self._averaging_alpha)
                    self.last_updated = get_dht_time()
                    self._state_updated.set()
            else:
                async for _ in runner:
                    raise ValueError("aux peers should not receive averaged tensors")

        # -- who may join a group, who may download the state ----------------------------------------------
        async def rpc_join_group(self, request, context):
            problem = None
            if self._authorize is not None:
                try:
                    _bandwidth, _mode, user_bytes = self.serializer.loads(request.gather)
                    problem = self._authorize(context.remote_id.to_base58(), self.serializer.loads(user_bytes))
                except Exception as error:  # noqa: BLE001 - malformed gathered data is a refusal, not a crash
                    problem = f"malformed join request ({type(error).__name__})"
            if problem is not None:
                log.warning("refused a join request from %s: %s", context.remote_id, problem)
                yield averaging_pb2.MessageFromLeader(code=averaging_pb2.PROTOCOL_VIOLATION)
                return
            async for response in super().rpc_join_group(request, context):
                yield response

        async def rpc_download_state(self, _request, _context):
            if self._known_peer is not None:
                known = await asyncio.get_event_loop().run_in_executor(
                    None, self._known_peer, _context.remote_id.to_base58())
                if not known:
                    log.warning("refused a state download to %s: not a credentialed peer of the swarm",
                                _context.remote_id)
                    return
            async for message in super().rpc_download_state(_request, _context):
                yield message

        def get_current_state(self):
            if self._state_provider is None:
                return super().get_current_state()
            metadata, tensors = self._state_provider()
            return metadata, list(tensors), None

        # -- adaptive deadlines ------------------------------------------------------------------------------
        def set_deadlines(self, *, allreduce_timeout: float, request_timeout: float, target_group_size: int | None,
                          min_group_size: int) -> None:
            """Change the deadlines for the next rounds (sent to the averager's process)."""
            self._outer_pipe.send(("_set_deadlines", [], dict(
                allreduce_timeout=float(allreduce_timeout), request_timeout=float(request_timeout),
                target_group_size=target_group_size, min_group_size=int(min_group_size))))

        async def _set_deadlines(self, *, allreduce_timeout, request_timeout, target_group_size, min_group_size):
            self._allreduce_timeout = allreduce_timeout
            sender = max(1.0, allreduce_timeout / 3)
            self.allreduce_kwargs.update(sender_timeout=sender, reducer_timeout=2 * sender)
            self.matchmaking_kwargs.update(request_timeout=request_timeout, target_group_size=target_group_size,
                                           min_group_size=min_group_size)
            matchmaking = getattr(self, "_matchmaking", None)
            if matchmaking is not None:
                matchmaking.request_timeout = request_timeout
                matchmaking.target_group_size = target_group_size
                matchmaking.min_group_size = min_group_size

        def drain_rejections(self) -> list[dict]:
            found = []
            while True:
                try:
                    found.append(self.rejections.get_nowait())
                except Exception:  # noqa: BLE001 - queue.Empty (or a closed queue at shutdown)
                    return found

    from typing import get_type_hints

    # hivemind finds a servicer's RPCs by their resolved type hints: give the overrides the base class's.
    for name in ("rpc_join_group", "rpc_download_state"):
        getattr(SwarmAverager, name).__annotations__ = get_type_hints(getattr(DecentralizedAverager, name))
    _CLASSES["reducer"] = GuardedReducer
    return SwarmAverager


_CLASSES: dict[str, Any] = {}


def swarm_averager_class():
    """The :class:`SwarmAverager` class (hivemind imported on first call)."""
    if "averager" not in _CLASSES:
        _CLASSES["averager"] = _hivemind_classes()
    return _CLASSES["averager"]


def guarded_reducer_class():
    """The guarded ``TensorPartReducer`` subclass (for tests)."""
    swarm_averager_class()
    return _CLASSES["reducer"]


__all__ = ["UpdateGuard", "guarded_reducer_class", "swarm_averager_class"]
