"""Gangs across nodes over the node protocol: every node holding one of an attempt's allocations runs its own
ranks (claim, report, finish), and the ranks meet through ``/node/attempts/{id}/rendezvous/``: rank 0's node
publishes its store's port, the address is the one that node registered."""

from __future__ import annotations

import pytest
from node_protocol import NodeProtocol

from strata.jobs.models import Allocation, Attempt, Job, JobEvent, JobState

GANG_SPEC = {"workload": "mlp-digits", "epochs": 1, "distributed": {"strategy": "ddp"}}


def register(name: str, address: str, gpus: int = 1):
    from strata.cluster.services import node_register

    return node_register(name=name, address=address, devices=[
        {"index": i, "kind": "virtual", "name": f"virtual GPU {i}", "memory_total": 8 * 2**30} for i in range(gpus)])


@pytest.fixture
def gang(make_team, make_user, node_token, api, run_pass):
    """A 2-worker job placed on two one-GPU nodes: ``{"job", "attempt", "primary", "secondary", "protocol"}``
    (``primary`` holds rank 0; ``protocol`` speaks for the attempt with the node token)."""
    from strata.jobs.services import job_submit

    team = make_team("alpha")
    user = make_user("alice", team)
    nodes = [register("n1", "10.0.0.1"), register("n2", "10.0.0.2")]
    job, _ = job_submit(user=user, team=team, data={
        "kind": "train", "name": "gang", "spec": GANG_SPEC, "resources": {"gpus": 1.0, "workers": 2},
        "priority": 0, "max_attempts": 2, "time_limit": 3600})
    run_pass()
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED, job.reason
    attempt = Attempt.objects.get(job=job, ended_at__isnull=True)
    ranks = dict(Allocation.objects.filter(attempt=attempt).values_list("rank", "device__node__name"))
    assert set(ranks) == {0, 1} and set(ranks.values()) == {"n1", "n2"}, ranks
    by_name = {node.name: node for node in nodes}
    primary, secondary = by_name[ranks[0]], by_name[ranks[1]]
    assert attempt.node_id == primary.pk  # the attempt's node is rank 0's
    return {"job": job, "attempt": attempt, "primary": primary, "secondary": secondary,
            "protocol": NodeProtocol(api(node_token), attempt)}


def post(gang, node, verb: str, token: str | None = None, **body):
    return gang["protocol"].post(verb, body, node=node, token=token)


def get(gang, node, verb: str, token: str | None = None):
    return gang["protocol"].get(verb, node=node, token=token)


def events(job, kind: str) -> list[JobEvent]:
    return list(JobEvent.objects.filter(job=job, kind=kind))


def test_every_node_of_a_gang_claims_and_reports(gang):
    primary, secondary, job = gang["primary"], gang["secondary"], gang["job"]
    answer = post(gang, secondary, "claim")
    assert answer.status_code == 200, answer.content
    claim = answer.json()
    assert claim["world_size"] == 2
    assert {(item["rank"], item["node"]) for item in claim["allocations"]} == {(0, str(primary.pk)),
                                                                                (1, str(secondary.pk))}
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
    assert post(gang, primary, "claim").status_code == 200
    report = post(gang, secondary, "report", logs=[{"message": "[rank 1] hello"}],
                  metrics=[{"name": "rank1.step_ms", "step": 10, "value": 3.5}])
    assert report.status_code == 200 and report.json() == {"stop": False}
    assert job.log_lines.filter(message="[rank 1] hello").exists()
    assert job.metric_points.filter(name="rank1.step_ms", step=10).exists()
    assert get(gang, secondary, "checkpoint").status_code == 404  # reached the route: no checkpoint yet


def test_a_node_without_an_allocation_of_the_gang_is_refused(gang, make_node):
    stranger = make_node("n3", gpus=1)
    assert post(gang, stranger, "claim").status_code == 409
    assert post(gang, stranger, "report").status_code == 409
    assert get(gang, stranger, "rendezvous").status_code == 409
    assert post(gang, stranger, "rendezvous", port=1234).status_code == 409
    assert Job.objects.get(pk=gang["job"].pk).state == JobState.SCHEDULED


def test_rank_0s_node_publishes_its_registered_address(gang):
    primary, secondary, attempt = gang["primary"], gang["secondary"], gang["attempt"]
    before = get(gang, secondary, "rendezvous")
    assert before.status_code == 200, before.content
    assert before.json() == {"address": None, "world_size": 2, "nodes": [primary.name, secondary.name]}

    published = post(gang, primary, "rendezvous", port=29500)
    assert published.status_code == 200, published.content
    address = f"{primary.address}:29500"
    assert published.json() == {"address": address, "world_size": 2, "nodes": [primary.name, secondary.name]}
    attempt.refresh_from_db()
    assert attempt.rendezvous == address
    [event] = events(gang["job"], "rendezvous")
    assert event.attempt_id == attempt.pk and event.data == {"address": address} and address in event.message
    assert get(gang, secondary, "rendezvous").json()["address"] == address
    assert get(gang, primary, "rendezvous").json()["address"] == address

    # Publishing the same again is harmless; a new port replaces the address, with an event of its own.
    assert post(gang, primary, "rendezvous", port=29500).json()["address"] == address
    assert len(events(gang["job"], "rendezvous")) == 1
    assert post(gang, primary, "rendezvous", port=29501).json()["address"] == f"{primary.address}:29501"
    assert len(events(gang["job"], "rendezvous")) == 2


def test_only_rank_0s_node_publishes(gang):
    refused = post(gang, gang["secondary"], "rendezvous", port=29500)
    assert refused.status_code == 409
    assert "rank 0" in refused.json()["detail"]
    gang["attempt"].refresh_from_db()
    assert gang["attempt"].rendezvous is None and not events(gang["job"], "rendezvous")


@pytest.mark.parametrize("port", [0, 65536, -1, "http", None, 1.5])
def test_a_bad_port_is_a_400_naming_it(gang, port):
    response = post(gang, gang["primary"], "rendezvous", port=port)
    assert response.status_code == 400, response.content
    assert response["Content-Type"].startswith("application/json")
    assert "port" in response.json()


def test_a_missing_port_or_query_is_a_400(gang):
    assert "port" in post(gang, gang["primary"], "rendezvous").json()
    protocol = gang["protocol"]
    response = protocol.client.get(protocol.url("rendezvous"))  # no node, no token
    assert response.status_code == 400 and "node" in response.json()


def test_a_wrong_token_or_an_ended_attempt_is_409(gang):
    primary, secondary = gang["primary"], gang["secondary"]
    assert get(gang, secondary, "rendezvous", token="0" * 32).status_code == 409
    assert post(gang, primary, "rendezvous", token="0" * 32, port=29500).status_code == 409
    assert post(gang, primary, "claim").status_code == 200
    assert post(gang, primary, "finish", outcome="failed", reason="rank 1 exit code 1").status_code == 200
    assert get(gang, secondary, "rendezvous").status_code == 409
    assert post(gang, primary, "rendezvous", port=29500).status_code == 409
    gang["attempt"].refresh_from_db()
    assert gang["attempt"].rendezvous is None


def test_ipv6_addresses_are_bracketed(make_team, make_user, node_token, api, run_pass):
    from strata.jobs.services import attempt_rendezvous, attempt_rendezvous_publish, job_submit

    team = make_team("alpha")
    user = make_user("alice", team)
    node = register("v6", "fd00::7", gpus=2)
    job, _ = job_submit(user=user, team=team, data={
        "kind": "train", "name": "gang", "spec": GANG_SPEC, "resources": {"gpus": 1.0, "workers": 2},
        "priority": 0, "max_attempts": 1, "time_limit": 3600})
    run_pass()
    attempt = Attempt.objects.get(job=job)
    assert attempt_rendezvous_publish(attempt, node, 4000) == "[fd00::7]:4000"
    assert attempt_rendezvous(attempt) == {"address": "[fd00::7]:4000", "world_size": 2, "nodes": ["v6", "v6"]}


def test_a_node_without_an_address_publishes_localhost(make_team, make_user, make_node, run_pass, submit):
    from strata.jobs.services import attempt_rendezvous_publish

    team = make_team("alpha")
    user = make_user("alice", team)
    node = make_node("bare", gpus=1)
    job = submit(user, team)
    run_pass()
    attempt = Attempt.objects.get(job=job)
    assert attempt_rendezvous_publish(attempt, node, 4000) == "127.0.0.1:4000"


def test_the_secondary_nodes_success_leaves_the_attempt_to_rank_0s_node(gang):
    """Rank 1 returns as soon as the model is synchronized, while rank 0 still evaluates and uploads model.pt:
    its node's success must not end the attempt under rank 0."""
    primary, secondary, job, attempt = gang["primary"], gang["secondary"], gang["job"], gang["attempt"]
    for node in (primary, secondary):
        assert post(gang, node, "claim").status_code == 200
    done = post(gang, secondary, "finish", outcome="succeeded")
    assert done.status_code == 200 and done.json() == {"job_state": "RUNNING"}
    attempt.refresh_from_db()
    assert attempt.ended_at is None
    assert Allocation.objects.filter(attempt=attempt, active=True).count() == 2
    assert any(secondary.name in event.message for event in events(job, "attempt"))
    # Rank 0's node may still report and upload; its end is the attempt's.
    assert post(gang, primary, "report", logs=[{"message": "uploading"}]).json() == {"stop": False}
    finished = post(gang, primary, "finish", outcome="succeeded")
    assert finished.status_code == 200 and finished.json() == {"job_state": "SUCCEEDED"}
    attempt.refresh_from_db()
    assert attempt.outcome == "succeeded" and not Allocation.objects.filter(attempt=attempt, active=True).exists()


def test_a_failing_secondary_node_ends_the_attempt(gang):
    primary, secondary, job, attempt = gang["primary"], gang["secondary"], gang["job"], gang["attempt"]
    for node in (primary, secondary):
        assert post(gang, node, "claim").status_code == 200
    failed = post(gang, secondary, "finish", outcome="failed", reason="rank 1 killed by signal 9")
    assert failed.status_code == 200 and failed.json() == {"job_state": "QUEUED"}
    attempt.refresh_from_db()
    assert attempt.outcome == "failed" and "rank 1" in attempt.exit_reason
    # Rank 0's node learns that its attempt is over, and stops.
    assert post(gang, primary, "report").status_code == 409
    assert post(gang, primary, "finish", outcome="failed", reason="stopped").status_code == 409
    assert Job.objects.get(pk=job.pk).failures == 1


def test_a_stopped_gang_keeps_its_attempt_until_rank_0_has_checkpointed(gang):
    """On a stop, rank 0 checkpoints while the other ranks return at once: their nodes' ends must not end the
    attempt first (rank 0's checkpoint upload would be refused)."""
    from strata.jobs.services import job_cancel

    primary, secondary, job, attempt = gang["primary"], gang["secondary"], gang["job"], gang["attempt"]
    for node in (primary, secondary):
        assert post(gang, node, "claim").status_code == 200
    job_cancel(Job.objects.get(pk=job.pk), "stop")
    assert post(gang, secondary, "report").json() == {"stop": True}
    assert post(gang, secondary, "finish", outcome="failed", reason="stopped").status_code == 200
    attempt.refresh_from_db()
    assert attempt.ended_at is None
    assert post(gang, primary, "report").json() == {"stop": True}  # still the attempt's: it may upload
    assert post(gang, primary, "finish", outcome="failed", reason="stopped").json() == {"job_state": "CANCELLED"}
    attempt.refresh_from_db()
    assert attempt.outcome == "cancelled"
