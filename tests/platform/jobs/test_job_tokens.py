"""Job access tokens: issued, listed and revoked through the API; their digests reach the job's attempts."""

from __future__ import annotations

import io

from node_protocol import NodeProtocol

from components.runtime.shared.tokens import token_digest
from strata.jobs.models import Attempt, JobToken


def _serve_job(make_team, make_user, make_token, make_node, node_token, api, submit, run_pass):
    from strata.jobs.services import artifact_store

    team = make_team("alpha")
    user = make_user("alice", team)
    node = make_node("n1", gpus=1)
    agent, client = api(node_token), api(make_token(user, team))

    def node_call(attempt, verb, method="post", **body):
        protocol = NodeProtocol(agent, attempt, node)
        if method == "get":
            return protocol.get(verb)
        response = protocol.post(verb, body)
        assert response.status_code == 200, response.content
        return response

    source = submit(user, team, gpus=0.5)
    run_pass()
    attempt = Attempt.objects.get(job=source, ended_at__isnull=True)
    node_call(attempt, "claim")
    artifact_store(attempt, "model.pt", io.BytesIO(b"weights"))
    node_call(attempt, "finish", outcome="succeeded")
    response = client.post("/api/v1/jobs/", {"kind": "serve", "name": "serve-it", "resources": {"gpus": 0.25},
                                             "spec": {"model": {"job": str(source.pk)}}}, format="json")
    assert response.status_code == 201, response.content
    return {"client": client, "node_call": node_call, "job_id": response.json()["id"], "source": source,
            "team": team, "user": user}


def test_tokens_are_issued_once_listed_without_secrets_revoked_and_reach_the_attempt(
        make_team, make_user, make_token, make_node, node_token, api, submit, run_pass):
    world = _serve_job(make_team, make_user, make_token, make_node, node_token, api, submit, run_pass)
    client, job_id = world["client"], world["job_id"]
    created = client.post(f"/api/v1/jobs/{job_id}/tokens/", {"name": "ci", "expires_in_s": 3600}, format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    raw = body["token"]
    assert raw.startswith(f"sj_{body['prefix']}_") and body["name"] == "ci" and body["active"] is True
    assert body["expires_at"] is not None and body["created_by"] == "alice"
    stored = JobToken.objects.get(pk=body["id"])
    assert stored.digest == token_digest(raw) and raw not in str(stored.__dict__)  # only the digest is kept
    second = client.post(f"/api/v1/jobs/{job_id}/tokens/", {}, format="json").json()

    listed = client.get(f"/api/v1/jobs/{job_id}/tokens/")
    assert listed.status_code == 200
    assert [t["id"] for t in listed.json()] == [body["id"], second["id"]]
    assert all("token" not in t for t in listed.json()) and raw not in listed.content.decode()

    run_pass()
    attempt = Attempt.objects.get(job_id=job_id, ended_at__isnull=True)
    world["node_call"](attempt, "claim")
    digests = world["node_call"](attempt, "tokens", method="get")
    assert digests.status_code == 200
    assert sorted(digests.json()["digests"]) == sorted([token_digest(raw), token_digest(second["token"])])

    revoked = client.delete(f"/api/v1/jobs/{job_id}/tokens/{body['id']}/")
    assert revoked.status_code == 200 and revoked.json()["active"] is False and revoked.json()["revoked_at"]
    assert client.delete(f"/api/v1/jobs/{job_id}/tokens/{body['id']}/").status_code == 200  # idempotent
    assert world["node_call"](attempt, "tokens", method="get").json()["digests"] == [token_digest(second["token"])]
    events = [e["message"] for e in client.get(f"/api/v1/jobs/{job_id}/events/").json() if e["kind"] == "token"]
    assert len(events) == 3 and "revoked by alice" in events[-1] and raw not in " ".join(events)


def test_bad_requests_and_other_teams(make_team, make_user, make_token, make_node, node_token, api, submit, run_pass):
    world = _serve_job(make_team, make_user, make_token, make_node, node_token, api, submit, run_pass)
    client, job_id = world["client"], world["job_id"]
    bad = client.post(f"/api/v1/jobs/{job_id}/tokens/", {"name": "x" * 101, "expires_in_s": 5}, format="json")
    assert bad.status_code == 400 and set(bad.json()) == {"name", "expires_in_s"}
    # A kind that checks no tokens has none to issue.
    train = client.post(f"/api/v1/jobs/{world['source'].pk}/tokens/", {}, format="json")
    assert train.status_code == 400 and "take no access tokens" in train.json()["kind"][0]
    # Another team's job is a 404, for every verb; a token id of another job too.
    token = client.post(f"/api/v1/jobs/{job_id}/tokens/", {}, format="json").json()
    other_team = make_team("beta")
    other = api(make_token(make_user("bob", other_team), other_team))
    assert other.get(f"/api/v1/jobs/{job_id}/tokens/").status_code == 404
    assert other.post(f"/api/v1/jobs/{job_id}/tokens/", {}, format="json").status_code == 404
    assert other.delete(f"/api/v1/jobs/{job_id}/tokens/{token['id']}/").status_code == 404
    assert client.delete(f"/api/v1/jobs/{job_id}/tokens/{job_id}/").status_code == 404
    assert JobToken.objects.get(pk=token["id"]).revoked_at is None
    # An ended job takes no new tokens.
    client.post(f"/api/v1/jobs/{job_id}/cancel/")
    ended = client.post(f"/api/v1/jobs/{job_id}/tokens/", {}, format="json")
    assert ended.status_code == 400 and "state" in ended.json()


def test_expired_tokens_are_not_handed_out(make_team, make_user, make_token, make_node, node_token, api, submit,
                                           run_pass):
    from datetime import timedelta

    from django.utils import timezone

    from strata.jobs.models import Job
    from strata.jobs.services import job_token_create, job_token_digests

    world = _serve_job(make_team, make_user, make_token, make_node, node_token, api, submit, run_pass)
    job = Job.objects.get(pk=world["job_id"])
    expired, _ = job_token_create(job, user=world["user"], expires_in_s=60)
    _, working = job_token_create(job, user=world["user"])
    JobToken.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert job_token_digests(job) == [token_digest(working)]
