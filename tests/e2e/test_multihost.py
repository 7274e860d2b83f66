"""Multi-host: the control plane and two GPU nodes on separate hosts (network namespaces joined by veth pairs on a
bridge, with addresses from 198.18.0.0/15 that exist only inside them; ``benchmarks.core.hosts``).

The control-plane host runs its own redis-server (the broker the nodes reach over the bridge), ``strata server``
and ``strata scheduler``, on PostgreSQL (a fresh database through the machine's Unix socket) when the suite runs
on PostgreSQL, SQLite otherwise. Nodes register with their own host's address and never reach the database.

Where namespaces cannot be made (not root, no iproute2) the tests fail and say why: never a silent skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest

from benchmarks.core.hosts import NODE_METRICS_PORT, HostCluster, Hosts, NamespaceError, get_text

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def digits(name: str, epochs: int, **resources) -> dict:
    return {"name": name, "kind": "train", "max_attempts": 2, "resources": {"gpus": 1, **resources},
            "spec": {"workload": "mlp-digits", "epochs": epochs, "batch_size": 32, "log_every": 10}}


def long_job(name: str, epochs: int = 60) -> dict:
    # About 90 steps per epoch at batch size 16, a few hundred steps a second: long enough for a host to be lost
    # mid-job; checkpoints every 250 steps, so the retry resumes instead of starting over.
    return {"name": name, "kind": "train", "max_attempts": 1, "resources": {"gpus": 1},
            "spec": {"workload": "mlp-digits", "epochs": epochs, "batch_size": 16, "log_every": 100,
                     "checkpoint_every": 250}}


@pytest.fixture(scope="module")
def multihost(tmp_path_factory):
    try:
        hosts = Hosts(["cp", "n1", "n2"])
    except NamespaceError as error:
        pytest.fail(f"the multi-host test needs network namespaces and cannot make them here: {error}")
    database = "postgres" if os.environ.get("STRATA_DATABASE_URL", "").startswith("postgres") else "sqlite"
    cluster = HostCluster(hosts, tmp_path_factory.mktemp("multihost"), database=database)
    try:
        cluster.start()
        for host in ("n1", "n2"):
            cluster.start_node(host)
        cluster.wait(lambda: up_nodes(cluster) == {"host-n1", "host-n2"}, 120, "both node hosts to register")
        yield cluster
    finally:
        cluster.stop()
        hosts.close()


def up_nodes(cluster) -> set[str]:
    return {node["name"] for node in cluster.api("GET", "nodes/")["results"] if node["lease_valid"]}


def job(cluster, job_id: str) -> dict:
    return cluster.api("GET", f"jobs/{job_id}/")


def wait_state(cluster, job_id: str, states: set[str], timeout: float) -> dict:
    return cluster.wait(lambda: (record := job(cluster, job_id))["state"] in states and record, timeout,
                        f"job {job_id} to reach {sorted(states)}")


def logs(cluster, job_id: str) -> str:
    return "\n".join(line["message"] for line in cluster.api("GET", f"jobs/{job_id}/logs/"))


def test_namespaces_are_separate_hosts(multihost):
    hosts = multihost.hosts
    # The test range exists only inside the namespaces: the machine itself holds no address in it ...
    mine = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    assert "198.18." not in mine and "198.19." not in mine, mine
    # ... while a node host reaches the control plane over the bridge, and each host has its own loopback.
    probe = "import socket; socket.create_connection((%r, 8000), timeout=5).close(); print('ok')"
    reached = hosts.run("n2", [sys.executable, "-c", probe % hosts.address("cp")])
    assert reached.stdout.strip() == "ok", reached.stderr
    alone = hosts.run("n1", [sys.executable, "-c", probe % "127.0.0.1"])
    assert alone.returncode != 0  # nothing listens on n1's own loopback: the server is on another host


def test_jobs_run_on_both_hosts_and_a_gang_spans_them(multihost):
    cluster = multihost
    ids = [cluster.api("POST", "jobs/", json=digits(f"mh-{i}", epochs=2))["id"] for i in range(2)]
    body = digits("mh-gang", epochs=3, workers=2)
    body["spec"]["distributed"] = {"strategy": "ddp"}
    gang = cluster.api("POST", "jobs/", json=body)["id"]
    records = [wait_state(cluster, job_id, TERMINAL, 240) for job_id in ids]
    assert all(r["state"] == "SUCCEEDED" for r in records), (records, cluster.output())
    # One virtual GPU per host and whole-GPU jobs submitted together: one ran on each host.
    assert {r["attempts"][0]["node"] for r in records} == {"host-n1", "host-n2"}

    record = wait_state(cluster, gang, TERMINAL, 300)
    assert record["state"] == "SUCCEEDED", (record, cluster.output())
    placed = {allocation["node"] for allocation in record["attempts"][-1]["allocations"]}
    assert placed == {"host-n1", "host-n2"}
    text = logs(cluster, gang)
    assert "on 2 workers (ddp, gloo" in text, text[-3000:]
    # The ranks met at rank 0's host address, announced through the control plane, never a loopback.
    events = cluster.api("GET", f"jobs/{gang}/events/")
    rendezvous = [event["message"] for event in events if event["kind"] == "rendezvous"]
    addresses = {cluster.hosts.address("n1"), cluster.hosts.address("n2")}
    assert rendezvous and any(address + ":" in rendezvous[-1] for address in addresses), rendezvous


def test_an_unchanged_torchrun_script_trains_across_the_two_hosts(multihost, tmp_path):
    """examples/projects/ddp-torchrun as a code bundle: its ranks read only torchrun's variables (MASTER_ADDR and
    MASTER_PORT from the control plane's rendezvous, on rank 0's host address) and train across both hosts."""
    import glob
    import io
    import shutil
    from pathlib import Path

    from components.runtime.shared import bundles

    example = Path(__file__).resolve().parents[2] / "examples" / "projects" / "ddp-torchrun"
    archive = io.BytesIO()
    bundles.pack(example, archive)
    digest = multihost.api("POST", "code/", data=archive.getvalue())["digest"]
    # The script's one requirement, from a wheel on the shared filesystem (the hosts reach no package index).
    wheels = glob.glob("/opt/pypi/files/tabulate-0.10.0-py3-none-any.whl")
    if wheels:
        requirement = str(shutil.copy(wheels[0], tmp_path))
    else:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(tmp_path),
                        "tabulate==0.10.0"], check=True, timeout=300)
        requirement = str(next(tmp_path.glob("tabulate-*.whl")))
    body = {"name": "mh-torchrun", "kind": "train", "code": digest, "max_attempts": 1,
            "resources": {"gpus": 1, "workers": 2},
            "spec": {"command": ["python", "train.py", "--epochs", "5"], "environment": {"pip": [requirement]}}}
    gang = multihost.api("POST", "jobs/", json=body)["id"]
    record = wait_state(multihost, gang, TERMINAL, 360)
    assert record["state"] == "SUCCEEDED", (record["reason"], logs(multihost, gang)[-4000:])
    assert {a["node"] for a in record["attempts"][-1]["allocations"]} == {"host-n1", "host-n2"}
    points = multihost.api("GET", f"jobs/{gang}/metrics/")
    accuracy = [point["value"] for point in points if point["name"] == "accuracy"]
    assert len(accuracy) == 5 and accuracy[-1] >= 0.9, accuracy
    events = multihost.api("GET", f"jobs/{gang}/events/")
    rendezvous = [event["message"] for event in events if event["kind"] == "rendezvous"]
    addresses = {multihost.hosts.address("n1"), multihost.hosts.address("n2")}
    assert rendezvous and any(address + ":" in rendezvous[-1] for address in addresses), rendezvous


def samples(text: str) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def scrape(hosts, url: str) -> dict | None:
    import requests

    try:
        return samples(hosts.call("cp", get_text, url))
    except requests.RequestException:
        return None


def test_metrics_are_scraped_across_hosts(multihost):
    cluster, hosts = multihost, multihost.hosts
    # Prometheus on the control-plane host scrapes the web process, and each node agent at its own address.
    web = samples(hosts.call("cp", get_text, f"{cluster.url}/metrics"))
    assert web[("strata_nodes_schedulable", ())] == 2
    assert web[("strata_jobs", (("state", "SUCCEEDED"),))] >= 0
    for host in ("n1", "n2"):
        url = f"http://{hosts.address(host)}:{NODE_METRICS_PORT}/metrics"
        beats = ("strata_node_heartbeats_total", (("node", f"host-{host}"),))
        node = cluster.wait(lambda: (found := scrape(hosts, url)) and found.get(beats, 0) >= 1 and found,  # noqa: B023
                            60, f"{url} to count a heartbeat")
        labels = (("device", "0"), ("kind", "virtual"), ("node", f"host-{host}"))
        assert node[("strata_node_device_memory_total_bytes", labels)] > 0


def test_a_serve_deployment_on_one_host_answers_from_the_other(multihost):
    cluster = multihost
    trained = cluster.api("POST", "jobs/", json=digits("mh-train", epochs=3))["id"]
    assert wait_state(cluster, trained, TERMINAL, 240)["state"] == "SUCCEEDED", cluster.output()
    served = cluster.api("POST", "jobs/", json={"name": "mh-serve", "kind": "serve", "resources": {"gpus": 0.25},
                                                "spec": {"model": {"job": trained}}})["id"]
    record = cluster.wait(lambda: (r := job(cluster, served))["endpoint"] and r, 180, "the endpoint to be published")
    assert record["state"] == "RUNNING"
    serving_host = {"host-n1": "n1", "host-n2": "n2"}[record["attempts"][-1]["node"]]
    other = "n2" if serving_host == "n1" else "n1"
    address = record["endpoint"]
    assert address.startswith(cluster.hosts.address(serving_host) + ":"), address
    token = cluster.api("POST", f"jobs/{served}/tokens/", json={"name": "multihost"})["token"]
    client = ("import json, sys; from components.serving.client import describe, predict; "
              "address, token = sys.argv[1], sys.argv[2]; "
              "print(json.dumps({'describe': describe(address, token=token), "
              "'rows': len(predict(address, [[0.0] * 64, [8.0] * 64], token=token))}))")

    def called():
        done = cluster.hosts.run(other, [sys.executable, "-c", client, address, token], timeout=60)
        return done.returncode == 0 and json.loads(done.stdout.strip().splitlines()[-1])

    answer = cluster.wait(called, 60, f"a gRPC call from {other} to the endpoint on {serving_host}")
    assert answer["describe"]["source_job"] == trained and answer["rows"] == 2
    cluster.api("POST", f"jobs/{served}/cancel/")
    wait_state(cluster, served, TERMINAL, 60)


def test_a_host_cut_off_loses_its_jobs_to_the_other_and_comes_back_fenced(multihost):
    cluster, hosts = multihost, multihost.hosts
    cluster.wait(lambda: up_nodes(cluster) == {"host-n1", "host-n2"}, 60, "both hosts up")
    long = cluster.api("POST", "jobs/", json=long_job("mh-long"))["id"]
    record = cluster.wait(lambda: (r := job(cluster, long))["state"] == "RUNNING" and r["attempts"]
                          and r["attempts"][-1]["started_at"] and r, 120, "the long job to run")
    lost_node = record["attempts"][-1]["node"]
    lost, survivor = {"host-n1": ("n1", "n2"), "host-n2": ("n2", "n1")}[lost_node]
    first_attempt = record["attempts"][-1]["id"]
    cluster.wait(lambda: children(hosts, lost), 60, "the attempt's child process on the host")

    hosts.cut(lost)
    # Within the lease (6 s here) plus a tick, the reaper ends the attempt as node_lost and requeues the job,
    # without counting a failure; it runs again on the surviving host.
    moved = cluster.wait(lambda: (r := job(cluster, long))["attempts"][-1]["id"] != first_attempt
                         and r["attempts"][-1]["node"] == f"host-{survivor}" and r, 60, "the job to move")
    ended = next(a for a in moved["attempts"] if a["id"] == first_attempt)
    assert ended["outcome"] == "node_lost" and moved["failures"] == 0, moved

    hosts.restore(lost)
    # The host comes back: its agent's next heartbeat is refused (the session expired), so it registers again
    # and is accepted; the old attempt's late reports are refused by its fencing token (409), which stops its
    # child (unless it had finished meanwhile: then its finish is refused), and the attempt's ending is never
    # rewritten.
    cluster.wait(lambda: lost_node in up_nodes(cluster), 60, "the host to register again")
    cluster.wait(lambda: f"Conflict: /api/v1/node/attempts/{first_attempt}/" in cluster.log("server"), 90,
                 "the control plane to refuse the stale attempt's late calls (409)")
    cluster.wait(lambda: not children(hosts, lost), 90, "the stale attempt's child on the restored host to stop")
    record = wait_state(cluster, long, TERMINAL, 300)
    assert record["state"] == "SUCCEEDED" and record["failures"] == 0, (record, cluster.output())
    assert next(a for a in record["attempts"] if a["id"] == first_attempt)["outcome"] == "node_lost"
    assert record["attempts"][-1]["node"] == f"host-{survivor}"

    # The restored host takes work again: two whole-GPU jobs at once land one on each host.
    again = [cluster.api("POST", "jobs/", json=digits(f"mh-after-{i}", epochs=1))["id"] for i in range(2)]
    records = [wait_state(cluster, job_id, TERMINAL, 240) for job_id in again]
    assert all(r["state"] == "SUCCEEDED" for r in records), records
    assert {r["attempts"][-1]["node"] for r in records} == {"host-n1", "host-n2"}


def test_a_host_whose_processes_die_is_replaced_by_the_other(multihost):
    cluster, hosts = multihost, multihost.hosts
    cluster.wait(lambda: up_nodes(cluster) == {"host-n1", "host-n2"}, 60, "both hosts up")
    # 20 epochs (1800 steps, seconds of training after the child's start-up): the host dies as soon as the attempt
    # has started, so the job is mid-way whatever its length; fewer steps only shorten the retry's training.
    long = cluster.api("POST", "jobs/", json=long_job("mh-killed", epochs=20))["id"]
    record = cluster.wait(lambda: (r := job(cluster, long))["state"] == "RUNNING" and r["attempts"]
                          and r["attempts"][-1]["started_at"] and r, 120, "the job to run")
    node = record["attempts"][-1]["node"]
    dead, survivor = {"host-n1": ("n1", "n2"), "host-n2": ("n2", "n1")}[node]
    assert hosts.kill(dead) > 0
    record = wait_state(cluster, long, TERMINAL, 300)
    assert record["state"] == "SUCCEEDED" and record["failures"] == 0, (record, cluster.output())
    assert record["attempts"][0]["outcome"] == "node_lost"
    assert record["attempts"][-1]["node"] == f"host-{survivor}"
    assert node not in up_nodes(cluster)


def children(hosts, host: str) -> list[int]:
    """Attempt child processes (``python -m components.runtime.node.child``) on ``host``."""
    found = []
    for pid in hosts.pids(host):
        try:
            command = " ".join(psutil.Process(pid).cmdline())
        except psutil.Error:
            continue
        if "components.runtime.node.child" in command:
            found.append(pid)
    return found
