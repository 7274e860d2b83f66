"""The retention collector (strata.quotas.retention) on a constructed history: it keeps exactly what the policies
say (job > parent > team > cluster), never deletes a checkpoint in use, a model being served or a referenced code
bundle, removes the bytes from the storage (its listing) with the rows, writes an event per deletion, and runs on
the scheduler's leader only."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.utils import timezone

from strata.jobs.models import Artifact, CodeBundle, Job, JobEvent, JobState, MetricPoint
from strata.jobs.storage import get_storage
from strata.quotas.retention import retention_collect

NOW = timezone.now()


@pytest.fixture
def team_user(make_team, make_user):
    team = make_team("alpha")
    return team, make_user("alice", team)


@pytest.fixture
def make_job(team_user):
    team, user = team_user

    def make(name: str, state: str = JobState.SUCCEEDED, *, kind: str = "train", spec=None, keep=None, parent=None,
             ended_days_ago: float = 0, team=None) -> Job:
        return Job.objects.create(team=team or team_user[0], owner=user, kind=kind, name=name, spec=spec or {},
                                  resources={"gpus": 1.0, "workers": 1}, state=state, keep=keep, parent=parent,
                                  finished_at=NOW - timedelta(days=ended_days_ago)
                                  if state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED) else None)

    return make


def put(job: Job, name: str, kind: str = Artifact.Kind.CHECKPOINT, *, days_ago: float = 0.0,
        data: bytes = b"weights") -> Artifact:
    key = f"{job.pk}/{kind}/{name}"
    size, sha = get_storage().save(key, io.BytesIO(data), 1 << 20)
    return Artifact.objects.create(job=job, kind=kind, name=name, size=size, sha256=sha, storage_key=key,
                                   created_at=NOW - timedelta(days=days_ago))


def metric(job: Job, name: str, value: float, *, days_ago: float) -> None:
    MetricPoint.objects.create(job=job, name=name, step=0, value=value, time=NOW - timedelta(days=days_ago))


def kept() -> set[tuple[str, str]]:
    return {(job_name, name) for job_name, name in Artifact.objects.values_list("job__name", "name")}


def retention_events() -> dict[tuple[str, str], str]:
    return {(event.job.name, event.data["artifact"]): event.message
            for event in JobEvent.objects.filter(kind="retention").select_related("job")}


def test_the_collector_keeps_exactly_what_the_policies_say(make_job, storage_backend, settings):
    settings.STRATA_RETENTION_CHECKPOINTS = "latest"
    settings.STRATA_RETENTION_ARTIFACTS_DAYS = None  # the cluster's default: artifacts forever
    # A job under the cluster's default (latest): its newest checkpoint stays, an older one of another name goes.
    plain = make_job("plain", ended_days_ago=50)
    put(plain, "checkpoint.pt", days_ago=50)
    put(plain, "old.pt", days_ago=60)
    put(plain, "model.pt", Artifact.Kind.ARTIFACT, days_ago=50)  # artifacts: forever by default
    # A job's own keep: every checkpoint; artifacts 7 days after the job ended.
    own = make_job("own", keep={"checkpoints": "all", "artifacts_days": 7}, ended_days_ago=10)
    put(own, "checkpoint.pt", days_ago=10)
    put(own, "epoch-1.pt", days_ago=12)
    put(own, "report.txt", Artifact.Kind.ARTIFACT, days_ago=11)  # 10 days after the end: goes
    put(own, "late.txt", Artifact.Kind.ARTIFACT, days_ago=1)  # stored after the end, 1 day ago: stays
    # A sweep keeps its 2 best trials by its kind's objective (acc, max): a value counts only if it was reported
    # before the checkpoint was stored; a copy with no value of its own ranks last.
    sweep = make_job("sweep", kind="tune", spec={"metric": "acc", "mode": "max"}, keep={"checkpoints": {"best": 2}})
    for number, (before, after) in enumerate([(0.5, None), (0.9, None), (0.7, 0.99), (0.8, None)], start=1):
        trial = make_job(f"trial-{number}", parent=sweep, ended_days_ago=1)
        metric(trial, "acc", before, days_ago=3)
        put(trial, "checkpoint.pt", days_ago=2)
        if after is not None:
            metric(trial, "acc", after, days_ago=1)
    copy = make_job("trial-copy", parent=sweep, state=JobState.CANCELLED)
    put(copy, "checkpoint.pt", days_ago=2)
    # A job that has not ended keeps everything, whatever its policy.
    running = make_job("running", JobState.RUNNING, keep={"checkpoints": {"best": 1, "metric": "loss", "mode": "min"}})
    put(running, "checkpoint.pt", days_ago=1)
    put(running, "older.pt", days_ago=2)

    collected = retention_collect()

    assert kept() == {
        ("plain", "checkpoint.pt"), ("plain", "model.pt"),
        ("own", "checkpoint.pt"), ("own", "epoch-1.pt"), ("own", "late.txt"),
        ("trial-2", "checkpoint.pt"), ("trial-4", "checkpoint.pt"),
        ("running", "checkpoint.pt"), ("running", "older.pt"),
    }
    gone = {("plain", "old.pt"), ("own", "report.txt"), ("trial-1", "checkpoint.pt"), ("trial-3", "checkpoint.pt"),
            ("trial-copy", "checkpoint.pt")}
    events = retention_events()
    assert set(events) == gone
    assert "latest" in events[("plain", "old.pt")]
    assert "acc=0.7" in events[("trial-3", "checkpoint.pt")] and "best 2" in events[("trial-3", "checkpoint.pt")]
    assert "no value" in events[("trial-copy", "checkpoint.pt")]
    assert "artifacts_days 7" in events[("own", "report.txt")]
    assert (collected.checkpoints, collected.artifacts) == (4, 1)
    # The bytes are gone from the storage itself, and only those.
    assert sorted(storage_backend.keys()) == sorted(Artifact.objects.values_list("storage_key", flat=True))
    # A second run finds nothing more to delete.
    assert retention_collect().as_dict() == {"checkpoints": 0, "artifacts": 0, "code": 0, "bytes": 0}


def test_precedence_is_job_then_parent_then_team_then_cluster(make_job, make_team, artifact_root, settings):
    from strata.quotas.services import quota_update

    settings.STRATA_RETENTION_ARTIFACTS_DAYS = 30
    team = make_team("beta")
    quota_update(team.pk, {"keep": {"artifacts_days": 5}})
    cluster_only = make_job("cluster-only", ended_days_ago=20)  # alpha: no team policy, the cluster's 30 days
    team_rule = make_job("team-rule", ended_days_ago=20, team=team)  # beta's 5 days
    job_rule = make_job("job-rule", ended_days_ago=20, team=team, keep={"artifacts_days": None})  # forever
    parent = make_job("parent", team=team, keep={"artifacts_days": 100}, ended_days_ago=20)
    child = make_job("child", team=team, parent=parent, ended_days_ago=20)  # follows its parent's 100 days
    for job in (cluster_only, team_rule, job_rule, parent, child):
        put(job, "out.bin", Artifact.Kind.ARTIFACT, days_ago=21)

    retention_collect()

    assert kept() == {("cluster-only", "out.bin"), ("job-rule", "out.bin"), ("parent", "out.bin"),
                      ("child", "out.bin")}
    assert "the team's keep" in retention_events()[("team-rule", "out.bin")]


def test_never_a_checkpoint_in_use_a_served_model_or_a_referenced_bundle(make_job, team_user, artifact_root, settings):
    team, user = team_user
    settings.STRATA_RETENTION_UNUSED_CODE_DAYS = 7
    # The newest checkpoint of a job whose parent runs (a sibling may start from it) stays, though its own best: 1
    # by loss prefers its older one.
    parent = make_job("parent", JobState.RUNNING)
    child = make_job("child", parent=parent, keep={"checkpoints": {"best": 1, "metric": "loss", "mode": "min"}})
    metric(child, "loss", 0.1, days_ago=3)
    put(child, "good.pt", days_ago=2)
    metric(child, "loss", 0.9, days_ago=1.5)
    put(child, "newest.pt", days_ago=1)
    # A model read by a job that has not ended stays past its artifacts_days; one whose reader ended goes.
    served = make_job("served", keep={"artifacts_days": 1}, ended_days_ago=30)
    put(served, "model.pt", Artifact.Kind.ARTIFACT, days_ago=30)
    make_job("reader", JobState.QUEUED, kind="serve", spec={"model": {"job": str(served.pk)}})
    unserved = make_job("unserved", keep={"artifacts_days": 1}, ended_days_ago=30)
    put(unserved, "model.pt", Artifact.Kind.ARTIFACT, days_ago=30)
    make_job("old-reader", JobState.CANCELLED, kind="serve", spec={"model": {"job": str(unserved.pk)}})
    # Code bundles: one a (finished) job references stays; unreferenced ones go after the grace, not before.
    bundles = {}
    for name, days in (("used", 30), ("unused-old", 30), ("unused-new", 1)):
        key = f"code/{team.pk}/{name}.tar.gz"
        size, _ = get_storage().save(key, io.BytesIO(b"archive"), 1 << 20)
        bundles[name] = CodeBundle.objects.create(team=team, digest=name.ljust(64, "0"), owner=user, size=size,
                                                  expanded_size=size, file_count=1, storage_key=key,
                                                  created_at=NOW - timedelta(days=days))
    Job.objects.filter(pk=make_job("old-job", JobState.FAILED).pk).update(code=bundles["used"])

    collected = retention_collect()

    assert kept() == {("child", "good.pt"), ("child", "newest.pt"), ("served", "model.pt")}
    assert set(CodeBundle.objects.values_list("digest", flat=True)) == {bundles["used"].digest,
                                                                       bundles["unused-new"].digest}
    assert collected.code == 1
    keys = [item.key for item in get_storage().list("code/")]
    assert sorted(keys) == sorted([bundles["used"].storage_key, bundles["unused-new"].storage_key])
    # Once the parent ended, the child's policy applies in full.
    Job.objects.filter(pk=parent.pk).update(state=JobState.SUCCEEDED, finished_at=NOW)
    retention_collect()
    assert ("child", "newest.pt") not in kept() and ("child", "good.pt") in kept()


def test_a_reader_submitted_during_a_run_keeps_the_model(make_job, artifact_root, monkeypatch):
    """The collector checks again, in each deletion's transaction, for jobs submitted since it began."""
    from strata.quotas import retention

    served = make_job("served", keep={"artifacts_days": 1}, ended_days_ago=30)
    put(served, "model.pt", Artifact.Kind.ARTIFACT, days_ago=30)
    original = retention.readers
    calls = []

    def readers_then_submit(jobs):
        calls.append(1)
        if len(calls) == 1:  # the run's first scan sees no reader; a reader arrives right after it
            answer = original(jobs)
            make_job("reader", JobState.PENDING, kind="serve", spec={"model": {"job": str(served.pk)}})
            return answer
        return original(jobs)

    monkeypatch.setattr(retention, "readers", readers_then_submit)
    retention_collect()
    assert kept() == {("served", "model.pt")}


def test_only_the_scheduler_leader_collects(make_job, artifact_root):
    from strata.scheduling.leader import lease_acquire, lease_release
    from strata.scheduling.tasks import retention_task

    job = make_job("plain")
    put(job, "checkpoint.pt", days_ago=1)
    put(job, "old.pt", days_ago=2)
    assert lease_acquire(holder="another-scheduler:1:abcd", ttl=600) is not None
    assert retention_task() == {}
    assert kept() == {("plain", "checkpoint.pt"), ("plain", "old.pt")}
    lease_release(holder="another-scheduler:1:abcd")
    assert retention_task()["checkpoints"] == 1
    assert kept() == {("plain", "checkpoint.pt")}
