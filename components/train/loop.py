"""The training loop: drives one :class:`~components.train.workloads.Workload` through a job's Context.

The loop is a state machine advanced by :meth:`TrainLoop.step`, one optimizer step per call, so that a
runtime may interleave the steps of several jobs (e.g. on one shared GPU). :meth:`TrainLoop.run` is the
plain single-job driver: start, step until done or stopped, finish. :meth:`TrainLoop.step_stages` is the same
step as a generator suspended at stage boundaries (given a staged ``train_step``), so that a shared device can
preempt a job inside an iteration.

A runtime that steps several jobs on one device thread (the GPU-sharing service) keeps network and disk work
off that thread: :meth:`TrainLoop.prefetch` downloads the job's checkpoint before the job is admitted, and
:meth:`TrainLoop.use_host_io` makes checkpoints and the final artifacts a consistent CPU snapshot taken on the
device thread, serialized and uploaded by a per-job :class:`HostIO` thread (:meth:`TrainLoop.wait_host_io`
waits for them).
"""

from __future__ import annotations

import copy
import json
import random
import tempfile
import threading
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import torch

from components.runtime.contract.context import Context
from components.train.model_format import describe_model, export_program, save_model
from components.train.workloads import Workload, derive_seed

CHECKPOINT_FORMAT = 1
# A gang agrees on stopping (one small all-reduce) every this many steps, not every step.
GANG_STOP_EVERY = 8


class TrainLoop:
    """Steps a workload, reports metrics and logs, checkpoints and resumes through ``ctx``.

    Lifecycle::

        loop = TrainLoop(workload, spec, ctx)
        loop.start()              # seed, workload.setup(), resume from ctx.restore()
        while not loop.done:
            loop.step()           # one optimizer step; reports, evaluates, checkpoints on schedule
        loop.finish()             # final evaluation, model.pt (model_format) and metrics.json artifacts

    Step ``n`` (0-based, counted over the whole run) is batch ``n % steps_per_epoch`` of epoch
    ``n // steps_per_epoch``, so the global step is all the position a checkpoint has to remember.

    ``owns_process`` (default True) lets the loop seed and checkpoint the process-global RNGs (torch, numpy,
    random), which user workloads may rely on. A runtime interleaving several jobs in one process passes
    False: the built-in workloads use only their own generators and stay reproducible either way.
    """

    def __init__(
        self,
        workload: Workload,
        spec: dict[str, Any],
        ctx: Context,
        *,
        device: str | torch.device | None = None,
        owns_process: bool = True,
    ):
        self.workload = workload
        self.spec = spec
        self.ctx = ctx
        self.device = torch.device(device if device is not None else ctx.torch_device)
        self.owns_process = owns_process
        self.step_count = 0
        self.resumed_from: int | None = None
        self.started = False
        self.last_eval: dict[str, float] = {}
        self._eval_step: int | None = None
        self._checkpoint_step: int | None = None
        self._window = _Accumulator()
        self._epoch = _Accumulator()
        self._last_train: dict[str, float] = {}
        self._samples = 0
        self._prefetched: tuple[dict[str, Any] | None] | None = None
        self.host_io: HostIO | None = None
        self._in_step = False  # a step_stages() generator is suspended mid-step
        # Distributed training (spec.distributed): this rank's gang and strategy runtime, set up by start().
        self.gang: Any = None
        self.parallel: Any = None
        self._synchronized_at: int | None = None
        self.stopped_together = False  # the run stopped early at a step every rank agreed on

    # -- host work off the device thread -----------------------------------------------------------------
    def use_host_io(self) -> HostIO:
        """Upload checkpoints and the final artifacts on a background thread (see :class:`HostIO`)."""
        if self.host_io is None:
            self.host_io = HostIO(name=f"train-io-{self.ctx.attempt_id[:8]}")
        return self.host_io

    def wait_host_io(self, timeout: float | None = None) -> None:
        """Wait for the queued uploads; raises the first upload error (the attempt must then fail)."""
        if self.host_io is not None:
            self.host_io.wait(timeout)

    def prefetch(self) -> None:
        """Download and load the job's latest checkpoint now (any thread), so :meth:`start` does no I/O."""
        self._prefetched = (self.ctx.restore(),)

    # -- position ----------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.spec.get("workload") or self.spec.get("entrypoint") or self.workload.name

    @property
    def rank(self) -> int:
        return self.gang.rank if self.gang is not None else 0

    @property
    def lead(self) -> bool:
        """True on the rank that evaluates, checkpoints, uploads and logs the job's progress (rank 0)."""
        return self.rank == 0

    @property
    def done(self) -> bool:
        return self.started and self.step_count >= self.total_steps

    @property
    def epoch(self) -> int:
        """The epoch the next step belongs to (0-based)."""
        return self.step_count // self.steps_per_epoch

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> None:
        """Set up the workload and resume from the job's latest checkpoint, if any."""
        if self.owns_process:
            _seed_globals(self.spec["seed"])
        self.workload.log = self.ctx.log  # the job's log, for workloads with something to say while set up
        self.workload.setup(self.spec, self.device)
        self.steps_per_epoch = int(self.workload.steps_per_epoch())
        if self.steps_per_epoch < 1:
            raise ValueError(f"workload {self.name} has no steps per epoch")
        if self.spec.get("distributed"):
            from components.runtime.contract.distributed import open_runtime
            from components.runtime.node.gang import init_gang

            self.gang = init_gang(self.ctx, self.spec["distributed"])
            self.parallel = open_runtime(self.ctx, self.spec["distributed"], self.gang)
            self.steps_per_epoch = int(self.parallel.steps_per_epoch(self.steps_per_epoch))
        self.total_steps = self.spec["epochs"] * self.steps_per_epoch
        if self.spec.get("max_steps"):
            self.total_steps = min(self.total_steps, self.spec["max_steps"])
        self.started = True

        if self._prefetched is not None:
            (state,), self._prefetched = self._prefetched, None
        else:
            state = self.ctx.restore()
        if state is not None:
            self.load_state_dict(state)
        if self.parallel is not None:
            self.parallel.setup(self.workload)
            if state is not None:
                self.parallel.load_state_dict(state.get("parallel") or {})
        if state is not None:
            self.resumed_from = self.step_count
            if self.workload.finished():  # it had reached its end before the checkpoint
                self.total_steps = min(self.total_steps, self.step_count)
            self.ctx.log(
                f"resumed {self.name} from the checkpoint at step {self.step_count}/{self.total_steps} "
                f"(epoch {min(self.epoch + 1, self.spec['epochs'])}/{self.spec['epochs']})"
            )
        elif self.lead:
            gang = (f" on {self.gang.world_size} workers ({self.spec['distributed']['strategy']}, "
                    f"{self.gang.backend}; batch {self.spec['batch_size']} per worker)" if self.gang else "")
            self.ctx.log(
                f"training {self.name} on {self.device}{gang}: {self.spec['epochs']} epochs x "
                f"{self.steps_per_epoch} steps, {self.total_steps} steps in all; batch {self.spec['batch_size']}, "
                f"{self.spec['optimizer']} lr {self.spec['lr']}, seed {self.spec['seed']}"
            )
        self._window.reset()
        self._epoch.reset()
        self._attempt_began = (time.perf_counter(), self._samples)

    def step(self) -> dict[str, float] | None:
        """Run one optimizer step; returns the metrics it reported, if this was a reporting step."""
        epoch, index = self._position_of_next_step()
        if self.parallel is not None:
            batch = self.parallel.batch(self.workload, epoch, index)
            values = dict(self.parallel.train_step(self.workload, batch))
        else:
            values = dict(self.workload.train_step(self.workload.batch(epoch, index)))
        return self._after_step(values, epoch, index)

    def step_stages(
        self, train_step: Callable[[Any], Generator[Any, None, dict[str, Any]]] | None = None
    ) -> Generator[Any, None, dict[str, float] | None]:
        """One step as a resumable generator: what :meth:`step` does, suspended at stage boundaries.

        ``train_step(batch)`` is a generator computing exactly what ``workload.train_step(batch)`` does and
        returning its metrics (e.g. :class:`components.gpushare.stages.StagedTrainStep`); this generator
        yields whatever it yields. The resume that finishes it also does the step's bookkeeping (metrics,
        evaluation at the end of an epoch, checkpoint) and returns what :meth:`step` returns. Without
        ``train_step`` the step runs whole on the first resume. While it is suspended the loop is between
        steps (the step count, the parameters and the optimizer state are those before it), so a checkpoint
        taken then is consistent; another step may not begin until it is finished or closed.
        """
        epoch, index = self._position_of_next_step()
        self._in_step = True
        try:
            if self.parallel is not None:  # a gang's step is its strategy's, never split into stages
                values = dict(self.parallel.train_step(self.workload,
                                                       self.parallel.batch(self.workload, epoch, index)))
                batch = None
            else:
                batch = self.workload.batch(epoch, index)
            if batch is None:
                pass
            elif train_step is None:
                values = dict(self.workload.train_step(batch))
            else:
                values = dict((yield from train_step(batch)))
        finally:
            self._in_step = False
        return self._after_step(values, epoch, index)

    def _position_of_next_step(self) -> tuple[int, int]:
        if not self.started:
            raise RuntimeError("call start() before step()")
        if self.done:
            raise RuntimeError(f"{self.name} already ran all {self.total_steps} steps")
        if self._in_step:
            raise RuntimeError(f"{self.name}: a staged step is still in progress")
        return divmod(self.step_count, self.steps_per_epoch)

    def _after_step(self, values: dict[str, Any], epoch: int, index: int) -> dict[str, float] | None:
        samples = int(values.pop("samples", self.spec["batch_size"]))
        self.step_count += 1
        self._samples += samples
        self._window.add(values, samples)
        self._epoch.add(values, samples)

        reported = None
        end_of_epoch = index == self.steps_per_epoch - 1
        if self.step_count % self.spec["log_every"] == 0 or self.done or end_of_epoch:
            reported = self._window.means()  # reading the values synchronises the device: only here
            reported["samples_per_s"] = self._window.samples / max(self._window.seconds, 1e-9)
            self._last_train = {name: value for name, value in reported.items() if name != "samples_per_s"}
            if self.lead:
                self.ctx.metrics(reported, self.step_count)
            if self.parallel is not None:
                self._report_ranks(reported)
        if end_of_epoch or self.done:
            self._end_epoch(epoch)
        if self.step_count % self.spec["checkpoint_every"] == 0 or self.done:
            self.checkpoint()
        if reported is not None:
            self._window.reset()  # after evaluation and checkpoint: they do not count against throughput
        return reported

    def _report_ranks(self, reported: dict[str, float]) -> None:
        """Every rank's own metrics, tagged ``rank<r>.<name>``; rank 0's report for the strategy's plugin."""
        own = {"loss": reported["loss"]} if "loss" in reported else {}
        own.update(self.parallel.rank_metrics())
        self.ctx.metrics({f"rank{self.rank}.{name}": value for name, value in own.items()}, self.step_count)
        if self.lead and self.parallel.plugin:
            payload = self.parallel.report()
            if payload is not None:
                self.ctx.report(self.parallel.plugin, payload)

    def synchronize(self) -> None:
        """Distributed: make rank 0's workload hold the gang's whole model (collective; once per step)."""
        if self.parallel is not None and self._synchronized_at != self.step_count:
            self.parallel.synchronize(self.workload)
            self._synchronized_at = self.step_count

    def stop_requested(self) -> bool:
        """``ctx.should_stop()``; in a gang, asked of every rank together every :data:`GANG_STOP_EVERY` steps (a
        collective: true on every rank as soon as it is on one), so the ranks checkpoint and stop at the same
        step, a few steps after the request."""
        if self.gang is None:
            return self.ctx.should_stop()
        if self.step_count % GANG_STOP_EVERY and not self.done:
            return False
        return self.gang.any(self.ctx.should_stop())

    def _end_epoch(self, epoch: int) -> None:
        train = self._epoch.means()
        seconds = self._epoch.seconds
        self._epoch.reset()
        self.synchronize()
        if not self.lead:  # rank 0 evaluates and logs for the gang
            return
        self.last_eval = self.workload.evaluate()
        self._eval_step = self.step_count
        extra = self.workload.end_epoch(epoch, dict(self.last_eval))
        if self.last_eval or extra:
            self.ctx.metrics({**self.last_eval, **extra}, self.step_count)
        summary = ", ".join(f"{name} {value:.4f}" for name, value in {**train, **self.last_eval}.items())
        partial = "" if (epoch + 1) * self.steps_per_epoch <= self.step_count else " (partial)"
        self.ctx.log(f"epoch {epoch + 1}/{self.spec['epochs']}{partial}: {summary} ({seconds:.1f}s)")
        if self.workload.finished() and not self.done:
            self.ctx.log(f"{self.name} finished early after epoch {epoch + 1}: step {self.step_count} of "
                         f"{self.total_steps} planned")
            self.total_steps = self.step_count

    def checkpoint(self) -> None:
        if self._checkpoint_step == self.step_count:
            return
        self.synchronize()
        if not self.lead:  # rank 0 checkpoints the gang's model
            self._checkpoint_step = self.step_count
            return
        if self.host_io is not None:
            # A consistent CPU copy now (training goes on); serialization and upload on the host thread.
            self.host_io.checkpoint(self.ctx.checkpoint, cpu_snapshot(self.state_dict()))
        else:
            self.ctx.checkpoint(self.state_dict())
        self._checkpoint_step = self.step_count

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "format": CHECKPOINT_FORMAT,
            "workload": self.name,
            "step": self.step_count,
            "epoch": self.epoch,
            "samples": self._samples,
            "state": self.workload.state_dict(),
        }
        if self.owns_process:
            state["rng"] = _global_rng_state()
        if self.parallel is not None:
            state["parallel"] = self.parallel.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"unsupported checkpoint format {state.get('format')!r}")
        if state.get("workload") != self.name:
            raise ValueError(f"the checkpoint is of {state.get('workload')!r}, not of {self.name!r}")
        self.workload.load_state_dict(state["state"])
        self.step_count = int(state["step"])
        self._samples = int(state.get("samples", 0))
        self._checkpoint_step = self.step_count
        if self.owns_process and "rng" in state:
            _set_global_rng_state(state["rng"])

    def finish(self) -> dict[str, Any]:
        """Evaluate if needed, upload ``model.pt`` and ``metrics.json``; returns the summary."""
        self.synchronize()
        if not self.lead:
            return {"workload": self.name, "steps": self.step_count, "rank": self.rank}
        if self._eval_step != self.step_count:
            self.last_eval = self.workload.evaluate()
            self._eval_step = self.step_count
            if self.last_eval:
                self.ctx.metrics(self.last_eval, self.step_count)
        seconds = time.perf_counter() - self._attempt_began[0]
        summary = {
            "workload": self.name,
            "steps": self.step_count,
            "total_steps": self.total_steps,
            "epochs": round(self.step_count / self.steps_per_epoch, 4),
            "samples": self._samples,
            "resumed_from_step": self.resumed_from,
            "device": str(self.device),
            # This attempt's wall time and throughput, evaluation and checkpoints included.
            "duration_s": round(seconds, 3),
            "samples_per_s": round((self._samples - self._attempt_began[1]) / max(seconds, 1e-9), 2),
            "train": self._last_train,
            "eval": self.last_eval,
        }
        if self.gang is not None:
            summary["distributed"] = {"strategy": self.spec["distributed"]["strategy"],
                                      "world_size": self.gang.world_size, "backend": self.gang.backend}
        weights = {name: tensor.detach().cpu() for name, tensor in self.workload.model_state().items()}
        # The description is plain values copied now, on the device thread: the upload may come later.
        description = describe_model(self.workload, name=self.name, spec=self.spec)
        program = self._export()
        if self.host_io is not None:
            self.host_io.submit(self._store_results, cpu_snapshot(weights), dict(summary), description, program)
        else:
            self._store_results(weights, summary, description, program)
        return summary

    def _export(self) -> dict[str, Any] | None:
        """A team's model that declares its input (``Workload.serving_input``), exported for serving without its
        class (:func:`components.train.model_format.export_program`); None when there is nothing to export or it
        cannot be exported (logged: the model is then saved without a program)."""
        try:
            program = export_program(self.workload)
        except ValueError as error:
            self.ctx.log(f"model.pt: not exported for serving ({error}); serve it with a loader class of your own "
                         "(the serve kind's model.entrypoint)", level="warning")
            return None
        if program is not None:
            self.ctx.log(f"model.pt: the model is exported (torch.export, rows of {program['input']['shape']} "
                         f"{program['input']['dtype']} -> {program['output']['shape']}): it is served without its "
                         "class")
        return program

    def _store_results(self, weights: dict[str, Any], summary: dict[str, Any],
                       description: dict[str, Any] | None = None, program: dict[str, Any] | None = None) -> None:
        """Upload ``model.pt`` (:mod:`components.train.model_format`) and ``metrics.json``, then log the end of
        training."""
        if description is None:
            description = describe_model(self.workload, name=self.name, spec=self.spec)
        with tempfile.TemporaryDirectory(prefix="strata-train-") as directory:
            model_path = Path(directory) / "model.pt"
            save_model(model_path, description, weights, program)
            self.ctx.artifact(model_path, "model.pt")
            metrics_path = Path(directory) / "metrics.json"
            metrics_path.write_text(json.dumps(summary, indent=2, sort_keys=True))
            self.ctx.artifact(metrics_path, "metrics.json")
        results = ", ".join(f"{name} {value:.4f}" for name, value in {**summary["train"], **summary["eval"]}.items())
        self.ctx.log(f"done: {self.name} ran {self.step_count} steps; {results}")

    def run(self) -> bool:
        """Train to the end (True) or until ``ctx.should_stop()`` (False, after a checkpoint)."""
        try:
            if not self.started:
                self.start()
            while not self.done:
                if self.stop_requested():
                    self.checkpoint()
                    self.ctx.log(
                        f"stopping {self.name} at step {self.step_count}/{self.total_steps}: checkpoint saved"
                    )
                    self.stopped_together = True  # every rank of a gang agreed to stop here
                    return False
                self.step()
            self.finish()
            return True
        finally:
            self.close()

    def close(self) -> None:
        """Let the workload free what it started (loader processes...); idempotent."""
        if not getattr(self, "_closed", False):
            self._closed = True
            self.workload.close()
            if self.parallel is not None:
                self.parallel.close()
            if self.gang is not None:
                self.gang.close(wait=self.done or self.stopped_together)


def cpu_snapshot(value: Any) -> Any:
    """A deep copy of ``value`` with every tensor cloned to the CPU: it no longer changes when training goes on."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        items = [(key, cpu_snapshot(item)) for key, item in value.items()]
        try:
            return type(value)(items)
        except TypeError:  # e.g. a defaultdict
            return dict(items)
    if isinstance(value, list):
        return [cpu_snapshot(item) for item in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(cpu_snapshot(item) for item in value)
    return copy.deepcopy(value)


class HostIO:
    """A job's host-side work (checkpoint serialization and upload, artifact uploads) on a background thread.

    The thread starts when there is work and ends when there is none, so an idle job holds no thread. Work
    runs in order. A checkpoint waiting behind a slow upload is replaced by a newer one (only the latest
    checkpoint matters: each overwrites the last), so a slow store costs memory for at most one pending copy.
    The first error is kept and raised by :meth:`wait`; later work still runs.
    """

    def __init__(self, name: str = "train-io"):
        self.name = name
        self._cond = threading.Condition()
        self._queue: list[tuple[str, Callable[..., Any], tuple]] = []
        self._busy = False
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.done = 0  # work items finished
        self.superseded = 0  # checkpoints replaced by a newer one before they were stored

    def checkpoint(self, save: Callable[[dict[str, Any]], None], state: dict[str, Any]) -> None:
        with self._cond:
            for index, (kind, _, _) in enumerate(self._queue):
                if kind == "checkpoint":
                    self._queue[index] = ("checkpoint", save, (state,))
                    self.superseded += 1
                    return
        self._put("checkpoint", save, (state,))

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        self._put("call", fn, args)

    def _put(self, kind: str, fn: Callable[..., Any], args: tuple) -> None:
        with self._cond:
            self._queue.append((kind, fn, args))
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
                self._thread.start()

    def _work(self) -> None:
        while True:
            with self._cond:
                if not self._queue:
                    self._thread = None
                    self._busy = False
                    self._cond.notify_all()
                    return
                _, fn, args = self._queue.pop(0)
                self._busy = True
            try:
                fn(*args)
            except BaseException as error:  # noqa: BLE001 -- kept for wait()
                with self._cond:
                    self.error = self.error or error
            with self._cond:
                self.done += 1

    @property
    def idle(self) -> bool:
        with self._cond:
            return not self._queue and self._thread is None

    def wait(self, timeout: float | None = None) -> None:
        """Block until the queued work is done; raise the first error, or TimeoutError."""
        with self._cond:
            if not self._cond.wait_for(lambda: not self._queue and self._thread is None, timeout):
                raise TimeoutError(f"{self.name}: uploads still running after {timeout:g} s")
            error = self.error
        if error is not None:
            raise error


class _Accumulator:
    """Sums of step metrics (tensors stay on the device until read) weighted by batch size."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.sums: dict[str, Any] = {}
        self.samples = 0
        self.started = time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def add(self, values: dict[str, Any], samples: int) -> None:
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                value = value.detach().float()
            self.sums[name] = self.sums.get(name, 0.0) + value * samples
        self.samples += samples

    def means(self) -> dict[str, float]:
        return {name: float(total) / max(self.samples, 1) for name, total in self.sums.items()}


def _seed_globals(seed: int) -> None:
    global_seed = derive_seed(seed, "global")
    torch.manual_seed(global_seed)  # seeds CUDA devices too
    random.seed(global_seed)
    try:
        import numpy

        numpy.random.seed(global_seed % 2**32)
    except ImportError:
        pass


def _global_rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy

        state["numpy"] = numpy.random.get_state()
    except ImportError:
        pass
    return state


def _set_global_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        try:
            import numpy

            numpy.random.set_state(state["numpy"])
        except ImportError:
            pass
