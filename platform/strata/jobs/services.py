"""Writes on jobs and attempts: submit, cancel, and the node-side attempt protocol.

Every attempt call from a node carries the attempt id and its fencing token; a call for an attempt that
has ended or whose token does not match raises :class:`StaleAttempt` (HTTP 409), so a zombie cannot write.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from datetime import timedelta
from typing import BinaryIO

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from components.runtime.shared import protocol
from components.runtime.shared.tokens import token_digest
from strata.cluster.models import Device
from strata.jobs import history, log_search
from strata.jobs.data import data_link
from strata.jobs.events import emit
from strata.jobs.events import subscribers as event_subscribers
from strata.jobs.models import (
    TERMINAL_STATES,
    Allocation,
    Artifact,
    Attempt,
    CodeBundle,
    Job,
    JobEvent,
    JobState,
    JobToken,
    LogLine,
    MetricPoint,
)
from strata.jobs.states import InvalidTransition, transition
from strata.jobs.storage import get_storage

S = JobState


class IdempotencyConflict(Exception):
    """The Idempotency-Key was used before with a different request body."""


class SubmitRejected(Exception):
    """A submitted job cannot be accepted; ``field`` names the part of the request at fault (a 400)."""

    def __init__(self, field: str, message: str):
        self.field, self.message = field, message
        super().__init__(message)


class QuotaRejected(SubmitRejected):
    """The job can never run under its team's quota."""


class StaleAttempt(Exception):
    """A report for an attempt that ended or whose fencing token does not match."""


def request_digest(data: dict) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def job_event(job_id, kind: str, message: str, attempt=None, **data) -> None:
    JobEvent.objects.create(job_id=job_id, attempt=attempt, kind=kind, message=message[:1000], data=data)


def job_submit(*, user, team, data: dict, idempotency_key: str | None = None,
               parent: Job | None = None, nested: bool = False) -> tuple[Job, bool]:
    """Record a validated job (a child of ``parent`` when given) and admit it under the team's quota -- or, for a
    ``nested`` child, at once: it runs inside its parent's allocation, whose admission already counted the team's
    quota. Returns (job, created)."""
    from strata.celery import request_pass
    from strata.quotas.models import Quota
    from strata.quotas.services import ClusterView, admit_pending, member_never_fits, never_fits

    digest = request_digest({**data, "team": team.slug})
    if idempotency_key:
        existing = Job.objects.filter(owner=user, idempotency_key=idempotency_key).first()
        if existing is not None:
            if existing.request_digest != digest:
                raise IdempotencyConflict(idempotency_key)
            return existing, False
    data = dict(data)
    code = data.pop("code", None)
    if code is None and parent is not None:
        data["code"] = parent.code  # a child (a sweep's trial) runs its parent's project unless it names its own
    elif code is not None:
        from strata.jobs.code import CodeRejected, code_of_team

        try:
            data["code"] = code if isinstance(code, CodeBundle) else code_of_team(team, code)
        except CodeRejected as error:
            raise SubmitRejected("code", str(error)) from None
    job = Job(team=team, owner=user, idempotency_key=idempotency_key or None, request_digest=digest, parent=parent,
              nested=nested, **data)
    check_sources(team, job.kind, job.spec)
    check_secrets(team, job.spec)
    job.spec = resolve_data(team, job.spec)
    if not nested:
        view = ClusterView()
        # Hardware no registered node has is refused at once; labels no node carries yet only keep the job
        # PENDING (a node with them may register later), where it holds none of the team's quota.
        unlabelled = {k: v for k, v in job.resources.items() if k != "node_labels"}
        if problem := view.problem(unlabelled):
            raise SubmitRejected("resources", f"no node in the cluster could ever run it: {problem}")
        quota = Quota.objects.filter(team=team).first()
        if quota is not None and (reason := never_fits(quota, job, view)):
            raise QuotaRejected("resources", f"can never run under the team's quota: {reason}")
        if reason := member_never_fits(job, view):
            raise QuotaRejected("resources", f"can never run under your limits in the team: {reason}")
    try:
        with transaction.atomic():
            job.save()
            data_link(job)
            job_event(job.pk, "state", "PENDING: submitted", state=S.PENDING)
            history.record("submit", job=job, kind=job.kind, team=team.slug, max_attempts=job.max_attempts,
                           parent=str(parent.pk) if parent is not None else None)
            if event_subscribers("job.transitioned"):
                from components.runtime.contract.events import JobTransitioned

                emit(JobTransitioned(job_id=str(job.pk), team_id=team.pk, kind=job.kind, source=None,
                                     target=S.PENDING, reason="submitted"))
            if nested:  # no quota admission: its parent's admission counted the team's quota
                transition(job, S.PENDING, S.QUEUED, f"admitted inside its parent {job.parent_id}'s allocation")
    except IntegrityError:
        if idempotency_key:
            existing = Job.objects.filter(owner=user, idempotency_key=idempotency_key).first()
            if existing is not None:
                if existing.request_digest != digest:
                    raise IdempotencyConflict(idempotency_key) from None
                return existing, False
        raise
    if not nested:
        admit_pending(team.pk)
    job.refresh_from_db()
    transaction.on_commit(request_pass)
    return job, True


def parent_room(attempt: Attempt) -> list[dict]:
    """The devices ``attempt`` holds, as nested children see them: ``[{"node", "device", "index", "share",
    "memory", "memory_total", "cpu"}]`` (whole allocations only, not nested ones; ``cpu``: the CPUs it reserved
    on a node's CPU device, ``share`` of them, with ``memory`` bytes of host memory)."""
    rows = (Allocation.objects.filter(attempt=attempt, active=True, nested=False)
            .values_list("device__node_id", "device_id", "device__index", "share", "memory", "device__memory_total",
                         "device__kind"))
    return [{"node": node, "device": device, "index": index, "share": share, "memory": memory,
             "memory_total": total, "cpu": kind == Device.Kind.CPU}
            for node, device, index, share, memory, total, kind in rows]


def nested_fit_problem(resources: dict, room: list[dict]) -> str | None:
    """Why a nested child with ``resources`` could never fit in its parent's allocation ``room``; None if it
    could (with every other child gone)."""
    if int(resources.get("workers", 1)) != 1:
        return "a nested child runs one worker"
    gpus = float(resources.get("gpus", 0))
    memory = resources.get("gpu_memory")
    cpus, host_memory = float(resources.get("cpus") or 0), int(resources.get("memory") or 0)
    hosts = [entry for entry in room if entry["cpu"]]
    room = [entry for entry in room if not entry["cpu"]]
    if (cpus or host_memory) and not any(e["share"] >= cpus - 1e-9 and e["memory"] >= host_memory for e in hosts):
        return (f"its parent reserved at most {max((e['share'] for e in hosts), default=0):g} CPUs and "
                f"{max((e['memory'] for e in hosts), default=0)} bytes of memory on one node")
    if gpus <= 0 and memory is None:  # it holds no GPU: the parent's CPUs are its room
        return None
    if not room:
        return "its parent holds no devices"
    if gpus > 1:
        whole: dict = {}
        for entry in room:
            if entry["share"] >= 1 - 1e-9 and (memory is None or entry["memory"] >= memory):
                whole[entry["node"]] = whole.get(entry["node"], 0) + 1
        if max(whole.values(), default=0) < round(gpus):
            return f"its parent holds at most {max(whole.values(), default=0)} whole device(s) on one node"
        return None
    for entry in room:
        need = memory if memory is not None else entry["memory_total"] * gpus
        if entry["share"] >= gpus - 1e-9 and entry["memory"] >= need:
            return None
    largest = max(entry["share"] for entry in room)
    return f"its parent holds at most {largest:g} of one device" + (f" and {max(e['memory'] for e in room)} bytes"
                                                                   if memory is not None else "")


def check_sources(team, kind: str, spec: dict) -> None:
    """Every job a spec reads from must be a job of ``team`` of the right kind that SUCCEEDED and stored the
    artifact. Another team's job is reported exactly like a missing one."""
    from components.runtime.contract.registry import get_kind, kinds

    kind_spec = get_kind(kind)
    for ref in kind_spec.sources(spec):
        source = Job.objects.filter(pk=ref.job, team=team).only("kind", "state", "spec").first()
        if source is None:
            raise SubmitRejected(ref.field, f"no job {ref.job} in team {team.slug}")
        if ref.kind is None:
            if ref.artifact not in getattr(kinds().get(source.kind), "products", ()):
                makers = ", ".join(sorted(name for name, spec in kinds().items() if ref.artifact in spec.products))
                raise SubmitRejected(ref.field, f"job {ref.job} is a {source.kind} job, which writes no "
                                                f"{ref.artifact} (kinds that do: {makers or 'none'})")
        elif source.kind != ref.kind:
            raise SubmitRejected(ref.field, f"job {ref.job} is a {source.kind} job, not a {ref.kind} job")
        if source.state != S.SUCCEEDED:
            raise SubmitRejected(ref.field, f"job {ref.job} is {source.state}; it must have SUCCEEDED")
        if not Artifact.objects.filter(job_id=source.pk, name=ref.artifact, kind=Artifact.Kind.ARTIFACT).exists():
            raise SubmitRejected(ref.field, f"job {ref.job} has no {ref.artifact} artifact")
        if problem := kind_spec.source_problem(ref, source.spec, spec):
            raise SubmitRejected(ref.field, problem)


def check_secrets(team, spec: dict) -> None:
    """The secrets a spec asks for (``environment.secrets``, whatever its kind) must be the team's: a missing one
    (another team's included) is a 400 naming ``spec.environment.secrets``."""
    from components.runtime.contract.project import requested_secrets, secrets_errors
    from strata.accounts.team_secrets import secrets_missing

    environment = spec.get("environment") if isinstance(spec, dict) else None
    if not isinstance(environment, dict) or environment.get("secrets") is None:
        return
    field = "spec.environment.secrets"
    if problems := secrets_errors(environment.get("secrets"), field):
        raise SubmitRejected(field, problems[field])
    if missing := secrets_missing(team.pk, requested_secrets(spec)):
        raise SubmitRejected(field, f"team {team.slug} has no secret {', '.join(missing)} "
                                    "(set one with `strata secrets set NAME`)")


def record_lookup(team):
    """``lookup(collection, name)``: the body (with ``name``) of ``team``'s record of that name in a plugin's
    collection, or of the collection's built-in entry of that name; None when there is neither. The core's own
    collection ``DATA_COLLECTION`` is the team's uploaded data sets (``strata.jobs.data``)."""
    from components.runtime.contract import registry
    from components.runtime.contract.data import DATA_COLLECTION
    from strata.jobs.data import data_lookup
    from strata.jobs.models import PluginRecord

    def lookup(collection: str, name: str) -> dict | None:
        if collection == DATA_COLLECTION:
            return data_lookup(team, name)
        found = registry.collections().get(collection)
        if found is None:
            return None
        builtin = next((item for item in found.builtins() if item.get("name") == name), None)
        if builtin is not None:
            return dict(builtin)
        record = PluginRecord.objects.filter(collection=collection, team=team, name=name).first()
        return {**record.body, "name": record.name} if record is not None else None

    return lookup


def resolve_data(team, spec: dict) -> dict:
    """The spec with its ``data`` options resolved by their providers (names of the team's registered records
    replaced by what they name, see ``DataProvider.resolve``); a name that resolves to nothing is a 400."""
    from components.runtime.contract.data import resolve_options

    data = spec.get("data") if isinstance(spec, dict) else None
    if not isinstance(data, dict) or not data:
        return spec
    resolved, errors = resolve_options(data, record_lookup(team))
    if errors:
        field, message = next(iter(errors.items()))
        raise SubmitRejected(field, message)
    return {**spec, "data": resolved}


def job_token_create(job: Job, *, user, name: str = "", expires_in_s: int | None = None) -> tuple[JobToken, str]:
    """Issue an access token for ``job``'s services; returns the row and the raw token (shown once).

    Only kinds whose ``KindSpec.accepts_tokens`` is true have tokens, and not once the job has ended (a
    :class:`SubmitRejected` on ``kind`` or ``state``, a 400)."""
    from components.runtime.contract.registry import get_kind

    if not get_kind(job.kind).accepts_tokens:
        raise SubmitRejected("kind", f"{job.kind} jobs take no access tokens: nothing in them checks one")
    if job.state in TERMINAL_STATES:
        raise SubmitRejected("state", f"job {job.pk} is {job.state}: an ended job serves nothing")
    prefix = secrets.token_hex(4)
    raw = f"sj_{prefix}_{secrets.token_urlsafe(32)}"
    expires_at = timezone.now() + timedelta(seconds=expires_in_s) if expires_in_s else None
    token = JobToken.objects.create(job=job, name=name, prefix=prefix, digest=token_digest(raw),
                                    created_by=user, expires_at=expires_at)
    job_event(job.pk, "token", f"access token {prefix}… ({name or 'unnamed'}) issued by {user}")
    return token, raw


def job_token_revoke(token: JobToken, *, user) -> JobToken:
    """Revoke ``token`` (idempotent); the job's attempts stop accepting it at their next refresh."""
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        job_event(token.job_id, "token", f"access token {token.prefix}… ({token.name or 'unnamed'}) revoked by {user}")
    return token


def job_token_digests(job: Job) -> list[str]:
    """SHA-256 digests of the tokens that work for ``job`` (neither revoked nor expired): its own and, for a
    child job, its parent's (the replicas a deployment starts as children answer the deployment's tokens)."""
    from django.db.models import Q

    now = timezone.now()
    owners = [job.pk] if job.parent_id is None else [job.pk, job.parent_id]
    return list(JobToken.objects.filter(job_id__in=owners, revoked_at__isnull=True)
                .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now)).values_list("digest", flat=True))


def participant_admission(team_id: int, gpus: float) -> str | None:
    """Why a participant bringing ``gpus`` GPUs cannot join a job of the team now (the quota's ``max_gpus`` or its
    GPU-hours), or None. Call it inside the transaction that records the participant: it locks the team's quota row
    as admission does (``quotas.services.participant_refusal``)."""
    from strata.quotas.services import participant_refusal

    return participant_refusal(team_id, gpus)


def attempt_credential(attempt: Attempt, node, subject: str) -> dict:
    """A job credential (``strata.jobs.credentials.sign``) for ``subject``, held by this rank's node of a live
    attempt (already checked by ``attempt_for_node``): ``{"credential", "public_key", "expires", "issued"}``."""
    from strata.jobs.credentials import sign

    return sign(attempt.job_id, subject, f"attempt {attempt.pk} on node {node.name}")


def job_cancel(job: Job, reason: str = "cancelled by user", *, request=None) -> Job:
    """Cancel a job and, in the same transaction, its child jobs that have not ended (recursively). A running
    attempt keeps its devices until its node confirms the child process is gone. Cancelled by a ``request`` of
    someone else than its owner, it leaves a ``job.cancel_other`` entry in the audit log."""
    from strata.celery import request_pass

    history.record("cancel", job=job, now=True, terminal=job.terminal, reason=reason[:200])
    if job.terminal:
        return job
    with transaction.atomic():
        for child in Job.objects.filter(parent=job).exclude(state__in=TERMINAL_STATES):
            job_cancel(child, f"parent job {job.pk} was cancelled")
        try:
            before = job.state
            transition(job, [S.PENDING, S.QUEUED, S.SCHEDULED, S.RUNNING, S.PREEMPTED], S.CANCELLED, reason)
        except InvalidTransition:
            job.refresh_from_db()
            return job
        _audit_other("job.cancel_other", job, request, before={"state": before}, after={"state": job.state})
        # An attempt no node has claimed yet is released at once; a claimed one keeps its devices until
        # its node confirms the child process is gone.
        for attempt in Attempt.objects.filter(job=job, ended_at__isnull=True, started_at__isnull=True):
            _release(attempt, Attempt.Outcome.CANCELLED, "cancelled before it started")
    transaction.on_commit(request_pass)
    return job


def child_submit(attempt: Attempt, data: dict, idempotency_key: str | None = None, *,
                 nested: bool = False, checkpoint_from: Job | None = None,
                 by_parent: bool = False) -> tuple[Job, bool]:
    """Submit a child job of the attempt's job: same team and owner, the normal checks and quota admission; or,
    ``nested``, inside the attempt's own allocation (refused when it could never fit there). Only a running job
    may have children submitted.

    ``checkpoint_from`` (another child of the same job): the new child starts from a copy of that job's latest
    checkpoint, as if it had written it itself (a population member that takes a better member's weights; a
    second training phase that goes on from the first). The copy is recorded in the same transaction as the
    child, so no node can start it before its checkpoint is there."""
    parent = attempt.job
    if parent.state != S.RUNNING:
        raise InvalidTransition(parent.pk, [S.RUNNING], "child submit", parent.state)
    if by_parent and not nested:  # ``by_parent``: its parent runs it itself, never placed (strata.jobs.parent_run)
        raise SubmitRejected("nested", "a child its parent runs itself must be nested")
    if nested and (problem := nested_fit_problem(data.get("resources") or {}, parent_room(attempt))):
        raise SubmitRejected("resources", f"cannot run inside its parent's allocation: {problem}")
    source = None
    if checkpoint_from is not None:
        if checkpoint_from.parent_id != parent.pk:
            raise SubmitRejected("checkpoint_from", "must be a child job of the same parent")
        source = latest_checkpoint(checkpoint_from)
        if source is None:
            raise SubmitRejected("checkpoint_from", f"job {checkpoint_from.pk} has no checkpoint yet")
    with transaction.atomic():
        job, created = job_submit(user=parent.owner, team=parent.team, data=data, idempotency_key=idempotency_key,
                                  parent=parent, nested=nested)
        if created and source is not None:
            checkpoint_copy(source, job)
        if created and by_parent:
            from strata.jobs.parent_run import mark_by_parent

            mark_by_parent(job)
    return job, created


def latest_checkpoint(job: Job) -> Artifact | None:
    """The newest checkpoint ``job`` wrote (from any attempt), or None."""
    return Artifact.objects.filter(job_id=job.pk, kind=Artifact.Kind.CHECKPOINT).order_by("-created_at").first()


def checkpoint_copy(source: Artifact, job: Job) -> Artifact:
    """Give ``job`` a copy of checkpoint ``source`` (of another job) as its own latest checkpoint."""
    storage = get_storage()
    key = f"{job.pk}/{Artifact.Kind.CHECKPOINT}/{source.name}"
    storage_admission(job.team_id, source.size)
    with storage.open(source.storage_key) as data:
        size, sha = storage.save(key, data, settings.STRATA_MAX_UPLOAD_BYTES)
    artifact, _ = Artifact.objects.update_or_create(
        job_id=job.pk, kind=Artifact.Kind.CHECKPOINT, name=source.name,
        defaults={"attempt": None, "size": size, "sha256": sha, "storage_key": key, "created_at": timezone.now()})
    job_event(job.pk, "checkpoint", f"starts from job {source.job_id}'s checkpoint ({size} bytes)")
    return artifact


def job_hold(job: Job, reason: str = "held") -> Job:
    """Hold ``job``: it keeps its place but is never placed until :func:`job_release`. A running or scheduled job
    is preempted first (it stops at its next checkpoint and is requeued, held)."""
    from strata.celery import request_pass

    with transaction.atomic():
        if job.terminal or not Job.objects.filter(pk=job.pk, held=False).exclude(
                state__in=TERMINAL_STATES).update(held=True):
            job.refresh_from_db()
            return job
        try:
            transition(job, [S.RUNNING, S.SCHEDULED], S.PREEMPTED, f"held: {reason}")
        except InvalidTransition:
            Job.objects.filter(pk=job.pk, state__in=[S.PENDING, S.QUEUED]).update(reason=f"held: {reason}")
        job_event(job.pk, "hold", f"held: {reason}")
    transaction.on_commit(request_pass)
    job.refresh_from_db()
    return job


def job_release(job: Job, reason: str = "released") -> Job:
    """Let a held job be placed again."""
    from strata.celery import request_pass

    with transaction.atomic():
        if Job.objects.filter(pk=job.pk, held=True).update(held=False):
            Job.objects.filter(pk=job.pk, state=S.QUEUED).update(reason=f"{reason}; waiting to be placed")
            job_event(job.pk, "hold", reason)
    transaction.on_commit(request_pass)
    job.refresh_from_db()
    return job


def job_resize(job: Job, resources: dict, reason: str = "resized") -> Job:
    """Give ``job`` new (normalized) resources: a queued job is placed with them; a running or scheduled one is
    preempted (it checkpoints) and requeued with them. A nested child's must fit its parent's allocation."""
    from strata.celery import request_pass

    if job.nested and job.parent_id is not None:
        live = Attempt.objects.filter(job_id=job.parent_id, ended_at__isnull=True).first()
        if live is not None and (problem := nested_fit_problem(resources, parent_room(live))):
            raise SubmitRejected("resources", f"cannot run inside its parent's allocation: {problem}")
    with transaction.atomic():
        if job.terminal:
            return job
        Job.objects.filter(pk=job.pk).update(resources=resources)
        job.resources = resources
        job_event(job.pk, "resize", f"{reason}: {resources}", resources=resources)
        try:
            transition(job, [S.RUNNING, S.SCHEDULED], S.PREEMPTED, f"{reason}: restarting with {resources}")
        except InvalidTransition:
            pass
    transaction.on_commit(request_pass)
    job.refresh_from_db()
    return job


def children_of(job: Job):
    return Job.objects.filter(parent=job).order_by("created_at")


def children_end_with(job: Job) -> None:
    """A parent that ended (succeeded or failed) takes its children that have not ended with it."""
    for child in Job.objects.filter(parent=job).exclude(state__in=TERMINAL_STATES):
        job_cancel(child, f"parent job {job.pk} ended {job.state}")


def job_resubmit(job: Job, *, user, request=None) -> Job:
    """Submit a copy of ``job`` as ``user``; by someone else than its owner, with a ``job.resubmit_other`` entry
    in the audit log (in the submit's transaction)."""
    data = {field: getattr(job, field) for field in
            ("kind", "name", "spec", "resources", "priority", "max_attempts", "time_limit", "keep")}
    with transaction.atomic():
        new_job, _ = job_submit(user=user, team=job.team, data=data)
        _audit_other("job.resubmit_other", job, request, actor=user, after={"job": new_job.pk})
    return new_job


def _audit_other(action: str, job: Job, request, *, actor=None, before=None, after=None) -> None:
    """An audit log entry for ``action`` on ``job`` when the one acting (``actor``, else the request's user) is
    not its owner: another person's job cancelled or resubmitted."""
    from strata.audit.services import record

    user = actor if actor is not None else getattr(request, "user", None)
    if user is None or not user.is_authenticated or user.pk == job.owner_id:
        return
    record(action, request=request, actor=user, team=job.team, target=f"job {job.pk}",
           before={"owner": job.owner.username, **(before or {})}, after=after)


# --- the node-side attempt protocol ------------------------------------------------------------------------

def attempt_for_node(attempt_id, fencing_token: str, node=None, *, lock: bool = False) -> Attempt:
    queryset = Attempt.objects.select_related("job")
    if lock:
        queryset = queryset.select_for_update()
    attempt = queryset.filter(pk=attempt_id).first()
    problem = None
    if attempt is None or attempt.fencing_token != fencing_token:
        problem = "unknown attempt or fencing token mismatch"
    elif node is not None and attempt.node_id != node.pk \
            and not attempt.allocations.filter(device__node_id=node.pk).exists():
        # A gang spans nodes: every node holding one of the attempt's allocations runs its own ranks.
        problem = "attempt belongs to another node"
    elif attempt.ended_at is not None:
        problem = f"attempt already ended ({attempt.outcome})"
    if problem:
        history.record("rejected", job=attempt.job_id if attempt else None, attempt=attempt_id, token=fencing_token,
                       now=True, node=getattr(node, "name", None), problem=problem)
        raise StaleAttempt(problem)
    return attempt


# Job states in which a still-running attempt must stop.
STOPPED_STATES = frozenset({S.CANCELLED, S.PREEMPTED, S.SUCCEEDED, S.FAILED})


def attempt_stop_requested(attempt: Attempt) -> bool:
    return attempt.ended_at is not None or attempt.job.state in STOPPED_STATES


@transaction.atomic
def attempt_claim(attempt_id, fencing_token: str, node) -> Attempt:
    """The node starts the attempt: SCHEDULED -> RUNNING. Each node claims its part once: a second claim from the
    same node (a redelivered or republished dispatch, or a restarted worker's) is refused as stale, so the
    attempt never runs twice there; an attempt whose node lost it ends through its heartbeats instead
    (cluster.services) and the job runs again as a new attempt."""
    attempt = attempt_for_node(attempt_id, fencing_token, node, lock=True)
    now = timezone.now()
    mine = Allocation.objects.filter(attempt=attempt, device__node=node)
    if mine.filter(claimed_at__isnull=False).exists():
        history.record("rejected", job=attempt.job_id, attempt=attempt, token=fencing_token, now=True,
                       node=node.name, problem="already claimed by this node")
        raise StaleAttempt("already claimed by this node: a duplicate dispatch")
    mine.update(claimed_at=now)
    if attempt.started_at is None:
        attempt.started_at = now
        attempt.save(update_fields=["started_at"])
    history.record("start", job=attempt.job_id, attempt=attempt, token=fencing_token, number=attempt.number,
                   node=node.name, started_at=history.timestamp(attempt.started_at))
    if attempt.job.state == S.SCHEDULED:
        fields = {} if attempt.job.started_at else {"started_at": attempt.started_at}
        transition(attempt.job, S.SCHEDULED, S.RUNNING, f"attempt {attempt.number} started on {node.name}", **fields)
    return attempt


def attempt_rendezvous_publish(attempt: Attempt, node, port: int, suffix: str = "") -> str:
    """Rank 0 of an attempt announces the port its store listens on; the address is the one its node registered
    (never one the caller names), followed by ``suffix`` (already checked: ``Context.RENDEZVOUS_SUFFIX``). Only
    the node holding rank 0 may publish; republishing replaces the address. Returns ``host:port`` + suffix."""
    if not attempt.allocations.filter(rank=0, device__node=node).exists():
        raise StaleAttempt("only the node running rank 0 publishes the rendezvous")
    host = node.address or "127.0.0.1"
    address = (f"[{host}]:{int(port)}" if ":" in host else f"{host}:{int(port)}") + suffix
    if address != attempt.rendezvous:
        Attempt.objects.filter(pk=attempt.pk).update(rendezvous=address)
        attempt.rendezvous = address
        job_event(attempt.job_id, "rendezvous", f"rank 0 listens on {address}", attempt=attempt, address=address)
    return address


def attempt_rendezvous(attempt: Attempt) -> dict:
    """What a rank needs to join: rank 0's address (None until published), the world size, and each rank's
    node name."""
    nodes = {}
    for rank, name in attempt.allocations.order_by("rank").values_list("rank", "device__node__name"):
        nodes.setdefault(rank, name)
    return {"address": attempt.rendezvous or None, "world_size": int(attempt.job.resources.get("workers", 1)),
            "nodes": [nodes[rank] for rank in sorted(nodes)]}


def attempt_report(attempt: Attempt, *, logs=(), metrics=(), endpoint: str | None = None,
                   reports: dict | None = None) -> None:
    """Append log lines and metric points sent by a running attempt; record where it serves requests and the
    plugins' reports about it (already checked by their schemas)."""
    now = timezone.now()
    history.record("heartbeat", job=attempt.job_id, attempt=attempt, token=attempt.fencing_token,
                   number=attempt.number, logs=len(logs), metrics=len(metrics))
    if reports:
        from strata.cluster.services import reports_merge

        merged = reports_merge(attempt.reports, reports, now)
        Attempt.objects.filter(pk=attempt.pk).update(reports=merged)
        attempt.reports = merged
    if endpoint and endpoint != attempt.endpoint:
        Attempt.objects.filter(pk=attempt.pk).update(endpoint=endpoint)
        attempt.endpoint = endpoint
        job_event(attempt.job_id, "endpoint", f"listening on {endpoint}", attempt=attempt, endpoint=endpoint)
    limit = settings.STRATA_MAX_LOG_LINES_PER_JOB
    if logs:
        room = limit - LogLine.objects.filter(job_id=attempt.job_id).count()
        redact = _redactor(attempt) if room > 0 else None
        lines = [LogLine(job_id=attempt.job_id, attempt=attempt, level=str(item.get("level", "info"))[:16],
                         message=_redacted(str(item.get("message", "")), redact)[:10000], time=item.get("time") or now)
                 for item in logs[: max(room, 0)]]
        for line in lines:
            line.rank = log_search.rank_of(line.message)
        LogLine.objects.bulk_create(lines)
        log_search.note_dropped(attempt.job_id, list(logs[max(room, 0):]), now)
    if metrics and event_subscribers("metrics.reported"):
        from components.runtime.contract.events import MetricsReported

        last = {}
        for item in sorted(metrics, key=lambda item: int(item["step"])):
            last[str(item["name"])[:100]] = float(item["value"])
        kind = Job.objects.filter(pk=attempt.job_id).values_list("kind", flat=True).first() or ""
        emit(MetricsReported(job_id=str(attempt.job_id), attempt_id=str(attempt.pk), kind=kind, last=last,
                             step=max(int(item["step"]) for item in metrics)))
    if metrics:
        MetricPoint.objects.bulk_create([
            MetricPoint(job_id=attempt.job_id, attempt=attempt, name=str(item["name"])[:100], step=int(item["step"]),
                        value=float(item["value"]), time=item.get("time") or now)
            for item in metrics
        ])


def _redactor(attempt: Attempt):
    """What replaces the values of the secrets ``attempt``'s job asks for with ``***`` (None when it asks for
    none): applied to what the attempt reports before it is stored."""
    from strata.accounts.team_secrets import redactor

    job = attempt.job if Attempt.job.is_cached(attempt) else Job.objects.only("team_id", "spec").get(pk=attempt.job_id)
    return redactor(job)


def _redacted(text: str, redact) -> str:
    return redact(text) if redact is not None else text


def _release(attempt: Attempt, outcome: str, reason: str) -> bool:
    """End an attempt and free its devices. False if it had already ended (someone else won)."""
    now = timezone.now()
    ended = Attempt.objects.filter(pk=attempt.pk, ended_at__isnull=True).update(
        ended_at=now, outcome=outcome, exit_reason=reason[:500])
    if ended:
        history.record("finish", job=attempt.job_id, attempt=attempt, token=attempt.fencing_token,
                       number=attempt.number, outcome=str(outcome), reason=reason[:200],
                       ended_at=now.timestamp(), share=attempt.gpu_share)
        Allocation.objects.filter(attempt=attempt).update(active=False)
        # Nested children ran inside this attempt's allocation: they stop with it, and wait for its next one.
        for child in Job.objects.filter(parent_id=attempt.job_id, nested=True, state__in=[S.RUNNING, S.SCHEDULED]):
            try:
                transition(child, [S.RUNNING, S.SCHEDULED], S.PREEMPTED,
                           f"its parent's attempt {attempt.number} ended; waiting for the parent to run again")
            except InvalidTransition:
                continue
        from strata.jobs.parent_run import requeue_after_parent

        requeue_after_parent(attempt)
        job_event(attempt.job_id, "attempt", f"attempt {attempt.number} ended: {outcome} {reason}".strip(),
                  attempt=attempt, outcome=outcome)
        if event_subscribers("attempt.ended"):
            from components.runtime.contract.events import AttemptEnded

            kind = Job.objects.filter(pk=attempt.job_id).values_list("kind", flat=True).first() or ""
            emit(AttemptEnded(attempt_id=str(attempt.pk), job_id=str(attempt.job_id), kind=kind,
                              number=attempt.number, outcome=str(outcome), reason=reason[:500],
                              node_id=str(attempt.node_id) if attempt.node_id else None))
    return bool(ended)


# How an attempt ended, as data (components.runtime.shared.protocol, shared with the node's worker): an outcome that
# ``requeue``s (a host such as a device's sharing service died under the attempt) is recorded as that outcome
# (Attempt.Outcome.SERVICE_LOST) and the job is requeued without counting a failure, as for a lost node --
# except that the LOST_LIMIT-th such loss of one job fails it (a crash loop must end).
SERVICE_LOST_REASON = protocol.LOST_REASON
SERVICE_LOST_LIMIT = protocol.LOST_LIMIT
REQUEUED_OUTCOMES = frozenset({Attempt.Outcome.NODE_LOST, Attempt.Outcome.SERVICE_LOST})


def attempt_finish(attempt_id, fencing_token: str, node, outcome: str, reason: str = "") -> Job:
    """The node reports that an attempt's child exited. Decides the job's next state."""
    from strata.celery import request_pass

    with transaction.atomic():
        attempt = attempt_for_node(attempt_id, fencing_token, node, lock=True)
        job = attempt.job
        job.refresh_from_db()
        if reason:  # the job's own words (its last lines of stderr): never its secrets
            reason = _redacted(reason, _redactor(attempt))
        if _secondary_end(attempt, job, node, outcome):
            # A gang spanning nodes: the other ranks return while rank 0 still evaluates, uploads the model or
            # saves the checkpoint of a stop; the attempt ends when rank 0's node (the attempt's) says so. A
            # failure or a time limit on any node ends it at once (rank 0's node then stops its ranks).
            job_event(job.pk, "attempt", f"the ranks on {node.name} ended ({outcome}"
                      + (f": {reason}" if reason else "") + "); the attempt ends with rank 0's node",
                      attempt=attempt, node=node.name, outcome=outcome)
            return job
        final = False
        if job.state == S.CANCELLED:
            outcome = Attempt.Outcome.CANCELLED
        elif job.state == S.PREEMPTED:
            outcome = Attempt.Outcome.PREEMPTED
        elif outcome in protocol.OUTCOMES and protocol.outcome(outcome).requeue:
            outcome, reason, final = _service_lost(job, attempt, reason)
        elif outcome in protocol.OUTCOMES and protocol.outcome(outcome).final:
            final = True  # a time limit, or the job's own deterministic error: no retry would end otherwise
        _release(attempt, outcome, reason)
        _after_attempt(job, attempt, outcome, reason, final=final)
    transaction.on_commit(request_pass)
    job.refresh_from_db()
    return job


def _secondary_end(attempt: Attempt, job: Job, node, outcome: str) -> bool:
    """True when ``node`` is not the attempt's own node (rank 0's) and its ranks ended without a failure of their
    own: they succeeded, or stopped because the job was cancelled or preempted. For a kind whose ranks are
    independent peers (``KindSpec.elastic_ranks``) a failure of another node's ranks does not end the attempt
    either: the peers on the other nodes carry on."""
    if node is None or attempt.node_id is None or node.pk == attempt.node_id:
        return False
    if outcome == Attempt.Outcome.FAILED and _elastic(job.kind):
        return True
    return outcome == Attempt.Outcome.SUCCEEDED or job.state in {S.CANCELLED, S.PREEMPTED}


def _elastic(kind: str) -> bool:
    from components.runtime.contract.registry import get_kind

    try:
        return bool(get_kind(kind).elastic_ranks)
    except Exception:  # noqa: BLE001 - an unknown kind is no swarm
        return False


def _service_lost(job: Job, attempt: Attempt, detail: str) -> tuple[str, str, bool]:
    """``(outcome, reason, final)`` for an attempt whose GPU-sharing service died: a node loss (requeue, no
    failure counted) unless the job already lost its service SERVICE_LOST_LIMIT - 1 times (then it fails)."""
    losses = 1 + Attempt.objects.filter(job_id=job.pk, outcome=Attempt.Outcome.SERVICE_LOST).exclude(
        pk=attempt.pk).count()
    suffix = f" ({detail})" if detail else ""
    if losses >= SERVICE_LOST_LIMIT:
        return (Attempt.Outcome.FAILED,
                f"{SERVICE_LOST_REASON} under this job {losses} times; not requeued again{suffix}", True)
    return Attempt.Outcome.SERVICE_LOST, f"{SERVICE_LOST_REASON}; requeued{suffix}", False


def _after_attempt(job: Job, attempt: Attempt, outcome: str, reason: str, *, final: bool = False) -> None:
    """Move the job on after its attempt ended with ``outcome``; ``final``: a failure that is not retried."""
    Outcome = Attempt.Outcome
    if job.state == S.PREEMPTED:
        transition(job, S.PREEMPTED, S.QUEUED, f"held after preemption ({reason or 'preempted'}); waiting for release"
                   if Job.objects.filter(pk=job.pk, held=True).exists()
                   else f"requeued after preemption ({reason or 'preempted'})")
    elif job.state in {S.RUNNING, S.SCHEDULED}:
        if outcome == Outcome.SUCCEEDED:
            transition(job, job.state, S.SUCCEEDED, "all steps finished")
        elif outcome in REQUEUED_OUTCOMES and not final:
            reason = reason or "node lost"
            transition(job, job.state, S.QUEUED, reason if "requeued" in reason else f"requeued: {reason}")
        else:
            failures = job.failures + 1
            if failures < job.max_attempts and outcome != Outcome.TIME_LIMIT and not final:
                transition(job, job.state, S.QUEUED,
                           f"attempt {attempt.number} failed ({reason}); retrying ({failures}/{job.max_attempts})",
                           failures=failures)
            else:
                transition(job, job.state, S.FAILED,
                           f"attempt {attempt.number} failed ({reason}); {failures}/{job.max_attempts} attempts used",
                           failures=failures)
    if job.state in TERMINAL_STATES:
        children_end_with(job)


def attempt_end(attempt: Attempt, outcome: str, reason: str, *, final: bool = False) -> bool:
    """End ``attempt`` with ``outcome`` (freeing its devices) and move its job on, in one transaction. False when
    it had already ended (someone else won). The one public way for other apps (the scheduler's reaper) to end
    an attempt."""
    with transaction.atomic():
        if not _release(attempt, outcome, reason):
            return False
        job = Job.objects.get(pk=attempt.job_id)
        _after_attempt(job, attempt, outcome, reason, final=final)
    return True


def attempt_lost(attempt: Attempt, reason: str, *, requeue: bool = True) -> None:
    """The node running ``attempt`` is gone: end it ``node_lost`` without counting a failure and requeue the job;
    with ``requeue=False`` (a kind's failure policy says so) the job fails instead, whatever attempts it had left."""
    with transaction.atomic():
        if not _release(attempt, Attempt.Outcome.NODE_LOST, reason):
            return
        job = Job.objects.get(pk=attempt.job_id)
        _after_attempt(job, attempt, Attempt.Outcome.NODE_LOST, reason, final=not requeue)


def attempt_drop_node(attempt: Attempt, node, reason: str) -> int:
    """``attempt`` carries on without ``node`` (lost): the devices it held there are freed, and it keeps the
    rest. Returns how many allocations were released."""
    with transaction.atomic():
        released = Allocation.objects.filter(attempt=attempt, active=True, device__node=node).update(active=False)
        if released:
            job_event(attempt.job_id, "attempt",
                      f"attempt {attempt.number} carries on without node {node.name} ({reason}); "
                      f"{released} device allocation(s) released", attempt=attempt, node=node.name)
    return released


def artifact_key(attempt: Attempt, name: str, kind: str) -> str:
    """Where an attempt's artifact (or checkpoint) ``name`` is stored."""
    return f"{attempt.job_id}/{kind}/{name}"


def storage_admission(team_id: int, extra_bytes: int | None, *, replaces: int = 0) -> None:
    """Raise ``quotas.services.StorageQuotaExceeded`` (a 413) when the team may not store ``extra_bytes`` more
    (None: a stream of a size not known yet) under its quota's ``max_storage_bytes``, ``replaces`` being the bytes
    of an object the new one overwrites. Every store calls it before writing a byte
    (``quotas.services.storage_allowed``)."""
    from strata.quotas.services import storage_allowed

    storage_allowed(team_id, extra_bytes, replaces=replaces)


def artifact_store(attempt: Attempt, name: str, source: BinaryIO, kind: str = Artifact.Kind.ARTIFACT) -> Artifact:
    key = artifact_key(attempt, name, kind)
    team_id = Job.objects.filter(pk=attempt.job_id).values_list("team_id", flat=True).first()
    replaced = Artifact.objects.filter(job_id=attempt.job_id, kind=kind, name=name).values_list("size", flat=True)
    storage_admission(team_id, None, replaces=replaced.first() or 0)
    size, sha = get_storage().save(key, source, settings.STRATA_MAX_UPLOAD_BYTES)
    return artifact_record(attempt, name, kind, key, size, sha)


def artifact_record(attempt: Attempt, name: str, kind: str, key: str, size: int, sha: str) -> Artifact:
    """Record what is now stored under ``key`` as the job's artifact ``name`` (through the control plane, or a
    direct upload it completed)."""
    artifact, _ = Artifact.objects.update_or_create(
        job_id=attempt.job_id, kind=kind, name=name,
        defaults={"attempt": attempt, "size": size, "sha256": sha, "storage_key": key, "created_at": timezone.now()},
    )
    if kind == Artifact.Kind.ARTIFACT:
        job_event(attempt.job_id, "artifact", f"artifact {name} stored ({size} bytes)", attempt=attempt)
    return artifact
