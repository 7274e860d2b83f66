"""The MLflow bridge: a team's tracking server (set, read, cleared by its team-admins) and the mirror of its jobs.

Each mirror round (:func:`mirror_all`, the scheduler leader's beat task ``strata.tracking.mirror``: never a request
nor a scheduling pass) takes every team with a server whose backoff has passed and, for each of its jobs that
started (and did not end before the server was configured) and is not mirrored to the end yet:

* creates the run when it has none: its name, start time, tags (job id, team, kind, command, GPU share...) and
  params (the spec, flattened: ``optimizer.lr``);
* sends the metric points recorded since the last round (``JobMirror.last_metric``), in ``log-batch`` calls of up
  to 1000, with the GPU-seconds used so far (``quotas.selectors.job_usage``, the count the quota bills) as a tag;
* once the job ended: the last points, the final tags, its artifacts and checkpoints (streamed from the artifact
  storage to the server's proxied artifact store, each at most ``STRATA_MLFLOW_MAX_ARTIFACT_BYTES``; a skipped one
  is named in the ``strata.artifacts_skipped`` tag) and the run's status (FINISHED, FAILED or KILLED).

A server that fails costs its own team only: the round records the error on the team's server (shown on the
dashboard's Tracking page and in ``GET /api/v1/tracking/``), backs off (the sync interval, doubled per failed
round up to ``STRATA_MLFLOW_BACKOFF_MAX_S``) and the next team goes on. Jobs are never touched: mirroring reads.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from strata.accounts import team_secrets
from strata.jobs.models import TERMINAL_STATES, Artifact, Attempt, Job, JobState, MetricPoint
from strata.tracking.mlflow_rest import MAX_METRICS_PER_BATCH, MlflowError, MlflowRest
from strata.tracking.models import JobMirror, TrackingServer

log = logging.getLogger(__name__)

MAX_URL_CHARS = 500
MAX_EXPERIMENT_CHARS = 250
MAX_TOKEN_BYTES = 8 * 1024
MAX_BATCHES_PER_JOB = 20  # metric batches one job gets per round (20,000 points); the rest go next round
MAX_ERROR_CHARS = 1000
RUN_STATUS = {JobState.SUCCEEDED: "FINISHED", JobState.FAILED: "FAILED", JobState.CANCELLED: "KILLED"}


class TrackingRejected(ValueError):
    """A tracking server cannot be set as asked: ``errors`` names each bad field (a 400)."""

    def __init__(self, errors: dict[str, str]):
        self.errors = errors
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors.items()))


# -- the team's configuration ---------------------------------------------------------------------------------------
def default_experiment(team) -> str:
    return f"strata-{team.slug}"


def url_problem(url: Any) -> str | None:
    if not isinstance(url, str) or not url.strip():
        return "required: the tracking server's URL, e.g. http://mlflow.internal:5000"
    if len(url) > MAX_URL_CHARS:
        return f"must be at most {MAX_URL_CHARS} characters"
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host"
    if parts.username or parts.password:
        return "must not hold a user or password: give a token instead"
    if parts.query or parts.fragment:
        return "must not have a query or fragment"
    return None


def experiment_problem(name: Any) -> str | None:
    if not isinstance(name, str) or not name.strip():
        return "must be a non-empty string"
    if len(name) > MAX_EXPERIMENT_CHARS:
        return f"must be at most {MAX_EXPERIMENT_CHARS} characters"
    if any(ord(char) < 32 for char in name):
        return "must not contain control characters"
    return None


def token_problem(token: Any) -> str | None:
    if not isinstance(token, str):
        return "must be a string (empty: no token)"
    if len(token.encode("utf-8", "surrogatepass")) > MAX_TOKEN_BYTES:
        return f"must be at most {MAX_TOKEN_BYTES // 1024} KiB"
    if any(ord(char) < 32 or ord(char) == 127 for char in token):
        return "must not contain control characters or newlines"
    return None


def describe(server: TrackingServer | None) -> dict[str, Any] | None:
    """What the API, the CLI and the dashboard show of a team's server: never the token itself."""
    if server is None:
        return None
    mirrors = JobMirror.objects.filter(team_id=server.team_id)
    return {
        "team": server.team.slug, "url": server.url, "experiment": server.experiment,
        "experiment_id": server.experiment_id or None, "token_set": bool(server.token_ciphertext),
        "configured_at": server.configured_at, "updated_by": server.updated_by.username if server.updated_by else None,
        "synced_at": server.synced_at, "error": server.error or None, "error_at": server.error_at,
        "failures": server.failures, "retry_at": server.retry_at,
        "runs": mirrors.count(), "runs_active": mirrors.filter(state=JobMirror.State.ACTIVE).count(),
    }


def problems(*, url: Any, experiment: Any = None, token: Any = None) -> dict[str, str]:
    """{field: problem} of a tracking server's fields as given (None: left as they are, except the URL)."""
    errors = {}
    if problem := url_problem(url):
        errors["url"] = problem
    if experiment is not None and (problem := experiment_problem(experiment)):
        errors["experiment"] = problem
    if token is not None and (problem := token_problem(token)):
        errors["token"] = problem
    return errors


def server_set(team, *, url: Any, experiment: Any = None, token: Any = None, user=None) -> tuple[TrackingServer, bool]:
    """Create or replace ``team``'s tracking server; returns (server, created). ``experiment`` None keeps the
    current one (or the default ``strata-<team>``); ``token`` None keeps the current one, "" removes it. A new
    URL or experiment starts afresh: the runs of jobs still going are created anew there (earlier runs stay where
    they are); jobs that already ended are not mirrored. :class:`TrackingRejected` names each bad field."""
    if errors := problems(url=url, experiment=experiment, token=token):
        raise TrackingRejected(errors)
    url = url.strip().rstrip("/")
    now = timezone.now()
    with transaction.atomic():
        server = TrackingServer.objects.select_for_update().filter(team=team).first()
        created = server is None
        if server is None:
            server = TrackingServer(team=team, url=url, experiment=experiment or default_experiment(team))
        experiment = (experiment.strip() if experiment is not None else server.experiment)
        if created or server.url != url or server.experiment != experiment:
            server.experiment_id, server.configured_at = "", now
            JobMirror.objects.filter(team=team).delete()
        server.url, server.experiment, server.updated_by = url, experiment, user
        if token is not None:
            server.token_ciphertext = team_secrets.encrypt(token) if token else ""
        server.error, server.error_at, server.failures, server.retry_at = "", None, 0, None
        server.save()
    return server, created


def server_clear(team) -> bool:
    """Remove ``team``'s tracking server (and its mirror records; the runs stay on the server). False: none."""
    deleted, _ = TrackingServer.objects.filter(team=team).delete()
    JobMirror.objects.filter(team=team).delete()
    return bool(deleted)


def server_token(server: TrackingServer) -> str:
    return team_secrets.decrypt(server.token_ciphertext) if server.token_ciphertext else ""


# -- what a run carries ---------------------------------------------------------------------------------------------
def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """A spec as MLflow params: nested mappings joined with dots (``optimizer.lr``), lists and scalars as JSON
    text (strings as themselves)."""
    if isinstance(value, dict):
        flat: dict[str, str] = {}
        for key, item in value.items():
            flat.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    if isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, sort_keys=True, default=str)
    return {prefix or "spec": text}


def _ms(moment: datetime | None) -> int:
    return int((moment or timezone.now()).timestamp() * 1000)


def gpu_seconds_used(job: Job) -> float:
    """The GPU-seconds billed for ``job``: the quota's own count (attempts and participants)."""
    from strata.quotas.selectors import job_usage

    return job_usage([job.pk])[job.pk]["gpu_seconds"]


def job_tags(job: Job) -> dict[str, str]:
    """The tags of a job's run: what it is and what it cost (refreshed every round, final at the end)."""
    attempt = Attempt.objects.filter(job=job, dispatched_at__isnull=False).order_by("-number").first()
    share = attempt.gpu_share if attempt is not None else job.gpus
    tags = {
        "strata.job_id": str(job.pk), "strata.team": job.team.slug, "strata.kind": job.kind,
        "strata.state": job.state, "strata.gpu_share": f"{share:g}", "strata.gpus_requested": f"{job.gpus:g}",
        "strata.gpu_seconds": f"{gpu_seconds_used(job):.3f}",
        "strata.attempts": str(Attempt.objects.filter(job=job).count()),
        "strata.url": f"{settings.STRATA_PUBLIC_URL.rstrip('/')}/jobs/{job.pk}/",
        "mlflow.user": job.owner.username, "mlflow.source.name": "strata", "mlflow.source.type": "JOB",
    }
    command = job.spec.get("command") if isinstance(job.spec, dict) else None
    if isinstance(command, list) and command:
        tags["strata.command"] = " ".join(str(arg) for arg in command)
    if job.reason and job.terminal:
        tags["strata.reason"] = job.reason
    return tags


# -- one job --------------------------------------------------------------------------------------------------------
def _run_start(client: MlflowRest, server: TrackingServer, job: Job) -> JobMirror:
    if not server.experiment_id:
        server.experiment_id = client.experiment_id(server.experiment)
        TrackingServer.objects.filter(pk=server.pk).update(experiment_id=server.experiment_id)
    tags = job_tags(job)
    parent = JobMirror.objects.filter(job_id=job.parent_id).first() if job.parent_id else None
    if parent is not None and parent.experiment_id == server.experiment_id:
        tags["mlflow.parentRunId"] = parent.run_id
    info = client.run_create(server.experiment_id, name=job.name, start_ms=_ms(job.started_at or job.created_at),
                             tags=tags)
    params = flatten(job.spec if isinstance(job.spec, dict) else {"spec": job.spec})
    client.log_batch(info["run_id"], params=params)
    mirror, _ = JobMirror.objects.update_or_create(job=job, defaults={
        "team_id": job.team_id, "run_id": info["run_id"], "experiment_id": server.experiment_id,
        "artifact_uri": info.get("artifact_uri", ""), "last_metric": 0, "state": JobMirror.State.ACTIVE,
        "artifacts": {}, "error": "", "updated_at": timezone.now()})
    return mirror


def _send_metrics(client: MlflowRest, mirror: JobMirror, tags: dict[str, str]) -> bool:
    """Send the job's points newer than ``mirror.last_metric`` (with ``tags``); True when none is left."""
    for _ in range(MAX_BATCHES_PER_JOB):
        points = list(MetricPoint.objects.filter(job_id=mirror.job_id, pk__gt=mirror.last_metric).order_by("pk")
                      .values_list("pk", "name", "step", "value", "time")[:MAX_METRICS_PER_BATCH])
        if not points:
            if tags:
                client.log_batch(mirror.run_id, tags=tags)
            return True
        client.log_batch(mirror.run_id, tags=tags, metrics=[
            {"key": name, "value": value, "step": step, "timestamp": _ms(moment)}
            for _, name, step, value, moment in points])
        tags = {}
        mirror.last_metric = points[-1][0]
        JobMirror.objects.filter(pk=mirror.pk).update(last_metric=mirror.last_metric, updated_at=timezone.now())
    return False


def _artifact_path(artifact: Artifact) -> str:
    return artifact.name if artifact.kind == Artifact.Kind.ARTIFACT else f"checkpoints/{artifact.name}"


def _send_artifacts(client: MlflowRest, mirror: JobMirror) -> dict[str, str]:
    """Copy the job's artifacts and checkpoints to the run (each once); returns {path: why} of those skipped."""
    from strata.jobs.storage import get_storage

    limit = settings.STRATA_MLFLOW_MAX_ARTIFACT_BYTES
    root = client.proxied_root(mirror.artifact_uri)
    skipped: dict[str, str] = {}
    for artifact in Artifact.objects.filter(job_id=mirror.job_id).order_by("kind", "name"):
        path, key = _artifact_path(artifact), str(artifact.pk)
        done = mirror.artifacts.get(key)
        if done == f"uploaded {artifact.sha256}":
            continue
        if done and not done.startswith("uploaded"):
            skipped[path] = done
            continue
        if root is None:
            why = f"the run's artifact store ({mirror.artifact_uri.split(':')[0]}) is not proxied by the tracking " \
                  "server (start it with artifact proxying on)"
        elif artifact.size > limit:
            why = f"{artifact.size} bytes, over STRATA_MLFLOW_MAX_ARTIFACT_BYTES={limit}"
        else:
            why = ""
            try:
                stream = get_storage().open(artifact.storage_key)
            except FileNotFoundError:
                why = "no longer stored (removed by retention)"
            else:
                with stream:
                    client.artifact_upload(root, path, stream, artifact.size)
        mirror.artifacts[key] = f"skipped: {why}" if why else f"uploaded {artifact.sha256}"
        if why:
            skipped[path] = mirror.artifacts[key]
        JobMirror.objects.filter(pk=mirror.pk).update(artifacts=mirror.artifacts, updated_at=timezone.now())
    return skipped


def mirror_job(client: MlflowRest, server: TrackingServer, job: Job) -> JobMirror | None:
    """Bring ``job``'s run up to date (create it, send new points, end it); returns its mirror, None when the
    job has not started. :class:`MlflowError` (or a storage error) leaves it to the next round."""
    if job.started_at is None:
        return None
    mirror = JobMirror.objects.filter(job=job).first()
    if mirror is None:
        mirror = _run_start(client, server, job)
    if mirror.state == JobMirror.State.DONE:
        return mirror
    terminal = job.state in TERMINAL_STATES
    if not _send_metrics(client, mirror, job_tags(job)):
        return mirror  # more points than a round sends: the rest (and the end) next round
    if not terminal:
        return mirror
    skipped = _send_artifacts(client, mirror)
    if skipped:
        client.log_batch(mirror.run_id, tags={"strata.artifacts_skipped": "; ".join(
            f"{path}: {why.removeprefix('skipped: ')}" for path, why in sorted(skipped.items()))})
    client.run_end(mirror.run_id, RUN_STATUS[JobState(job.state)], _ms(job.finished_at))
    mirror.state, mirror.error = JobMirror.State.DONE, ""
    JobMirror.objects.filter(pk=mirror.pk).update(state=mirror.state, error="", updated_at=timezone.now())
    return mirror


# -- a round --------------------------------------------------------------------------------------------------------
def jobs_to_mirror(server: TrackingServer):
    """The team's jobs a round looks at: started, not ended before the server was configured, not mirrored to
    the end; oldest first."""
    return (Job.objects.filter(team_id=server.team_id, started_at__isnull=False)
            .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=server.configured_at))
            .exclude(tracking_mirror__state=JobMirror.State.DONE)
            .select_related("team", "owner").order_by("started_at", "pk"))


def _backoff(failures: int) -> float:
    return min(settings.STRATA_MLFLOW_SYNC_SECONDS * 2 ** max(failures - 1, 0), settings.STRATA_MLFLOW_BACKOFF_MAX_S)


def mirror_team(server: TrackingServer, *, budget_s: float | None = None) -> int:
    """One round for one team; returns how many jobs' runs it touched. A failure (the server down, an error
    answer, a storage error) stops the team's round, records the error and backs off; it never raises."""
    started = time.monotonic()
    touched = 0
    client = None
    problems: list[str] = []
    try:
        client = MlflowRest(server.url, server_token(server), timeout=settings.STRATA_MLFLOW_TIMEOUT_S)
        if not server.experiment_id:  # the first round after a change checks the server, jobs or none
            server.experiment_id = client.experiment_id(server.experiment)
            TrackingServer.objects.filter(pk=server.pk).update(experiment_id=server.experiment_id)
        for job in jobs_to_mirror(server):
            try:
                if mirror_job(client, server, job) is not None:
                    touched += 1
            except MlflowError as error:
                if error.status != 400:
                    raise
                # the server refused something of this job's only: the others go on; it is retried next round
                problems.append(f"job {job.pk}: {error}")
                JobMirror.objects.filter(job=job).update(error=str(error)[:MAX_ERROR_CHARS], updated_at=timezone.now())
                log.warning("mirroring job %s of team %s: %s", job.pk, server.team_id, error)
            if budget_s is not None and time.monotonic() - started > budget_s:
                break  # the rest next round
    except (MlflowError, OSError, team_secrets.SecretUnreadable) as error:
        failures = server.failures + 1
        now = timezone.now()
        message = str(error)[:MAX_ERROR_CHARS] or error.__class__.__name__
        TrackingServer.objects.filter(pk=server.pk).update(
            error=message, error_at=now, failures=failures, retry_at=now + timedelta(seconds=_backoff(failures)))
        log.warning("mirroring team %s to %s failed (%d in a row): %s", server.team_id, server.url, failures, message)
        return touched
    finally:
        if client is not None:
            client.close()
    now = timezone.now()
    refused = f"{len(problems)} job(s) refused by the server; {problems[0]}"[:MAX_ERROR_CHARS] if problems else ""
    TrackingServer.objects.filter(pk=server.pk).update(error=refused, error_at=now if problems else None, failures=0,
                                                       retry_at=None, synced_at=now)
    return touched


ROUND_LEASE_S = 900.0  # a worker that died mid-round holds its team this long at most


def due_servers(now: datetime | None = None):
    """The servers whose round may start now: not backing off, not in another worker's round."""
    now = now or timezone.now()
    return (TrackingServer.objects.filter(Q(retry_at__isnull=True) | Q(retry_at__lte=now))
            .filter(Q(busy_until__isnull=True) | Q(busy_until__lte=now))
            .select_related("team").order_by("team__slug"))


def claim(server_id: int, now: datetime | None = None) -> TrackingServer | None:
    """Take the team's round (no other worker runs it until :func:`release` or the lease ends); None when it
    is backing off, busy elsewhere or gone."""
    now = now or timezone.now()
    taken = (TrackingServer.objects.filter(pk=server_id)
             .filter(Q(retry_at__isnull=True) | Q(retry_at__lte=now))
             .filter(Q(busy_until__isnull=True) | Q(busy_until__lte=now))
             .update(busy_until=now + timedelta(seconds=ROUND_LEASE_S)))
    return TrackingServer.objects.select_related("team").filter(pk=server_id).first() if taken else None


def release(server_id: int) -> None:
    TrackingServer.objects.filter(pk=server_id).update(busy_until=None)


def mirror_claimed(server_id: int, now: datetime | None = None) -> int | None:
    """One team's round, if it can be claimed now (what the ``tracking`` queue's task runs): runs touched, or
    None when it was not this worker's to run."""
    server = claim(server_id, now)
    if server is None:
        return None
    try:
        return mirror_team(server, budget_s=settings.STRATA_MLFLOW_ROUND_BUDGET_S)
    finally:
        release(server_id)


def mirror_all(now: datetime | None = None) -> dict[str, int]:
    """One round, here and now, for every team whose server is due: {team slug: runs touched}."""
    rounds = {}
    for server in due_servers(now):
        touched = mirror_claimed(server.pk, now)
        if touched is not None:
            rounds[server.team.slug] = touched
    return rounds
