"""The node side of the ``train`` kind: runs a built-in workload or user code through a TrainLoop."""

from __future__ import annotations

import os
from typing import Any, ClassVar

from components.runtime.contract.component import Component, NotHostable, Session, drive, torch_threads
from components.runtime.contract.context import Context
from components.runtime.contract.project import UserError
from components.runtime.contract.registry import import_path
from components.train.spec import TrainSpec


class EntrypointImportError(UserError, ImportError):
    """The entrypoint's module or function cannot be imported: retrying the attempt cannot fix it."""


def resolve_entrypoint(ctx: Context, path: str):
    """Import ``"package.module:function"`` and call it with ``ctx``.

    Returns None when the function trained by itself, or the :class:`Workload` it returned for the loop to
    drive. ``path`` may also name a Workload subclass, which is instantiated with no arguments.
    """
    try:
        target = import_path(path)
    except (ImportError, AttributeError) as error:
        raise EntrypointImportError(f"cannot import the entrypoint {path!r}: {error}") from error
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
    user code (see :func:`resolve_entrypoint`); ``spec.command`` runs any program
    (:mod:`components.runtime.node.command`: logs, metrics from stdout, checkpoints of a directory, torchrun's
    variables). A Workload is driven by
    :class:`~components.train.loop.TrainLoop`, which resumes from ``ctx.restore()``, reports metrics and
    logs, checkpoints every ``checkpoint_every`` steps, stops early (after a checkpoint) when
    ``ctx.should_stop()`` turns true, and uploads ``model.pt`` and ``metrics.json`` when done.

    The loop runs as a step-at-a-time session (:class:`~components.train.sessions.TrainLoopSession`) on both
    paths: :meth:`run` drives it to the end in the attempt's child process; a device's sharing service gets it
    from :meth:`session` with ``hosted=True`` (no process-global RNG, uploads on a host thread, stage
    preemption) and interleaves it with other jobs. An entrypoint *function* may train by itself, so it
    cannot be hosted (:class:`~components.runtime.contract.component.NotHostable`): it runs only in a child process.
    """

    kind: ClassVar[str] = TrainSpec.kind
    hostable: ClassVar[bool] = True

    @classmethod
    def warm_up(cls) -> None:
        """The loop, the workloads, scikit-learn's bundled-dataset loader (the digits) and the optimizers (the
        first optimizer step imports torch's compiler stack): about 1.7 s on this machine, once per process."""
        import torch
        from sklearn.datasets import load_digits  # noqa: F401

        import components.train.loop  # noqa: F401
        import components.train.sessions  # noqa: F401
        from components.train.workloads import make_optimizer

        weight = torch.nn.Parameter(torch.zeros(1))
        for optimizer in ("adam", "sgd"):
            step = make_optimizer([weight], {"optimizer": optimizer, "lr": 0.0, "options": {}})
            weight.grad = torch.zeros(1)
            step.step()

    def session(self, ctx: Context, *, hosted: bool = False) -> Session:
        spec: dict[str, Any] = TrainSpec().validate(ctx.spec)
        ctx.spec = spec
        factory = self._workload_factory(spec)
        return self._session(ctx, spec, factory(), factory, hosted=hosted)

    @staticmethod
    def _workload_factory(spec: dict[str, Any]):
        """A factory of fresh workloads for a built-in workload or an entrypoint naming a Workload class;
        raises NotHostable for an entrypoint function (it may train by itself)."""
        if spec.get("command"):
            raise NotHostable("a command job runs its own program in a child process")
        if spec["entrypoint"]:
            from components.train.workloads import Workload

            target = import_path(spec["entrypoint"])
            if not (isinstance(target, type) and issubclass(target, Workload)):
                raise NotHostable(f"the entrypoint {spec['entrypoint']!r} is a function that may train by itself, "
                                  "which cannot be interleaved; only Workload classes and built-in workloads share "
                                  "a device")
            return target
        from components.train.workloads import builtin_workload

        builtin_workload(spec["workload"])  # an unknown name fails here, before anything runs
        return lambda: builtin_workload(spec["workload"])

    @staticmethod
    def _session(ctx: Context, spec: dict[str, Any], workload: Any, factory: Any = None, *,
                 hosted: bool) -> Session:
        from components.train.loop import TrainLoop
        from components.train.sessions import TrainLoopSession

        loop = TrainLoop(workload, spec, ctx, owns_process=not hosted)
        if hosted:
            return TrainLoopSession(loop, host_io=True, profile=factory)
        return TrainLoopSession(loop, staged=False, operator_preemption=False)

    def run(self, ctx: Context) -> None:
        spec: dict[str, Any] = TrainSpec().validate(ctx.spec)
        ctx.spec = spec
        if spec.get("command"):  # any program, with its own threads: components.runtime.node.command
            from components.runtime.node.command import run_command

            run_command(ctx, spec["command"])
            return
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

        torch.set_num_threads(threads)
        drive(self._session(ctx, spec, workload, hosted=False), ctx.torch_device)
