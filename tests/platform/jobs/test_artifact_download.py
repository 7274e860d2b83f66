"""GET /api/v1/jobs/{id}/artifacts/{artifact_id}/download/: found by tests/platform/api/test_fuzz_schemathesis.py,
an artifact id that the route lets through but that is no UUID was a 500; the answer is always bytes."""

from __future__ import annotations

import io

import pytest

from strata.jobs.models import Attempt
from strata.jobs.services import artifact_store

pytestmark = pytest.mark.usefixtures("storage_backend")  # local disk, then S3 (SeaweedFS): conftest.py


def _job_with_artifact(make_team, make_user, make_token, api, submit, run_pass, name):
    team = make_team("alpha")
    user = make_user("alice", team)
    job = submit(user, team)
    run_pass()
    artifact = artifact_store(Attempt.objects.get(job=job), name, io.BytesIO(b"<script>alert(1)</script>"))
    return api(make_token(user, team)), job, artifact


def test_an_artifact_id_that_is_no_uuid_is_404(make_team, make_user, make_token, make_node, api, submit, run_pass):
    make_node()
    client, job, _ = _job_with_artifact(make_team, make_user, make_token, api, submit, run_pass, "model.pt")
    for bad in ("0" * 36, "-" * 36, "0123456789abcdef0123456789abcdef-123"):
        response = client.get(f"/api/v1/jobs/{job.pk}/artifacts/{bad}/download/")
        assert response.status_code == 404, (bad, response.status_code)
        assert set(response.json()) == {"detail"}


def test_a_download_is_bytes_whatever_its_name(make_team, make_user, make_token, make_node, api, submit, run_pass):
    make_node()
    client, job, artifact = _job_with_artifact(make_team, make_user, make_token, api, submit, run_pass, "page.html")
    response = client.get(f"/api/v1/jobs/{job.pk}/artifacts/{artifact.pk}/download/")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/octet-stream"
    assert response["Content-Disposition"].startswith("attachment")
    assert response["Content-Length"] == str(len(b"<script>alert(1)</script>"))  # the stream tells its size
    assert b"".join(response.streaming_content) == b"<script>alert(1)</script>"
