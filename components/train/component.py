"""The node side of the ``train`` kind: runs a built-in workload or user code through a TrainLoop."""

from __future__ import annotations

import os
from typing import Any, ClassVar

from components.runtime.component import Component
from components.runtime.context import Context
from components.runtime.registry import import_path
from components.train.spec import TrainSpec

THREADS_ENV = "STRATA_TORCH_THREADS"
DEFAULT_THREADS = 2


def torch_threads() -> int:
    """Intra-op threads for one training process: ``STRATA_TORCH_THREADS`` or 2 (nodes run several jobs)."""
    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return DEFAULT_THREADS
    try:
        threads = int(raw)
    except ValueError:
        raise ValueError(f"{THREADS_ENV} must be a positive integer, got {raw!r}") from None
    if threads < 1:
        raise ValueError(f"{THREADS_ENV} must be a positive integer, got {raw!r}")
    return threads


def resolve_entrypoint(ctx: Context, path: str):
    """Import ``"package.module:function"`` and call it with ``ctx``.

    Returns None when the function trained by itself, or the :class:`Workload` it returned for the loop to
    drive. ``path`` may also name a Workload subclass, which is instantiated with no arguments.
    """
    try:
        target = import_path(path)
    except (ImportError, AttributeError) as error:
        raise ImportError(f"cannot import the entrypoint {path!r}: {error}") from error
    if isinstance(target, type):
        from components.train.workloads import Workload

        if issubclass(target, Workload):
            return target()
    if not callable(target):
        raise TypeError(f"the entrypoint {path!r} is not callable")
    result = target(ctx)
    if result is None:
        return None
    from components.train.workloads import Workload  # torch is imported only when a Workload must be driven

    if isinstance(result, Workload):
        return result
    raise TypeError(
        f"the entrypoint {path!r} returned {type(result).__name__}; expected None (it trained by itself) "
        "or a components.train.workloads.Workload"
    )


class TrainComponent(Component):
    """Runs one attempt of a ``train`` job.

    ``spec.workload`` picks a built-in :class:`~components.train.workloads.Workload`; ``spec.entrypoint`` names
    user code (see :func:`resolve_entrypoint`). A Workload is driven by
    :class:`~components.train.loop.TrainLoop`, which resumes from ``ctx.restore()``, reports metrics and
    logs, checkpoints every ``checkpoint_every`` steps, stops early (after a checkpoint) when
    ``ctx.should_stop()`` turns true, and uploads ``model.pt`` and ``metrics.json`` when done.
    """

    kind: ClassVar[str] = TrainSpec.kind
    hostable: ClassVar[bool] = True

    def run(self, ctx: Context) -> None:
        spec: dict[str, Any] = TrainSpec().validate(ctx.spec)
        ctx.spec = spec
        threads = torch_threads()
        # Read by torch when it is first imported, which for self-training entrypoints happens in user code;
        # an entrypoint that needs no torch never pays for importing it.
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        if spec["entrypoint"]:
            workload = resolve_entrypoint(ctx, spec["entrypoint"])
            if workload is None:
                ctx.log(f"{spec['entrypoint']} finished")
                return
        else:
            from components.train.workloads import builtin_workload

            workload = builtin_workload(spec["workload"])
        import torch

        from components.train.loop import TrainLoop

        torch.set_num_threads(threads)
        TrainLoop(workload, spec, ctx).run()
