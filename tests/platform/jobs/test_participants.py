"""Participants: machines outside the cluster join a running job with one of its access tokens, heartbeat with a
secret of their own, count their GPUs against the team's quota (and are billed for them), and are stopped when
their token is revoked, the job ends, they are evicted or their lease expires. A throwaway kind with
``accepts_participants`` is installed for these tests: the core names no plugin."""

from __future__ import annotations

from datetime import timedelta
from typing import ClassVar
from urllib.parse import urlsplit

import pytest
from django.utils import timezone

from components.runtime.contract.plugins import Plugin
from components.runtime.shared.credentials import verify
from components.train.spec import TrainSpec
from strata.jobs.models import Attempt, Job, JobEvent, JobState, JobToken, Participant

JOIN = "/api/v1/participants/"


class SwarmSpec(TrainSpec):
    """A kind that takes participants; what it hands them shows what PanelData gave it."""

    kind: ClassVar[str] = "swarmtest"
    accepts_tokens: ClassVar[bool] = True
    accepts_participants: ClassVar[bool] = True

    def participant_payload(self, spec, data):
        return {"job": data.job["id"], "epochs": spec["epochs"], "state": data.job["state"],
                "already": [p["name"] for p in data.participants()]}


class BrokenSwarmSpec(SwarmSpec):
    kind: ClassVar[str] = "swarmbroken"

    def participant_payload(self, spec, data):
        raise RuntimeError("boom")


def volunteers(data):
    """A job route: the job's participants as PanelData gives them."""
    return [{"name": p["name"], "state": p["state"], "gpus": p["gpus"]} for p in data.participants()]


SWARM = Plugin(name="swarmtest", kinds=(f"{__name__}:SwarmSpec", f"{__name__}:BrokenSwarmSpec"),
               job_routes={"volunteers": f"{__name__}:volunteers"})


def _submit(user, team, kind: str = "swarmtest", gpus: float = 1.0, name: str = "swarm") -> Job:
    from strata.jobs.services import job_submit

    job, _ = job_submit(user=user, team=team, data={
        "kind": kind, "name": name, "spec": {"workload": "mlp-digits", "epochs": 1},
        "resources": {"gpus": gpus, "gpu_memory": None, "workers": 1}, "priority": 0, "max_attempts": 3,
        "time_limit": 3600})
    return job


def _start(job, node, run_pass) -> Attempt:
    from strata.jobs.services import attempt_claim

    run_pass()
    attempt = Attempt.objects.get(job=job, ended_at__isnull=True)
    attempt_claim(attempt.pk, attempt.fencing_token, node)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING, job.reason
    return attempt


@pytest.fixture
def swarm(install_plugins, make_team, make_user, make_token, make_node, api, run_pass):
    """A RUNNING swarmtest job holding one GPU of team alpha (max_gpus 2), with a working access token."""
    from strata.jobs.services import job_token_create

    install_plugins(f"{__name__}:SWARM")
    team = make_team("alpha", max_gpus=2.0)
    alice = make_user("alice", team)
    node = make_node("n1", gpus=4)
    job = _submit(alice, team)
    attempt = _start(job, node, run_pass)
    token, raw = job_token_create(job, user=alice, name="volunteers")
    return {"team": team, "alice": alice, "node": node, "job": job, "attempt": attempt, "token": token, "raw": raw,
            "client": api(make_token(alice, team)), "api": api, "run_pass": run_pass}


def join(swarm, raw=None, **body):
    return swarm["api"](raw or swarm["raw"]).post(JOIN, {"job": str(swarm["job"].pk), **body}, format="json")


def beat(swarm, joined, secret=None, **body):
    return swarm["api"](secret or joined["secret"]).post(f"{JOIN}{joined['id']}/heartbeat/", body, format="json")


def events(job, kind="participant") -> list[str]:
    return list(JobEvent.objects.filter(job=job, kind=kind).values_list("message", flat=True))


def test_a_working_token_joins_a_running_job(swarm):
    from strata.jobs.credentials import job_public_key

    answer = join(swarm, name="lab-box", gpus=0.5, info={"address": "/ip4/10.1.2.3/tcp/4000"})
    assert answer.status_code == 201, answer.content
    body = answer.json()
    job = swarm["job"]
    assert body["name"] == "lab-box" and body["gpus"] == 0.5 and body["secret"].startswith("sp_")
    assert body["job"] == {"id": str(job.pk), "kind": "swarmtest", "spec": job.spec, "state": "RUNNING"}
    assert body["payload"] == {"job": str(job.pk), "epochs": 1, "state": "RUNNING", "already": []}
    assert body["public_key"] == job_public_key(job.pk) and len(body["public_key"]) == 64
    assert body["lease_s"] == 30.0 and body["heartbeat_s"] == 10.0
    stored = Participant.objects.get(pk=body["id"])
    assert stored.state == "active" and stored.token_id == swarm["token"].pk and stored.info["address"]
    assert body["secret"] not in str(stored.__dict__)  # only the digest is kept
    assert events(job) == ["participant lab-box joined (gpus 0.5)"]
    # The next one's payload sees the first; a nameless one gets a name.
    second = join(swarm).json()
    assert second["payload"]["already"] == ["lab-box"] and second["name"].startswith("p-") and second["gpus"] == 0


def test_bad_tokens_are_401_and_never_echoed(swarm, make_user, make_token, run_pass):
    from strata.jobs.services import job_token_create, job_token_revoke

    other_job = _submit(swarm["alice"], swarm["team"], name="other")
    _start(other_job, swarm["node"], run_pass)
    _, others = job_token_create(other_job, user=swarm["alice"])
    revoked, revoked_raw = job_token_create(swarm["job"], user=swarm["alice"])
    job_token_revoke(revoked, user=swarm["alice"])
    expired, expired_raw = job_token_create(swarm["job"], user=swarm["alice"], expires_in_s=60)
    JobToken.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    user_token = make_token(swarm["alice"], swarm["team"])
    for raw in ("sj_nope_nope", others, revoked_raw, expired_raw, user_token, "x" * 600):
        answer = join(swarm, raw=raw)
        assert answer.status_code == 401, (raw, answer.content)
        assert answer.json()["detail"].startswith("the access token is not valid") and raw not in answer.content.decode()
        assert answer["WWW-Authenticate"] == "Bearer"
    nobody = swarm["api"]().post(JOIN, {"job": str(swarm["job"].pk)}, format="json")
    assert nobody.status_code == 401 and "detail" in nobody.json()
    # A job that does not exist reads exactly like a wrong token; a bad token is a 401 whatever the body.
    missing = swarm["api"](swarm["raw"]).post(JOIN, {"job": "00000000-0000-4000-8000-000000000000"}, format="json")
    assert missing.status_code == 401 and "for job 00000000-" in missing.json()["detail"]
    assert swarm["api"]("sj_nope_nope").post(JOIN, {"job": "nope", "gpus": -1}, format="json").status_code == 401
    assert not Participant.objects.exists()


def test_bad_fields_are_named_at_once(swarm):
    answer = swarm["api"](swarm["raw"]).post(JOIN, {"job": "nope", "gpus": -1, "name": 5, "info": [1], "extra": 1},
                                             format="json")
    assert answer.status_code == 400
    assert set(answer.json()) == {"job", "gpus", "name", "info", "extra"}
    big = join(swarm, info={"blob": "x" * 9000})
    assert big.status_code == 400 and "8192 bytes" in big.json()["info"][0]
    assert join(swarm, gpus=65).status_code == 400


def test_only_running_jobs_of_kinds_that_take_participants(swarm, run_pass):
    from components.runtime.shared.tokens import token_digest
    from strata.jobs.services import job_token_create
    from strata.quotas.models import Quota

    Quota.objects.filter(team=swarm["team"]).update(max_gpus=None)
    waiting = _submit(swarm["alice"], swarm["team"], gpus=1.0, name="waiting")  # admitted, not placed
    assert waiting.state == JobState.QUEUED
    _, raw = job_token_create(waiting, user=swarm["alice"])
    answer = swarm["api"](raw).post(JOIN, {"job": str(waiting.pk)}, format="json")
    assert answer.status_code == 409
    assert answer.json()["detail"] == f"job {waiting.pk} is QUEUED: participants join a running job"

    train = _submit(swarm["alice"], swarm["team"], kind="train", gpus=0.5, name="plain")
    JobToken.objects.create(job=train, prefix="abcd", digest=token_digest("sj_abcd_plain"))
    plain = swarm["api"]("sj_abcd_plain").post(JOIN, {"job": str(train.pk)}, format="json")
    assert plain.status_code == 400 and plain.json() == {"job": ["train jobs take no participants"]}

    broken = _submit(swarm["alice"], swarm["team"], kind="swarmbroken", gpus=0.25, name="broken")
    _start(broken, swarm["node"], run_pass)
    _, raw = job_token_create(broken, user=swarm["alice"])
    failed = swarm["api"](raw).post(JOIN, {"job": str(broken.pk)}, format="json")
    assert failed.status_code == 500 and "swarmbroken kind" in failed.json()["detail"]
    assert not Participant.objects.exists()


def test_participants_count_against_max_gpus_and_other_jobs_see_them(swarm):
    from strata.quotas.services import admit_pending, team_load, team_usage

    first = join(swarm, name="a", gpus=0.75)
    assert first.status_code == 201
    load = team_load(swarm["team"].pk)
    assert load.gpus == pytest.approx(1.75) and load.participants == 1 and load.jobs == 1
    over = join(swarm, name="b", gpus=0.5)
    assert over.status_code == 409
    assert over.json()["detail"] == "cannot join: team at max_gpus (1.75 held + 0.5 requested > 2)"
    assert join(swarm, name="free", gpus=0).status_code == 201  # no GPU: nothing to hold
    assert team_usage(swarm["team"].pk)["participants"] == 2

    # Another job of the team waits for the volunteer's GPUs...
    pending = _submit(swarm["alice"], swarm["team"], gpus=0.5, name="next")
    assert pending.state == JobState.PENDING
    assert pending.reason.startswith("waiting: team at max_gpus (1.75 held + 0.5 requested")
    # ... until the volunteer is evicted.
    evicted = swarm["client"].delete(f"/api/v1/jobs/{swarm['job'].pk}/participants/{first.json()['id']}/")
    assert evicted.status_code == 200 and evicted.json()["state"] == "stopped"
    assert evicted.json()["reason"] == "evicted by alice"
    assert team_load(swarm["team"].pk).gpus == pytest.approx(1.0)
    assert [job.pk for job in admit_pending(swarm["team"].pk)] == [pending.pk]
    assert "participant a stopped: evicted by alice" in events(swarm["job"])
    heartbeat = beat(swarm, first.json())
    assert heartbeat.status_code == 200 and heartbeat.json() == {"state": "stop", "reason": "evicted by alice"}


def test_a_used_up_gpu_hours_window_refuses_participants_with_gpus(swarm):
    from strata.quotas.models import Quota

    Quota.objects.filter(team=swarm["team"]).update(gpu_hours=1.0, window_hours=24)
    Attempt.objects.filter(pk=swarm["attempt"].pk).update(dispatched_at=timezone.now() - timedelta(hours=2))
    refused = join(swarm, gpus=1)
    assert refused.status_code == 409 and "GPU-hours in the last 24 h" in refused.json()["detail"]
    assert join(swarm, gpus=0).status_code == 201


def test_heartbeats_record_metrics_and_hand_out_credentials(swarm):
    joined = join(swarm, name="lab-box", gpus=0.5).json()
    answer = beat(swarm, joined, metrics={"loss": 2.5, "samples_per_s": 120}, info={"address": "a"},
                  subject="p2p:QmPeer")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["state"] == "run" and body["reason"] == ""
    credential = body["credential"]
    assert credential["public_key"] == joined["public_key"] and credential["expires"] > credential["issued"]
    claims, problem = verify(credential["credential"], joined["public_key"], job=str(swarm["job"].pk),
                             subject="p2p:QmPeer")
    assert problem is None and claims["holder"] == f"participant {joined['id']}"
    assert verify(credential["credential"], joined["public_key"], job=str(swarm["job"].pk),
                  subject="p2p:Other")[1] == "the credential is for another subject"
    stored = Participant.objects.get(pk=joined["id"])
    assert stored.metrics == {"loss": 2.5, "samples_per_s": 120.0} and stored.info == {"address": "a"}
    # Without a subject: no credential; without metrics: the stored ones stay.
    assert beat(swarm, joined).json() == {"state": "run", "reason": ""}
    assert Participant.objects.get(pk=joined["id"]).metrics["loss"] == 2.5
    listed = swarm["client"].get(f"/api/v1/jobs/{swarm['job'].pk}/participants/")
    assert listed.status_code == 200
    [entry] = listed.json()
    assert set(entry) == {"id", "name", "gpus", "state", "reason", "info", "metrics", "joined_at", "last_seen",
                          "ended_at"}
    assert entry["name"] == "lab-box" and entry["state"] == "active" and entry["metrics"]["loss"] == 2.5


def test_heartbeat_authentication_and_bad_fields(swarm):
    joined = join(swarm).json()
    assert beat(swarm, joined, secret="sp_wrong").status_code == 401
    assert beat(swarm, joined, secret=swarm["raw"]).status_code == 401  # the job token is not the secret
    assert swarm["api"]().post(f"{JOIN}{joined['id']}/heartbeat/", {}, format="json").status_code == 401
    unknown = swarm["api"](joined["secret"]).post(f"{JOIN}00000000-0000-4000-8000-000000000000/heartbeat/", {},
                                                  format="json")
    assert unknown.status_code == 404
    bad = beat(swarm, joined, metrics={"ok": 1, "bad": "x", "flag": True, "x" * 65: 1.0}, subject="no spaces",
               other=1)
    assert bad.status_code == 400
    assert set(bad.json()) == {"metrics.bad", "metrics.flag", "metrics." + "x" * 64, "subject", "other"}
    many = beat(swarm, joined, metrics={f"m{i}": i for i in range(65)})
    assert many.status_code == 400 and "at most 64" in many.json()["metrics"][0]
    assert beat(swarm, joined, info={"blob": "x" * 9000}).status_code == 400
    assert Participant.objects.get(pk=joined["id"]).metrics == {}


def test_a_revoked_token_stops_its_participants(swarm):
    from strata.jobs.services import job_token_revoke
    from strata.quotas.services import team_load

    joined = join(swarm, gpus=0.5).json()
    assert beat(swarm, joined).json()["state"] == "run"
    job_token_revoke(swarm["token"], user=swarm["alice"])
    answer = beat(swarm, joined, subject="p2p:QmPeer").json()
    assert answer["state"] == "stop" and "was revoked" in answer["reason"] and "credential" not in answer
    stored = Participant.objects.get(pk=joined["id"])
    assert stored.state == "stopped" and stored.ended_at is not None
    assert team_load(swarm["team"].pk).gpus == pytest.approx(1.0)
    assert beat(swarm, joined).json()["state"] == "stop"


def test_the_reaper_stops_participants_of_revoked_tokens(swarm):
    from strata.scheduling.services import reap

    joined = join(swarm).json()
    JobToken.objects.filter(pk=swarm["token"].pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert reap()["stopped_participants"] == 1
    assert Participant.objects.get(pk=joined["id"]).reason.endswith("expired")


def test_a_job_that_ends_stops_its_participants(swarm):
    from strata.quotas.services import team_load

    joined = join(swarm, gpus=0.5).json()
    cancelled = swarm["client"].post(f"/api/v1/jobs/{swarm['job'].pk}/cancel/")
    assert cancelled.json()["state"] == "CANCELLED"
    stored = Participant.objects.get(pk=joined["id"])
    assert stored.state == "stopped" and stored.reason == "the job ended (CANCELLED)"
    assert "1 participant(s) stopped: the job ended (CANCELLED)" in events(swarm["job"])
    assert team_load(swarm["team"].pk).participants == 0
    assert beat(swarm, joined).json() == {"state": "stop", "reason": "the job ended (CANCELLED)"}
    assert join(swarm).status_code == 409


def test_a_participant_that_misses_its_lease_is_lost(swarm, settings):
    from strata.quotas.services import team_load
    from strata.scheduling.services import reap

    joined = join(swarm, gpus=0.5).json()
    assert team_load(swarm["team"].pk).gpus == pytest.approx(1.5)
    seen = timezone.now() - timedelta(seconds=31)
    Participant.objects.filter(pk=joined["id"]).update(last_seen=seen)
    # It stops counting at once, before the reaper runs, and shows as lost.
    assert team_load(swarm["team"].pk).gpus == pytest.approx(1.0)
    assert swarm["client"].get(f"/api/v1/jobs/{swarm['job'].pk}/participants/").json()[0]["state"] == "lost"
    assert reap()["lost_participants"] == 1
    stored = Participant.objects.get(pk=joined["id"])
    assert stored.state == "lost" and stored.reason.startswith("missed its lease")
    assert stored.ended_at == seen + timedelta(seconds=settings.STRATA_PARTICIPANT_LEASE_S)
    assert any(message.startswith("participant ") and " lost: missed its lease" in message
               for message in events(swarm["job"]))
    assert beat(swarm, joined).json()["state"] == "stop"
    assert reap()["lost_participants"] == 0


def test_a_late_heartbeat_finds_it_lost(swarm):
    joined = join(swarm).json()
    Participant.objects.filter(pk=joined["id"]).update(last_seen=timezone.now() - timedelta(seconds=60))
    answer = beat(swarm, joined).json()
    assert answer["state"] == "stop" and answer["reason"].startswith("missed its lease")
    assert Participant.objects.get(pk=joined["id"]).state == "lost"


def test_leaving_is_idempotent(swarm):
    joined = join(swarm).json()
    url = f"{JOIN}{joined['id']}/leave/"
    left = swarm["api"](joined["secret"]).post(url)
    assert left.status_code == 200 and left.json() == {"id": joined["id"], "state": "left", "reason": "left"}
    assert swarm["api"](joined["secret"]).post(url).json()["state"] == "left"
    assert swarm["api"]("sp_wrong").post(url).status_code == 401
    assert beat(swarm, joined).json() == {"state": "stop", "reason": "left"}
    assert f"participant {joined['name']} left" in events(swarm["job"])


def test_the_list_and_eviction_are_team_scoped(swarm, make_team, make_user, make_token):
    joined = join(swarm, name="lab-box").json()
    beta = make_team("beta")
    bob = swarm["api"](make_token(make_user("bob", beta), beta))
    base = f"/api/v1/jobs/{swarm['job'].pk}/participants/"
    listed = bob.get(base)
    assert listed.status_code == 404 and "lab-box" not in listed.content.decode()
    assert bob.delete(f"{base}{joined['id']}/").status_code == 404
    assert Participant.objects.get(pk=joined["id"]).state == "active"
    assert swarm["client"].delete(f"{base}00000000-0000-4000-8000-000000000000/").status_code == 404
    assert swarm["client"].delete(f"{base}{joined['id']}/").json()["state"] == "stopped"
    assert swarm["client"].delete(f"{base}{joined['id']}/").json()["reason"] == "evicted by alice"  # idempotent


def test_panel_data_and_job_routes_see_participants(swarm):
    from strata.jobs.api.serializers import JobSerializer
    from strata.jobs.panel_data import DatabasePanelData

    joined = join(swarm, name="lab-box", gpus=0.5).json()
    beat(swarm, joined, metrics={"loss": 1.0})
    job = swarm["job"]
    [entry] = DatabasePanelData([swarm["team"].pk], job, JobSerializer(job).data).participants()
    assert entry["name"] == "lab-box" and entry["metrics"] == {"loss": 1.0} and entry["ended_at"] is None
    assert isinstance(entry["joined_at"], float) and isinstance(entry["last_seen"], float)
    assert DatabasePanelData([swarm["team"].pk + 1000], job, {}).participants() == []
    route = swarm["client"].get(f"/api/v1/jobs/{job.pk}/volunteers/")
    assert route.status_code == 200 and route.json() == [{"name": "lab-box", "state": "active", "gpus": 0.5}]
    # The static twin, for panel tests: what it is given, copied.
    from components.runtime.contract.panels import StaticPanelData

    given = [{"name": "x"}]
    static = StaticPanelData(participants=given)
    assert static.participants() == given and static.participants()[0] is not given[0]
    assert StaticPanelData().participants() == []


def test_gpu_seconds_bill_participants(swarm):
    from strata.quotas.services import gpu_seconds

    team, job = swarm["team"].pk, swarm["job"]
    until = timezone.now()
    before = gpu_seconds(team, until=until)
    window_before = gpu_seconds(team, since=until - timedelta(seconds=70), until=until)
    # Active, last seen 40 s ago (billed to then); left 50 s ago; lost (billed up to its lease, 30 s).
    Participant.objects.create(job=job, name="active", gpus=2.0, secret_digest="a" * 64, joined_at=until - timedelta(seconds=100),
                               last_seen=until - timedelta(seconds=40))
    Participant.objects.create(job=job, name="left", gpus=1.0, secret_digest="b" * 64, state="left",
                               joined_at=until - timedelta(seconds=100), last_seen=until - timedelta(seconds=50),
                               ended_at=until - timedelta(seconds=50))
    Participant.objects.create(job=job, name="lost", gpus=1.0, secret_digest="c" * 64, state="lost",
                               joined_at=until - timedelta(seconds=100), last_seen=until - timedelta(seconds=90),
                               ended_at=until - timedelta(seconds=5))
    Participant.objects.create(job=job, name="cpu", gpus=0.0, secret_digest="d" * 64,
                               joined_at=until - timedelta(seconds=100), last_seen=until)
    assert gpu_seconds(team, until=until) - before == pytest.approx(2 * 60 + 50 + 40)
    window = gpu_seconds(team, since=until - timedelta(seconds=70), until=until) - window_before
    assert window == pytest.approx(2 * 30 + 20 + 10)


# --- the participant runtime against this control plane ------------------------------------------------------

class _Answer:
    def __init__(self, response):
        self.status_code, self.content = response.status_code, response.content
        self.text = response.content.decode(errors="replace")

    def json(self):
        import json

        return json.loads(self.content)


class DjangoSession:
    """The one method of ``requests.Session`` that ControlPlaneClient uses, answered by Django's test client."""

    def __init__(self):
        self.headers: dict[str, str] = {}

    def request(self, method, url, json=None, params=None, timeout=None, headers=None, **_):
        from rest_framework.test import APIClient

        client = APIClient()
        extra = {"HTTP_AUTHORIZATION": self.headers["Authorization"]} if "Authorization" in self.headers else {}
        response = getattr(client, method.lower())(urlsplit(url).path, json or {}, format="json", **extra)
        return _Answer(response)


def test_a_participant_session_joins_heartbeats_and_leaves(swarm, monkeypatch, tmp_path):
    from components.runtime.client import client as client_module
    from components.runtime.client.client import ApiError
    from components.runtime.client.participant import ParticipantSession
    from strata.jobs.services import job_token_revoke

    monkeypatch.setattr(client_module.requests, "Session", DjangoSession)
    session = ParticipantSession("http://testserver", str(swarm["job"].pk), swarm["raw"], name="box", gpus=0.5,
                                 info={"version": 1}, workdir=tmp_path, echo=False, heartbeat=False)
    with session as ctx:
        assert ctx.job_id == str(swarm["job"].pk) and ctx.spec == swarm["job"].spec
        assert ctx.payload["job"] == str(swarm["job"].pk) and ctx.heartbeat_s == 10.0
        ctx.metrics(loss=0.25, step=7)
        assert ctx.beat()["state"] == "run"
        stored = Participant.objects.get(pk=ctx.participant_id)
        assert stored.metrics == {"loss": 0.25, "step": 7.0} and stored.info == {"version": 1}
        answer = ctx.identity.credential("p2p:QmBox")
        claims, problem = verify(answer["credential"], ctx.public_key, job=ctx.job_id, subject="p2p:QmBox")
        assert problem is None and claims["holder"] == f"participant {ctx.participant_id}"
        assert ctx.identity.credential("p2p:QmBox") == answer  # still fresh: no new heartbeat needed
        job_token_revoke(swarm["token"], user=swarm["alice"])
        ctx.beat()
        assert ctx.should_stop() and "was revoked" in ctx.reason
        with pytest.raises(RuntimeError, match="the participant stops"):
            ctx.identity.credential("p2p:Another")
    assert Participant.objects.get(pk=ctx.participant_id).state == "stopped"  # leaving changed nothing

    with pytest.raises(ApiError, match="HTTP 401: the access token is not valid"):
        ParticipantSession("http://testserver", str(swarm["job"].pk), "sj_bad", echo=False).open()


def test_the_participants_verb_lists_one_line_each(swarm, monkeypatch, make_token, capsys):
    from components.runtime.client import client as client_module
    from strata.cli.main import main

    monkeypatch.setattr(client_module.requests, "Session", DjangoSession)
    token = make_token(swarm["alice"], swarm["team"])
    job = str(swarm["job"].pk)
    assert main(["--url", "http://testserver", "--token", token, "participants", job]) == 0
    assert capsys.readouterr().out == f"job {job} has no participants\n"
    first = join(swarm, name="lab-box", gpus=0.5).json()
    beat(swarm, first, metrics={"loss": 0.25})
    second = join(swarm, name="laptop").json()
    swarm["api"](second["secret"]).post(f"{JOIN}{second['id']}/leave/")
    assert main(["--url", "http://testserver", "--token", token, "participants", job]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"{first['id']}  lab-box") and "active" in lines[0] and "loss=0.25" in lines[0]
    assert "gpus 0.5" in lines[0] and "s ago" in lines[0]
    assert lines[1].startswith(f"{second['id']}  laptop") and " left " in lines[1] and lines[1].endswith("left")
