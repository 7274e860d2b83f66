"""Work lost when a job must stop (strata.scheduling.lost_work): one row per attempt that ended preempted, shrunk or
with its node, recorded by the attempt.ended subscriber; steps since the latest checkpoint, seconds and GPU-seconds;
the team's sums in the usage report (API and CLI)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from strata.cluster.models import Node
from strata.jobs.models import Artifact, Attempt, Job, JobState, MetricPoint
from strata.jobs.services import job_resize
from strata.scheduling import lost_work
from strata.scheduling.models import LostWork
from strata.scheduling.services import reap

RAN = 200  # seconds the attempt has run when it is stopped


@pytest.fixture
def cluster(make_team, make_user, make_token, make_node, api, settings, tmp_path):
    settings.STRATA_ARTIFACT_ROOT = str(tmp_path / "artifacts")
    alpha, beta = make_team("alpha"), make_team("beta")
    alice, bob = make_user("alice", alpha), make_user("bob", beta)
    node = make_node("n1", gpus=2)
    return {"alpha": alpha, "beta": beta, "alice": alice, "bob": bob, "node": node,
            "client": api(make_token(alice, alpha))}


def _running(cluster, submit, run_pass, node_protocol, *, user="alice", team="alpha", gpus=2.0, name="victim"):
    """A low-priority job placed and claimed by its node (the real protocol), started RAN seconds ago."""
    job = submit(cluster[user], cluster[team], gpus=gpus, priority=0, name=name)
    run_pass()
    attempt = Attempt.objects.get(job=job, ended_at__isnull=True)
    protocol = node_protocol(attempt, node=cluster["node"])
    began = timezone.now() - timedelta(seconds=RAN)
    Attempt.objects.filter(pk=attempt.pk).update(started_at=began, dispatched_at=began)
    attempt.refresh_from_db()
    return job, attempt, protocol, began


def _steps(protocol, attempt, began, steps):
    """Report ``steps`` (a loss and an accuracy each) as the node does; step ``s`` is dated ``began + 10 s``."""
    metrics = [{"name": name, "step": step, "value": 1.0 / step} for step in steps for name in ("loss", "acc")]
    assert protocol.report(metrics=metrics).status_code == 200
    for step in steps:
        MetricPoint.objects.filter(attempt=attempt, step=step).update(time=began + timedelta(seconds=10 * step))


def _checkpoint(protocol, job, at):
    assert protocol.put("artifacts/checkpoint.pt", b"weights", kind="checkpoint").status_code in (200, 201)
    Artifact.objects.filter(job=job, kind=Artifact.Kind.CHECKPOINT).update(created_at=at)


def _preempt(cluster, submit, run_pass, protocol, job, capture, *, team="alpha", user="alice"):
    """A higher-priority job takes the node; the victim's node then reports the stop (as its worker does)."""
    high = submit(cluster[user], cluster[team], gpus=2, priority=50, name="urgent")
    assert run_pass().preempted == 1
    assert Job.objects.get(pk=job.pk).state == JobState.PREEMPTED
    with capture(execute=True):
        assert protocol.finish("failed", reason="SIGTERM").status_code == 200
    return high


def test_steps_since_the_checkpoint_are_lost(cluster, submit, run_pass, node_protocol,
                                             django_capture_on_commit_callbacks):
    job, attempt, protocol, began = _running(cluster, submit, run_pass, node_protocol)
    _steps(protocol, attempt, began, range(1, 7))
    _checkpoint(protocol, job, began + timedelta(seconds=65))  # after step 6 (60 s), before step 7 (70 s)
    _steps(protocol, attempt, began, range(7, 11))
    _preempt(cluster, submit, run_pass, protocol, job, django_capture_on_commit_callbacks)

    attempt.refresh_from_db()
    assert attempt.outcome == Attempt.Outcome.PREEMPTED
    row = LostWork.objects.get(attempt=attempt)
    assert (row.cause, row.job_id, row.team_id) == ("preempted", job.pk, cluster["alpha"].pk)
    assert row.steps == 4 and row.checkpoint and row.checkpoint_step == 6
    assert row.time == attempt.ended_at
    # From the checkpoint (65 s after the start) to the attempt's end (RAN s after it), on 2 GPUs.
    expected = (attempt.ended_at - (began + timedelta(seconds=65))).total_seconds()
    assert row.seconds == pytest.approx(expected) and RAN - 65 <= row.seconds
    assert row.gpu_seconds == pytest.approx(2.0 * expected)
    # Recording twice gives the same one row.
    assert lost_work.record(attempt.pk).pk == row.pk and LostWork.objects.count() == 1


def test_a_checkpoint_written_at_the_stop_loses_nothing(cluster, submit, run_pass, node_protocol,
                                                       django_capture_on_commit_callbacks):
    job, attempt, protocol, began = _running(cluster, submit, run_pass, node_protocol)
    _steps(protocol, attempt, began, range(1, 11))
    _checkpoint(protocol, job, began + timedelta(seconds=105))  # after step 10: the stop's checkpoint
    _preempt(cluster, submit, run_pass, protocol, job, django_capture_on_commit_callbacks)

    row = LostWork.objects.get(attempt=attempt)
    assert row.cause == "preempted" and row.checkpoint and row.checkpoint_step == 10
    assert row.steps == 0 and row.seconds == 0 and row.gpu_seconds == 0


def test_without_a_checkpoint_everything_since_the_first_step_is_lost(cluster, submit, run_pass, node_protocol,
                                                                     django_capture_on_commit_callbacks):
    job, attempt, protocol, began = _running(cluster, submit, run_pass, node_protocol)
    _steps(protocol, attempt, began, range(1, 11))
    _preempt(cluster, submit, run_pass, protocol, job, django_capture_on_commit_callbacks)

    attempt.refresh_from_db()
    row = LostWork.objects.get(attempt=attempt)
    assert row.steps == 10 and not row.checkpoint and row.checkpoint_step is None
    assert row.seconds == pytest.approx((attempt.ended_at - began).total_seconds())
    assert row.gpu_seconds == pytest.approx(2.0 * row.seconds)


def test_a_resumed_attempt_loses_only_what_it_did_past_the_earlier_checkpoint(cluster, submit, run_pass,
                                                                              node_protocol,
                                                                              django_capture_on_commit_callbacks):
    job, attempt, protocol, began = _running(cluster, submit, run_pass, node_protocol)
    _steps(protocol, attempt, began, range(1, 7))
    _checkpoint(protocol, job, began + timedelta(seconds=65))
    _steps(protocol, attempt, began, range(7, 11))
    high = _preempt(cluster, submit, run_pass, protocol, job, django_capture_on_commit_callbacks)
    assert LostWork.objects.get(attempt=attempt).steps == 4

    # The urgent job ends; the victim's second attempt resumes from step 6's checkpoint, reaches 9 and is
    # preempted again: 3 steps lost, the checkpoint being older than the attempt.
    urgent = Attempt.objects.get(job=high, ended_at__isnull=True)
    with django_capture_on_commit_callbacks(execute=True):
        assert node_protocol(urgent, node=cluster["node"]).finish("succeeded").status_code == 200
    run_pass()
    second = Attempt.objects.get(job=job, ended_at__isnull=True)
    again = node_protocol(second, node=cluster["node"])
    restarted = timezone.now() - timedelta(seconds=50)
    Attempt.objects.filter(pk=second.pk).update(started_at=restarted)
    assert again.report(metrics=[{"name": "loss", "step": step, "value": 0.1} for step in (7, 8, 9)]).status_code == 200
    _preempt(cluster, submit, run_pass, again, job, django_capture_on_commit_callbacks)
    row = LostWork.objects.get(attempt=second)
    assert row.steps == 3 and row.checkpoint_step == 6 and row.checkpoint
    second.refresh_from_db()
    assert row.seconds == pytest.approx((second.ended_at - restarted).total_seconds())  # since its own start


def test_a_shrink_is_recorded_as_shrunk(cluster, submit, run_pass, node_protocol,
                                        django_capture_on_commit_callbacks):
    job, attempt, protocol, began = _running(cluster, submit, run_pass, node_protocol)
    _steps(protocol, attempt, began, range(1, 6))
    job_resize(job, {**job.resources, "gpus": 1.0}, "shrunk for higher-priority job 1234")
    assert Job.objects.get(pk=job.pk).state == JobState.PREEMPTED
    with django_capture_on_commit_callbacks(execute=True):
        assert protocol.finish("failed", reason="SIGTERM").status_code == 200
    row = LostWork.objects.get(attempt=attempt)
    assert row.cause == "shrunk" and row.steps == 5
    # An attempt whose own end names the shrink is one too; a plain preemption's is not.
    assert lost_work.cause_of(Attempt(outcome="preempted", exit_reason="shrunk to 1 GPU")) == "shrunk"
    assert lost_work.cause_of(Attempt(outcome="failed", exit_reason="shrunk to 1 GPU")) is None


def test_the_schedulers_shrink_of_an_elastic_job_is_recorded_as_shrunk(cluster, submit_resources, make_node,
                                                                      run_pass, node_protocol,
                                                                      django_capture_on_commit_callbacks):
    node = make_node("small", gpus=1, labels={"size": "small"})
    resources = {"gpus": 1, "elastic": {"min_share": 0.5}, "node_labels": {"size": "small"}}
    elastic = submit_resources(cluster["alice"], cluster["alpha"], resources, name="elastic")
    run_pass()
    attempt = Attempt.objects.get(job=elastic)
    protocol = node_protocol(attempt, node=node)
    began = timezone.now() - timedelta(seconds=RAN)
    Attempt.objects.filter(pk=attempt.pk).update(started_at=began)
    _steps(protocol, attempt, began, range(1, 9))
    _checkpoint(protocol, elastic, began + timedelta(seconds=45))  # after step 4

    submit_resources(cluster["alice"], cluster["alpha"], {"gpus": 0.5, "node_labels": {"size": "small"}},
                     name="urgent", priority=50)
    run_pass()
    assert Job.objects.get(pk=elastic.pk).reason.startswith("shrunk")
    with django_capture_on_commit_callbacks(execute=True):
        assert protocol.finish("failed", reason="SIGTERM").status_code == 200
    row = LostWork.objects.get(attempt=attempt)
    assert (row.cause, row.steps, row.checkpoint_step) == ("shrunk", 4, 4)
    assert row.gpu_seconds == pytest.approx(1.0 * row.seconds) and row.seconds > 0
    assert lost_work.team_summary(cluster["alpha"].pk, None, None)["shrinks"] == 1


def test_a_node_loss_is_recorded_as_node_lost(cluster, submit, run_pass, node_protocol,
                                              django_capture_on_commit_callbacks):
    job, attempt, protocol, began = _running(cluster, submit, run_pass, node_protocol)
    _steps(protocol, attempt, began, range(1, 4))
    Node.objects.filter(pk=cluster["node"].pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=True):
        assert reap()["lost_nodes"] == 1
    attempt.refresh_from_db()
    assert attempt.outcome == Attempt.Outcome.NODE_LOST
    row = LostWork.objects.get(attempt=attempt)
    assert row.cause == "node_lost" and row.steps == 3 and not row.checkpoint
    assert row.gpu_seconds == pytest.approx(2.0 * (attempt.ended_at - began).total_seconds())


def test_other_ends_record_nothing_and_no_steps_is_null(cluster, submit, run_pass, node_protocol,
                                                       django_capture_on_commit_callbacks):
    job, attempt, protocol, _ = _running(cluster, submit, run_pass, node_protocol)
    with django_capture_on_commit_callbacks(execute=True):
        assert protocol.finish("succeeded").status_code == 200
    assert not LostWork.objects.exists()

    quiet, quiet_attempt, quiet_protocol, _ = _running(cluster, submit, run_pass, node_protocol, name="quiet")
    _preempt(cluster, submit, run_pass, quiet_protocol, quiet, django_capture_on_commit_callbacks)
    row = LostWork.objects.get(attempt=quiet_attempt)
    assert row.steps is None and row.seconds > 0  # no steps reported: how many is unknown, the time is not


def test_a_failing_recorder_never_breaks_the_attempts_end_and_is_caught_up(cluster, submit, run_pass,
                                                                          node_protocol, monkeypatch,
                                                                          django_capture_on_commit_callbacks):
    job, attempt, protocol, began = _running(cluster, submit, run_pass, node_protocol)
    _steps(protocol, attempt, began, range(1, 3))

    def broken(_attempt):
        raise RuntimeError("no database today")

    measure = lost_work.measure
    monkeypatch.setattr(lost_work, "measure", broken)
    _preempt(cluster, submit, run_pass, protocol, job, django_capture_on_commit_callbacks)
    attempt.refresh_from_db()
    assert attempt.outcome == Attempt.Outcome.PREEMPTED and Job.objects.get(pk=job.pk).state == JobState.QUEUED
    assert not LostWork.objects.exists()
    monkeypatch.setattr(lost_work, "measure", measure)
    from strata.scheduling import tasks

    tasks.eta_task()  # the leader's periodic task catches it up
    assert LostWork.objects.get(attempt=attempt).steps == 2
    assert lost_work.record_missing() == 0


class _ApiAdapter:
    """The CLI's REST client's calls, answered by the Django test client."""

    def __init__(self, api):
        self.api = api

    def request(self, method, path, *, params=None, raw=False, **_kwargs):
        response = self.api.get(f"/api/v1/{path}", params or {})
        assert response.status_code == 200, response.content
        return response if raw else response.json()

    def get(self, path, **kwargs):
        return self.request("GET", path, **kwargs)


def test_the_teams_usage_sums_its_lost_work(cluster, submit, run_pass, node_protocol, make_node, monkeypatch,
                                           capsys, django_capture_on_commit_callbacks):
    from strata.cli import client_commands
    from strata.cli.main import build_parser
    from strata.quotas import cli

    # alpha: one job preempted (4 steps since its checkpoint), another lost with its node (3 steps, no checkpoint).
    job, attempt, protocol, began = _running(cluster, submit, run_pass, node_protocol)
    _steps(protocol, attempt, began, range(1, 7))
    _checkpoint(protocol, job, began + timedelta(seconds=65))
    _steps(protocol, attempt, began, range(7, 11))
    _preempt(cluster, submit, run_pass, protocol, job, django_capture_on_commit_callbacks)  # the urgent job holds n1
    other = make_node("n2", gpus=1)
    cluster["node"] = other
    lost, lost_attempt, lost_protocol, lost_began = _running(cluster, submit, run_pass, node_protocol, gpus=1,
                                                             name="unlucky")
    assert lost_attempt.node_id == other.pk
    _steps(lost_protocol, lost_attempt, lost_began, range(1, 4))
    Node.objects.filter(pk=other.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=True):
        reap()
    # beta lost nothing.
    rows = {row.job_id: row for row in LostWork.objects.all()}
    assert {row.cause for row in rows.values()} == {"preempted", "node_lost"}

    body = cluster["client"].get("/api/v1/usage/alpha/?since=1h").json()
    summary = body["lost_work"]
    assert (summary["preemptions"], summary["shrinks"], summary["node_losses"]) == (1, 0, 1)
    assert summary["steps"] == 7
    total = sum(row.gpu_seconds for row in rows.values())
    assert summary["gpu_hours"] == pytest.approx(total / 3600)
    assert summary["by_cause"]["node_lost"]["steps"] == 3 and summary["by_cause"]["preempted"]["attempts"] == 1
    top = summary["jobs"]
    assert [row["job"] for row in top] == [str(job_id) for job_id, _ in
                                           sorted(((row.job_id, row.gpu_seconds) for row in rows.values()),
                                                  key=lambda item: -item[1])]
    assert {row["name"]: row["steps"] for row in top} == {"victim": 4, "unlucky": 3}
    listed = cluster["client"].get("/api/v1/usage/?since=1h").json()["results"]
    assert listed[0]["lost_work"]["steps"] == 7 and listed[0]["lost_work"]["jobs"] == []
    # Nothing of alpha's shows in beta's.
    beta = lost_work.team_summary(cluster["beta"].pk, None, None)
    assert beta["preemptions"] == beta["node_losses"] == 0 and beta["jobs"] == []

    monkeypatch.setattr(client_commands, "connect", lambda args: _ApiAdapter(cluster["client"]))
    assert cli.run(build_parser().parse_args(["usage", "alpha", "--since", "1h"])) == 0
    out = capsys.readouterr().out
    assert "lost work: 1 preempted, 0 shrunk, 1 node lost; 7 steps" in out
    assert "LOST WORK: JOB" in out and str(job.pk) in out and str(lost.pk) in out


def test_a_stop_its_owner_or_parent_asked_for_is_not_lost_to_preemption(cluster, submit, run_pass, node_protocol,
                                                                        django_capture_on_commit_callbacks):
    from strata.jobs.services import job_hold, job_resize

    for name, stop in (("held", lambda job: job_hold(job, "paused between rungs")),
                       ("resized", lambda job: job_resize(job, {"gpus": 1.0, "gpu_memory": None, "workers": 1},
                                                          "water-filled: 1 GPU"))):
        job, attempt, protocol, began = _running(cluster, submit, run_pass, node_protocol, name=name)
        _steps(protocol, attempt, began, range(1, 4))
        stop(job)
        assert Job.objects.get(pk=job.pk).state == JobState.PREEMPTED
        with django_capture_on_commit_callbacks(execute=True):
            assert protocol.finish("failed", reason="SIGTERM").status_code == 200
        assert Attempt.objects.get(pk=attempt.pk).outcome == Attempt.Outcome.PREEMPTED
        assert not LostWork.objects.filter(attempt=attempt).exists(), name
        Job.objects.filter(pk=job.pk).update(state=JobState.CANCELLED)  # out of the way of the next one
