"""The agent's lean node path: once the control plane names a ``telemetry_seconds`` cadence, the lease is renewed
with ``node/renew/`` every beat; a full heartbeat carries every beat's device samples (with their times) and the
plugins' reports once per cadence, and at once when the running attempts change; an older control plane (no
cadence, or no route) gets full heartbeats every beat."""

from __future__ import annotations

import json

from components.runtime.client.client import ApiError


class Plane:
    """Answers ``node/renew/`` and ``node/heartbeat/`` as the control plane does; records each call."""

    def __init__(self, telemetry_seconds=15.0, renew_route=True):
        self.calls: list[tuple[str, dict]] = []
        self.telemetry_seconds, self.renew_route = telemetry_seconds, renew_route

    def post(self, path: str, body: dict):
        self.calls.append((path, json.loads(json.dumps(body))))
        if path == "node/renew/" and not self.renew_route:
            raise ApiError(404, "Not found.")
        answer = {"lease_seconds": 15.0, "stop": [], "sharing_policy": "srtf", "state": "up"}
        if self.telemetry_seconds is not None:
            answer["telemetry_seconds"] = self.telemetry_seconds
        return answer

    def paths(self) -> list[str]:
        return [path.split("/")[1] for path, _ in self.calls]


def make_agent(tmp_path, plane):
    from components.runtime.node.agent import NodeAgent, NodeOptions

    agent = NodeAgent(NodeOptions(server="http://127.0.0.1:9", token="t", name="node-a", virtual_gpus=2,
                                  virtual_gpu_memory=4 << 30, state_dir=tmp_path / "node", sandbox="none"))
    agent.registration = {"node": "00000000-0000-0000-0000-000000000001", "session": "s"}
    agent.client = plane
    return agent


def elapse(agent, seconds: float) -> None:
    """As if the last full heartbeat had been sent ``seconds`` earlier than it was."""
    agent.telemetry_sent_at -= seconds


def test_renewals_between_full_heartbeats_that_carry_every_beats_samples(tmp_path):
    plane = Plane()
    agent = make_agent(tmp_path, plane)
    for _ in range(4):
        agent.heartbeat()
    assert plane.paths() == ["heartbeat", "renew", "renew", "renew"]  # the first beat is full: it learns the cadence
    renewal = plane.calls[1][1]
    assert renewal == {"node": agent.registration["node"], "session": "s", "attempts": []}
    elapse(agent, 15.0)
    agent.heartbeat()
    assert plane.paths()[-1] == "heartbeat"
    full = plane.calls[-1][1]
    # The samples of the 3 renewed beats and of this one, 2 devices each, each with the time it was taken.
    assert len(full["samples"]) == 8 and {sample["index"] for sample in full["samples"]} == {0, 1}
    times = [sample["time"] for sample in full["samples"]]
    assert times == sorted(times)
    agent.heartbeat()
    assert plane.paths()[-1] == "renew"  # the samples went: the next full heartbeat starts afresh
    elapse(agent, 15.0)
    agent.heartbeat()
    assert len(plane.calls[-1][1]["samples"]) == 4


def test_a_change_of_running_attempts_sends_a_full_heartbeat_at_once(tmp_path):
    plane = Plane()
    agent = make_agent(tmp_path, plane)
    agent.heartbeat()
    agent.heartbeat()
    attempt = "00000000-0000-0000-0000-0000000000aa"
    (agent.state_dir / "running" / f"{attempt}.json").write_text(json.dumps({"attempt": attempt, "pids": {}}))
    agent.heartbeat()
    assert plane.paths() == ["heartbeat", "renew", "heartbeat"]
    assert plane.calls[-1][1]["attempts"] == [attempt]
    agent.heartbeat()
    assert plane.paths()[-1] == "renew" and plane.calls[-1][1]["attempts"] == [attempt]


def test_an_older_control_plane_gets_full_heartbeats(tmp_path):
    plane = Plane(telemetry_seconds=None)
    agent = make_agent(tmp_path, plane)
    for _ in range(3):
        agent.heartbeat()
    assert plane.paths() == ["heartbeat"] * 3
    # A control plane that names a cadence but has no renewal route: the beat is sent as a full heartbeat.
    plane = Plane(renew_route=False)
    agent = make_agent(tmp_path, plane)
    agent.heartbeat()
    agent.heartbeat()
    assert plane.paths() == ["heartbeat", "renew", "heartbeat"]


def test_a_new_registration_starts_with_a_full_heartbeat(tmp_path):
    plane = Plane()
    agent = make_agent(tmp_path, plane)
    agent.heartbeat()
    agent.heartbeat()
    agent.client = type("Registrar", (), {"post": lambda self, path, body: (
        plane.calls.append((path, body)) or {"node": "n2", "session": "s2", "queue": "q"})})()
    agent.register(wait=0)
    agent.client = plane
    agent.heartbeat()
    assert plane.paths() == ["heartbeat", "renew", "register", "heartbeat"]
