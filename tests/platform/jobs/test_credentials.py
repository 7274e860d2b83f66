"""Job credentials on the control plane: a key per job derived from the secret key (nothing stored), and the node
route through which an attempt's ranks get credentials, fenced like every attempt route."""

from __future__ import annotations

import uuid

import pytest

from components.runtime.shared.credentials import verify
from strata.jobs.credentials import job_public_key, sign
from strata.jobs.models import Attempt


def test_each_job_has_its_own_key_derived_from_the_secret(settings):
    first, second = uuid.uuid4(), uuid.uuid4()
    assert job_public_key(first) == job_public_key(str(first)) != job_public_key(second)
    answer = sign(first, "p2p:QmPeer", "attempt x")
    assert answer["public_key"] == job_public_key(first)
    assert answer["expires"] - answer["issued"] == pytest.approx(settings.STRATA_CREDENTIAL_TTL_S, abs=0.01)
    assert settings.STRATA_CREDENTIAL_TTL_S == 60.0
    claims, problem = verify(answer["credential"], job_public_key(first), job=str(first), subject="p2p:QmPeer")
    assert problem is None and claims["holder"] == "attempt x"
    assert verify(answer["credential"], job_public_key(second), job=str(first))[1].startswith("bad signature")
    before = job_public_key(first)
    settings.SECRET_KEY = "another secret of the control plane"
    assert job_public_key(first) != before
    short = sign(first, "x", "y", ttl_s=5)
    assert short["expires"] - short["issued"] == pytest.approx(5.0, abs=0.01)


def test_the_node_holding_an_attempt_gets_credentials(make_team, make_user, make_node, node_protocol, api, submit,
                                                      run_pass):
    team = make_team("alpha")
    user = make_user("alice", team)
    node, stranger = make_node("n1", gpus=1), make_node("n2", gpus=1)
    job = submit(user, team, gpus=1.0)
    run_pass()
    attempt = Attempt.objects.get(job=job)
    holder = node if attempt.node_id == node.pk else stranger
    other = stranger if holder is node else node
    protocol = node_protocol(attempt, claim=False)

    def call(who, token=None, **body):
        return protocol.post("credential", {"subject": "p2p:QmRank0", **body}, node=who, token=token)

    answer = call(holder)
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert set(body) == {"credential", "public_key", "expires", "issued"}
    claims, problem = verify(body["credential"], job_public_key(job.pk), job=str(job.pk), subject="p2p:QmRank0")
    assert problem is None and claims["holder"] == f"attempt {attempt.pk} on node {holder.name}"
    assert call(other).status_code == 409  # a node that holds none of the attempt
    assert call(holder, token="wrong").status_code == 409
    unknown = protocol.post("credential", {"subject": "p2p:x"}, node=uuid.uuid4())
    assert unknown.status_code == 404
    bad = call(holder, subject="has space")
    assert bad.status_code == 400 and set(bad.json()) == {"subject"}
    assert api().post(protocol.url("credential"), {}, format="json").status_code == 401
    from strata.jobs.services import attempt_claim, attempt_finish

    attempt_claim(attempt.pk, attempt.fencing_token, holder)
    attempt_finish(attempt.pk, attempt.fencing_token, holder, "succeeded")
    assert call(holder).status_code == 409  # the attempt ended
