"""/metrics (Prometheus, the control plane's aggregate counts and its own latencies) and /readyz."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from strata.cluster.models import Node
from strata.jobs.models import Job, JobState


def scrape(client: Client | None = None, **headers) -> dict[tuple[str, tuple], float]:
    response = (client or Client()).get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.content.decode()) for sample in family.samples}


def value(found: dict, name: str, **labels) -> float:
    return found[(name, tuple(sorted(labels.items())))]


@pytest.fixture
def alice(make_team, make_user):
    team = make_team("alpha-secret-team")
    return make_user("alice", team), team


def test_jobs_and_queue_depth_by_state_are_counted_from_the_database(alice, submit):
    user, team = alice
    jobs = [submit(user, team, name=f"secret-job-{i}") for i in range(7)]
    assert all(job.state == JobState.QUEUED for job in Job.objects.all())
    Job.objects.filter(pk__in=[jobs[0].pk, jobs[1].pk]).update(state=JobState.RUNNING)
    Job.objects.filter(pk=jobs[2].pk).update(state=JobState.FAILED)
    Job.objects.filter(pk=jobs[3].pk).update(state=JobState.PENDING,
                                            created_at=timezone.now() - timedelta(minutes=5))
    found = scrape()
    expected = {state: 0 for state in JobState.values}
    expected.update({JobState.QUEUED: 3, JobState.RUNNING: 2, JobState.FAILED: 1, JobState.PENDING: 1})
    for state, count in expected.items():
        assert value(found, "strata_jobs", state=state) == count, state
    assert value(found, "strata_queue_depth", state="QUEUED") == 3
    assert value(found, "strata_queue_depth", state="PENDING") == 1
    assert value(found, "strata_queue_oldest_age_seconds", state="PENDING") >= 299
    assert value(found, "strata_queue_oldest_age_seconds", state="QUEUED") >= 0


def test_nodes_by_state_and_schedulable(make_node):
    up, stale, draining, down = (make_node(f"n{i}") for i in range(4))
    Node.objects.filter(pk=stale.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    Node.objects.filter(pk=draining.pk).update(state=Node.State.DRAINING)
    Node.objects.filter(pk=down.pk).update(state=Node.State.DOWN)
    found = scrape()
    assert value(found, "strata_nodes", state="up") == 2
    assert value(found, "strata_nodes", state="draining") == 1
    assert value(found, "strata_nodes", state="down") == 1
    assert value(found, "strata_nodes_schedulable") == 1


def test_the_submit_latency_histogram_counts_api_submits(alice, make_token, api, job_body):
    user, team = alice
    client = api(make_token(user, team))
    before = value(scrape(), "strata_job_submit_seconds_count")
    response = client.post("/api/v1/jobs/", job_body(), format="json")
    assert response.status_code == 201, response.content
    found = scrape()
    assert value(found, "strata_job_submit_seconds_count") == before + 1
    assert value(found, "strata_job_submit_seconds_bucket", le="+Inf") >= before + 1


def test_scheduling_passes_are_timed_in_the_process_that_runs_them(alice, submit, make_node, run_pass):
    user, team = alice
    make_node("n1")
    submit(user, team)
    before = value(scrape(), "strata_scheduler_pass_seconds_count")
    run_pass()
    found = scrape()
    assert value(found, "strata_scheduler_pass_seconds_count") == before + 1
    assert value(found, "strata_scheduler_last_pass_timestamp_seconds") > 0


def test_metrics_show_no_team_data(alice, submit):
    user, team = alice
    submit(user, team, name="secret-job-name")
    body = Client().get("/metrics").content.decode()
    for secret in ("alpha-secret-team", "secret-job-name", "alice"):
        assert secret not in body


def test_a_metrics_token_when_set_is_required(db, settings):
    settings.STRATA_METRICS_TOKEN = "s3cret-metrics"
    client = Client()
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Basic s3cret-metrics").status_code == 401
    found = scrape(client, HTTP_AUTHORIZATION="Bearer s3cret-metrics")
    assert ("strata_nodes_schedulable", ()) in found
    assert client.post("/metrics").status_code == 405


# -- readiness -------------------------------------------------------------------------------------------------


def test_ready_when_database_migrations_and_broker_answer(db):
    response = Client().get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json() == {"status": "ok", "checks": {"database": "ok", "migrations": "ok", "broker": "ok"}}
    head = Client().head("/readyz")
    assert head.status_code == 200 and head.content == b""
    assert Client().head("/healthz").status_code == 200


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed once the socket is: nothing listens there


@pytest.mark.parametrize("url", ["redis://127.0.0.1:{port}/0", "amqp://guest:guest@127.0.0.1:{port}//"])
def test_not_ready_when_the_broker_does_not_answer(db, settings, url):
    settings.CELERY_BROKER_URL = url.format(port=_closed_port())
    response = Client().get("/readyz")
    assert response.status_code == 503
    data = response.json()
    assert data["status"] == "unavailable"
    assert data["checks"]["database"] == "ok" and data["checks"]["migrations"] == "ok"
    assert data["checks"]["broker"] != "ok" and "Error" in data["checks"]["broker"]
    head = Client().head("/readyz")
    assert head.status_code == 503 and head.content == b""


def test_not_ready_when_the_filesystem_broker_spool_is_missing(db, settings, tmp_path):
    settings.CELERY_BROKER_URL = f"filesystem://{tmp_path / 'nowhere'}"
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert "does not exist" in response.json()["checks"]["broker"]
    (tmp_path / "nowhere" / "queue").mkdir(parents=True)
    assert Client().get("/readyz").status_code == 200


def test_not_ready_when_the_database_fails(db, monkeypatch):
    from strata.api import metrics

    def refuse():
        raise RuntimeError("database is down")

    monkeypatch.setitem(metrics.CHECKS, "database", refuse)
    data = Client().get("/readyz").json()
    assert data["checks"]["database"] == "RuntimeError: database is down"
    assert data["checks"]["migrations"].startswith("not checked")


def test_unapplied_migrations_are_named_until_applied(db, monkeypatch):
    from django.db.migrations.executor import MigrationExecutor

    from strata.api import metrics

    monkeypatch.setattr(metrics, "_migrated", type(metrics._migrated)())  # forget an earlier success
    monkeypatch.setattr(MigrationExecutor, "migration_plan",
                        lambda self, targets: [(type("M", (), {"app_label": "jobs", "name": "0099_new"})(), False)])
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert "1 unapplied migration(s): jobs.0099_new" in response.json()["checks"]["migrations"]
    monkeypatch.undo()
    monkeypatch.setattr(metrics, "_migrated", type(metrics._migrated)())
    assert Client().get("/readyz").status_code == 200
    assert metrics._migrated.is_set()  # remembered: later answers skip the check


def test_the_scheduler_process_exposes_its_passes_on_its_own_port(db, run_pass):
    import requests

    from strata.telemetry.metrics import start_scheduler_server

    assert start_scheduler_server(0, "127.0.0.1") is None  # 0: off
    server = start_scheduler_server(_closed_port(), "127.0.0.1")
    assert server is not None
    try:
        run_pass()
        port = server.server_address[1]
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
        found = {sample.name: sample.value for family in text_string_to_metric_families(text)
                 for sample in family.samples}
        assert found["strata_scheduler_pass_seconds_count"] >= 1
        assert found["strata_scheduler_last_pass_timestamp_seconds"] > 0
        assert "strata_jobs" not in found  # the cluster's counts are the web process's /metrics
        # A port already taken costs only the metrics, never the scheduler.
        assert start_scheduler_server(port, "127.0.0.1") is None
    finally:
        server.shutdown()
        server.server_close()


def test_probes_and_metrics_answer_any_host_while_other_paths_check_it(db, client):
    # Kubernetes probes and Prometheus call a replica by its pod address, which ALLOWED_HOSTS does not list.
    for path in ("/healthz", "/readyz", "/metrics"):
        assert client.get(path, HTTP_HOST="10.1.2.3:8000").status_code == 200, path
        assert client.head(path, HTTP_HOST="10.1.2.3:8000").status_code == 200, path
    assert client.get("/api/v1/jobs/", HTTP_HOST="10.1.2.3:8000").status_code == 400
    assert client.get("/login/", HTTP_HOST="10.1.2.3:8000").status_code == 400
