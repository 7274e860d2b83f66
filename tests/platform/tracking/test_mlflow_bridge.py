"""The MLflow bridge against a real ``mlflow server`` (conftest.py): a team-admin sets the team's tracking server
through the API; jobs that run are mirrored by the beat's rounds (called here directly, as the task does); the
runs are read back with MLflow's own client: params (the flattened spec), metric histories (values, steps,
timestamps), tags (job id, GPU share, GPU-seconds as the quota counts them, state), status and artifact bytes. A
server that is down costs its own team only."""

from __future__ import annotations

import io
import os

import pytest
import support

from strata.jobs.models import Attempt, JobState
from strata.jobs.services import artifact_store, job_cancel
from strata.quotas.selectors import job_usage
from strata.tracking import services
from strata.tracking.models import JobMirror, TrackingServer
from strata.tracking.tasks import mirror_task

MiB = 2**20


@pytest.fixture
def local_artifacts(settings, tmp_path):
    settings.STRATA_ARTIFACT_ROOT = tmp_path / "artifacts"
    settings.STRATA_MLFLOW_MAX_ARTIFACT_BYTES = 3 * MiB
    settings.STRATA_MLFLOW_TIMEOUT_S = 2.0
    settings.STRATA_NODE_LEASE_SECONDS = 3600.0  # the test's node sends no heartbeats while runs are checked


@pytest.fixture
def alpha(make_team, make_user, make_token, api):
    team = make_team("alpha")
    admin = make_user("alice", team, role="team-admin")
    return team, admin, api(make_token(admin, team))


def run_job(submit, run_pass, node_protocol, user, team, *, gpus=1.0, name="job"):
    """A job submitted, placed and claimed by its node: RUNNING. Returns (job, its node protocol)."""
    job = submit(user, team, gpus=gpus, name=name)
    run_pass()
    attempt = Attempt.objects.get(job=job, ended_at__isnull=True)
    protocol = node_protocol(attempt)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    return job, protocol


def download(client, run_id: str, path: str, tmp_path) -> bytes:
    target = tmp_path / "downloads" / run_id
    target.mkdir(parents=True, exist_ok=True)
    with open(client.download_artifacts(run_id, path, str(target)), "rb") as stream:
        return stream.read()


@pytest.mark.e2e  # a real mlflow server process (conftest.py)
def test_a_job_is_mirrored_to_an_mlflow_run(mlflow_server, alpha, local_artifacts, make_node, submit, run_pass,
                                            node_protocol, tmp_path):
    team, admin, client = alpha
    make_node(gpus=2)
    response = client.put("/api/v1/tracking/", {"url": mlflow_server.url + "/", "experiment": "alpha-runs",
                                                "token": "tok-0123456789"}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["url"] == mlflow_server.url and response.json()["token_set"] is True
    assert "tok-0123456789" not in response.content.decode()

    job, protocol = run_job(submit, run_pass, node_protocol, admin, team, gpus=1.0, name="digits")
    assert protocol.report(metrics=[{"name": "loss", "step": 1, "value": 0.9},
                                    {"name": "loss", "step": 2, "value": 0.5},
                                    {"name": "train/acc", "step": 2, "value": 0.75}]).status_code == 200
    assert services.mirror_all() == {"alpha": 1}
    mirror = JobMirror.objects.get(job=job)
    assert mirror.state == JobMirror.State.ACTIVE
    mlflow = mlflow_server.client()
    run = mlflow.get_run(mirror.run_id)
    assert run.info.status == "RUNNING" and run.info.run_name == "digits"
    assert run.info.experiment_id == mlflow.get_experiment_by_name("alpha-runs").experiment_id
    assert run.data.params == {"workload": "mlp-digits", "epochs": "1"}  # the spec, flattened
    assert run.data.tags["strata.job_id"] == str(job.pk) and run.data.tags["strata.state"] == "RUNNING"
    assert [(m.step, m.value) for m in mlflow.get_metric_history(mirror.run_id, "loss")] == [(1, 0.9), (2, 0.5)]

    # more points, artifacts (one over the limit), a checkpoint; then the job ends
    assert protocol.report(metrics=[{"name": "loss", "step": 3, "value": 0.25}]).status_code == 200
    model = os.urandom(2 * MiB + 12345)  # more than one streamed chunk
    artifact_store(protocol.attempt, "model.pt", io.BytesIO(model))
    artifact_store(protocol.attempt, "huge.bin", io.BytesIO(b"x" * (4 * MiB)))
    artifact_store(protocol.attempt, "step-3.ckpt", io.BytesIO(b"checkpoint bytes"), kind="checkpoint")
    assert protocol.finish("succeeded").status_code == 200
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED

    mirror_task()  # the beat's task: this process holds the leader lease
    mirror.refresh_from_db()
    assert mirror.state == JobMirror.State.DONE
    run = mlflow.get_run(mirror.run_id)
    assert run.info.status == "FINISHED"
    assert run.info.end_time == int(job.finished_at.timestamp() * 1000)
    history = mlflow.get_metric_history(mirror.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(1, 0.9), (2, 0.5), (3, 0.25)]
    points = job.metric_points.filter(name="loss").order_by("step")
    assert [m.timestamp for m in history] == [int(point.time.timestamp() * 1000) for point in points]
    assert [(m.step, m.value) for m in mlflow.get_metric_history(mirror.run_id, "train/acc")] == [(2, 0.75)]
    tags = run.data.tags
    used = job_usage([job.pk])[job.pk]["gpu_seconds"]
    assert used > 0
    assert tags["strata.gpu_seconds"] == f"{used:.3f}"  # what the quota bills the job
    assert tags["strata.gpu_share"] == "1" and tags["strata.state"] == "SUCCEEDED"
    assert tags["strata.team"] == "alpha" and tags["strata.kind"] == "train" and tags["mlflow.user"] == "alice"
    assert "huge.bin" in tags["strata.artifacts_skipped"] and "STRATA_MLFLOW_MAX_ARTIFACT_BYTES" in \
        tags["strata.artifacts_skipped"]
    assert download(mlflow, mirror.run_id, "model.pt", tmp_path) == model
    assert download(mlflow, mirror.run_id, "checkpoints/step-3.ckpt", tmp_path) == b"checkpoint bytes"
    assert "huge.bin" not in {item.path for item in mlflow.list_artifacts(mirror.run_id)}

    # a cancelled job's run is KILLED; a done run is left alone by later rounds
    other, _ = run_job(submit, run_pass, node_protocol, admin, team, gpus=0.5, name="cancelled")
    services.mirror_all()
    job_cancel(other)
    assert services.mirror_all() == {"alpha": 1}
    killed = mlflow.get_run(JobMirror.objects.get(job=other).run_id)
    assert killed.info.status == "KILLED" and killed.data.tags["strata.gpu_share"] == "0.5"
    assert services.mirror_all() == {"alpha": 0}
    server = TrackingServer.objects.get(team=team)
    assert server.error == "" and server.synced_at is not None and server.failures == 0
    answer = client.get("/api/v1/tracking/").json()
    assert answer["runs"] == 2 and answer["runs_active"] == 0 and answer["experiment_id"] == \
        run.info.experiment_id


@pytest.mark.e2e  # a real mlflow server process (conftest.py)
def test_a_server_that_is_down_costs_its_own_team_only(mlflow_server, alpha, local_artifacts, make_team, make_user,
                                                       make_token, make_node, api, submit, run_pass,
                                                       node_protocol):
    team, admin, client = alpha
    make_node(gpus=2)
    beta = make_team("beta")
    bob = make_user("bob", beta, role="team-admin")
    beta_client = api(make_token(bob, beta))
    closed = support.free_port()  # nothing listens there
    assert client.put("/api/v1/tracking/", {"url": mlflow_server.url}, format="json").status_code == 201
    assert beta_client.put("/api/v1/tracking/", {"url": f"http://127.0.0.1:{closed}"},
                           format="json").status_code == 201
    job_a, _ = run_job(submit, run_pass, node_protocol, admin, team, name="a")
    job_b, protocol_b = run_job(submit, run_pass, node_protocol, bob, beta, name="b")

    assert services.mirror_all() == {"alpha": 1, "beta": 0}
    down = TrackingServer.objects.get(team=beta)
    assert down.failures == 1 and "cannot reach the tracking server" in down.error and down.retry_at is not None
    assert JobMirror.objects.filter(job=job_a).exists() and not JobMirror.objects.filter(job=job_b).exists()
    shown = beta_client.get("/api/v1/tracking/").json()
    assert shown["error"] == down.error and shown["failures"] == 1
    # the job itself goes on: it reports and ends as ever
    assert protocol_b.report(metrics=[{"name": "loss", "step": 1, "value": 1.0}]).status_code == 200
    assert protocol_b.finish("failed", reason="boom").status_code == 200
    job_b.refresh_from_db()
    assert job_b.state in (JobState.QUEUED, JobState.FAILED)
    # backing off: the next round skips beta until retry_at
    assert "beta" not in services.mirror_all()
    assert services.mirror_all(now=down.retry_at)["beta"] == 0
    down.refresh_from_db()
    assert down.failures == 2 and (down.retry_at - down.error_at).total_seconds() > \
        services._backoff(1) - 1  # doubled

    # the team fixes its URL: the error is gone and the job is mirrored
    assert beta_client.put("/api/v1/tracking/", {"url": mlflow_server.url}, format="json").status_code == 200
    assert beta_client.get("/api/v1/tracking/").json()["error"] is None
    services.mirror_all()
    mirror = JobMirror.objects.get(job=job_b)
    metrics = mlflow_server.client().get_metric_history(mirror.run_id, "loss")
    assert [(m.step, m.value) for m in metrics] == [(1, 1.0)]
    assert mlflow_server.client().get_run(mirror.run_id).data.tags["strata.team"] == "beta"


def test_the_token_is_sent_as_a_bearer_token(alpha, settings):
    """The token (encrypted at rest) goes to the server as ``Authorization: Bearer`` on every call."""
    import http.server
    import threading

    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            seen.append(self.headers.get("Authorization"))
            body = b'{"experiment": {"experiment_id": "7"}}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        team, admin, _ = alpha
        tracking, _ = services.server_set(team, url=f"http://127.0.0.1:{server.server_port}", token="s3cret-token")
        assert "s3cret-token" not in tracking.token_ciphertext
        from strata.tracking.mlflow_rest import MlflowRest

        rest = MlflowRest(tracking.url, services.server_token(tracking))
        assert rest.experiment_id("strata-alpha") == "7"
        assert seen == ["Bearer s3cret-token"]
    finally:
        server.shutdown()
        server.server_close()


def test_only_team_admins_configure_it(alpha, make_user, make_token, make_team, api):
    team, admin, client = alpha
    member = api(make_token(make_user("mallory", team, role="member"), team))
    assert member.get("/api/v1/tracking/").status_code == 403
    assert member.put("/api/v1/tracking/", {"url": "http://127.0.0.1:5000"}, format="json").status_code == 403
    other = make_team("gamma")
    assert client.get("/api/v1/tracking/", {"team": other.slug}).status_code == 404  # another team's: a 404
    assert client.get("/api/v1/tracking/").json() == {"team": "alpha", "configured": False}

    bad = client.put("/api/v1/tracking/", {"url": "ftp://x", "experiment": "", "token": 5, "colour": "red"},
                     format="json")
    assert bad.status_code == 400
    assert set(bad.json()) == {"url", "experiment", "token", "colour"}  # every bad field named
    assert client.put("/api/v1/tracking/", {}, format="json").json().keys() == {"url"}
    assert not TrackingServer.objects.exists()

    assert client.put("/api/v1/tracking/", {"url": "http://127.0.0.1:5000"}, format="json").status_code == 201
    shown = client.get("/api/v1/tracking/").json()
    assert shown["experiment"] == "strata-alpha" and shown["token_set"] is False and shown["configured"] is True
    assert client.delete("/api/v1/tracking/").status_code == 204
    assert client.delete("/api/v1/tracking/").status_code == 404
    from strata.audit.models import AuditEntry

    changes = list(AuditEntry.objects.filter(action="tracking.change").order_by("pk").values_list("before", "after"))
    assert changes == [(None, {"url": "http://127.0.0.1:5000", "experiment": "strata-alpha", "token_set": False}),
                       ({"url": "http://127.0.0.1:5000", "experiment": "strata-alpha", "token_set": False}, None)]


def test_the_cli_sets_shows_and_clears(alpha, monkeypatch, capsys):
    import sys

    from strata.cli.main import main

    team, admin, client = alpha

    class Adapter:  # the CLI's REST client, answered by the API views through the test client
        def request(self, method, path, *, json=None, params=None, **_):
            url = f"/api/v1/{path}" + ("?" + "&".join(f"{k}={v}" for k, v in (params or {}).items()) if params
                                       else "")
            response = getattr(client, method.lower())(url, json, format="json") if json is not None else \
                getattr(client, method.lower())(url)
            assert response.status_code < 400, response.content
            return None if response.status_code == 204 else response.json()

        def get(self, path, **kwargs):
            return self.request("GET", path, **kwargs)

        def delete(self, path, **kwargs):
            return self.request("DELETE", path, **kwargs)

    monkeypatch.setattr("strata.cli.client_commands.connect", lambda args: Adapter())
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"tok-cli-0123\n"), encoding="utf-8"))
    assert main(["tracking", "set", "http://127.0.0.1:5000", "--experiment", "E", "--token-stdin"]) == 0
    server = TrackingServer.objects.get(team=team)
    assert (server.url, server.experiment, services.server_token(server)) == ("http://127.0.0.1:5000", "E",
                                                                              "tok-cli-0123")
    assert main(["tracking", "show"]) == 0
    out = capsys.readouterr().out
    assert "http://127.0.0.1:5000" in out and "token       set" in out and "tok-cli" not in out
    assert main(["tracking", "clear"]) == 0
    assert main(["tracking", "show"]) == 0
    assert "no tracking server" in capsys.readouterr().out
    assert not TrackingServer.objects.exists()


def test_the_dashboard_page(alpha, client, make_user):
    team, admin, _ = alpha
    client.force_login(admin)
    page = client.get("/team/tracking/")
    assert page.status_code == 200 and b"No tracking server" in page.content
    saved = client.post("/team/tracking/", {"team": "alpha", "action": "set", "url": "http://127.0.0.1:5000",
                                            "experiment": "", "token": "tok-page-1"})
    assert saved.status_code == 302
    server = TrackingServer.objects.get(team=team)
    assert server.experiment == "strata-alpha" and services.server_token(server) == "tok-page-1"
    TrackingServer.objects.filter(pk=server.pk).update(error="cannot reach the tracking server at x", failures=3)
    page = client.get("/team/tracking/?team=alpha")
    assert b"cannot reach the tracking server at x" in page.content and b"tok-page-1" not in page.content
    assert client.post("/team/tracking/", {"team": "alpha", "action": "set", "url": "nope"}).status_code == 400
    member = make_user("mallory", team, role="member")
    client.force_login(member)
    assert client.get("/team/tracking/?team=alpha").status_code == 403


@pytest.mark.e2e  # a real mlflow server process (conftest.py)
def test_a_new_server_is_checked_at_the_first_round(alpha, mlflow_server):
    """The first round after a server is set looks its experiment up (creating it), jobs or none: a wrong URL
    shows as an error on the team's page at once."""
    team, _, client = alpha
    server, _ = services.server_set(team, url=f"http://127.0.0.1:{support.free_port()}")
    assert services.mirror_team(server) == 0
    server.refresh_from_db()
    assert server.failures == 1 and server.error.startswith("cannot reach") and server.experiment_id == ""
    assert client.put("/api/v1/tracking/", {"url": mlflow_server.url, "experiment": "fresh"},
                      format="json").status_code == 200
    assert services.mirror_all() == {"alpha": 0}
    server.refresh_from_db()
    assert server.failures == 0 and server.error == ""
    assert server.experiment_id == mlflow_server.client().get_experiment_by_name("fresh").experiment_id


def test_the_beat_sends_each_due_team_to_the_tracking_queue(alpha, make_team, settings, monkeypatch):
    """Outside the test suite's inline mode the beat's task only queues one round per due team on the
    ``tracking`` queue (the scheduler's queue never waits on a server); a team in backoff or in another worker's
    round is not queued, and a claimed round cannot be claimed twice."""
    from datetime import timedelta

    from django.utils import timezone

    from strata.celery import app

    settings.STRATA_SCHEDULE_INLINE = False
    sent = []
    monkeypatch.setattr(app, "send_task", lambda name, args=None, queue=None, **_: sent.append((name, args, queue)))
    team, _, _ = alpha
    beta, gamma = make_team("beta"), make_team("gamma")
    servers = {t.slug: services.server_set(t, url="http://127.0.0.1:9")[0] for t in (team, beta, gamma)}
    TrackingServer.objects.filter(team=beta).update(retry_at=timezone.now() + timedelta(minutes=5))
    assert services.claim(servers["gamma"].pk) is not None
    assert services.claim(servers["gamma"].pk) is None  # busy: one worker per team
    mirror_task()
    assert sent == [("strata.tracking.mirror_team", [servers["alpha"].pk], "tracking")]
    services.release(servers["gamma"].pk)
    assert services.claim(servers["gamma"].pk) is not None


@pytest.mark.e2e  # a real mlflow server process (conftest.py)
def test_a_job_the_server_refuses_does_not_hold_up_the_others(mlflow_server, alpha, local_artifacts, make_node,
                                                             submit, run_pass, node_protocol):
    """A 400 about one job (here: its run was deleted on the server) is recorded on that job's mirror and on the
    team's page; the team's other jobs are mirrored in the same round, with no backoff."""
    team, admin, client = alpha
    make_node(gpus=2)
    assert client.put("/api/v1/tracking/", {"url": mlflow_server.url, "experiment": "refusals"},
                      format="json").status_code == 201
    first, first_protocol = run_job(submit, run_pass, node_protocol, admin, team, name="first")
    second, second_protocol = run_job(submit, run_pass, node_protocol, admin, team, name="second")
    assert services.mirror_all() == {"alpha": 2}
    mlflow = mlflow_server.client()
    mlflow.delete_run(JobMirror.objects.get(job=first).run_id)
    for protocol in (first_protocol, second_protocol):
        assert protocol.report(metrics=[{"name": "loss", "step": 7, "value": 0.125}]).status_code == 200
    assert services.mirror_all() == {"alpha": 1}
    refused = JobMirror.objects.get(job=first)
    assert "HTTP 400" in refused.error
    server = TrackingServer.objects.get(team=team)
    assert server.failures == 0 and server.retry_at is None and server.error.startswith("1 job(s) refused")
    history = mlflow.get_metric_history(JobMirror.objects.get(job=second).run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(7, 0.125)]
