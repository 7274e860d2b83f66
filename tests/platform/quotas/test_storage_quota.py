"""Stored bytes per team: counted in Usage and /metrics, capped by the quota's max_storage_bytes (a 413 naming the
limit and the use, from quotas.services.storage_allowed, for artifacts and checkpoints, code bundles and data
uploads), and the retention policies' fields on the quota API and on a submitted job."""

from __future__ import annotations

import hashlib
import io

import pytest

from components.runtime.shared import bundles
from strata.jobs.models import Artifact, Attempt, CodeBundle, DataUpload
from strata.quotas.services import quota_update, team_storage

JOBS = "/api/v1/jobs/"


@pytest.fixture
def running(make_team, make_user, make_node, node_protocol, make_token, api, submit, run_pass, artifact_root):
    """A team (alpha) with a running attempt: its node's protocol client, and the team's user client."""
    team = make_team("alpha")
    node = make_node("n1", gpus=1)
    user = make_user("alice", team)
    job = submit(user, team)
    run_pass()
    attempt = Attempt.objects.get(job=job)

    class Running:
        pass

    state = Running()
    state.team, state.job, state.attempt = team, job, attempt
    state.node = node_protocol(attempt, node, claim=False)
    state.user = api(make_token(user, team))
    state.admin = api(make_token(make_user("root", team, admin=True), team))
    return state


def put(running, name: str, size: int, kind: str = "artifact"):
    return running.node.put(f"artifacts/{name}", b"x" * size, kind=kind)


def project(tmp_path) -> bytes:
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "main.py").write_text("print('hello')\n" * 50)
    buffer = io.BytesIO()
    bundles.pack(tmp_path / "p", buffer)
    return buffer.getvalue()


def test_usage_counts_every_part_of_the_stored_bytes(running, tmp_path):
    assert put(running, "model.pt", 1000).status_code == 201
    assert put(running, "checkpoint.pt", 300, "checkpoint").status_code == 201
    assert running.user.generic("POST", "/api/v1/code/", data=project(tmp_path),
                                content_type="application/gzip").status_code in (200, 201)
    code = CodeBundle.objects.get(team=running.team).size
    usage = running.user.get("/api/v1/quotas/alpha/usage/").json()["usage"]["storage"]
    assert usage == {"artifacts": 1000, "checkpoints": 300, "code": code, "data": 0, "uploads": 0,
                     "total": 1300 + code}
    # A checkpoint written again replaces the old one: counted once.
    assert put(running, "checkpoint.pt", 200, "checkpoint").status_code == 201
    assert team_storage(running.team.pk)["total"] == 1200 + code


def test_the_quota_caps_stored_bytes_with_a_413_naming_the_limit_and_the_use(running, tmp_path):
    response = running.admin.patch("/api/v1/quotas/alpha/", {"max_storage_bytes": "2KiB"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["max_storage_bytes"] == 2048
    assert put(running, "checkpoint.pt", 1500, "checkpoint").status_code == 201
    # A checkpoint overwriting its previous self is measured without it; a new artifact once at the limit is not.
    assert put(running, "checkpoint.pt", 2048, "checkpoint").status_code == 201
    refused = put(running, "model.pt", 10)
    assert refused.status_code == 413
    body = refused.json()
    assert body["limit"] == "max_storage_bytes" and body["max_storage_bytes"] == 2048
    assert body["stored_bytes"] == 2048 and "max_storage_bytes is 2048" in body["detail"]
    assert not Artifact.objects.filter(name="model.pt").exists()
    # A code bundle's size is known before it is stored: refused when it would pass the limit.
    code = running.user.generic("POST", "/api/v1/code/", data=project(tmp_path), content_type="application/gzip")
    assert code.status_code == 413 and code.json()["requested_bytes"] > 0
    assert not CodeBundle.objects.exists()
    # A data upload declares its size: one that cannot fit is refused at once.
    data = b"d" * 4096
    opened = running.user.post("/api/v1/uploads/", {"name": "big", "size": len(data), "chunk_size": 1024,
                                                    "sha256": hashlib.sha256(data).hexdigest()}, format="json")
    assert opened.status_code == 413 and opened.json()["requested_bytes"] == 4096
    assert not DataUpload.objects.exists()
    # Raised, the limit lets the same stores through.
    quota_update(running.team.pk, {"max_storage_bytes": None})
    assert put(running, "model.pt", 10).status_code == 201


def test_keep_on_the_quota_is_validated_and_stored(running):
    bad = running.admin.patch("/api/v1/quotas/alpha/", {"keep": {"checkpoints": {"best": 0}, "artifacts_days": -1,
                                                                 "x": 1}}, format="json")
    assert bad.status_code == 400
    assert set(bad.json()) == {"keep.checkpoints.best", "keep.artifacts_days", "keep.x"}
    good = running.admin.patch("/api/v1/quotas/alpha/", {"keep": {"checkpoints": {"best": 3, "metric": "loss",
                                                                                  "mode": "min"}}}, format="json")
    assert good.status_code == 200, good.content
    assert good.json()["keep"] == {"checkpoints": {"best": 3, "metric": "loss", "mode": "min"}}
    assert running.user.patch("/api/v1/quotas/alpha/", {"keep": None}, format="json").status_code == 403


def test_a_job_keep_is_checked_naming_every_bad_field(running, job_body):
    bad = running.user.post(JOBS, job_body(keep={"checkpoints": "some", "artifacts_days": "ten", "extra": True},
                                           priority=1000), format="json")
    assert bad.status_code == 400
    assert {"keep.checkpoints", "keep.artifacts_days", "keep.extra", "priority"} <= set(bad.json())
    # best: N needs a metric when the kind names no objective.
    unranked = running.user.post(JOBS, job_body(keep={"checkpoints": {"best": 2}}), format="json")
    assert unranked.status_code == 400 and "keep.checkpoints.metric" in unranked.json()
    ok = running.user.post(JOBS, job_body(keep={"checkpoints": {"best": 2, "metric": "loss", "mode": "min"},
                                                "artifacts_days": 14}), format="json")
    assert ok.status_code == 201, ok.content
    assert ok.json()["keep"] == {"checkpoints": {"best": 2, "metric": "loss", "mode": "min"}, "artifacts_days": 14.0}
    assert running.user.get(f"{JOBS}{ok.json()['id']}/").json()["keep"]["artifacts_days"] == 14.0


def test_metrics_show_stored_bytes_and_per_team_only_behind_the_token(running, client, settings):
    assert put(running, "model.pt", 1000).status_code == 201
    text = client.get("/metrics").content.decode()
    assert 'strata_storage_bytes{part="artifacts"} 1000.0' in text
    assert "alpha" not in text  # an open /metrics names no team
    settings.STRATA_METRICS_TOKEN = "metrics-secret"
    quota_update(running.team.pk, {"max_storage_bytes": 10_000})
    text = client.get("/metrics", HTTP_AUTHORIZATION="Bearer metrics-secret").content.decode()
    assert 'strata_team_storage_bytes{team="alpha"} 1000.0' in text
    assert 'strata_team_storage_limit_bytes{team="alpha"} 10000.0' in text


def test_the_usage_page_shows_storage_against_the_limit(running, client):
    from django.contrib.auth import get_user_model

    quota_update(running.team.pk, {"max_storage_bytes": 2**30})
    assert put(running, "model.pt", 2**20).status_code == 201
    client.force_login(get_user_model().objects.get(username="alice"))
    page = client.get("/usage/?team=alpha").content.decode()
    assert 'data-meter="max_storage_bytes"' in page and f'data-used="{2**20}"' in page
