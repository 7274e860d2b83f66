"""The distributed-training seam: one model trained by the workers (ranks) of a gang, on one node or several.

A job asks for ``resources: {workers: N}`` and names a **strategy** in its spec's ``distributed`` options::

    distributed: {strategy: ddp, backend: auto, timeout_s: 120,
                  slow: {ranks: [1], factor: 2.0}, bandwidth_mbit: 100, <the strategy's own options>}

Three things live here, none of them specific to a plugin:

1. **Strategies** (a seam). A plugin names :class:`Strategy` subclasses in ``Plugin.strategies``; each has a name,
   its own options (checked at submit by :meth:`Strategy.validate`, so a bad spec is a 400 naming
   ``spec.distributed.<option>``) and the ``"module:Class"`` path of its :class:`StrategyRuntime`, the node-side
   part that a training loop drives once per step. :func:`distributed_errors` checks a whole ``distributed``
   value against the installed strategies; :func:`open_runtime` builds a rank's runtime.
2. **Rendezvous through the control plane** (:func:`components.runtime.node.gang.init_gang`). Rank 0 starts a ``torch.distributed.TCPStore``
   on a free port and publishes the port (``ctx.gang.publish``); the control plane answers with the
   address *its node registered* (never a hard-coded one), and the other ranks, wherever they run, read it
   (``ctx.gang.address``). The process group is gloo on the CPU, NCCL on CUDA (``backend: auto``).
3. **Fault injection** (:class:`Slowdown`, :class:`Link`) for tests, benchmarks and demos: a chosen rank, or
   random ranks in episodes, is slowed by a factor (sleeps proportional to its measured work, or CPU contention
   from a burner process), and an emulated link turns bytes sent into time.

Light at import (no torch): the control plane imports this module for the option check.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import subprocess
import sys
import time
from typing import Any, ClassVar

from components.runtime.shared.units import finite_number

log = logging.getLogger(__name__)

BACKENDS = ("auto", "gloo", "nccl")
COMMON_OPTIONS = frozenset({"strategy", "backend", "timeout_s", "slow", "bandwidth_mbit"})
SLOW_OPTIONS = frozenset({"ranks", "factor", "random", "duration", "mode", "seed"})
SLOW_MODES = ("sleep", "cpu")
DEFAULT_STRATEGY = "ddp"
DEFAULT_TIMEOUT_S = 120.0
MAX_FACTOR = 100.0
MAX_WORKERS = 1024
RENDEZVOUS_WAIT_S = 300.0

# What may follow ``host:port`` in a published rendezvous address: a path such as ``/p2p/<peer id>`` (a libp2p
# listener's identity), at most 200 characters of letters, digits and ``/._-``.
RENDEZVOUS_SUFFIX = r"^(/[A-Za-z0-9._-]+){1,8}$"


def check_rendezvous_suffix(suffix: str) -> str:
    """``suffix`` when it is empty or matches :data:`RENDEZVOUS_SUFFIX` (at most 200 characters); else ValueError."""
    import re

    if suffix and (len(suffix) > 200 or not re.match(RENDEZVOUS_SUFFIX, suffix)):
        raise ValueError(f"rendezvous suffix {suffix[:40]!r} must match {RENDEZVOUS_SUFFIX} (200 characters at most)")
    return suffix or ""


class Strategy:
    """A way to fit one model on several ranks (a plugin names the subclass in ``Plugin.strategies``).

    Subclasses set :attr:`name`, :attr:`description`, :attr:`options` (their own option names besides the
    common ones), :attr:`runtime` (``"module:Class"`` of the :class:`StrategyRuntime`, imported on nodes only) and
    :attr:`min_workers`, and may override :meth:`validate`. Instantiated with no arguments; importing one must
    stay light (the control plane does)."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    options: ClassVar[frozenset[str]] = frozenset()
    runtime: ClassVar[str] = ""
    min_workers: ClassVar[int] = 1
    # Whether a gang of this strategy may give up workers (down to min_workers) instead of being preempted when a
    # higher-priority job needs room: it must resume from rank 0's checkpoint at any world size down to that.
    # A kind that trains with strategies offers it as its jobs' elastic default (elastic_default below).
    elastic: ClassVar[bool] = False

    def validate(self, options: dict[str, Any]) -> dict[str, str]:
        """Problems with this strategy's own options (``options`` holds only those): ``{option: message}``."""
        return {}

    def defaults(self, options: dict[str, Any]) -> dict[str, Any]:
        """The options with defaults filled in (what the stored spec carries)."""
        return dict(options)

    def check_workers(self, options: dict[str, Any], workers: int) -> str | None:
        """A problem with running on ``workers`` ranks given these (normalized) options, or None."""
        return None


def strategies() -> dict[str, Strategy]:
    """The installed strategies by name (from the plugin registry)."""
    from components.runtime.contract import registry

    return registry.strategies()


def distributed_errors(value: Any, prefix: str = "spec.distributed") -> dict[str, str]:
    """Every problem with a spec's ``distributed`` value, as ``{"spec.distributed.<field>": message}``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        return {prefix: "must be an object, e.g. {strategy: ddp}"}
    errors: dict[str, str] = {}
    known = strategies()
    name = value.get("strategy", DEFAULT_STRATEGY)
    strategy = known.get(name) if isinstance(name, str) else None
    if strategy is None:
        errors[f"{prefix}.strategy"] = f"must be one of {', '.join(sorted(known)) or '(none installed)'}"
    own = strategy.options if strategy is not None else frozenset()
    unknown = sorted(set(value) - COMMON_OPTIONS - own)
    for key in unknown:
        errors[f"{prefix}.{key}"] = "unknown option" + (f" of {name}" if strategy is not None else "")
    backend = value.get("backend", "auto")
    if backend not in BACKENDS:
        errors[f"{prefix}.backend"] = f"must be one of {', '.join(BACKENDS)}"
    timeout = value.get("timeout_s", DEFAULT_TIMEOUT_S)
    if not _number(timeout) or not 1 <= timeout <= 3600:
        errors[f"{prefix}.timeout_s"] = "must be a number of seconds from 1 to 3600"
    bandwidth = value.get("bandwidth_mbit")
    if bandwidth is not None and (not _number(bandwidth) or not 0.1 <= bandwidth <= 1e6):
        errors[f"{prefix}.bandwidth_mbit"] = "must be a number from 0.1 to 1000000 (an emulated link), or absent"
    errors.update(slow_errors(value.get("slow"), f"{prefix}.slow"))
    if strategy is not None:
        mine = {key: item for key, item in value.items() if key in own}
        try:
            problems = strategy.validate(mine)
        except Exception as error:  # noqa: BLE001 -- a broken strategy says so instead of a 500
            problems = {"strategy": f"{name} could not check its options: {error}"}
        for key, message in problems.items():
            errors[f"{prefix}.{key}"] = message
    return errors


def normalize(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """A valid ``distributed`` value with the defaults filled in (None stays None)."""
    if value is None:
        return None
    name = value.get("strategy", DEFAULT_STRATEGY)
    strategy = strategies()[name]
    mine = strategy.defaults({key: item for key, item in value.items() if key in strategy.options})
    out = {"strategy": name, "backend": value.get("backend", "auto"),
           "timeout_s": float(value.get("timeout_s", DEFAULT_TIMEOUT_S)), **mine}
    if value.get("bandwidth_mbit") is not None:
        out["bandwidth_mbit"] = float(value["bandwidth_mbit"])
    if value.get("slow") is not None:
        out["slow"] = dict(value["slow"])
    return out


def workers_problems(value: dict[str, Any] | None, workers: int, prefix: str = "spec.distributed") -> dict[str, str]:
    """Whether a normalized ``distributed`` value can run on ``workers`` ranks: the strategy's
    :attr:`Strategy.min_workers` and :meth:`Strategy.check_workers`, as ``{"resources.workers": message}``."""
    if not value:
        return {}
    strategy = strategies().get(value.get("strategy", DEFAULT_STRATEGY))
    if strategy is None:
        return {}
    if workers < strategy.min_workers:
        return {"resources.workers": f"{strategy.name} needs at least {strategy.min_workers} workers; ask for "
                                     f"resources: {{workers: {strategy.min_workers}}} or more"}
    problem = strategy.check_workers({k: v for k, v in value.items() if k in strategy.options}, workers)
    return {"resources.workers": problem} if problem else {}


def elastic_default(value: dict[str, Any] | None) -> dict[str, float] | None:
    """The elastic default of a gang trained with the normalized ``distributed`` value: ``{"min_workers": the
    strategy's min_workers}`` when its strategy is :attr:`Strategy.elastic`, else None."""
    if not value:
        return None
    strategy = strategies().get(value.get("strategy", DEFAULT_STRATEGY))
    if strategy is None or not strategy.elastic:
        return None
    return {"min_workers": strategy.min_workers}


def slow_errors(value: Any, prefix: str) -> dict[str, str]:
    """Problems with a ``slow`` (fault injection) value: ``{ranks: [r...] | random: p, factor, duration, mode}``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        return {prefix: "must be an object, e.g. {ranks: [1], factor: 2}"}
    errors = {f"{prefix}.{key}": "unknown option" for key in sorted(set(value) - SLOW_OPTIONS)}
    ranks, chance = value.get("ranks"), value.get("random")
    if ranks is None and chance is None:
        errors[prefix] = "name the slowed ranks ({ranks: [1]}) or a chance per step ({random: 0.05})"
    if ranks is not None and (not isinstance(ranks, list) or not ranks or len(ranks) > MAX_WORKERS
                              or not all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < MAX_WORKERS
                                         for r in ranks)):
        errors[f"{prefix}.ranks"] = f"must be a non-empty list of ranks (integers from 0 to {MAX_WORKERS - 1})"
    if chance is not None and (not _number(chance) or not 0 < chance <= 1):
        errors[f"{prefix}.random"] = "must be a probability in (0, 1]"
    factor = value.get("factor", 2.0)
    if not _number(factor) or not 1 <= factor <= MAX_FACTOR:
        errors[f"{prefix}.factor"] = f"must be a number from 1 to {MAX_FACTOR:g}"
    duration = value.get("duration", 20)
    if not isinstance(duration, int) or isinstance(duration, bool) or not 1 <= duration <= 10**6:
        errors[f"{prefix}.duration"] = "must be a whole number of steps from 1 to 1000000"
    if value.get("mode", "sleep") not in SLOW_MODES:
        errors[f"{prefix}.mode"] = f"must be one of {', '.join(SLOW_MODES)}"
    seed = value.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32:
        errors[f"{prefix}.seed"] = "must be an integer from 0 to 2**32-1"
    return errors


def _number(value: Any) -> bool:
    return finite_number(value)


# -- node side (the gang itself lives in components.runtime.node.gang, which imports torch) -------------------------
class StrategyRuntime:
    """One rank's side of a strategy, driven by a training loop once the gang is up.

    The loop calls :meth:`setup` after the workload is built (and before it resumes), then per step
    ``train_step(workload, batch(workload, epoch, index))``; before evaluating, checkpointing and saving the final
    model it calls :meth:`synchronize` on every rank (a collective: afterwards rank 0's workload holds the whole
    model). Only rank 0 evaluates, checkpoints and uploads. :meth:`report` is rank 0's payload for
    :attr:`plugin`'s report channel; :meth:`rank_metrics` each rank's own metrics (reported rank-tagged).

    Subclasses get :attr:`slowdown` (fault injection: call :meth:`Slowdown.delay` with the samples about to be
    processed, and :meth:`Slowdown.observe` with the CPU time they took) and :attr:`link` (an emulated link:
    :meth:`Link.send` with the bytes this rank sends)."""

    plugin: ClassVar[str | None] = None

    def __init__(self, ctx: Any, options: dict[str, Any], gang: Any):  # gang: components.runtime.node.gang.Gang
        self.ctx = ctx
        self.options = options
        self.gang = gang
        self.rank, self.world_size = gang.rank, gang.world_size
        self.slowdown = Slowdown(options.get("slow"), gang.rank, gang.world_size)
        self.link = Link(options.get("bandwidth_mbit"))
        self._step_ms: list[float] = []  # this rank's step times since the last rank_metrics()

    def record_step(self, milliseconds: float) -> None:
        """Note how long this rank's last step took (wall time, waiting for the others included)."""
        self._step_ms.append(float(milliseconds))

    def setup(self, workload: Any) -> None:  # noqa: B027 -- optional hook
        """Prepare the workload for this strategy (wrap its model, split it, register communication hooks)."""

    def steps_per_epoch(self, steps: int) -> int:
        """Steps of one epoch for the gang, given the workload's single-worker count: each gang step consumes
        one batch per rank (a remainder of fewer batches than ranks is dropped)."""
        return max(1, steps // self.world_size)

    def batch(self, workload: Any, epoch: int, index: int) -> Any:
        """This rank's batch of gang step ``index``: the workload's batch ``index * world_size + rank``."""
        local = workload.steps_per_epoch()
        return workload.batch(epoch, min(index * self.world_size + self.rank, local - 1))

    def train_step(self, workload: Any, batch: Any) -> dict[str, Any]:
        raise NotImplementedError

    def synchronize(self, workload: Any) -> None:  # noqa: B027 -- optional hook
        """Collective: make rank 0's workload hold the whole, current model."""

    def state_dict(self) -> dict[str, Any]:
        """This strategy's state to checkpoint with the model (rank 0's; e.g. error-feedback residuals)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 -- optional hook
        pass

    def rank_metrics(self) -> dict[str, float]:
        """This rank's own metrics since the last call; reported as ``rank<r>.<name>``. By default the mean
        ``step_ms`` of the steps :meth:`record_step` noted, and ``slowed_steps`` (fault injection)."""
        values: dict[str, float] = {}
        if self._step_ms:
            values["step_ms"] = sum(self._step_ms) / len(self._step_ms)
            self._step_ms.clear()
        if self.slowdown.enabled:
            values["slowed_steps"] = float(self.slowdown.slowed_steps)
        return values

    def report(self) -> dict[str, Any] | None:
        """Rank 0's report payload for :attr:`plugin` (None: nothing to report)."""
        return None

    def close(self) -> None:
        self.slowdown.close()


def open_runtime(ctx: Any, options: dict[str, Any], gang: Any) -> StrategyRuntime:
    """Build this rank's runtime of the strategy ``options`` names."""
    from components.runtime.contract.registry import import_path

    name = options.get("strategy", DEFAULT_STRATEGY)
    strategy = strategies().get(name)
    if strategy is None:
        raise ValueError(f"no installed strategy is called {name!r}")
    if gang.world_size < strategy.min_workers:
        raise ValueError(f"{name} needs at least {strategy.min_workers} workers; this job has {gang.world_size}")
    cls = import_path(strategy.runtime)
    if not (isinstance(cls, type) and issubclass(cls, StrategyRuntime)):
        raise TypeError(f"{strategy.runtime} is not a StrategyRuntime")
    return cls(ctx, options, gang)


# -- fault injection -------------------------------------------------------------------------------------------
class Slowdown:
    """Makes this rank slow on the steps the ``slow`` options choose.

    - ``ranks: [r...]``: those ranks are slow on every step; ``random: p``: each rank starts a slow *episode* of
      ``duration`` steps (default 20) with probability ``p`` per step (seeded by ``seed`` and the rank, so a run
      is reproducible). Episodes, not independent steps: real slowdowns persist (contention, a noisy neighbour).
    - ``factor``: a slow rank does its work ``factor`` times slower. ``mode: sleep`` (default) sleeps
      ``(factor - 1)`` times the CPU time per sample measured so far (:meth:`observe`) for each sample about to be
      processed (:meth:`delay`), so a slow rank given fewer samples catches up, as a slow machine would;
      ``mode: cpu`` runs a burner process pinned to this rank's CPUs while it is slow (real contention; the
      slowdown is then whatever the contention costs)."""

    def __init__(self, options: dict[str, Any] | None, rank: int, world_size: int = 1):
        options = dict(options or {})
        self.enabled = bool(options)
        self.rank = rank
        self.factor = float(options.get("factor", 2.0))
        self.ranks = set(options.get("ranks") or ())
        self.chance = float(options.get("random") or 0.0)
        self.duration = int(options.get("duration", 20))
        self.mode = options.get("mode", "sleep")
        self.rng = random.Random((int(options.get("seed", 0)) << 16) ^ (rank * 7919 + 17))
        self.step = -1
        self.active = False
        self.episode_left = 0
        self.per_sample = 0.0  # CPU seconds per sample (exponential moving average)
        self.slowed_steps = 0
        self.slept = 0.0
        self._burner: subprocess.Popen | None = None

    def advance(self) -> bool:
        """Start the next step; True when this rank is slow during it."""
        self.step += 1
        if not self.enabled:
            return False
        slow = self.rank in self.ranks
        if self.chance:
            if self.episode_left > 0:
                self.episode_left -= 1
                slow = True
            elif self.rng.random() < self.chance:
                self.episode_left = self.duration - 1
                slow = True
        self.active = slow
        if slow:
            self.slowed_steps += 1
        if self.mode == "cpu":
            self._contend(slow)
        return slow

    def observe(self, cpu_seconds: float, samples: int) -> None:
        """Record the CPU time ``samples`` samples took on this rank (the work a slow rank is slower at)."""
        if samples > 0 and cpu_seconds > 0:
            rate = cpu_seconds / samples
            self.per_sample = rate if self.per_sample == 0 else 0.8 * self.per_sample + 0.2 * rate

    def delay(self, samples: int) -> float:
        """Sleep as long as ``samples`` more samples cost a slow rank (sleep mode); returns the seconds slept."""
        if not (self.enabled and self.active and self.mode == "sleep") or samples <= 0:
            return 0.0
        seconds = (self.factor - 1.0) * self.per_sample * samples
        if seconds > 0:
            time.sleep(seconds)
            self.slept += seconds
        return seconds

    def _contend(self, on: bool) -> None:
        if on and self._burner is None:
            cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
            code = ("import os,sys\n"
                    "cpus=[int(c) for c in sys.argv[1:]]\n"
                    "hasattr(os,'sched_setaffinity') and cpus and os.sched_setaffinity(0,cpus)\n"
                    "while True: pass\n")
            self._burner = subprocess.Popen([sys.executable, "-c", code, *map(str, cpus)],
                                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        elif not on:
            self.close()

    def close(self) -> None:
        if self._burner is not None:
            with contextlib.suppress(OSError):
                self._burner.kill()
            with contextlib.suppress(Exception):
                self._burner.wait(timeout=5)
            self._burner = None


class Link:
    """An emulated network link of ``mbit`` Mbit/s: :meth:`send` sleeps for the time the bytes take on it
    (nothing when no bandwidth is set). Counts the bytes either way."""

    def __init__(self, mbit: float | None):
        self.mbit = float(mbit) if mbit else None
        self.bytes = 0
        self.seconds = 0.0

    def send(self, nbytes: int) -> float:
        self.bytes += int(nbytes)
        if not self.mbit or nbytes <= 0:
            return 0.0
        seconds = nbytes * 8 / (self.mbit * 1e6)
        time.sleep(seconds)
        self.seconds += seconds
        return seconds


def ring_allreduce_bytes(nbytes: int, world_size: int) -> int:
    """Bytes one rank sends in a ring all-reduce of ``nbytes``: 2 (n-1)/n of the payload."""
    if world_size <= 1:
        return 0
    return int(2 * (world_size - 1) * nbytes / world_size)


def check_strategy(strategy: Strategy, path: str, name: str | None) -> None:
    """The registry's check of a ``strategies`` part: a name and the path of its node-side runtime."""
    from components.runtime.contract.plugins import NAME_RE

    if not isinstance(strategy.name, str) or not NAME_RE.match(strategy.name):
        raise ValueError(f"{path}: a strategy needs a name matching {NAME_RE.pattern}")
    if not isinstance(strategy.runtime, str) or ":" not in strategy.runtime:
        raise ValueError(f"{path}: runtime must be the 'module:Class' of a StrategyRuntime")
