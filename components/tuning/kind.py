"""The ``tune`` kind's component: the sweep's engine on warm trial runners (:mod:`components.tuning.pool`), or,
with ``runners: 0`` (and for population based training), every trial placed as a job of its own
(:class:`components.tuning.component.Engine`)."""

from __future__ import annotations

from typing import ClassVar

from components.runtime.contract.component import Component
from components.runtime.contract.context import Context
from components.tuning.component import Engine
from components.tuning.pool import RunnerEngine, runners_per_gpu
from components.tuning.spec import TuneSpec


class TuneComponent(Component):
    kind: ClassVar[str] = TuneSpec.kind

    def run(self, ctx: Context) -> None:
        spec = TuneSpec().validate(ctx.spec)
        per_gpu = runners_per_gpu(spec, ctx.devices)
        if per_gpu:
            RunnerEngine(ctx, spec, per_gpu=per_gpu).run()
        else:
            Engine(ctx, spec).run()
