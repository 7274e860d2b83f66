"""A deployment's replicas: the controller's reconcile and autoscaling rule, the replicas route, and the client
that balances over replicas by outstanding requests and fails over when one dies."""

import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from support import wait_for

from components.gpushare.executor import DeviceExecutor
from components.gpushare.lanes import MemoryRequest
from components.runtime.contract.context import DeviceHandle, LocalChildren, LocalContext
from components.runtime.contract.panels import StaticPanelData
from components.serving.client import Balancer, ServingError
from components.serving.endpoint import start_serving
from components.serving.model import load_served_model
from components.serving.replicas import ReplicaController, Window, decide, replicas_route
from components.serving.spec import ServeSpec

MODEL = {"job": "3f0c5b8e-9a51-4c55-9c1e-0f1b2f0d9a11"}
AUTO = {"min": 1, "max": 3, "target_attainment": 0.95, "queue_per_replica": 16.0, "period_s": 10.0}


class PointsChildren(LocalChildren):
    """Children that report the metric points the test sets (``ctx.points``)."""

    def metrics(self, job_id, after=0):
        points = [p for p in self.ctx.points.get(job_id, []) if p["id"] > after]
        return {**self._child(job_id)["summary"], "points": points, "cursor": points[-1]["id"] if points else after}


class Ctx(LocalContext):
    """A LocalContext whose children report metric points (the test sets them)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.points: dict[str, list[dict]] = {}

    def parts(self):
        return (PointsChildren(self), *super().parts()[1:])

    def set_child(self, job_id, **fields):
        self.children._child(job_id)["summary"].update(fields)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def stats(ok=0, missed=0, queue=0):
    return {"requests": ok + missed, "errors": missed, "errors_by_status": {"DEADLINE_EXCEEDED": missed},
            "queue_depth": queue}


def test_the_rule():
    calm = Window(ok=100, missed=0, queues=[0, 0])
    slow = Window(ok=80, missed=20, queues=[1, 1])
    deep = Window(ok=100, missed=0, queues=[40, 20])
    assert decide(1, slow, AUTO, all_running=True, calm=0) == (2, 0)
    assert decide(2, deep, AUTO, all_running=True, calm=0) == (3, 0)
    assert decide(3, slow, AUTO, all_running=True, calm=0) == (3, 0)  # at max
    assert decide(2, slow, AUTO, all_running=False, calm=0) == (2, 0)  # a replica still waits for a device
    assert decide(2, calm, AUTO, all_running=True, calm=0) == (2, 1)  # one calm window is not enough
    assert decide(2, calm, AUTO, all_running=True, calm=1) == (1, 0)
    assert decide(1, calm, AUTO, all_running=True, calm=5) == (1, 0)  # at min
    assert decide(2, Window(), AUTO, all_running=True, calm=1) == (1, 0)  # no traffic at all
    middle = Window(ok=100, missed=0, queues=[8])  # under the limit, over a quarter of it: hold
    assert decide(2, middle, AUTO, all_running=True, calm=1) == (2, 0)


def test_the_controller_keeps_the_count_and_replaces_a_replica_that_ended(tmp_path):
    spec = ServeSpec().validate({"model": MODEL, "replicas": 3})
    ctx = Ctx(job_id="deploy-1", attempt_id="a", spec=spec, workdir=tmp_path, devices=[DeviceHandle("virtual", 0, 2**30, 0.25)])
    from components.serving.component import ServeSession

    session = ServeSession(ctx, spec)
    controller = ReplicaController(ctx, spec, lambda: stats(), session.replica_job)
    controller.tick()
    children = ctx.children.list()
    assert len(children) == 2 and [e["idempotency_key"] for e in ctx.child_jobs] == [
        "deploy-1:replica:0", "deploy-1:replica:1"]
    body = ctx.child_jobs[0]["job"]
    assert body["kind"] == "serve" and body["resources"] == {"gpus": 0.25}
    assert body["spec"]["replicas"] == 1 and body["spec"]["autoscale"] is None and body["spec"]["model"] == {**MODEL, "entrypoint": None}
    controller.tick()
    assert len(ctx.children.list()) == 2  # nothing more
    ctx.set_child(children[0]["id"], state="FAILED")
    controller.tick()
    assert [e["idempotency_key"] for e in ctx.child_jobs][-1] == "deploy-1:replica:2"
    assert len([c for c in ctx.children.list() if c["state"] != "FAILED"]) == 2


def test_autoscaling_up_on_missed_deadlines_and_down_when_calm(tmp_path):
    spec = ServeSpec().validate({"model": MODEL, "replicas": 1, "autoscale": {"min": 1, "max": 3, "period_s": 5}})
    ctx = Ctx(job_id="deploy-2", attempt_id="a", spec=spec, workdir=tmp_path)
    own = {"value": stats()}
    clock = Clock()
    controller = ReplicaController(ctx, spec, lambda: own["value"], lambda: {"kind": "serve", "spec": {}},
                                   clock=clock)
    controller.tick()
    assert ctx.children.list() == []  # one replica: this one
    own["value"] = stats(ok=50, missed=50)  # half the requests missed their deadline
    clock.now = 6
    controller.tick()
    assert controller.want == 2 and len(ctx.children.list()) == 1
    child = ctx.children.list()[0]["id"]
    # The new replica is not running yet: however bad it gets, no third one.
    own["value"] = stats(ok=60, missed=100)
    clock.now = 12
    controller.tick()
    assert controller.want == 2 and len(ctx.children.list()) == 1
    ctx.set_child(child, state="RUNNING", endpoint="127.0.0.1:1")
    ctx.points[child] = [{"id": 1, "name": "answered_ok", "value": 10.0}, {"id": 2, "name": "missed", "value": 30.0},
                         {"id": 3, "name": "queue_depth", "value": 40.0}]
    own["value"] = stats(ok=70, missed=150)
    clock.now = 18
    controller.tick()
    assert controller.want == 3 and len([c for c in ctx.children.list() if c["state"] != "CANCELLED"]) == 2
    # Calm: every request on time and short queues, two windows in a row: one replica goes, the newest.
    for step, now in enumerate((24, 30)):
        ctx.points[child].extend([{"id": 10 + 3 * step, "name": "answered_ok", "value": 200.0 + 100 * step},
                                  {"id": 11 + 3 * step, "name": "queue_depth", "value": 0.0}])
        own["value"] = stats(ok=300 + 100 * step, missed=150)
        clock.now = now
        controller.tick()
    assert controller.want == 2
    states = [c["state"] for c in ctx.children.list()]
    assert states == ["RUNNING", "CANCELLED"]
    assert any("autoscale: 3 -> 2" in message for _, _, message in ctx.logs)


def test_the_replicas_route():
    data = StaticPanelData(job={"id": "d", "state": "RUNNING", "endpoint": "10.0.0.1:5", "spec": {"replicas": 3}},
                           children=[{"id": "c1", "kind": "serve", "state": "RUNNING", "endpoint": "10.0.0.2:6"},
                                     {"id": "c2", "kind": "serve", "state": "QUEUED", "endpoint": None},
                                     {"id": "c3", "kind": "serve", "state": "FAILED", "endpoint": None}])
    answer = replicas_route(data)
    assert answer["endpoints"] == ["10.0.0.1:5", "10.0.0.2:6"] and answer["live"] == 3 and answer["wanted"] == 3
    assert [row["job"] for row in answer["replicas"]] == ["d", "c1", "c2", "c3"]


@pytest.fixture
def executor():
    with DeviceExecutor("cpu", "1GiB", "pack") as executor:
        yield executor


def test_the_balancer_spreads_by_outstanding_requests_and_fails_over(executor, digits_model):
    served = load_served_model(digits_model)
    rows = np.ones((1, 64), np.float32)
    first = start_serving(executor, "r1", served, max_rows=4)
    second = start_serving(executor, "r2", load_served_model(digits_model), max_rows=4)
    try:
        balancer = Balancer([first.address, second.address], retry_after_s=60)
        # Hold the device: calls stay outstanding, so each new call goes to the replica with fewer.
        release, running = threading.Event(), threading.Event()
        executor.submit("long-unit", lambda: (running.set(), release.wait(20), True)[-1], MemoryRequest(2**10, 2**10))
        assert running.wait(5)
        with ThreadPoolExecutor(6) as pool:
            try:
                futures = [pool.submit(balancer.predict, rows, timeout=60) for _ in range(6)]
                wait_for(lambda: first.stats()["in_flight"] + second.stats()["in_flight"] == 6, 20, "six calls")
                assert first.stats()["in_flight"] == 3 and second.stats()["in_flight"] == 3
            finally:
                release.set()
            assert all(future.result().shape == (1, 10) for future in futures)
        # A caller's own fault is its answer: not retried on another replica.
        with pytest.raises(ServingError) as wrong:
            balancer.predict(np.ones((1, 3), np.float32))
        assert wrong.value.code == grpc.StatusCode.INVALID_ARGUMENT and balancer.failovers == 0
        # One replica dies: every call is still answered, by the other.
        second.stop(grace=0.5)
        answers = [balancer.predict(rows, timeout=10) for _ in range(6)]
        assert all(answer.shape == (1, 10) for answer in answers) and balancer.failovers >= 1
        assert first.stats()["requests"] >= 3 + 6
        # Nothing left: UNAVAILABLE, as one line.
        first.stop(grace=0.5)
        with pytest.raises(ServingError) as caught:
            balancer.predict(rows, timeout=5)
        assert caught.value.code == grpc.StatusCode.UNAVAILABLE
    finally:
        first.stop(grace=0.5)
        second.stop(grace=0.5)


def test_the_balancer_reads_its_endpoints_from_a_source():
    calls = []

    def source():
        calls.append(1)
        return ["127.0.0.1:1"] if len(calls) == 1 else ["127.0.0.1:2", "127.0.0.1:3"]

    balancer = Balancer(source, refresh_s=0.0)
    assert balancer.endpoints() == ["127.0.0.1:1"]
    assert balancer.endpoints() == ["127.0.0.1:2", "127.0.0.1:3"]
    empty = Balancer([])
    with pytest.raises(ServingError) as caught:
        empty.predict(np.ones((1, 64), np.float32))
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE and "no running replica" in caught.value.details
