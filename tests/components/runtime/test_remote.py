"""The remote context's report buffer: logs, metrics and plugins' attempt reports go out with one flush; a
failed flush keeps them (a plugin's newer report wins), a refused one drops them without stopping the attempt."""

from __future__ import annotations

from components.runtime.client import ApiError
from components.runtime.remote import RemoteContext


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
