"""The node agent's drain and leave (components.runtime.node.agent), and the devices a batch system grants
(components.runtime.node.devices.visible_indices). The real thing runs under Slurm in tests/e2e/test_slurm.py."""

from __future__ import annotations

import signal
import time

from components.runtime.client.client import ApiError
from components.runtime.node.agent import LEAVE_MARGIN_S, NodeAgent, NodeOptions
from components.runtime.node.devices import DeviceInfo, visible_ids, visible_indices


class FakeClient:
    def __init__(self, answers: dict | None = None, fail: set | None = None):
        self.calls: list[tuple[str, dict]] = []
        self.answers = answers or {}
        self.fail = fail or set()

    def post(self, path: str, body: dict):
        self.calls.append((path, dict(body)))
        if path in self.fail:
            raise ApiError(0, "control plane unreachable")
        return self.answers.get(path, {})


def agent(**options) -> NodeAgent:
    made = object.__new__(NodeAgent)
    made.options = NodeOptions(server="http://cp", token="t", **options)
    made.registration = {"node": "n1", "session": "s1"}
    made.stopping = made.drain_requested = made.draining = False
    made.client = FakeClient({"node/drain/": {"state": "draining", "attempts_left": 2},
                              "node/leave/": {"state": "down", "released": 2}})
    return made


def test_usr1_drains_and_the_node_leaves_once_nothing_is_left():
    node = agent()
    node._on_drain_signal(signal.SIGUSR1, None)
    assert node.drain_requested and not node.draining
    node._drain_due()
    assert node.client.calls == [("node/drain/", {"node": "n1", "session": "s1"})]
    assert node.draining and not node.stopping  # two attempts run on
    node._drain_due()
    assert len(node.client.calls) == 1  # drained once
    node._note_state({"state": "draining", "attempts_left": 1, "stop": []})
    assert not node.stopping
    node._note_state({"state": "draining", "attempts_left": 0, "stop": []})
    assert node.stopping


def test_an_up_node_is_not_stopped_by_its_heartbeats():
    node = agent()
    node._note_state({"state": "up", "stop": []})
    node._note_state({"stop": []})  # an older control plane says nothing of the state
    assert not node.draining and not node.stopping


def test_a_failed_drain_is_tried_again():
    node = agent()
    node.client.fail = {"node/drain/"}
    node.drain_requested = True
    node._drain_due()
    assert not node.draining
    node.client.fail = set()
    node._drain_due()
    assert node.draining and [path for path, _ in node.client.calls] == ["node/drain/", "node/drain/"]


def test_the_end_of_the_allocation_drains_then_leaves():
    now = time.time()
    node = agent(end_time=now + 3600, drain_before=300)
    node._drain_due()
    assert node.client.calls == [] and not node.drain_requested  # far from the end
    node.options.end_time = now + 200
    node._drain_due()
    assert node.draining and not node.stopping
    node.options.end_time = now + LEAVE_MARGIN_S / 2
    node._drain_due()
    assert node.stopping
    # Without drain_before, only the leave.
    other = agent(end_time=now + 60)
    other._drain_due()
    assert not other.drain_requested and not other.stopping


def test_leave_tells_the_control_plane_and_survives_its_absence():
    node = agent()
    node.leave()
    assert node.client.calls == [("node/leave/", {"node": "n1", "session": "s1"})]
    node.client.fail = {"node/leave/"}
    node.leave()  # logged: the lease reaper requeues the attempts instead
    unregistered = agent()
    unregistered.registration = {}
    unregistered.leave()
    assert unregistered.client.calls == []


def test_granted_devices_keep_the_ids_cuda_visible_devices_gives(monkeypatch):
    cuda = [DeviceInfo("cuda", 0, "A", 1, "GPU-a"), DeviceInfo("cuda", 1, "B", 1, "GPU-b")]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_ids() is None and visible_indices(cuda) == cuda
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert visible_ids() == [2, 3]
    assert [(d.index, d.uuid) for d in visible_indices(cuda)] == [(2, "GPU-a"), (3, "GPU-b")]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-x,GPU-y")  # by UUID: left as torch numbers them
    assert visible_ids() is None and visible_indices(cuda) == cuda
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")  # fewer ids than devices: not a list of these devices
    assert visible_indices(cuda) == cuda


def test_a_stalled_worker_is_restarted_once_it_had_the_time_itself(monkeypatch):
    node = agent()
    events = []
    monkeypatch.setattr(node, "stop_worker", lambda: events.append("stop"), raising=False)

    def start():
        events.append("start")
        node.worker_started_at = time.monotonic()

    monkeypatch.setattr(node, "start_worker", start, raising=False)
    node.worker = object()
    node.worker_started_at = time.monotonic()
    node._restart_stalled_worker({"attempts": 2, "after_seconds": 60})
    assert events == []  # a worker younger than the claim timeout is given its chance
    node.worker_started_at = time.monotonic() - 61
    node._restart_stalled_worker({"attempts": 2, "after_seconds": 60})
    assert events == ["stop", "start"]
    node._restart_stalled_worker({"attempts": 2, "after_seconds": 60})
    assert events == ["stop", "start"]  # the fresh worker is not restarted again at once
    node._restart_stalled_worker(None)
    assert events == ["stop", "start"]
