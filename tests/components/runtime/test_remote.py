"""The remote context's report buffer: logs, metrics and plugins' attempt reports go out with one flush; a
failed flush keeps them (a plugin's newer report wins), a refused one drops them without stopping the attempt.
And the ranks of a gang meeting through the control plane's rendezvous route."""

from __future__ import annotations

import pytest

from components.runtime.client.client import ApiError
from components.runtime.client.remote import RemoteContext


class Client:
    def __init__(self, fail: list[int]):
        self.fail = list(fail)
        self.bodies: list[dict] = []

    def post(self, path, body):
        self.bodies.append({"path": path, **body})
        if self.fail:
            raise ApiError(self.fail.pop(0), "no")
        return {"stop": False}


def context(client) -> RemoteContext:
    return RemoteContext(job_id="j", attempt_id="a", spec={}, client=client, node_id="n", token="t")


def test_reports_go_with_the_next_flush_and_survive_a_failed_one():
    client = Client(fail=[503])
    ctx = context(client)
    ctx.log("hello")
    ctx.report("tuning", {"trials": [1]})
    ctx.flush()  # fails: kept
    ctx.report("tuning", {"trials": [1, 2]})  # newer wins
    ctx.report("other", {"x": 1})
    ctx.flush()
    sent = client.bodies[-1]
    assert sent["path"] == "node/attempts/a/report/"
    assert sent["reports"] == {"tuning": {"trials": [1, 2]}, "other": {"x": 1}}
    assert [line["message"] for line in sent["logs"]] == ["hello"]
    ctx.flush()
    assert "reports" not in client.bodies[-1]  # sent once


def test_a_refused_report_is_dropped_and_the_attempt_goes_on():
    client = Client(fail=[400])
    ctx = context(client)
    ctx.report("tuning", {"bad": True})
    ctx.flush()
    ctx.flush()
    assert "reports" not in client.bodies[-1] and not ctx.should_stop()


# -- rendezvous through the control plane (components.runtime.node.gang.init_gang) ---------------------------------
class Rendezvous:
    """The control plane's rendezvous route: ``answers`` are what successive GETs return (an int: that error)."""

    def __init__(self, answers: list):
        self.answers = list(answers)
        self.calls: list[tuple[str, str, dict]] = []

    def post(self, path, body):
        self.calls.append(("POST", path, dict(body)))
        return {"address": f"10.0.0.1:{body['port']}", "world_size": 2, "nodes": ["n1", "n2"]}

    def request(self, method, path, params=None, timeout=None):
        self.calls.append((method, path, dict(params or {})))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, int):
            raise ApiError(answer, "no")
        return answer


def rank(client, rank: int = 1, address: str = "") -> RemoteContext:
    return RemoteContext(job_id="j", attempt_id="a", spec={}, client=client, node_id="n", token="t", rank=rank,
                         world_size=2, address=address)


def test_rank_0_publishes_its_port_and_gets_its_nodes_address():
    client = Rendezvous([])
    ctx = rank(client, 0, address="10.0.0.1")
    assert ctx.gang.node_address() == "10.0.0.1"
    assert ctx.gang.publish(29500) == "10.0.0.1:29500"
    assert client.calls == [("POST", "node/attempts/a/rendezvous/", {"node": "n", "token": "t", "port": 29500})]
    assert rank(client, 0).gang.node_address() is None  # a node that registered no address


def test_the_other_ranks_wait_for_the_address(monkeypatch):
    from components.runtime.client import remote

    monkeypatch.setattr(remote.time, "sleep", lambda seconds: None)
    client = Rendezvous([{"address": None}, 503, {"address": None}, {"address": "10.0.0.1:29500"}])
    assert rank(client).gang.address(timeout=60) == "10.0.0.1:29500"
    assert [call[:2] for call in client.calls] == [("GET", "node/attempts/a/rendezvous/")] * 4
    assert client.calls[0][2] == {"node": "n", "token": "t"}


def test_a_rank_stops_waiting_when_its_attempt_ended_or_in_time():
    with pytest.raises(RuntimeError, match="no rendezvous"):
        rank(Rendezvous([{"address": None}, 409])).gang.address(timeout=60)
    with pytest.raises(TimeoutError, match="did not publish"):
        rank(Rendezvous([{"address": None}])).gang.address(timeout=0.3)


def test_a_ranks_log_lines_name_it():
    client = Client(fail=[])
    ctx = rank(client, 1)
    ctx.log("joined")
    ctx.flush()
    assert [line["message"] for line in client.bodies[-1]["logs"]] == ["[rank 1] joined"]
    single = context(client)
    single.log("alone")
    single.flush()
    assert [line["message"] for line in client.bodies[-1]["logs"]] == ["alone"]


def test_a_checkpoint_goes_out_after_the_steps_reported_before_it(monkeypatch):
    """The lost-work record reads the step a checkpoint holds from the metric points on record before it."""
    from components.runtime.client import transfers

    client = Client(fail=[])
    ctx = context(client)
    order = []
    monkeypatch.setattr(transfers, "upload_bytes", lambda *args, **kwargs: order.append("checkpoint"))
    original = client.post
    client.post = lambda path, body: (order.append(("report", [m["step"] for m in body["metrics"]])),
                                      original(path, body))[1]
    ctx.metrics({"loss": 0.5}, step=7)
    ctx._save_checkpoint_bytes(b"state")
    assert order == [("report", [7]), "checkpoint"]
