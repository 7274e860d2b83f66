"""The component contract: what every job kind implements to run on a node."""

from __future__ import annotations

import abc
from typing import Any, ClassVar

from components.runtime.context import Context


class Component(abc.ABC):
    """A job kind's node-side implementation.

    Lifecycle of one attempt:

    1. The node's worker receives the attempt, claims it from the control plane (SCHEDULED -> RUNNING) and
       starts a child process.
    2. In the child, the registry imports the component class named by the kind's ``KindSpec.component`` and
       instantiates it with no arguments.
    3. :meth:`run` is called once with a :class:`~components.runtime.context.Context` that holds the
       normalized spec, the resolved devices, and the reporting, checkpoint and stop hooks. It should call
       ``ctx.restore()`` first to resume after a preemption or a lost node, checkpoint from time to time, and
       return promptly (after a checkpoint) once ``ctx.should_stop()`` is true.
    4. Returning normally means SUCCEEDED; raising means the attempt FAILED (and is retried up to the job's
       ``max_attempts``). The child is killed if it ignores a stop request past the grace period.

    A component may also declare a long-lived per-node ``service`` (started and supervised by the node agent).
    Dashboard panels are declared on the light ``KindSpec.panels`` instead, so the control plane can render
    them without importing the component (see :mod:`components.runtime.panels`).
    """

    kind: ClassVar[str]
    hostable: ClassVar[bool] = False  # may run inside a node service that hosts attempts (see session())

    @abc.abstractmethod
    def run(self, ctx: Context) -> None:
        """Run one attempt to completion, reporting through ``ctx``."""

    def service(self) -> Any | None:
        """An optional long-lived node service (e.g. a per-device executor). None by default."""
        return None

