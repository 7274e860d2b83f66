"""SwitchFlow stages: splitting, bit-identical preemptible training, and preemption bounded by one stage (or,
serving in place between operators, by one operator)."""

import random
import time

import pytest
import torch
from torch import nn

from components.gpushare.executor import DeviceExecutor
from components.gpushare.lanes import MemoryRequest
from components.gpushare.sessions import Progress
from components.gpushare.stages import (
    InferenceSession,
    StagedSession,
    StagedWorkloadSession,
    as_sequential,
    partition,
    split_sequential,
)
from components.train.spec import TrainSpec
from components.train.workloads import builtin_workload


def test_partition_minimizes_the_largest_stage():
    assert partition([1, 1, 1, 1], 2) == [2, 2]
    assert partition([5, 1, 1, 1, 1, 1], 2) == [1, 5]
    assert partition([1, 2, 3], 5) == [1, 1, 1]  # no more stages than layers
    sizes = partition([3, 1, 4, 1, 5, 9, 2, 6], 3)
    assert sum(sizes) == 8 and max(sum([3, 1, 4, 1, 5, 9, 2, 6][sum(sizes[:i]):sum(sizes[:i + 1])])
                                   for i in range(3)) == 14


def test_split_sequential_shares_the_layers():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    stages = split_sequential(model, [2, 2, 1])
    assert [len(stage) for stage in stages] == [2, 2, 1]
    assert stages[0][0] is model[0]
    x = torch.randn(3, 4)
    out = x
    for stage in stages:
        out = stage(out)
    assert torch.equal(out, model(x))
    assert len(split_sequential(model, 2, sample=x)) == 2
    with pytest.raises(ValueError):
        split_sequential(model, [2, 2])
    with pytest.raises(TypeError):
        split_sequential(nn.Linear(2, 2), 2)


def test_a_model_is_split_where_it_says_and_otherwise_runs_as_one_stage():
    sequential = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    assert as_sequential(sequential) is sequential

    class Two(nn.Module):  # says where to cut itself
        def __init__(self):
            super().__init__()
            self.first, self.second = nn.Linear(4, 8), nn.Linear(8, 2)

        def forward(self, x):
            return self.second(self.first(x))

        def stages(self):
            return [self.first, self.second]

    two = Two()
    layers = as_sequential(two)
    assert [stage for stage in layers] == [two.first, two.second]

    opaque = nn.GRU(2, 2)  # says nothing: one stage, the model itself
    layers = as_sequential(opaque)
    assert len(layers) == 1 and layers[0] is opaque
    stages = split_sequential(layers, 3)
    assert len(stages) == 1

    class Holder(nn.Module):  # a submodule called "stages" is not a method that splits the model
        def __init__(self):
            super().__init__()
            self.stages = nn.ModuleList([nn.Linear(2, 2)])

        def forward(self, x):
            return self.stages[0](x)

    holder = Holder()
    assert list(as_sequential(holder)) == [holder]


@pytest.mark.parametrize(
    ("workload", "fields", "stages", "steps"),
    [
        ("mlp-digits", {"hidden": 32}, 3, 12),
        ("cnn-synthetic", {"hidden": 8}, [3, 3, 2], 8),
        ("tiny-gpt", {"hidden": 32, "batch_size": 8}, 4, 4),
    ],
)
def test_a_preempted_staged_job_ends_bit_identical_to_plain_steps(workload, fields, stages, steps):
    spec = TrainSpec().validate({"workload": workload, "seed": 5, **fields})
    staged = StagedWorkloadSession(lambda: builtin_workload(workload), spec, stages, steps=steps)
    staged.start(torch.device("cpu"))
    rng = random.Random(0)
    progress, yields = None, 0
    while progress is not Progress.DONE:
        progress = staged.step(lambda: rng.random() < 0.3)  # preempted at random stage boundaries
        yields += progress is Progress.YIELDED
    assert yields > 0 and staged.step_count == steps

    plain = builtin_workload(workload)
    plain.setup(spec, torch.device("cpu"))
    for step in range(steps):
        plain.train_step(plain.batch(*divmod(step, plain.steps_per_epoch())))
    for (name, left), right in zip(staged.workload.model.state_dict().items(),
                                   plain.model.state_dict().values(), strict=True):
        assert torch.equal(left, right), name
    for left, right in zip(staged.workload.optimizer.state_dict()["state"].values(),
                           plain.optimizer.state_dict()["state"].values(), strict=True):
        assert all(torch.equal(left[key], right[key]) for key in left)


def wide_mlp(width=768, depth=4):
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def test_inference_preempts_training_within_one_stage():
    torch.manual_seed(0)
    model = wide_mlp()
    stages = split_sequential(model, [2, 2, 2, 2, 1])
    inputs, targets = torch.randn(256, 768), torch.randint(0, 10, (256,))
    # Stage boundaries only: the bound this test checks is one stage.
    training = StagedSession(stages, torch.optim.SGD(model.parameters(), lr=1e-3),
                             batch=lambda step: (inputs, targets), steps=10**6, operator_preemption=False)
    served = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    rng = random.Random(1)
    with DeviceExecutor("cpu", "1GiB", "pack", measure_iterations=0) as executor:
        executor.serve("served", InferenceSession(served), MemoryRequest(2**20, 2**20))
        executor.submit("train", training, MemoryRequest(64 * 2**20, 64 * 2**20))
        while executor.job_status("train")["steps"] < 2:
            time.sleep(0.005)
        latencies = []
        for _ in range(12):
            time.sleep(rng.uniform(0.01, 0.05))
            sent = time.perf_counter()
            executor.infer("served", torch.randn(1, 32)).result(10)
            latencies.append(time.perf_counter() - sent)
        status = executor.status()
        step_time = status["jobs"]["train"]["step_time_s"]
        executor.cancel("train")
    longest_stage = training.longest_action_s
    preemption = status["counters"]["preemption_latency"]
    assert status["counters"]["preemptions"] >= 8
    assert preemption["count"] >= 8
    # Bounded by the longest stage (plus scheduling slack), far below a whole iteration.
    assert preemption["max_s"] <= longest_stage + 0.01
    assert preemption["p50_s"] < step_time / 3
    assert sorted(latencies)[len(latencies) // 2] < step_time / 2


def test_requests_served_between_operators_leave_training_bit_identical():
    spec = TrainSpec().validate({"workload": "tiny-gpt", "seed": 5, "hidden": 32, "batch_size": 8})
    steps = 3
    staged = StagedWorkloadSession(lambda: builtin_workload("tiny-gpt"), spec, 4, steps=steps)
    staged.start(torch.device("cpu"))
    served_model = builtin_workload("tiny-gpt")
    served_model.setup(TrainSpec().validate({"workload": "tiny-gpt"}), torch.device("cpu"))
    served_model = served_model.model.eval()
    request = torch.randint(0, 95, (1, 16), generator=torch.Generator().manual_seed(0))
    expected = served_model(request).detach()
    rng = random.Random(2)
    state = {"pending": False, "other": False}
    actions, outputs = set(), []

    def should_yield():
        if rng.random() < 0.05:
            state["pending"] = True  # a request arrives
        if rng.random() < 0.002:
            state["other"] = True  # a reason to give the device up at the next stage boundary
        return state["pending"] or state["other"]

    def serve_pending():
        if not state["pending"]:
            return 0.0
        began = time.perf_counter()
        actions.add(staged._plan[staged._position][0])
        with torch.inference_mode():
            outputs.append(served_model(request))
        state["pending"] = False
        return time.perf_counter() - began

    should_yield.serve_pending = serve_pending
    progress, yields = None, 0
    while progress is not Progress.DONE:
        progress = staged.step(should_yield)
        if progress is Progress.YIELDED:
            yields += 1
            state["other"] = False
    # Requests were served inside forward, backward and the optimizer step, not only between stages.
    assert {"forward", "backward", "step"} <= actions
    assert staged.inline_points == len(outputs) > 20
    assert all(torch.equal(output, expected) for output in outputs)

    plain = builtin_workload("tiny-gpt")
    plain.setup(spec, torch.device("cpu"))
    for step in range(steps):
        plain.train_step(plain.batch(*divmod(step, plain.steps_per_epoch())))
    for (name, left), right in zip(staged.workload.model.state_dict().items(),
                                   plain.model.state_dict().values(), strict=True):
        assert torch.equal(left, right), name
    for left, right in zip(staged.workload.optimizer.state_dict()["state"].values(),
                           plain.optimizer.state_dict()["state"].values(), strict=True):
        assert all(torch.equal(left[key], right[key]) for key in left)


def test_inference_preempts_training_within_one_operator():
    torch.manual_seed(0)
    model = wide_mlp()
    stages = split_sequential(model, [len(model)])  # one stage: stage boundaries alone would not help
    inputs, targets = torch.randn(256, 768), torch.randint(0, 10, (256,))
    training = StagedSession(stages, torch.optim.Adam(model.parameters(), lr=1e-3),
                             batch=lambda step: (inputs, targets), steps=10**6)
    served = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    rng = random.Random(1)
    with DeviceExecutor("cpu", "1GiB", "pack", measure_iterations=0) as executor:
        executor.serve("served", InferenceSession(served), MemoryRequest(2**20, 2**20))
        executor.submit("train", training, MemoryRequest(64 * 2**20, 64 * 2**20))
        while executor.job_status("train")["steps"] < 2:
            time.sleep(0.005)
        latencies = []
        for _ in range(12):
            time.sleep(rng.uniform(0.01, 0.05))
            sent = time.perf_counter()
            executor.infer("served", torch.randn(1, 32)).result(10)
            latencies.append(time.perf_counter() - sent)
        status = executor.status()
        steps = executor.job_status("train")["steps"]
        executor.cancel("train")
    longest_stage = training.longest_action_s  # the whole forward or backward: one stage
    preemption = status["counters"]["preemption_latency"]
    assert training.inline_points >= 8
    assert steps >= 2 and preemption["count"] >= 8
    # Served between two operators: far below the one (long) stage the request arrived in.
    assert preemption["p50_s"] < longest_stage / 4
    assert sorted(latencies)[len(latencies) // 2] < longest_stage / 2
