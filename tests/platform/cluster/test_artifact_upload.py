"""PUT /api/v1/node/attempts/{id}/artifacts/{name}/: an empty body is an empty file (it was a 500: DRF gives no
stream for an empty body). Found by tests/platform/api/test_fuzz_schemathesis.py."""

from __future__ import annotations

import hashlib

from strata.jobs.models import Artifact, Attempt


def test_an_empty_upload_stores_an_empty_artifact(make_team, make_user, make_node, node_token, api, submit, run_pass):
    team = make_team("alpha")
    node = make_node("n1", gpus=1)
    job = submit(make_user("alice", team), team)
    run_pass()
    attempt = Attempt.objects.get(job=job)
    response = api(node_token).put(
        f"/api/v1/node/attempts/{attempt.pk}/artifacts/empty.bin/?node={node.pk}&token={attempt.fencing_token}",
        b"", content_type="application/octet-stream")
    assert response.status_code == 201, response.content
    assert response.json()["size"] == 0 and response.json()["sha256"] == hashlib.sha256(b"").hexdigest()
    assert Artifact.objects.get(job=job, name="empty.bin").size == 0
