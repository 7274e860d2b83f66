"""Job submission API: validation, read-only fields, idempotency and malformed bodies."""

from __future__ import annotations

import json

import pytest

from strata.jobs.models import Job, JobState

JOBS = "/api/v1/jobs/"


@pytest.fixture
def alice(make_team, make_user, make_token, api):
    team = make_team("alpha")
    user = make_user("alice", team)
    return api(make_token(user, team))


def post_raw(client, body: str | bytes, **headers):
    return client.post(JOBS, data=body, content_type="application/json", **headers)


def test_submit_returns_201_and_a_pending_or_queued_job(alice, job_body):
    response = alice.post(JOBS, job_body(), format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["state"] == JobState.QUEUED
    assert data["team"] == "alpha" and data["owner"] == "alice"
    assert data["resources"] == {"gpus": 1.0, "gpu_memory": None, "workers": 1}
    assert data["failures"] == 0 and data["attempts"] == []


def test_invalid_spec_names_the_field(alice, job_body):
    response = alice.post(JOBS, job_body(spec={"workload": "mlp-digits", "epochs": -1}), format="json")
    assert response.status_code == 400
    assert "spec.epochs" in response.json()
    assert Job.objects.count() == 0


def test_every_bad_field_is_named_at_once(alice, job_body):
    """The envelope, resources and the kind's spec are all checked before the answer: one round trip."""
    body = job_body(priority=500, time_limit="forever", resources={"gpus": -1, "workers": 0},
                    spec={"workload": "mlp-digits", "epochs": -3, "bogus": 1})
    errors = alice.post(JOBS, body, format="json").json()
    assert {"priority", "time_limit", "resources.gpus", "resources.workers", "spec.epochs", "spec.bogus"} <= set(errors)


def test_unknown_kind_lists_known_kinds(alice, job_body):
    response = alice.post(JOBS, job_body(kind="no-such-kind"), format="json")
    assert response.status_code == 400
    message = " ".join(response.json()["kind"])
    assert "no-such-kind" in message and "train" in message


@pytest.mark.parametrize("gpus", [-1, 1e9, 1.5, "1", True, None])
def test_bad_gpu_counts_are_refused(alice, job_body, gpus):
    response = alice.post(JOBS, job_body(resources={"gpus": gpus}), format="json")
    assert response.status_code == 400, (gpus, response.content)
    assert "resources.gpus" in response.json()
    assert Job.objects.count() == 0


@pytest.mark.parametrize("resources, field", [
    ({"workers": 0}, "resources.workers"),
    ({"workers": 1.5}, "resources.workers"),
    ({"gpu_memory": "lots"}, "resources.gpu_memory"),
    ({"gpu_memory": -5}, "resources.gpu_memory"),
    ({"cpus": 0}, "resources.cpus"),
    ({"gpus": 0, "cpus": "4"}, "resources.cpus"),
    ({"gpus": 0, "memory": "lots"}, "resources.memory"),
    ({"cpus_per_worker": 4}, "resources.cpus_per_worker"),
    ({"node_labels": ["a"]}, "resources.node_labels"),
])
def test_bad_resources_name_the_field(alice, job_body, resources, field):
    response = alice.post(JOBS, job_body(resources=resources), format="json")
    assert response.status_code == 400
    assert field in response.json()


def test_fractional_gpu_and_memory_are_normalized(alice, job_body):
    response = alice.post(JOBS, job_body(resources={"gpus": 0.25, "gpu_memory": "2GiB"}), format="json")
    assert response.status_code == 201, response.content
    assert response.json()["resources"] == {"gpus": 0.25, "gpu_memory": 2 * 2**30, "workers": 1}


@pytest.mark.parametrize("field, value", [
    ("state", "SUCCEEDED"), ("owner", "mallory"), ("attempts", []), ("id", "00000000-0000-0000-0000-000000000000"),
    ("failures", 0), ("reason", "x"), ("created_at", "2000-01-01T00:00:00Z"),
])
def test_read_only_fields_are_refused_and_never_persisted(alice, job_body, field, value):
    response = alice.post(JOBS, job_body(**{field: value}), format="json")
    assert response.status_code == 400
    assert field in response.json()
    assert Job.objects.count() == 0


def test_team_of_another_team_cannot_be_set(alice, make_team, job_body):
    make_team("beta")
    response = alice.post(JOBS, job_body(team="beta"), format="json")
    assert response.status_code == 400
    assert "team" in response.json()
    assert not Job.objects.filter(team__slug="beta").exists()


def test_team_of_own_token_is_accepted(alice, job_body):
    response = alice.post(JOBS, job_body(team="alpha"), format="json")
    assert response.status_code == 201
    assert response.json()["team"] == "alpha"


@pytest.mark.parametrize("field, value", [
    ("priority", 101), ("priority", "high"), ("max_attempts", 0), ("max_attempts", 21), ("time_limit", 0),
    ("time_limit", "forever"), ("name", "x" * 201),
])
def test_out_of_range_scalars(alice, job_body, field, value):
    response = alice.post(JOBS, job_body(**{field: value}), format="json")
    assert response.status_code == 400
    assert field in response.json()


def test_idempotency_key_same_body_returns_same_job(alice, job_body):
    first = alice.post(JOBS, job_body(), format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    second = alice.post(JOBS, job_body(), format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == 201 and second.status_code == 200
    assert first.json()["id"] == second.json()["id"]
    assert Job.objects.count() == 1


def test_idempotency_key_different_body_is_422(alice, job_body):
    assert alice.post(JOBS, job_body(), format="json", HTTP_IDEMPOTENCY_KEY="k-2").status_code == 201
    response = alice.post(JOBS, job_body(name="other"), format="json", HTTP_IDEMPOTENCY_KEY="k-2")
    assert response.status_code == 422
    assert Job.objects.count() == 1


def test_idempotency_key_too_long_is_400(alice, job_body):
    response = alice.post(JOBS, job_body(), format="json", HTTP_IDEMPOTENCY_KEY="k" * 201)
    assert response.status_code == 400
    assert Job.objects.count() == 0


def test_different_keys_make_different_jobs(alice, job_body):
    a = alice.post(JOBS, job_body(), format="json", HTTP_IDEMPOTENCY_KEY="a").json()["id"]
    b = alice.post(JOBS, job_body(), format="json", HTTP_IDEMPOTENCY_KEY="b").json()["id"]
    assert a != b


def test_oversize_body_is_413(alice, job_body, settings):
    body = json.dumps(job_body(name="x", spec={"workload": "mlp-digits", "epochs": 1, "pad": "x" * (2 * 2**20)}))
    response = post_raw(alice, body)
    assert response.status_code == 413
    assert Job.objects.count() == 0


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_in_json_is_400(alice, literal):
    body = '{"kind": "train", "spec": {"workload": "mlp-digits", "epochs": 1}, "resources": {"gpus": LITERAL}}'
    body = body.replace("LITERAL", literal)
    response = post_raw(alice, body)
    assert response.status_code == 400
    assert Job.objects.count() == 0


def test_deeply_nested_json_is_400_not_500(alice):
    depth = 100_000
    body = '{"kind": "train", "spec": ' + "[" * depth + "]" * depth + "}"
    response = post_raw(alice, body)
    assert response.status_code == 400


@pytest.mark.parametrize("body", ["[]", '"train"', "{", "", "null", "\xff\xfe"])
def test_malformed_bodies_are_400(alice, body):
    response = post_raw(alice, body.encode("latin-1"))
    assert response.status_code == 400


def test_list_filters(alice, job_body):
    alice.post(JOBS, job_body(name="a"), format="json")
    assert alice.get(JOBS, {"state": "queued"}).json()["count"] == 1
    assert alice.get(JOBS, {"state": "RUNNING"}).json()["count"] == 0
    assert alice.get(JOBS, {"state": "BOGUS"}).status_code == 400
    assert alice.get(JOBS, {"kind": "train"}).json()["count"] == 1
    assert alice.get(JOBS, {"owner": "bob"}).json()["count"] == 0
    job_id = alice.get(JOBS).json()["results"][0]["id"]
    assert alice.get(f"{JOBS}{job_id}/events/", {"after": "x"}).status_code == 400


def test_cancel_and_resubmit_via_api(alice, job_body):
    job_id = alice.post(JOBS, job_body(), format="json").json()["id"]
    response = alice.post(f"{JOBS}{job_id}/cancel/")
    assert response.status_code == 200 and response.json()["state"] == JobState.CANCELLED
    # Cancelling again is a no-op, not an error.
    assert alice.post(f"{JOBS}{job_id}/cancel/").json()["state"] == JobState.CANCELLED
    again = alice.post(f"{JOBS}{job_id}/resubmit/")
    assert again.status_code == 201
    assert again.json()["id"] != job_id and again.json()["state"] == JobState.QUEUED
    events = alice.get(f"{JOBS}{job_id}/events/").json()
    assert [e["data"].get("state") for e in events if e["kind"] == "state"] == ["PENDING", "QUEUED", "CANCELLED"]


def test_a_bad_distributed_value_names_each_field(alice, job_body):
    spec = {"workload": "mlp-digits", "distributed": {"strategy": "nope", "slow": {"factor": 0}, "period": 2}}
    response = alice.post(JOBS, job_body(spec=spec, resources={"workers": 2}), format="json")
    assert response.status_code == 400, response.content
    errors = response.json()
    assert {"spec.distributed.strategy", "spec.distributed.slow", "spec.distributed.slow.factor",
            "spec.distributed.period"} <= set(errors)
    assert "ddp" in " ".join(errors["spec.distributed.strategy"])
    assert Job.objects.count() == 0


def test_a_good_distributed_value_is_stored_normalized(alice, job_body):
    spec = {"workload": "mlp-digits", "distributed": {"strategy": "post-local-sgd", "period": 8,
                                                      "bandwidth_mbit": 100}}
    response = alice.post(JOBS, job_body(spec=spec, resources={"workers": 2}), format="json")
    assert response.status_code == 201, response.content
    stored = Job.objects.get(pk=response.json()["id"])
    assert stored.spec["distributed"] == {"strategy": "post-local-sgd", "backend": "auto", "timeout_s": 120.0,
                                          "period": 8, "warmup": 0, "bandwidth_mbit": 100.0}
    assert response.json()["spec"]["distributed"] == stored.spec["distributed"]
    assert stored.resources["workers"] == 2


def test_a_gang_smaller_than_its_strategy_needs_is_a_400_on_resources_workers(alice, job_body):
    spec = {"workload": "mlp-digits", "distributed": {"strategy": "post-local-sgd"}}
    response = alice.post(JOBS, job_body(spec=spec, resources={"workers": 1}), format="json")
    assert response.status_code == 400, response.content
    assert "at least 2 workers" in " ".join(response.json()["resources.workers"])
    assert Job.objects.count() == 0


@pytest.mark.parametrize("example", ["ddp-digits.yaml", "sms-straggler.yaml", "stanza-cnn.yaml"])
def test_the_distributed_example_jobs_are_accepted(alice, example):
    from pathlib import Path

    import yaml

    body = yaml.safe_load((Path(__file__).parents[3] / "examples/jobs" / example).read_text())
    response = alice.post(JOBS, body, format="json")
    assert response.status_code == 201, response.content
    stored = Job.objects.get(pk=response.json()["id"])
    assert stored.spec["distributed"]["strategy"] == body["spec"]["distributed"]["strategy"]
    assert stored.resources["workers"] == body["resources"]["workers"]
