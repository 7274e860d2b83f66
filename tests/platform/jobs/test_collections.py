"""The collections seam (``/api/v1/{collection}/``) with the datacache plugin's datasets, and data names
resolved at submit."""

from __future__ import annotations

import pytest

from components.datacache.datasets import pipeline_id
from strata.jobs.models import Job, PluginRecord

DATASETS = "/api/v1/datasets/"
PETS = {"name": "pets", "source": {"path": "/srv/data/pets"}, "format": "image-folder", "size": 24}


@pytest.fixture
def callers(make_team, make_user, make_token, api):
    # Both teams were granted /srv/data (strata.quotas.roots): a root granted to both is shared.
    alpha, beta = make_team("alpha", data_roots=["/srv/data"]), make_team("beta", data_roots=["/srv/data"])
    alice, bob = make_user("alice", alpha), make_user("bob", beta)
    return api(make_token(alice, alpha)), api(make_token(bob, beta))


def test_the_list_has_the_builtins_with_their_pipelines(callers):
    alice, _ = callers
    answer = alice.get(DATASETS).json()
    names = {item["name"]: item for item in answer["results"]}
    assert {"shapes-jpeg", "digits", "corpus"} <= set(names)
    shapes = names["shapes-jpeg"]
    assert shapes["builtin"] is True and shapes["team"] is None
    assert shapes["pipelines"][0]["id"] == pipeline_id(shapes["pipelines"][0]["definition"])
    assert shapes["pipelines"][0]["cached_on"] == []


def test_registering_reading_and_deleting_a_dataset(callers):
    alice, bob = callers
    created = alice.post(DATASETS, PETS, format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["team"] == "alpha" and body["format"] == "image-folder" and body["size"] == 24
    assert body["augment"]["flip"] is True and body["pipelines"][0]["definition"]["dataset"] == "pets"
    assert alice.get(f"{DATASETS}pets/").json()["source"] == {"path": "/srv/data/pets"}
    assert "pets" in {item["name"] for item in alice.get(DATASETS).json()["results"]}
    # Another team sees nothing of it: not in its list, a 404 to read or delete.
    assert "pets" not in {item["name"] for item in bob.get(DATASETS).json()["results"]}
    assert bob.get(f"{DATASETS}pets/").status_code == 404
    assert bob.delete(f"{DATASETS}pets/").status_code == 404
    # The same name twice in a team is a conflict; another team may use it.
    assert alice.post(DATASETS, PETS, format="json").status_code == 409
    assert bob.post(DATASETS, PETS, format="json").status_code == 201
    assert alice.delete(f"{DATASETS}pets/").status_code == 204
    assert alice.get(f"{DATASETS}pets/").status_code == 404
    assert PluginRecord.objects.filter(name="pets").count() == 1  # bob's


def test_a_bad_body_names_every_bad_field_at_once(callers):
    alice, _ = callers
    response = alice.post(DATASETS, {"name": "Bad Name", "source": {"path": "relative/path"}, "format": "tar",
                                     "size": 1000, "augment": {"rotate": -5, "crop": [0.9, 0.1], "colour": 1},
                                     "bogus": True, "team": "nope"}, format="json")
    assert response.status_code == 400
    errors = response.json()
    assert {"name", "source.path", "format", "size", "augment.rotate", "augment.crop", "augment.colour", "bogus",
            "team"} <= set(errors), errors
    assert PluginRecord.objects.count() == 0


def test_builtins_cannot_be_shadowed_or_deleted(callers):
    alice, _ = callers
    assert alice.post(DATASETS, {**PETS, "name": "digits"}, format="json").status_code == 409
    assert alice.delete(f"{DATASETS}digits/").status_code == 400


def test_an_unknown_collection_is_a_json_404(callers):
    alice, _ = callers
    response = alice.get("/api/v1/no-such-thing/")
    assert response.status_code == 404 and "detail" in response.json()


def test_a_job_naming_a_registered_dataset_stores_what_it_named(callers, job_body):
    alice, bob = callers
    alice.post(DATASETS, PETS, format="json")
    spec = {"workload": "cnn-dataset", "data": {"dataset": "pets", "cache": True, "perfect": {"reuse": 2}}}
    response = alice.post("/api/v1/jobs/", job_body(spec=spec), format="json")
    assert response.status_code == 201, response.content
    stored = Job.objects.get(pk=response.json()["id"]).spec["data"]
    assert stored["dataset"]["name"] == "pets" and stored["dataset"]["definition"]["size"] == 24
    assert stored["cache"] is True and stored["perfect"] == {"reuse": 2}
    # The registration may change later; the job keeps what the name meant when it was submitted.
    alice.delete(f"{DATASETS}pets/")
    assert Job.objects.get(pk=response.json()["id"]).spec["data"]["dataset"]["definition"]["format"] == "image-folder"
    # Another team's dataset is unknown to bob, named on the field.
    refused = bob.post("/api/v1/jobs/", job_body(spec=spec), format="json")
    assert refused.status_code == 400 and "no dataset named 'pets'" in refused.json()["spec.data.dataset"][0]


def test_a_builtin_dataset_resolves_and_bad_data_options_are_all_named(callers, job_body):
    alice, _ = callers
    ok = alice.post("/api/v1/jobs/", job_body(spec={"workload": "cnn-dataset", "data": {"dataset": "shapes-jpeg"}}),
                    format="json")
    assert ok.status_code == 201, ok.content
    assert Job.objects.get(pk=ok.json()["id"]).spec["data"]["dataset"]["definition"]["format"] == "generated-jpeg"
    bad = alice.post("/api/v1/jobs/", job_body(spec={"workload": "cnn-dataset", "data": {
        "dataset": 7, "cache": "yes", "workers": -1, "perfect": {"reuse": 0, "switch": 2, "speed": 1},
        "colour": True}}), format="json")
    assert bad.status_code == 400
    assert {"spec.data.dataset", "spec.data.cache", "spec.data.workers", "spec.data.perfect.reuse",
            "spec.data.perfect.switch", "spec.data.perfect.speed", "spec.data.colour"} <= set(bad.json()), bad.json()
    missing = alice.post("/api/v1/jobs/", job_body(spec={"workload": "cnn-dataset"}), format="json")
    assert missing.status_code == 400 and "spec.data.dataset" in missing.json()
    wrong = alice.post("/api/v1/jobs/", job_body(spec={"workload": "mlp-digits", "data": {"dataset": "digits"}}),
                       format="json")
    assert wrong.status_code == 400 and "spec.data.dataset" in wrong.json()


@pytest.mark.parametrize("example", ["perfect-shapes.yaml", "sweep-cached.yaml"])
def test_the_example_jobs_are_accepted(callers, example):
    from pathlib import Path

    import yaml

    alice, _ = callers
    body = yaml.safe_load((Path(__file__).parents[3] / "examples/jobs" / example).read_text())
    response = alice.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    data = Job.objects.get(pk=response.json()["id"]).spec["data"]
    assert isinstance(data["dataset"], dict) and data["cache"] is True
