"""A serve job reads the model of a finished train job: checked at submit, fetched by the node, endpoint shown."""

from __future__ import annotations

import io
import uuid

import pytest
from node_protocol import NodeProtocol

from strata.jobs.models import Attempt, Job, JobEvent, JobState


@pytest.fixture
def cluster(make_team, make_user, make_token, make_node, node_token, api):
    team, other = make_team("alpha"), make_team("beta")
    user, stranger = make_user("alice", team), make_user("bob", other)
    node = make_node("n1", gpus=1)
    return {"team": team, "other": other, "user": user, "stranger": stranger, "node": node,
            "agent": api(node_token), "client": api(make_token(user, team)),
            "foreign": api(make_token(stranger, other))}


def _node(cluster, attempt) -> NodeProtocol:
    return NodeProtocol(cluster["agent"], attempt, cluster["node"])


def _node_call(cluster, attempt, verb, **body):
    return _node(cluster, attempt).post(verb, body)


def _run(cluster, submit, run_pass, user, team, *, outcome="succeeded", model: bytes | None = b"model-bytes"):
    """A train job of ``team`` run to its end through the node protocol, storing ``model`` as model.pt."""
    from strata.jobs.services import artifact_store

    job = submit(user, team, gpus=0.5)
    run_pass()
    attempt = Attempt.objects.get(job=job, ended_at__isnull=True)
    assert _node_call(cluster, attempt, "claim").status_code == 200
    if model is not None:
        artifact_store(attempt, "model.pt", io.BytesIO(model))
    assert _node_call(cluster, attempt, "finish", outcome=outcome).status_code == 200
    job.refresh_from_db()
    return job


def _serve(client, job_id, **spec):
    return client.post("/api/v1/jobs/", {"kind": "serve", "name": "serve-it", "resources": {"gpus": 0.25},
                                         "spec": {"model": {"job": str(job_id)}, **spec}}, format="json")


def test_serve_spec_errors_name_the_field(cluster):
    client = cluster["client"]
    response = client.post("/api/v1/jobs/", {"kind": "serve", "spec": {}}, format="json")
    assert response.status_code == 400 and "spec.model" in response.json()
    response = _serve(client, "not-a-uuid", port=70000, max_rows=0, extra=1)
    assert response.status_code == 400
    assert set(response.json()) == {"spec.model.job", "spec.port", "spec.max_rows", "spec.extra"}


def test_serve_needs_a_succeeded_train_job_of_the_same_team_with_a_model(cluster, submit, run_pass):
    client = cluster["client"]
    missing = uuid.uuid4()
    response = _serve(client, missing)
    assert response.status_code == 400
    assert response.json() == {"spec.model.job": [f"no job {missing} in team alpha"]}

    foreign = _run(cluster, submit, run_pass, cluster["stranger"], cluster["other"])
    response = _serve(client, foreign.pk)
    # Another team's job reads exactly like a missing one: nothing about it leaks.
    assert response.status_code == 400
    assert response.json() == {"spec.model.job": [f"no job {foreign.pk} in team alpha"]}

    failed = _run(cluster, submit, run_pass, cluster["user"], cluster["team"], outcome="failed")
    failed.refresh_from_db()
    assert failed.state != JobState.SUCCEEDED
    response = _serve(client, failed.pk)
    assert response.status_code == 400 and "it must have SUCCEEDED" in response.json()["spec.model.job"][0]

    no_model = _run(cluster, submit, run_pass, cluster["user"], cluster["team"], model=None)
    assert no_model.state == JobState.SUCCEEDED
    response = _serve(client, no_model.pk)
    assert response.json() == {"spec.model.job": [f"job {no_model.pk} has no model.pt artifact"]}

    user_code = _run(cluster, submit, run_pass, cluster["user"], cluster["team"])
    Job.objects.filter(pk=user_code.pk).update(spec={"entrypoint": "my_pkg.train:main", "epochs": 1})
    # A team's own model is served from the program its model.pt holds (the node finds out when it loads it).
    response = _serve(client, user_code.pk)
    assert response.status_code == 201, response.content
    client.post(f"/api/v1/jobs/{response.json()['id']}/cancel/")
    # With a loader of the user's own, it is accepted too.
    accepted = client.post("/api/v1/jobs/", {"kind": "serve", "resources": {"gpus": 0.25}, "spec": {
        "model": {"job": str(user_code.pk), "entrypoint": "components.serving.examples:LinearModel"}}}, format="json")
    assert accepted.status_code == 201, accepted.content
    client.post(f"/api/v1/jobs/{accepted.json()['id']}/cancel/")  # its share is not needed below
    bad = client.post("/api/v1/jobs/", {"kind": "serve", "resources": {"gpus": 0.25}, "spec": {
        "model": {"job": str(user_code.pk), "entrypoint": "not an entrypoint"}}}, format="json")
    assert bad.status_code == 400 and set(bad.json()) == {"spec.model.entrypoint"}

    good = _run(cluster, submit, run_pass, cluster["user"], cluster["team"])
    response = _serve(client, good.pk)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["kind"] == "serve" and body["spec"] == {
        "model": {"job": str(good.pk), "entrypoint": None}, "port": 0, "request_timeout_s": 10.0, "max_rows": 1024, "slo_ms": None,
        "auth": "token", "replicas": 1, "autoscale": None, "emoe": None,
        "batching": {"policy": "orloj", "max_batch": 8, "max_queue_delay_ms": 2.0, "max_queue": 128,
                     "preempt": True}}
    serve = _serve(client, body["id"])  # a serve job writes no model.pt
    assert serve.json() == {"spec.model.job": [
        f"job {body['id']} is a serve job, which writes no model.pt (kinds that do: compress-embeddings, train)"]}


def test_a_compressed_model_is_served_like_a_trained_one(cluster, submit, run_pass):
    """A kind whose KindSpec.products names model.pt (compress-embeddings) is a source the serve kind accepts."""
    from strata.jobs.services import artifact_store

    client = cluster["client"]
    trained = _run(cluster, submit, run_pass, cluster["user"], cluster["team"])
    Job.objects.filter(pk=trained.pk).update(spec={"workload": "dlrm-movielens", "epochs": 1})
    compress = client.post("/api/v1/jobs/", {"kind": "compress-embeddings", "resources": {"gpus": 0.5},
                                             "spec": {"source": {"job": str(trained.pk)}, "ratio": 8}}, format="json")
    assert compress.status_code == 201, compress.content
    run_pass()
    attempt = Attempt.objects.get(job_id=compress.json()["id"], ended_at__isnull=True)
    assert _node_call(cluster, attempt, "claim").status_code == 200
    artifact_store(attempt, "model.pt", io.BytesIO(b"compressed"))
    assert _node_call(cluster, attempt, "finish", outcome="succeeded").status_code == 200
    served = _serve(client, compress.json()["id"])
    assert served.status_code == 201, served.content
    # compress-embeddings reads train jobs only, of a DLRM workload.
    again = client.post("/api/v1/jobs/", {"kind": "compress-embeddings",
                                          "spec": {"source": {"job": compress.json()["id"]}}}, format="json")
    assert again.json() == {"spec.source.job": [
        f"job {compress.json()['id']} is a compress-embeddings job, not a train job"]}
    digits = _run(cluster, submit, run_pass, cluster["user"], cluster["team"])
    Job.objects.filter(pk=digits.pk).update(spec={"workload": "mlp-digits"})
    refused = client.post("/api/v1/jobs/", {"kind": "compress-embeddings",
                                            "spec": {"source": {"job": str(digits.pk)}}}, format="json")
    assert refused.status_code == 400 and "only the model.pt of dlrm-ctr, dlrm-movielens" in \
        refused.json()["spec.source.job"][0]


def test_node_fetches_the_source_model_and_publishes_the_endpoint(cluster, submit, run_pass):
    client = cluster["client"]
    source = _run(cluster, submit, run_pass, cluster["user"], cluster["team"], model=b"\x00trained-weights\xff")
    job_id = _serve(client, source.pk).json()["id"]
    run_pass()
    attempt = Attempt.objects.get(job_id=job_id, ended_at__isnull=True)
    assert _node_call(cluster, attempt, "claim").status_code == 200
    node = _node(cluster, attempt)
    response = node.get("sources/model.pt")
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == b"\x00trained-weights\xff"
    assert node.get("sources/metrics.json").status_code == 404
    assert node.get("sources/model.pt", token="not-the-token").status_code in (404, 409)

    assert client.get(f"/api/v1/jobs/{job_id}/").json()["endpoint"] is None
    bad = _node_call(cluster, attempt, "report", endpoint="no port here")
    assert bad.status_code == 400 and "endpoint" in bad.json()
    assert _node_call(cluster, attempt, "report", endpoint="127.0.0.1:50123").status_code == 200
    assert _node_call(cluster, attempt, "report", endpoint="127.0.0.1:50123").status_code == 200
    detail = client.get(f"/api/v1/jobs/{job_id}/").json()
    assert detail["state"] == JobState.RUNNING and detail["endpoint"] == "127.0.0.1:50123"
    assert detail["attempts"][0]["endpoint"] == "127.0.0.1:50123"
    assert JobEvent.objects.filter(job_id=job_id, kind="endpoint").count() == 1  # once, not per report
    assert cluster["foreign"].get(f"/api/v1/jobs/{job_id}/").status_code == 404

    assert _node_call(cluster, attempt, "finish", outcome="succeeded").status_code == 200
    assert client.get(f"/api/v1/jobs/{job_id}/").json()["endpoint"] is None  # not serving any more


def test_a_job_that_reads_what_user_code_wrote_is_claimed_as_user_code(cluster, submit, run_pass):
    """The claim says whether the attempt reads a source job's artifacts that a team's code wrote (the node then
    runs it in its own sandboxed processes, never in a shared node service): a built-in's model does not, an
    entrypoint's or a project's does."""
    from strata.jobs.models import CodeBundle

    client = cluster["client"]
    builtin = _run(cluster, submit, run_pass, cluster["user"], cluster["team"])
    user_code = _run(cluster, submit, run_pass, cluster["user"], cluster["team"])
    Job.objects.filter(pk=user_code.pk).update(spec={"entrypoint": "mywork:DigitsWorkload", "epochs": 1})
    project = _run(cluster, submit, run_pass, cluster["user"], cluster["team"])
    bundle = CodeBundle.objects.create(team=cluster["team"], digest="a" * 64, size=1, expanded_size=1, file_count=1,
                                       storage_key="code/aaaa")
    Job.objects.filter(pk=project.pk).update(code=bundle)
    claims = {}
    for source in (builtin, user_code, project):
        job_id = _serve(client, source.pk).json()["id"]
        run_pass()
        attempt = Attempt.objects.get(job_id=job_id, ended_at__isnull=True)
        claim = _node_call(cluster, attempt, "claim")
        assert claim.status_code == 200, claim.content
        claims[source.pk] = claim.json()["reads_user_output"]
        client.post(f"/api/v1/jobs/{job_id}/cancel/")
    assert claims == {builtin.pk: False, user_code.pk: True, project.pk: True}


def test_a_train_attempt_has_no_sources(cluster, submit, run_pass):
    job = submit(cluster["user"], cluster["team"], gpus=0.5)
    run_pass()
    attempt = Attempt.objects.get(job=job)
    assert _node(cluster, attempt).get("sources/model.pt").status_code == 404


def test_the_job_page_shows_the_source_model_and_the_endpoint(cluster, submit, run_pass):
    from django.test import Client

    source = _run(cluster, submit, run_pass, cluster["user"], cluster["team"])
    job_id = _serve(cluster["client"], source.pk).json()["id"]
    browser = Client()
    browser.force_login(cluster["user"])
    page = browser.get(f"/jobs/{job_id}/").content.decode()
    assert f'href="/jobs/{source.pk}/"' in page and 'id="job-endpoint"' not in page
    run_pass()
    attempt = Attempt.objects.get(job_id=job_id, ended_at__isnull=True)
    _node_call(cluster, attempt, "claim")
    _node_call(cluster, attempt, "report", endpoint="127.0.0.1:50999")
    page = browser.get(f"/jobs/{job_id}/").content.decode()
    assert 'id="job-endpoint">127.0.0.1:50999' in page
    assert f"strata infer {job_id}" in page


def test_the_web_form_submits_a_serve_job_and_names_a_bad_source(cluster, submit, run_pass):
    from django.test import Client

    source = _run(cluster, submit, run_pass, cluster["user"], cluster["team"])
    browser = Client()
    browser.force_login(cluster["user"])
    form = {"kind": "serve", "name": "web-serve", "team": "alpha", "spec.model": f'{{"job": "{source.pk}"}}',
            "spec.port": "", "spec.request_timeout_s": "", "spec.max_rows": "", "priority": "0",
            "max_attempts": "3", "time_limit": "10m", "resources.gpus": "0.25", "resources.gpu_memory": "",
            "resources.workers": ""}
    response = browser.post("/jobs/new/", form)
    assert response.status_code == 302, response.content.decode()[-2000:]
    from strata.jobs.models import Job

    job = Job.objects.get(name="web-serve")
    assert job.kind == "serve" and job.spec["model"] == {"job": str(source.pk), "entrypoint": None}
    missing = uuid.uuid4()
    page = browser.post("/jobs/new/", {**form, "name": "bad", "spec.model": f'{{"job": "{missing}"}}'})
    assert page.status_code == 400 or "no job" in page.content.decode()
    assert f"no job {missing} in team alpha" in page.content.decode()
    assert not Job.objects.filter(name="bad").exists()


def test_the_example_serve_file_validates():
    from pathlib import Path

    import yaml

    from strata.jobs.api.serializers import JobSubmitSerializer

    body = yaml.safe_load((Path(__file__).parents[3] / "examples/jobs/serve-digits.yaml").read_text())
    serializer = JobSubmitSerializer(data=body)
    assert serializer.is_valid(), serializer.errors
    assert serializer.validated_data["spec"]["max_rows"] == 1024
