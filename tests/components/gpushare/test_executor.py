"""The per-device execution service: interleaving, isolation, cancel, memory, priority preemption, serving."""

import time

import pytest
import torch
from torch import nn

from components.gpushare.executor import DeviceExecutor, ExecutorClosed, JobState
from components.gpushare.lanes import MemoryRequest
from components.gpushare.sessions import CallableSession, Progress, Session, TrainLoopSession, WorkloadSession
from components.gpushare.stages import InferenceSession, StagedSession
from components.runtime.contract.context import LocalContext
from components.train.loop import TrainLoop
from components.train.spec import TrainSpec
from components.train.workloads import builtin_workload


def counter(steps, seconds=0.0, fail_at=None):
    """A toy job: ``steps`` iterations of ``seconds`` each; raises at iteration ``fail_at``."""
    done = [0]

    def iteration():
        done[0] += 1
        if fail_at is not None and done[0] == fail_at:
            raise RuntimeError("boom")
        if seconds:
            time.sleep(seconds)

    return CallableSession(iteration, steps=steps)


def state_tensors(workload):
    state = workload.state_dict()
    tensors = dict(state["model"])
    for index, parameter_state in state["optimizer"]["state"].items():
        for name, value in parameter_state.items():
            tensors[f"optimizer.{index}.{name}"] = value
    return tensors


def assert_bit_identical(left, right):
    assert left.keys() == right.keys()
    for name in left:
        assert torch.equal(left[name], right[name]), name


JOBS = {
    "digits-a": ("mlp-digits", {"hidden": 32, "seed": 1}, 30),
    "shapes": ("cnn-synthetic", {"hidden": 8, "seed": 2}, 20),
    "digits-b": ("mlp-digits", {"hidden": 48, "seed": 3, "optimizer": "sgd"}, 25),
}


@pytest.mark.parametrize("policy", ["pack", "fair"])
def test_interleaved_jobs_end_bit_identical_to_running_alone(policy, tmp_path):
    sessions = {name: WorkloadSession.builtin(kind, steps=steps, **fields)
                for name, (kind, fields, steps) in JOBS.items()}
    spec = TrainSpec().validate({"workload": "mlp-digits", "hidden": 16, "seed": 4, "max_steps": 30})
    loop_ctx = LocalContext(job_id="loop", attempt_id="1", spec=spec, workdir=tmp_path / "shared")
    loop = TrainLoop(builtin_workload("mlp-digits"), spec, loop_ctx, owns_process=False)
    with DeviceExecutor("cpu", "1GiB", policy, start=False) as executor:
        for name, session in sessions.items():
            assert executor.submit(name, session).admitted
        executor.submit("loop", TrainLoopSession(loop), MemoryRequest(2**20, 2**20))
        executor.start()
        for name in [*sessions, "loop"]:
            assert executor.wait(name, 60)["state"] == "succeeded"
        status = executor.status()
        timeline = executor.timeline()
    iterations = [entry["job"] for entry in timeline if entry["kind"] == "iteration"]
    assert len(iterations) == sum(steps for _, _, steps in JOBS.values()) + 30
    assert status["counters"]["switches"] >= 30  # the jobs really took turns
    assert len(set(iterations[:8])) == 4

    for name, (kind, fields, steps) in JOBS.items():
        alone = builtin_workload(kind)
        alone.setup(TrainSpec().validate({"workload": kind, **fields}), torch.device("cpu"))
        for step in range(steps):
            alone.train_step(alone.batch(*divmod(step, alone.steps_per_epoch())))
        assert_bit_identical(state_tensors(sessions[name].workload), state_tensors(alone))

    solo_ctx = LocalContext(job_id="solo", attempt_id="1", spec=spec, workdir=tmp_path / "solo")
    TrainLoop(builtin_workload("mlp-digits"), spec, solo_ctx).run()
    shared = torch.load(loop_ctx.artifacts["model.pt"], weights_only=True)["state_dict"]
    solo = torch.load(solo_ctx.artifacts["model.pt"], weights_only=True)["state_dict"]
    assert_bit_identical(shared, solo)


def test_a_failing_job_is_isolated_and_its_lane_goes_to_a_waiting_job():
    with DeviceExecutor("cpu", 1000, "pack") as executor:
        assert executor.submit("failing", counter(50, 0.002, fail_at=3), MemoryRequest(400, 300)).admitted
        assert executor.submit("healthy", counter(20, 0.001), MemoryRequest(100, 100)).admitted
        waiting = executor.submit("waiting", counter(5), MemoryRequest(400, 300))
        assert waiting.status == "waiting"
        failed = executor.wait("failing", 10)
        assert failed["state"] == "failed"
        assert "RuntimeError: boom" in failed["error"]
        waited = executor.wait("waiting", 10)
        assert waited["state"] == "succeeded"
        assert waited["admitted_s"] >= failed["finished_s"]
        assert executor.wait("healthy", 10)["state"] == "succeeded"
        assert executor.status()["memory"]["lanes"] == []


def test_cancel_frees_the_lane_and_a_waiting_job_gets_in():
    with DeviceExecutor("cpu", 1000, "pack") as executor:
        executor.submit("endless", counter(10**9, 0.002), MemoryRequest(600, 200))
        assert executor.submit("next", counter(3), MemoryRequest(500, 100)).status == "waiting"
        assert executor.submit("dropped", counter(3), MemoryRequest(500, 100)).status == "waiting"
        assert executor.cancel("dropped")
        assert executor.job_status("dropped")["state"] == "cancelled"  # at once: it never ran
        time.sleep(0.05)
        assert executor.job_status("next")["state"] == "waiting"
        assert executor.cancel("endless")
        assert executor.wait("endless", 10)["state"] == "cancelled"
        assert executor.wait("next", 10)["state"] == "succeeded"
        assert not executor.cancel("endless")  # already over
        assert executor.job_status("dropped")["steps"] == 0


def test_rejects_what_can_never_fit_and_bad_submissions():
    with DeviceExecutor("cpu", 1000) as executor:
        answer = executor.submit("huge", counter(1), MemoryRequest(900, 200))
        assert answer.status == "rejected"
        assert executor.wait("huge", 1)["state"] == "rejected"
        executor.submit("one", counter(1), MemoryRequest(1, 1))
        with pytest.raises(ValueError, match="already submitted"):
            executor.submit("one", counter(1), MemoryRequest(1, 1))
        with pytest.raises(ValueError, match="memory_request"):
            executor.submit("unsized", counter(1))
        with pytest.raises(TypeError):
            executor.submit("not-a-job", 42, MemoryRequest(1, 1))
    with pytest.raises(ExecutorClosed):
        executor.submit("late", counter(1), MemoryRequest(1, 1))


def test_status_timeline_and_switch_counters():
    with DeviceExecutor("cpu", 10_000, "pack", start=False, name="virtual:3") as executor:
        executor.submit("a", counter(20, 0.001), MemoryRequest(10, 10))
        executor.submit("b", counter(20, 0.001), MemoryRequest(10, 10))
        executor.start()
        executor.wait("a", 10)
        executor.wait("b", 10)
        status = executor.status()
        timeline = executor.timeline()
    counters = status["counters"]
    assert status["device"] == "virtual:3" and status["virtual"] and status["policy"] == "pack"
    assert counters["iterations"] == 40
    assert counters["switches"] >= 38  # PACK alternates
    assert counters["switch_latency"]["count"] >= 30
    assert counters["switch_latency"]["p50_s"] < 0.005
    assert 0 < counters["utilization"] <= 1 and counters["busy_s"] > 0.035
    steps = [entry for entry in timeline if entry["kind"] == "iteration"]
    assert all(entry["device"] == "virtual:3" and entry["end"] >= entry["start"] for entry in steps)
    assert [entry["job"] for entry in steps[:4]] == ["a", "b", "a", "b"]
    job = status["jobs"]["a"]
    assert job["state"] == "succeeded" and job["steps"] == 20 and job["jct_s"] > 0 and job["lane"] == 0


def test_a_job_using_more_than_it_reserved_is_relaned_or_paused_until_memory_frees():
    # The digits job claims almost nothing; its first measured iterations show its real needs (~0.7 MB).
    budget = 3 * 2**20
    with DeviceExecutor("cpu", budget, "pack") as executor:
        executor.submit("big", counter(40, 0.002), MemoryRequest(int(2.6 * 2**20), 0))
        executor.submit("digits", WorkloadSession.builtin("mlp-digits", steps=10, hidden=32), MemoryRequest(1, 1))
        paused_seen = False
        deadline = time.monotonic() + 10
        while executor.job_status("big")["state"] == "admitted" and time.monotonic() < deadline:
            paused_seen |= bool(executor.job_status("digits")["paused"])
            time.sleep(0.002)
        digits = executor.wait("digits", 20)
        big = executor.wait("big", 1)
    assert digits["state"] == "succeeded" and digits["steps"] == 10
    assert digits["overruns"] >= 1
    assert digits["request"]["total"] >= digits["measured"]["total"] > 2**19
    assert paused_seen
    assert digits["finished_s"] > big["finished_s"]


class SleepyStage(nn.Module):
    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds
        self.weight = nn.Parameter(torch.ones(()))

    def forward(self, x):
        time.sleep(self.seconds)
        return x * self.weight


def test_a_higher_priority_job_preempts_a_staged_job_at_the_next_stage_boundary():
    stage_s, count = 0.03, 8
    stages = [SleepyStage(stage_s) for _ in range(count)]
    low = StagedSession(stages, torch.optim.SGD([s.weight for s in stages], lr=1e-3),
                        batch=lambda step: (torch.ones(2), None), loss=lambda out, _: out.sum(), steps=10**6)
    with DeviceExecutor("cpu", 10_000, "priority") as executor:
        executor.submit("low", low, MemoryRequest(10, 10))
        while executor.job_status("low")["steps"] < 1:
            time.sleep(0.005)
        time.sleep(stage_s * 2.5)  # somewhere inside the forward pass
        executor.submit("high", counter(5), MemoryRequest(10, 10), priority=5)
        high = executor.wait("high", 10)
        low_status = executor.job_status("low")
        counters = executor.status()["counters"]
        executor.cancel("low")
        assert executor.wait("low", 10)["state"] == "cancelled"
    assert high["state"] == "succeeded"
    assert low.yields >= 1 and counters["preemptions"] >= 1
    iteration_s = count * stage_s
    assert high["jct_s"] < iteration_s / 2  # it did not wait for the iteration to end
    assert counters["preemption_latency"]["max_s"] <= low.longest_action_s + 0.03
    assert low_status["state"] == "admitted" and low_status["mid_iteration"]


def test_inference_requests_are_served_and_a_bad_request_does_not_stop_the_endpoint():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    inputs = torch.randn(4, 8)
    with torch.inference_mode():
        expected = model(inputs)
    with DeviceExecutor("cpu", "64MiB") as executor:
        admission = executor.serve("classifier", InferenceSession(model, sample=inputs))
        assert admission.admitted
        assert torch.equal(executor.infer("classifier", inputs).result(10), expected)
        bad = executor.infer("classifier", torch.randn(4, 5))
        with pytest.raises(RuntimeError):
            bad.result(10)
        assert torch.equal(executor.infer("classifier", inputs).result(10), expected)
        status = executor.status()
        assert status["jobs"]["classifier"]["served"] == 3
        assert status["counters"]["inference_latency"]["count"] == 3
        assert status["memory"]["lanes"][0]["exclusive"]
        with pytest.raises(KeyError):
            executor.infer("nobody", inputs)
    with pytest.raises(ExecutorClosed):
        executor.infer("classifier", inputs)


def test_shutdown_can_drain_or_cancel():
    executor = DeviceExecutor("cpu", 1000)
    executor.submit("a", counter(10, 0.001), MemoryRequest(10, 10))
    executor.submit("b", counter(10, 0.001), MemoryRequest(10, 10))
    executor.shutdown(cancel=False, timeout=10)
    assert executor.job_status("a")["state"] == executor.job_status("b")["state"] == "succeeded"

    executor = DeviceExecutor("cpu", 1000)
    executor.submit("endless", counter(10**9, 0.001), MemoryRequest(10, 10))
    executor.submit("queued", counter(1), MemoryRequest(995, 0))
    executor.shutdown(cancel=True, timeout=10)
    assert {executor.job_status(j)["state"] for j in ("endless", "queued")} == {"cancelled"}


def test_any_object_with_step_can_be_a_job():
    class Countdown:
        def __init__(self):
            self.left = 4

        def step(self):
            self.left -= 1
            return self.left == 0

        def remaining_steps(self):
            return self.left

    class Broken(Session):
        def step(self, should_yield=None):
            return "not a Progress"

    with DeviceExecutor("cpu", 1000, "srtf") as executor:
        executor.submit("countdown", Countdown(), MemoryRequest(1, 1))
        executor.submit("broken", Broken(), MemoryRequest(1, 1))
        assert executor.wait("countdown", 5)["steps"] == 4
        assert "not a Progress" in executor.wait("broken", 5)["error"]
    assert JobState.SUCCEEDED.terminal and not JobState.ADMITTED.terminal
    assert Progress.DONE.value == "done"


def test_an_ended_job_releases_its_session_and_old_records_are_dropped():
    import gc
    import weakref

    with DeviceExecutor("cpu", "64MiB", retain_finished=2) as executor:
        session = WorkloadSession.builtin("mlp-digits", steps=2, hidden=16)
        alive = weakref.ref(session)
        executor.submit("digits", session, MemoryRequest(2**20, 2**20))
        del session
        finished = executor.wait("digits", 30)
        assert finished["result"]["steps"] == 2 and set(finished["result"]["metrics"]) >= {"loss"}
        gc.collect()
        assert alive() is None  # the executor kept neither the session nor its model
        for name in ("one", "two"):
            executor.submit(name, counter(1), MemoryRequest(1, 1))
            executor.wait(name, 5)
        with pytest.raises(KeyError):
            executor.job_status("digits")
        assert executor.job_status("two")["state"] == "succeeded"
