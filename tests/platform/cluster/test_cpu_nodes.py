"""Nodes report their CPUs and memory: stored on the node, with a CPU device that CPU reservations are allocated
on and that no listing of GPUs shows; the agent reads them from the machine or from an override."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from node_protocol import NODE_API, NodeProtocol

from strata.cluster.models import CPU_INDEX, Device, Node
from strata.cluster.services import pools_list
from strata.jobs.models import Allocation, Attempt, Job, JobState

GiB = 2**30


def register(agent, **extra):
    body = {"name": "n1", "devices": [{"index": 0, "kind": "virtual", "memory_total": 8 * GiB}], **extra}
    answer = agent.post(f"{NODE_API}/register/", body, format="json")
    assert answer.status_code == 200, answer.content
    return Node.objects.get(pk=answer.json()["node"])


def test_registration_stores_cpus_and_memory_and_a_hidden_cpu_device(node_token, api, make_team, make_user,
                                                                    make_token):
    agent = api(node_token)
    node = register(agent, cpus=6, memory=16 * GiB)
    assert (node.cpus, node.memory) == (6.0, 16 * GiB)
    cpu = Device.objects.get(node=node, kind=Device.Kind.CPU)
    assert (cpu.index, cpu.memory_total) == (CPU_INDEX, 16 * GiB)

    team = make_team("alpha")
    client = api(make_token(make_user("alice", team), team))
    [listed] = client.get("/api/v1/nodes/").json()["results"]
    assert (listed["cpus"], listed["memory"]) == (6.0, 16 * GiB)
    assert [device["kind"] for device in listed["devices"]] == ["virtual"]
    assert [device["kind"] for device in client.get("/api/v1/devices/").json()["results"]] == ["virtual"]
    assert [(pool["nodes"], pool["devices"]) for pool in pools_list()] == [(1, 1)]

    # Re-registering updates the offer in place; without CPUs the node has no CPU device any more.
    assert register(agent, cpus=2, memory=GiB).cpus == 2.0
    assert Device.objects.get(node=node, kind=Device.Kind.CPU).pk == cpu.pk
    assert register(agent).cpus is None
    assert not Device.objects.filter(node=node, kind=Device.Kind.CPU).exists()
    assert Device.objects.filter(node=node).count() == 1


def test_a_node_cannot_report_a_cpu_device_or_nonsense_cpus(node_token, api):
    agent = api(node_token)
    body = {"name": "n1", "devices": [{"index": 0, "kind": "cpu", "memory_total": GiB}]}
    assert agent.post(f"{NODE_API}/register/", body, format="json").status_code == 400
    for extra in ({"cpus": 0}, {"cpus": -2}, {"cpus": "many"}, {"memory": -1}):
        answer = agent.post(f"{NODE_API}/register/", {"name": "n1", "devices": [], **extra}, format="json")
        assert answer.status_code == 400 and set(extra) <= set(answer.json()), (extra, answer.content)


def test_heartbeats_hold_a_cpu_attempt_to_its_node(make_team, make_user, make_node, node_token, api,
                                                   submit_resources, run_pass, settings):
    team = make_team("alpha")
    user = make_user("alice", team)
    node = make_node("n1", gpus=1, cpus=2, host_memory=4 * GiB)
    agent = api(node_token)
    job = submit_resources(user, team, {"gpus": 0, "cpus": 2})
    run_pass()
    attempt = Attempt.objects.get(job=job)
    protocol = NodeProtocol(agent, attempt, node)
    claimed = protocol.claim()
    assert claimed.status_code == 200 and claimed.json()["allocations"][0]["device"] is None

    def beat(attempts, samples=()):
        node.refresh_from_db()
        answer = protocol.heartbeat(samples=list(samples), attempts=attempts)
        assert answer.status_code == 200, answer.content
        return answer.json()

    # A sample names a GPU by its index; the CPU device is never sampled (nor confused with a GPU).
    assert beat([str(attempt.pk)], [{"index": 0, "utilization": 50, "memory_used": GiB}])["stop"] == []
    assert Device.objects.get(node=node, index=0).utilization == 50
    beat([])
    Allocation.objects.filter(attempt=attempt).update(
        unreported_since=timezone.now() - timedelta(seconds=settings.STRATA_NODE_LEASE_SECONDS + 1))
    beat([])
    attempt.refresh_from_db()
    assert attempt.outcome == "node_lost" and Job.objects.get(pk=job.pk).state == JobState.QUEUED
    assert not Allocation.objects.filter(attempt=attempt, active=True).exists()


def test_the_agent_reads_cpus_and_memory_from_an_override_or_the_machine(monkeypatch):
    from components.runtime.node.agent import host_resources

    monkeypatch.setenv("STRATA_NODE_CPUS", "3.5")
    monkeypatch.setenv("STRATA_NODE_MEMORY", "2GiB")
    assert host_resources() == (3.5, 2 * GiB)
    assert host_resources(cpus=1, memory=GiB) == (1, GiB)  # `strata node --cpus 1 --memory 1GiB`
    monkeypatch.delenv("STRATA_NODE_CPUS")
    monkeypatch.delenv("STRATA_NODE_MEMORY")
    cpus, memory = host_resources()
    assert cpus >= 1 and memory > 0
