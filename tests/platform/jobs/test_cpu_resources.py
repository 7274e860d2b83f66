"""The resources of jobs that need no GPU: ``gpus: 0`` reserves CPUs (1 unless stated) and optionally host memory;
bad values name each field, all at once; GPU jobs may state CPUs too; nested children fit their parent's CPUs."""

from __future__ import annotations

import pytest

from strata.jobs.api.serializers import normalize_resources
from strata.jobs.models import Job
from strata.jobs.services import nested_fit_problem

JOBS = "/api/v1/jobs/"
GiB = 2**30


@pytest.fixture
def alice(make_team, make_user, make_token, make_node, api):
    team = make_team("alpha")
    make_node("n1", gpus=2, cpus=8, host_memory=32 * GiB)
    return api(make_token(make_user("alice", team), team))


def test_gpus_zero_reserves_one_cpu_unless_it_says(alice, job_body):
    response = alice.post(JOBS, job_body(resources={"gpus": 0}), format="json")
    assert response.status_code == 201, response.content
    assert response.json()["resources"] == {"gpus": 0.0, "gpu_memory": None, "workers": 1, "cpus": 1.0,
                                            "memory": None}
    response = alice.post(JOBS, job_body(resources={"gpus": 0, "cpus": 0.5, "memory": "512MiB", "workers": 2}),
                          format="json")
    assert response.status_code == 201, response.content
    assert response.json()["resources"] == {"gpus": 0.0, "gpu_memory": None, "workers": 2, "cpus": 0.5,
                                            "memory": 512 * 2**20}


def test_gpu_jobs_reserve_cpus_only_when_they_state_them():
    assert normalize_resources({"gpus": 1}) == {"gpus": 1.0, "gpu_memory": None, "workers": 1}
    # gpus 0 with gpu_memory is a GPU slice sized by memory, as before: no CPUs unless stated.
    assert normalize_resources({"gpus": 0, "gpu_memory": "2GiB"}) == {"gpus": 0.0, "gpu_memory": 2 * GiB,
                                                                      "workers": 1}
    assert normalize_resources({"gpus": 0.5, "cpus": 4, "memory": 2 * GiB}) == {
        "gpus": 0.5, "gpu_memory": None, "workers": 1, "cpus": 4.0, "memory": 2 * GiB}
    assert normalize_resources({"gpus": 1, "memory": "1GiB"})["cpus"] == 1.0  # memory alone: with one CPU


def test_every_bad_field_is_named_at_once(alice, job_body):
    body = job_body(resources={"gpus": 0, "cpus": -1, "memory": "lots", "workers": 0})
    body["spec"]["epochs"] = 0
    response = alice.post(JOBS, body, format="json")
    assert response.status_code == 400
    assert {"resources.cpus", "resources.memory", "resources.workers", "spec.epochs"} <= set(response.json())
    for resources, field in [({"gpus": 0, "cpus": 0}, "resources.cpus"), ({"gpus": 0, "cpus": True}, "resources.cpus"),
                             ({"gpus": 0, "cpus": 0.0001}, "resources.cpus"), ({"gpus": 0, "cpus": 5000}, "resources.cpus"),
                             ({"gpus": 0, "memory": 0}, "resources.memory"), ({"gpus": 1, "cpus": "2"}, "resources.cpus"),
                             ({"gpus": 0, "memory": 2**51}, "resources.memory")]:
        response = alice.post(JOBS, job_body(resources=resources), format="json")
        assert response.status_code == 400 and field in response.json(), (resources, response.content)
    assert Job.objects.count() == 0


def test_a_nested_child_fits_its_parents_cpus():
    room = [{"node": "n", "device": 1, "index": 0, "share": 1.0, "memory": 8 * GiB, "memory_total": 8 * GiB,
             "cpu": False},
            {"node": "n", "device": 2, "index": 2**31 - 1, "share": 4.0, "memory": 2 * GiB, "memory_total": 64 * GiB,
             "cpu": True}]
    assert nested_fit_problem(normalize_resources({"gpus": 0, "cpus": 2}), room) is None
    assert "reserved at most 4 CPUs" in nested_fit_problem(normalize_resources({"gpus": 0, "cpus": 8}), room)
    assert "reserved at most 4 CPUs" in nested_fit_problem(normalize_resources({"gpus": 0, "memory": "4GiB"}), room)
    assert nested_fit_problem(normalize_resources({"gpus": 0.5}), room) is None
    assert "1 of one device" in nested_fit_problem(normalize_resources({"gpus": 1, "gpu_memory": "16GiB"}), room)
    assert nested_fit_problem(normalize_resources({"gpus": 0}), room[:1]) is not None  # a parent without CPUs
