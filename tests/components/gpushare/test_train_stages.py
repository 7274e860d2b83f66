"""SwitchFlow in the platform's path: a TrainLoop run by a TrainLoopSession yields at stage boundaries (to a
higher-priority job, an inference request or a cancel) and resumes, ending bit-identical to a plain run."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import pytest
import torch

from components.gpushare.executor import DeviceExecutor
from components.gpushare.lanes import MemoryRequest
from components.gpushare.sessions import CallableSession, Progress, TrainLoopSession
from components.gpushare.stages import InferenceSession, StagedTrainStep
from components.runtime.contract.context import LocalContext
from components.train.loop import TrainLoop, cpu_snapshot
from components.train.spec import TrainSpec
from components.train.workloads import MLPDigits, builtin_workload

pytestmark = pytest.mark.timeout(180)


@dataclass
class MetricsContext(LocalContext):
    """Keeps every metrics call and checkpoint (step -> state)."""

    reported: list = field(default_factory=list)
    checkpoints: dict = field(default_factory=dict)

    def metrics(self, values, step=None):
        self.reported.append((step, {k: v for k, v in values.items() if k != "samples_per_s"}))
        super().metrics(values, step)

    def checkpoint(self, state):
        self.checkpoints[int(state["step"])] = cpu_snapshot(state["state"])  # not live tensors
        super().checkpoint(state)


def make_loop(tmp_path, name, spec, workload=None):
    ctx = MetricsContext(job_id=name, attempt_id=f"{name}-attempt", spec=spec, workdir=tmp_path / name)
    return TrainLoop(workload or builtin_workload(spec["workload"]), spec, ctx, owns_process=False), ctx


def same(left, right) -> bool:
    if isinstance(left, torch.Tensor):
        return isinstance(right, torch.Tensor) and left.dtype == right.dtype and torch.equal(left, right)
    if isinstance(left, dict):
        return left.keys() == right.keys() and all(same(left[k], right[k]) for k in left)
    if isinstance(left, list | tuple):
        return len(left) == len(right) and all(same(a, b) for a, b in zip(left, right, strict=True))
    return left == right


def assert_same_run(loop, ctx, plain, plain_ctx):
    assert loop.step_count == plain.step_count
    for (name, left), right in zip(loop.workload.model.state_dict().items(),
                                   plain.workload.model.state_dict().values(), strict=True):
        assert torch.equal(left, right), name
    assert same(loop.workload.optimizer.state_dict(), plain.workload.optimizer.state_dict())
    assert same(ctx.reported, plain_ctx.reported)  # every reported training and evaluation metric
    assert ctx.checkpoints.keys() == plain_ctx.checkpoints.keys()
    assert all(same(ctx.checkpoints[step], plain_ctx.checkpoints[step]) for step in ctx.checkpoints)


@pytest.mark.parametrize(
    ("workload", "fields"),
    [
        ("mlp-digits", {"hidden": 32, "max_steps": 25}),
        ("cnn-synthetic", {"hidden": 8, "max_steps": 6}),
        ("tiny-gpt", {"hidden": 32, "batch_size": 8, "max_steps": 8}),
    ],
)
def test_a_train_loop_preempted_at_stage_boundaries_ends_bit_identical_to_a_plain_run(tmp_path, workload, fields):
    spec = TrainSpec().validate({"workload": workload, "seed": 11, "log_every": 3, "checkpoint_every": 4,
                                 **fields})
    loop, ctx = make_loop(tmp_path, "staged", spec)
    session = TrainLoopSession(loop)
    session.start(torch.device("cpu"))
    assert isinstance(session.train_step, StagedTrainStep) and len(session.train_step.stages) >= 5
    rng = random.Random(0)
    progress = None
    suspended = {}  # step -> the workload's state while a step was suspended
    while progress is not Progress.DONE:
        progress = session.step(lambda: rng.random() < 0.3)  # preempted at random stage boundaries
        if progress is Progress.YIELDED:
            assert session.mid_iteration
            suspended[loop.step_count] = cpu_snapshot(loop.workload.state_dict())
    assert session.yields > 5

    plain, plain_ctx = make_loop(tmp_path, "plain", spec)
    assert plain.run()
    assert_same_run(loop, ctx, plain, plain_ctx)
    # While suspended, the state is the one before the step (a checkpoint then would be consistent).
    common = suspended.keys() & plain_ctx.checkpoints.keys()
    assert common
    assert all(same(suspended[step], plain_ctx.checkpoints[step]) for step in common)
    assert same(session.summary["train"], plain.finish()["train"])


def test_a_suspended_step_blocks_another_step_and_custom_train_steps_run_whole(tmp_path):
    spec = TrainSpec().validate({"workload": "mlp-digits", "hidden": 16, "max_steps": 4})
    loop, _ = make_loop(tmp_path, "a", spec)
    loop.start()
    pending = loop.step_stages(StagedTrainStep(loop.workload))
    next(pending)
    with pytest.raises(RuntimeError, match="in progress"):
        loop.step()
    pending.close()  # abandoned: the loop is back between steps
    assert loop.step_count == 0
    loop.step()
    assert loop.step_count == 1

    class Custom(MLPDigits):  # an overridden train_step (as user code has) must not be staged
        def train_step(self, batch):
            return super().train_step(batch)

    loop, _ = make_loop(tmp_path, "b", spec, workload=Custom())
    session = TrainLoopSession(loop)
    session.start(torch.device("cpu"))
    assert session.train_step is None
    assert session.step(lambda: True) is Progress.ITERATION  # a whole step, never yielded
    assert loop.step_count == 1 and session.yields == 0


def test_a_high_priority_job_preempts_a_train_loop_within_one_stage_and_the_loop_resumes(tmp_path):
    spec = TrainSpec().validate({"workload": "tiny-gpt", "hidden": 128, "batch_size": 64, "seed": 2,
                                 "max_steps": 16, "log_every": 4, "checkpoint_every": 8})
    loop, ctx = make_loop(tmp_path, "low", spec)
    low = TrainLoopSession(loop)
    rng = random.Random(3)
    latencies: list[float] = []
    stage_maxima: list[float] = []  # the longest stage of recent (warm, unmetered) iterations
    with DeviceExecutor("cpu", "1GiB", "priority") as executor:
        executor.submit("low", low, MemoryRequest(2**20, 2**20))
        for round_ in range(4):
            while executor.job_status("low")["steps"] < 2 + 3 * round_:
                time.sleep(0.002)
            step_s = executor.job_status("low")["step_time_s"]
            time.sleep(rng.uniform(0.1, 0.8) * step_s)  # somewhere inside an iteration
            began: list[float] = []
            high = CallableSession(lambda began=began: began.append(time.perf_counter()), steps=2)
            sent = time.perf_counter()
            executor.submit(f"high-{round_}", high, MemoryRequest(2**20, 2**20), priority=5)
            assert executor.wait(f"high-{round_}", 20)["state"] == "succeeded"
            latencies.append(began[0] - sent)
            stage_maxima.append(max(list(low.train_step.action_durations.values())))  # a recent iteration's
        low_status = executor.wait("low", 60)
        counters = executor.status()["counters"]
        timeline = executor.timeline()
    assert low_status["state"] == "succeeded", low_status["error"]
    assert low.yields >= 1 and counters["preemptions"] >= 1
    assert any(entry["job"] == "low" and entry["kind"] == "slice" for entry in timeline)
    longest_stage = max([*stage_maxima, *low.train_step.action_durations.values()])
    iteration_s = low_status["step_time_s"]
    print(f"submit-to-start {[round(x * 1000, 1) for x in latencies]} ms; longest stage "
          f"{longest_stage * 1000:.1f} ms; iteration {iteration_s * 1000:.1f} ms; preemption latency "
          f"{counters['preemption_latency']}")
    # Within about one stage of the running loop, clearly less than one of its iterations.
    assert max(latencies) <= longest_stage + 0.025
    assert max(latencies) < iteration_s / 2

    plain, plain_ctx = make_loop(tmp_path, "plain", spec)
    assert plain.run()
    assert_same_run(loop, ctx, plain, plain_ctx)


@pytest.mark.parametrize("operator_preemption", [False, True])
def test_an_inference_request_preempts_a_train_loop_at_a_stage_boundary(tmp_path, operator_preemption):
    """Requests are served at the next stage boundary (the loop yields), or, with operator-level preemption,
    in place between two of the step's operators; either way the run is bit-identical to an unpreempted one."""
    spec = TrainSpec().validate({"workload": "tiny-gpt", "hidden": 64, "batch_size": 32, "max_steps": 10})
    loop, ctx = make_loop(tmp_path, "train", spec)
    session = TrainLoopSession(loop, operator_preemption=operator_preemption)
    model = torch.nn.Linear(8, 2)
    with DeviceExecutor("cpu", "1GiB", "pack") as executor:
        executor.serve("served", InferenceSession(model), MemoryRequest(2**16, 2**16))
        executor.submit("train", session, MemoryRequest(2**20, 2**20))
        while executor.job_status("train")["steps"] < 2:
            time.sleep(0.002)
        for _ in range(3):
            time.sleep(0.013)
            executor.infer("served", torch.ones(1, 8)).result(10)
        status = executor.wait("train", 60)
    assert status["state"] == "succeeded"
    if operator_preemption:
        assert session.inline_points >= 1 and session.yields == 0
    else:
        assert session.yields >= 1 and session.inline_points == 0
    plain, plain_ctx = make_loop(tmp_path, "plain", spec)
    assert plain.run()
    assert_same_run(loop, ctx, plain, plain_ctx)
