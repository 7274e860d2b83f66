"""SwitchFlow's migration on two CPU "devices": a preempted job's next stages run on a replica, the copies
agree after every optimizer step, and the run ends bit-identical to one that never moved."""

import random
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from components.gpushare.executor import DeviceExecutor
from components.gpushare.lanes import MemoryRequest
from components.gpushare.migration import MigrationTarget
from components.gpushare.sessions import Progress, WorkloadSession
from components.gpushare.stages import StagedWorkloadSession
from components.train.spec import TrainSpec
from components.train.workloads import Workload, builtin_workload, generator

REQUEST = MemoryRequest(2**26, 2**26)


class UsersWorkload(Workload):
    """A user's own Workload (not a built-in): its own model with BatchNorm (buffers updated in forward),
    its own data and optimizer, the Workload API only."""

    def setup(self, spec, device):
        rng = generator(spec["seed"])
        self.x = torch.randn(96, 12, generator=rng).to(device)
        self.y = (self.x[:, :3].sum(dim=1) > 0).long().to(device)
        torch.manual_seed(spec["seed"])
        self.model = nn.Sequential(nn.Linear(12, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 16),
                                   nn.Tanh(), nn.Linear(16, 2)).to(device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)

    def steps_per_epoch(self):
        return 6

    def batch(self, epoch, index):
        order = torch.randperm(96, generator=generator(epoch))
        rows = order[index * 16:(index + 1) * 16]
        return self.x[rows], self.y[rows]

    def train_step(self, batch):
        inputs, targets = batch
        self.model.train()
        loss = F.cross_entropy(self.model(inputs), targets)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return {"loss": loss.detach(), "samples": len(targets)}

    def state_dict(self):
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state):
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


class Checked(StagedWorkloadSession):
    """Asserts after every optimizer step, on whichever device ran it, that both copies agree exactly."""

    checks = 0

    def _run(self, action, index):
        super()._run(action, index)
        if action == "step" and self._fallback is not None:
            assert_replicas_agree(self)
            self.checks += 1


def assert_replicas_agree(session):
    primary, fallback = session._primary, session._fallback
    for a, b in zip(primary.params + primary.buffers, fallback.params + fallback.buffers, strict=True):
        assert torch.equal(a, b)
    mapping = dict(zip(map(id, primary.params), fallback.params, strict=True))
    for param, state in primary.optimizer.state.items():
        other = fallback.optimizer.state[mapping[id(param)]]
        assert state.keys() == other.keys()
        for key, value in state.items():
            assert torch.equal(value, other[key]) if isinstance(value, torch.Tensor) else value == other[key]


def tensors(session):
    model = session.workload.model
    state = session.workload.optimizer.state_dict()["state"]
    return [*model.state_dict().values(), *(v for s in state.values() for v in s.values()
                                            if isinstance(v, torch.Tensor))]


def drive(session, script):
    """Step ``session`` to the end; ``script(session, asking_from_away)`` answers ``contended()``."""
    while True:
        def should_yield():
            return False
        should_yield.contended = lambda: script(session, session.away)
        progress = session.step(should_yield)
        if progress is Progress.DONE:
            return
        if progress is Progress.YIELDED:
            deadline = time.monotonic() + 30
            while not session.ready():
                assert time.monotonic() < deadline
                time.sleep(0.001)


def random_script(seed):
    """Leave at a random action boundary (every position of the plan gets its turn), stay away a random
    number of actions (sometimes whole iterations), come back."""
    rng = random.Random(seed)
    state = {"countdown": 0}

    def script(session, away):
        if away:
            return rng.random() < 0.85
        state["countdown"] -= 1
        if state["countdown"] < 0:
            state["countdown"] = rng.randrange(0, 2 * len(session.stages) + 2)
            return True
        return False

    return script


CASES = [
    ("tiny-gpt", {"hidden": 32, "batch_size": 8}, [1] * 6),
    ("mlp-digits", {"hidden": 32}, 2),
    ("cnn-synthetic", {"hidden": 8}, 3),
]


@pytest.mark.parametrize(("name", "spec", "stages"), CASES)
def test_a_migrated_run_ends_bit_identical_and_the_copies_agree_after_every_step(name, spec, stages):
    normalized = TrainSpec().validate({"workload": name, **spec})
    steps = 8
    plain = StagedWorkloadSession(lambda: builtin_workload(name), normalized, stages, steps=steps)
    plain.start(torch.device("cpu"))
    drive(plain, lambda session, away: False)
    moved = Checked(lambda: builtin_workload(name), normalized, stages, steps=steps,
                    migrate_to=MigrationTarget("cpu", name="second"))
    moved.start(torch.device("cpu"))
    drive(moved, random_script(hash(name) % 1000))
    stats = moved.migration_stats()
    assert stats["migrations"] >= 3 and stats["steps_away"] >= 1 and stats["returns"] >= 1
    assert moved.checks == steps  # every optimizer step was followed by equal copies
    for a, b in zip(tensors(plain), tensors(moved), strict=True):
        assert torch.equal(a, b)
    # And the staged run is the plain train_step's run.
    reference = builtin_workload(name)
    reference.setup(normalized, torch.device("cpu"))
    for step in range(steps):
        reference.train_step(reference.batch(*divmod(step, reference.steps_per_epoch())))
    for a, b in zip(reference.model.state_dict().values(), moved.workload.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_a_users_own_workload_with_batchnorm_migrates_exactly_at_every_boundary():
    spec = TrainSpec().validate({"workload": "mlp-digits", "seed": 3})
    steps = 12
    reference = UsersWorkload()
    reference.setup(spec, torch.device("cpu"))
    for step in range(steps):
        reference.train_step(reference.batch(*divmod(step, 6)))
    for position in range(2 * 3 + 2):  # leave at each action boundary of a 3-stage plan once
        calls = {"n": 0}

        def script(session, away, position=position, calls=calls):
            if away:
                return session.step_count < 6  # stay until half-way, then come back mid-iteration
            calls["n"] += 1
            return calls["n"] == position + 1

        moved = Checked(UsersWorkload, spec, [2, 2, 2], steps=steps, migrate_to=MigrationTarget("cpu"))
        moved.start(torch.device("cpu"))
        drive(moved, script)
        assert moved.migrations == 1 and moved.checks == steps
        for a, b in zip(reference.model.state_dict().values(), moved.workload.model.state_dict().values(),
                        strict=True):
            assert torch.equal(a, b), position  # BatchNorm's running statistics included


def test_the_executor_runs_a_preempted_job_on_its_fallback_device_while_higher_priority_work_holds_it():
    spec = TrainSpec().validate({"workload": "tiny-gpt", "hidden": 32, "batch_size": 8})
    steps = 30
    reference = StagedWorkloadSession(lambda: builtin_workload("tiny-gpt"), spec, 4, steps=steps)
    reference.start(torch.device("cpu"))
    drive(reference, lambda session, away: False)
    with DeviceExecutor("cpu", "1GiB", "priority") as executor:
        low = StagedWorkloadSession(lambda: builtin_workload("tiny-gpt"), spec, 4, steps=steps,
                                    migrate_to=MigrationTarget("cpu", name="second"))
        executor.submit("low", low, REQUEST)
        while executor.job_status("low")["steps"] < 2:
            time.sleep(0.002)
        at = low.step_count
        executor.submit("high", WorkloadSession.builtin("tiny-gpt", steps=15, hidden=32, batch_size=8), REQUEST,
                        priority=1)
        executor.wait("high", 60)
        progressed = low.step_count - at  # steps taken while the high-priority job held the device
        status = executor.wait("low", 60)
        counters = executor.status()["counters"]
    assert status["state"] == "succeeded"
    assert status["migrations"] >= 1 and counters["migrations"] >= 1
    assert status["migration"]["steps_away"] >= 1
    assert progressed >= 1
    for a, b in zip(tensors(reference), tensors(low), strict=True):
        assert torch.equal(a, b)


def test_inference_on_the_device_sends_training_away_and_it_comes_back_when_requests_stop():
    spec = TrainSpec().validate({"workload": "tiny-gpt", "hidden": 32, "batch_size": 8})
    model = nn.Sequential(nn.Linear(4, 4))
    with DeviceExecutor("cpu", "1GiB", "pack", migration_settle_s=0.05) as executor:
        executor.serve("endpoint", model, MemoryRequest(2**20, 2**20))
        training = StagedWorkloadSession(lambda: builtin_workload("tiny-gpt"), spec, 4, steps=10**6,
                                         migrate_to=MigrationTarget("cpu"))
        executor.submit("train", training, REQUEST)
        while executor.job_status("train")["steps"] < 2:
            time.sleep(0.002)
        for _ in range(20):
            executor.infer("endpoint", torch.ones(1, 4)).result(10)
            time.sleep(0.005)
        assert training.migrations >= 1
        deadline = time.monotonic() + 20
        while training.returns < 1 or training.away:  # requests stopped: it comes home
            assert time.monotonic() < deadline
            time.sleep(0.01)
        executor.cancel("train")
        status = executor.wait("train", 30)
    assert status["state"] == "cancelled"
    assert status["migration"]["migrations"] >= 1


def test_cancel_while_away_stops_the_fallback_worker():
    with DeviceExecutor("cpu", "1GiB", "priority") as executor:
        low = StagedWorkloadSession.builtin("mlp-digits", stages=2, steps=10**6, hidden=32,
                                            migrate_to=MigrationTarget("cpu"))
        executor.submit("low", low, REQUEST)
        executor.submit("high", StagedWorkloadSession.builtin("mlp-digits", stages=2, steps=10**6, hidden=32),
                        REQUEST, priority=1)
        deadline = time.monotonic() + 20
        while low.steps_away < 3:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        executor.cancel("low")
        assert executor.wait("low", 20)["state"] == "cancelled"
        assert not low.away
        executor.cancel("high")
