"""The ``stanza`` strategy's submit-time half: its name, options and checks. Light (no torch): the control plane
imports it. The node-side runtime is :class:`components.straggler.stanza.StanzaRuntime`."""

from __future__ import annotations

from typing import Any, ClassVar

from components.runtime.contract.distributed import MAX_WORKERS, Strategy

DEFAULT_FC_WORKERS = 1


class StanzaStrategy(Strategy):
    """Stanza's layer separation: most ranks train only a CNN's convolutional layers, ``fc_workers`` ranks only its
    fully connected layers. Activations and their gradients cross the network instead of the FC layers' gradients,
    and only the (small) convolutional gradients are all-reduced, among the conv ranks. Synchronous: every step
    equals synchronous SGD on the conv ranks' batches together."""

    name: ClassVar[str] = "stanza"
    description: ClassVar[str] = (
        "Layer separation (Stanza): most workers train only a CNN's convolutional layers and fc_workers (default 1) "
        "only its fully connected layers; activations and their gradients cross the network instead of the FC "
        "layers' gradients, and only the convolutional gradients are all-reduced. Synchronous, equal to "
        "synchronous SGD; for CNNs whose parameters sit mostly in the FC layers (e.g. cnn-fc)."
    )
    options: ClassVar[frozenset[str]] = frozenset({"fc_workers"})
    runtime: ClassVar[str] = "components.straggler.stanza:StanzaRuntime"
    min_workers: ClassVar[int] = 2

    def validate(self, options: dict[str, Any]) -> dict[str, str]:
        value = options.get("fc_workers", DEFAULT_FC_WORKERS)
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_WORKERS // 2:
            return {"fc_workers": (f"must be a whole number from 1 to {MAX_WORKERS // 2}: the workers that train the "
                                   "fully connected layers (the others, at least as many, train the convolutions)")}
        return {}

    def defaults(self, options: dict[str, Any]) -> dict[str, Any]:
        return {**options, "fc_workers": options.get("fc_workers", DEFAULT_FC_WORKERS)}

    def check_workers(self, options: dict[str, Any], workers: int) -> str | None:
        fc = int(options.get("fc_workers", DEFAULT_FC_WORKERS))
        if workers - fc < fc:
            return (f"stanza with fc_workers {fc} needs at least {2 * fc} workers (at least as many convolutional "
                    f"workers as FC workers); this job asks for {workers}")
        return None


def roles(world_size: int, fc_workers: int) -> tuple[list[int], list[int], dict[int, int]]:
    """``(conv ranks, FC ranks, {conv rank: the FC rank serving it})`` of a gang: ranks ``0 .. W - fc_workers - 1``
    train the convolutions (rank 0 among them: it evaluates and checkpoints), the rest the FC layers; conv rank
    ``c`` is served by FC rank ``W - fc_workers + c % fc_workers`` (round robin). Raises ValueError when the gang
    cannot give every FC rank at least one conv rank."""
    if not isinstance(fc_workers, int) or fc_workers < 1:
        raise ValueError(f"stanza: fc_workers must be a whole number >= 1, not {fc_workers!r}")
    conv_count = world_size - fc_workers
    if conv_count < fc_workers:
        raise ValueError(f"stanza: fc_workers={fc_workers} of {world_size} workers leaves {max(conv_count, 0)} conv "
                         f"worker(s); it needs at least as many conv workers as FC workers (at most "
                         f"{world_size // 2} FC workers for {world_size} workers)")
    conv = list(range(conv_count))
    fc = list(range(conv_count, world_size))
    return conv, fc, {rank: conv_count + rank % fc_workers for rank in conv}
