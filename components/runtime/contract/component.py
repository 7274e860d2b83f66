"""The component contract: what every job kind implements to run on a node, and the session contract through
which the same component code runs in a child process or inside a node service that hosts attempts."""

from __future__ import annotations

import abc
import enum
import os
from collections.abc import Callable
from typing import Any, ClassVar

from components.runtime.contract.context import Context


class Progress(enum.Enum):
    """What one :meth:`Session.step` call achieved."""

    ITERATION = "iteration"  # an iteration ended; more to do
    YIELDED = "yielded"  # stopped at a stage boundary inside an iteration (preempted); call step() to resume
    DONE = "done"  # the job has nothing left to do


def never() -> bool:
    return False


THREADS_ENV = "STRATA_TORCH_THREADS"
DEFAULT_THREADS = 2


def torch_threads() -> int:
    """Intra-op threads for one job process: ``STRATA_TORCH_THREADS`` or 2 (nodes run several jobs)."""
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


class NotHostable(Exception):
    """This attempt cannot run inside a host (its spec needs a process of its own): run it in a child process."""


class Session(abc.ABC):
    """One attempt (or any job) as a step function: the unit both execution paths of a node run.

    A session advances one iteration per :meth:`step` call and keeps all of its state in itself, so a host
    (a device's sharing executor) can interleave several sessions at iteration boundaries, and a child
    process can simply step one to the end (:func:`drive`).

    Lifecycle:

    1. :meth:`prepare` (any thread, before admission): host-side work such as downloading the checkpoint.
    2. :meth:`memory_estimate` (the submitting thread): the memory request, or None when the host must pick
       one. It must not touch the device.
    3. :meth:`bind` gives a ``wakeup`` callable to call when :meth:`ready` turns true from another thread.
    4. :meth:`start` once, after admission: build the state on ``device``.
    5. :meth:`step` repeatedly: one iteration (a staged session may stop early at a stage boundary when
       ``should_yield()`` is true, and resume on the next call). Returns a :class:`Progress`. When the
       attempt's context asks to stop, the session checkpoints and returns ``DONE``, and
       :meth:`stopped_on_request` turns true.
    6. :meth:`close` once at the end -- finished, failed or cancelled -- to drop device memory.
    7. :meth:`settle`: wait for work that outlives the steps (uploads queued on a host thread); raises its error.

    **Hosting hooks** (only a host calls them): :meth:`attach` lets a session join the host's executor its own
    way (an inference endpoint, say) instead of being stepped; :meth:`interrupt` tells it the host was asked
    to stop it.
    """

    _wakeup: Callable[[], object] = staticmethod(never)

    def prepare(self) -> None:  # noqa: B027 -- optional hook
        """Host-side work before admission (downloads), off the device thread."""

    def memory_estimate(self) -> Any | None:
        return None

    def bind(self, wakeup: Callable[[], object]) -> None:
        self._wakeup = wakeup

    def start(self, device: Any) -> None:  # noqa: B027 -- optional hook
        """Allocate the job's state on ``device`` (a ``torch.device``)."""

    @abc.abstractmethod
    def step(self, should_yield: Callable[[], bool] = never) -> Progress:
        """Advance one iteration (or, for staged sessions, until ``should_yield()`` at a stage boundary)."""

    def remaining_steps(self) -> int | None:
        return None

    def ready(self) -> bool:
        """False while the next iteration's input is not ready (host work); must be cheap, it runs under a lock."""
        return True

    def resident(self) -> tuple[Any, ...]:
        """Objects holding the job's device state, for measuring its persistent memory."""
        return ()

    def close(self) -> None:  # noqa: B027 -- optional hook
        """Release device memory."""

    def result(self) -> Any:
        return None

    def stopped_on_request(self) -> bool:
        """True when the session ended early because it was asked to stop (after a checkpoint, if it has one)."""
        return False

    def settle(self, timeout: float | None = None) -> None:  # noqa: B027 -- optional hook
        """Wait until what outlives the steps (checkpoint and artifact uploads) is done; raise its error."""

    # -- hosting hooks -------------------------------------------------------------------------------------
    def attach(self, executor: Any, name: str, *, priority: int = 0, weight: float = 1.0) -> Any | None:
        """Join ``executor`` as job ``name`` by yourself and return the admission, or None (the default): the
        host then submits the session as step-at-a-time work. The job must end in the executor (its state is
        what the host waits for)."""
        return None

    def interrupt(self, hard: bool = False) -> None:  # noqa: B027 -- optional hook
        """The host was asked to stop this attempt (its context's ``request_stop`` was already called)."""


def drive(session: Session, device: Any) -> Progress:
    """Run ``session`` to its end in this thread: the child-process path. Returns the last progress."""
    session.prepare()
    session.start(device)
    try:
        progress = Progress.ITERATION
        while progress is not Progress.DONE:
            progress = session.step(never)
            if not isinstance(progress, Progress):
                raise TypeError(f"session.step() returned {progress!r}, not a Progress")
    finally:
        session.close()
    session.settle()
    return progress


class Component(abc.ABC):
    """A job kind's node-side implementation.

    Lifecycle of one attempt:

    1. The node's worker receives the attempt and claims it from the control plane (SCHEDULED -> RUNNING).
    2. It runs in a child process of its own, or -- when the component is :attr:`hostable` and a node service
       claims the attempt (e.g. a device's sharing service takes one that got a fraction of its device) --
       inside that service, next to other attempts.
    3. There the registry imports the component class named by the kind's ``KindSpec.component`` and
       instantiates it with no arguments; the context comes from
       :func:`components.runtime.client.remote.context_from_payload` on both paths.
    4. In a child, :meth:`run` is called once with the :class:`~components.runtime.contract.context.Context`; inside a
       host, :meth:`session` is called with ``hosted=True`` and the host steps the session. Either way the
       component should resume from ``ctx.restore()``, checkpoint from time to time, and end promptly (after
       a checkpoint) once ``ctx.should_stop()`` is true.
    5. Returning normally (the session reaching ``DONE``) means SUCCEEDED; raising means the attempt FAILED (and
       is retried up to the job's ``max_attempts``). The child is killed if it ignores a stop request past the
       grace period.

    A component implements :meth:`run`, or :meth:`session` (then :meth:`run` drives the session to its end),
    or both. Long-lived per-node work belongs in a node service (:mod:`components.runtime.contract.services`).
    Dashboard panels are declared in the plugin's manifest instead (a panel's ``kinds`` names the kinds it is
    shown on), so the control plane can render them without importing the component (:mod:`components.runtime.contract.panels`).
    """

    kind: ClassVar[str]
    hostable: ClassVar[bool] = False  # may run inside a node service that hosts attempts (see session())

    @classmethod
    def warm_up(cls) -> None:
        """Import and initialize, once per process, what this kind's first attempt would otherwise pay for
        (libraries, loaders). A node service that hosts attempts calls it for every hostable kind when it
        starts, in the background, so the first attempts it hosts start warm. Must be safe to call more than
        once and must not touch a device. Default: nothing."""
        return None

    def session(self, ctx: Context, *, hosted: bool = False) -> Session:
        """One attempt as a :class:`Session`. ``hosted``: it will share its process and device with other
        attempts (no process-global state, host I/O off the device thread). Raise :class:`NotHostable` when
        this attempt cannot be hosted (the worker then runs it in a child process)."""
        raise NotImplementedError(f"{type(self).__name__} implements run(), not session()")

    def run(self, ctx: Context) -> None:
        """Run one attempt to completion, reporting through ``ctx``. Default: drive :meth:`session`."""
        drive(self.session(ctx), ctx.torch_device)
