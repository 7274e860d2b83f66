"""The participant runtime against a scripted control plane: metrics go with the next heartbeat, credentials are
asked for once and renewed by the heartbeats, a stop answer or a lease without a heartbeat that got through stops
the participant, and the session leaves when it closes. (Against the real API: tests/platform/jobs/
test_participants.py.)"""

from __future__ import annotations

import time

import pytest

from components.runtime.client.client import ApiError
from components.runtime.client.participant import ParticipantContext, ParticipantSession

JOINED = {"id": "p1", "name": "box", "gpus": 0.0, "secret": "sp_s", "public_key": "ab" * 32,
          "job": {"id": "j1", "kind": "swarm", "spec": {"steps": 3}, "state": "RUNNING"},
          "payload": {"peers": ["/ip4/10.0.0.1/tcp/4000"]}, "heartbeat_s": 10.0, "lease_s": 30.0}


class Plane:
    """The participant routes: records each heartbeat; ``answers`` are returned in turn (an int: that error)."""

    def __init__(self, answers=None, ttl: float = 60.0):
        self.answers = list(answers or [])
        self.beats: list[dict] = []
        self.left = 0
        self.ttl = ttl

    def heartbeat(self, *, metrics=None, info=None, subject=None):
        self.beats.append({"metrics": metrics, "info": info, "subject": subject})
        answer = self.answers.pop(0) if self.answers else {"state": "run", "reason": ""}
        if isinstance(answer, int):
            raise ApiError(answer, f"HTTP {answer}: no")
        answer = dict(answer)
        if subject and answer["state"] == "run":
            now = time.time()
            answer["credential"] = {"credential": f"cred-{subject}-{len(self.beats)}", "public_key": "ab" * 32,
                                    "expires": now + self.ttl, "issued": now}
        return answer

    def leave(self):
        self.left += 1
        return {"id": "p1", "state": "left", "reason": "left"}


def context(plane, tmp_path, **answer) -> ParticipantContext:
    return ParticipantContext.from_join("http://x", {**JOINED, **answer}, workdir=tmp_path, echo=False, client=plane)


def wait_for(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_context_is_built_from_the_join(tmp_path):
    ctx = context(Plane(), tmp_path)
    assert (ctx.job_id, ctx.participant_id, ctx.spec, ctx.name) == ("j1", "p1", {"steps": 3}, "box")
    assert ctx.payload == {"peers": ["/ip4/10.0.0.1/tcp/4000"]} and ctx.public_key == "ab" * 32
    assert (ctx.heartbeat_s, ctx.lease_s, ctx.rank, ctx.world_size) == (10.0, 30.0, 0, 1)
    with pytest.raises(NotImplementedError):
        ctx.gang.address()
    with pytest.raises(NotImplementedError):
        ctx.children.submit({"kind": "x"})


def test_metrics_go_with_the_next_heartbeat_and_only_when_changed(tmp_path, capsys):
    plane = Plane()
    ctx = context(plane, tmp_path)
    ctx.echo = True
    ctx.metrics(loss=1.5)
    ctx.metrics({"samples": 10}, step=4)
    ctx.metrics(bad=float("nan"), worse="x", **{"y" * 65: 1.0})
    assert "metrics not kept" in capsys.readouterr().out
    ctx.set_info({"address": "a"})
    assert ctx.beat() == {"state": "run", "reason": ""}
    assert plane.beats[-1] == {"metrics": {"loss": 1.5, "samples": 10.0, "step": 4.0}, "info": {"address": "a"},
                               "subject": None}
    ctx.beat()
    assert plane.beats[-1] == {"metrics": None, "info": None, "subject": None}
    ctx.metrics(loss=1.0)
    ctx.beat()
    assert plane.beats[-1]["metrics"] == {"loss": 1.0, "samples": 10.0, "step": 4.0}
    ctx.log("hello")
    assert capsys.readouterr().out == "[participant box] hello\n"
    ctx.metrics({f"m{i}": i for i in range(70)})
    assert len(ctx.latest_metrics()) == 64


def test_a_failed_heartbeat_keeps_the_metrics_for_the_next(tmp_path):
    plane = Plane(answers=[503])
    ctx = context(plane, tmp_path)
    ctx.metrics(loss=2.0)
    with pytest.raises(ApiError):
        ctx.beat()
    assert not ctx.should_stop()
    ctx.beat()
    assert plane.beats[-1]["metrics"] == {"loss": 2.0}


def test_credentials_are_asked_once_then_renewed_by_heartbeats(tmp_path):
    plane = Plane(ttl=60.0)
    ctx = context(plane, tmp_path)
    first = ctx.identity.credential("p2p:QmBox")
    assert first["credential"] == "cred-p2p:QmBox-1" and plane.beats[-1]["subject"] == "p2p:QmBox"
    assert ctx.identity.credential("p2p:QmBox") == first and len(plane.beats) == 1
    ctx.beat()
    assert plane.beats[-1]["subject"] is None  # fresh: nothing to renew
    # Past half its life, the next heartbeat renews it (the oldest first).
    ctx._credentials["p2p:QmBox"].update(issued=time.time() - 50, expires=time.time() + 10)
    ctx.identity.credential("rsa:abc")
    ctx.beat()
    assert plane.beats[-1]["subject"] == "p2p:QmBox"
    assert ctx.identity.credential("p2p:QmBox")["credential"] == f"cred-p2p:QmBox-{len(plane.beats)}"
    # A subject the control plane refuses is a ValueError.
    refusing = context(Plane(answers=[400]), tmp_path)
    with pytest.raises(ValueError, match="no credential"):
        refusing.identity.credential("bad subject")


def test_a_stop_answer_stops_the_participant(tmp_path):
    ctx = context(Plane(answers=[{"state": "stop", "reason": "evicted by alice"}]), tmp_path)
    ctx.beat()
    assert ctx.should_stop() and ctx.reason == "evicted by alice"
    with pytest.raises(RuntimeError, match="evicted by alice"):
        ctx.identity.credential("p2p:QmBox")
    gone = context(Plane(answers=[404]), tmp_path)
    with pytest.raises(ApiError):
        gone.beat()
    assert gone.should_stop() and "no longer knows" in gone.reason
    mine = context(Plane(), tmp_path)
    mine.stop()
    assert mine.should_stop() and mine.reason == "stopped by its process"


def test_the_heartbeat_thread_stops_it_after_a_lease_without_heartbeats(tmp_path):
    plane = Plane(answers=[0] * 10_000)
    ctx = context(plane, tmp_path, heartbeat_s=0.02, lease_s=0.3)
    ctx.start()
    try:
        wait_for(ctx.should_stop)
    finally:
        ctx.close()
    assert "no heartbeat got through" in ctx.reason and len(plane.beats) >= 1


def test_the_heartbeat_thread_beats_until_told_to_stop(tmp_path):
    plane = Plane(answers=[{"state": "run", "reason": ""}] * 3 + [{"state": "stop", "reason": "the job ended"}])
    ctx = context(plane, tmp_path, heartbeat_s=0.02)
    ctx.metrics(loss=1.0)
    ctx.start()
    try:
        wait_for(ctx.should_stop)
    finally:
        ctx.close()
    assert ctx.reason == "the job ended" and len(plane.beats) == 4
    assert plane.beats[0]["metrics"] == {"loss": 1.0}


def test_state_and_artifacts_stay_in_the_workdir(tmp_path):
    ctx = context(Plane(), tmp_path / "w")
    assert ctx.restore() is None
    ctx.checkpoint({"step": 3})
    again = context(Plane(), tmp_path / "w")
    assert again.restore(weights_only=True) == {"step": 3}
    source = tmp_path / "out.txt"
    source.write_text("result")
    ctx.artifact(source, "result.txt")
    assert (tmp_path / "w" / "artifacts" / "result.txt").read_text() == "result"


def test_the_session_joins_and_leaves(tmp_path, monkeypatch):
    from components.runtime.client import participant

    calls = []
    monkeypatch.setattr(participant, "participant_join",
                        lambda url, job, token, **kwargs: calls.append((url, job, token, kwargs)) or dict(JOINED))
    plane = Plane()
    with ParticipantSession("http://x", "j1", "sj_t", name="box", gpus=1, info={"v": 1}, workdir=tmp_path,
                            echo=False, heartbeat=False, client=plane) as ctx:
        ctx.metrics(loss=0.5)
    assert calls == [("http://x", "j1", "sj_t", {"name": "box", "gpus": 1.0, "info": {"v": 1}})]
    assert plane.beats[-1]["metrics"] == {"loss": 0.5}  # flushed on close
    assert plane.left == 1
