"""A job holds a real, accounted share or is refused; a request no node could ever satisfy is refused at
submit with the reason, and a job that cannot run never holds one of its team's slots."""

from __future__ import annotations

import pytest

from strata.jobs.models import Allocation, Job, JobState
from strata.quotas.services import team_usage

JOBS = "/api/v1/jobs/"
GiB = 2**30


@pytest.fixture
def alpha(make_team, make_user, make_token, api):
    team = make_team("alpha")
    user = make_user("alice", team)
    return team, api(make_token(user, team))


def submit(client, resources, **extra):
    return client.post(JOBS, {"kind": "train", "name": "j", "spec": {"workload": "mlp-digits", "epochs": 1},
                              "resources": resources, **extra}, format="json")


def test_gpus_zero_is_a_cpu_job_and_a_sliver_of_a_gpu_is_refused(alpha):
    _, client = alpha
    response = submit(client, {"gpus": 0})
    # No GPU: it holds a real share of a node's CPUs instead (one unless it says), accounted like GPUs.
    assert response.status_code == 201
    assert response.json()["resources"] == {"gpus": 0.0, "gpu_memory": None, "workers": 1, "cpus": 1.0,
                                            "memory": None}
    assert submit(client, {"gpus": 0.0001}).status_code == 400
    assert Job.objects.count() == 1


def test_max_gpus_zero_refuses_every_job_even_one_sized_by_memory(alpha, make_node):
    team, client = alpha
    make_node("n1", gpus=1, memory=8 * GiB)
    from strata.quotas.models import Quota

    Quota.objects.filter(team=team).update(max_gpus=0)
    for resources in ({"gpu_memory": "1GiB"}, {"gpus": 0, "gpu_memory": 2**20}, {"gpus": 0.25}):
        response = submit(client, resources)
        assert response.status_code == 400 and "max_gpus=0" in response.json()["resources"][0]
    assert Job.objects.count() == 0


def test_a_job_sized_by_memory_is_accounted_and_billed(alpha, make_node, run_pass):
    team, client = alpha
    make_node("n1", gpus=1, memory=8 * GiB)
    response = submit(client, {"gpu_memory": "2GiB"})
    assert response.status_code == 201
    assert team_usage(team.pk)["gpus"] == pytest.approx(0.25)  # queued: what it would take of the device
    run_pass()
    allocation = Allocation.objects.get()
    assert allocation.share == pytest.approx(0.25) and allocation.memory == 2 * GiB
    assert team_usage(team.pk)["gpus"] == pytest.approx(0.25)  # placed: what its attempt holds


@pytest.mark.parametrize("memory", [10**30, "99999999999999999999999TiB", "9" * 400 + "TiB", 2**50 + 1])
def test_absurd_memory_is_refused_even_on_an_empty_cluster(alpha, memory):
    _, client = alpha
    response = submit(client, {"gpu_memory": memory})
    assert response.status_code == 400 and "resources.gpu_memory" in response.json()
    assert Job.objects.count() == 0


@pytest.mark.parametrize("resources, reason", [
    ({"gpu_memory": "16GiB"}, "no device has 16 GiB"),
    ({"gpus": 4}, "no node has 4 devices"),
    ({"gpus": 2, "workers": 3}, "room for 1"),
    ({"gpus": 1, "gpu_memory": "9GiB"}, "no device has 9 GiB"),
])
def test_hardware_no_registered_node_has_is_refused_with_the_reason(alpha, make_node, resources, reason):
    _, client = alpha
    make_node("n1", gpus=2, memory=8 * GiB)
    response = submit(client, resources)
    assert response.status_code == 400, response.content
    assert reason in response.json()["resources"][0]


def test_a_job_that_cannot_run_holds_no_slot(alpha, make_node, run_pass, make_team):
    team, client = alpha
    from strata.quotas.models import Quota

    Quota.objects.filter(team=team).update(max_concurrent_jobs=1, max_gpus=1)
    make_node("n1", gpus=1, memory=8 * GiB)
    stuck = submit(client, {"gpus": 1, "node_labels": {"gpu": "h100"}})
    assert stuck.status_code == 201
    runnable = submit(client, {"gpus": 1})
    assert runnable.status_code == 201
    stuck_job, runnable_job = Job.objects.get(pk=stuck.json()["id"]), Job.objects.get(pk=runnable.json()["id"])
    assert stuck_job.state == JobState.PENDING
    assert "no node could ever run it" in stuck_job.reason and "h100" in stuck_job.reason
    assert runnable_job.state == JobState.QUEUED
    assert team_usage(team.pk)["jobs"] == 1 and team_usage(team.pk)["gpus"] == 1
    run_pass()
    assert Job.objects.get(pk=runnable_job.pk).state == JobState.SCHEDULED


def test_no_nodes_yet_means_no_hardware_verdict(alpha):
    _, client = alpha
    response = submit(client, {"gpus": 8, "gpu_memory": "80GiB"})
    assert response.status_code == 201
    assert Job.objects.get().state == JobState.QUEUED


@pytest.mark.parametrize("changes, field", [
    ({"max_gpu_memory": 10**30}, "max_gpu_memory"),
    ({"max_gpu_memory": "99999999999999999999999TiB"}, "max_gpu_memory"),
    ({"max_gpus": "9" * 400}, "max_gpus"),
    ({"max_concurrent_jobs": "1" + "0" * 400}, "max_concurrent_jobs"),
])
def test_quota_numbers_out_of_range_are_field_errors(make_user, alpha, client, changes, field):
    client.force_login(make_user("root", admin=True))
    response = client.patch("/api/v1/quotas/alpha/", changes, content_type="application/json")
    assert response.status_code == 400 and field in response.json(), response.content
