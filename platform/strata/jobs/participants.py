"""Participants: machines outside the cluster that join a running job (volunteers adding their own machines to a
job's workers), for kinds whose ``KindSpec.accepts_participants`` is true.

- **Joining** takes one of the job's working access tokens (``JobToken``: neither revoked nor expired, of that very
  job). The job must be RUNNING, and the participant's ``gpus`` must fit the team's quota, checked under the same
  lock as admission (``quotas.services.participant_refusal``). The participant gets a secret of its own (256
  random bits, only the SHA-256 digest is kept) that authenticates its heartbeats and its leaving.
- **Heartbeats** keep it active (``STRATA_PARTICIPANT_LEASE_S``), carry its latest metrics and what it says about
  itself (``info``), and are answered ``run`` or ``stop``, with a fresh job credential for a ``subject`` when it
  asks for one (``strata.jobs.credentials``). ``stop`` when the job ended, its token was revoked or expired, it
  was evicted, it left, or its lease expired.
- **Quota**: an active participant heard from within the lease counts its GPUs against the team's ``max_gpus``
  (``quotas.services.team_load``) and is billed for them (``gpu_seconds``). One that misses its lease stops
  counting at once; the reaper then marks it ``lost``. A job that ends stops its participants in the same
  transaction (``jobs.states.transition``).
"""

from __future__ import annotations

import hmac
import json
import math
import secrets
import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from components.runtime.shared.credentials import subject_problem
from components.runtime.shared.tokens import MAX_TOKEN_CHARS, token_digest
from strata.api.values import safe_name
from strata.jobs.models import TERMINAL_STATES, Job, JobState, JobToken, Participant
from strata.jobs.services import SubmitRejected, job_event, participant_admission

P = Participant.State
MAX_NAME = 100
MAX_GPUS = 64.0
MAX_INFO_BYTES = 8192
MAX_METRICS = 64
MAX_METRIC_NAME = 64
JOIN_FIELDS = ("job", "name", "gpus", "info")
HEARTBEAT_FIELDS = ("metrics", "info", "subject")


class ParticipantDenied(Exception):
    """The credentials of a participant route are not valid (a 401): the job token, or the participant's secret.
    The message never repeats what was presented."""


class ParticipantUnknown(LookupError):
    """No participant of that id (a 404)."""


class ParticipantConflict(Exception):
    """The job cannot take the participant now (a 409): it is not running, or the team's quota is full."""


class ParticipantInvalid(ValueError):
    """Bad fields (a 400); ``errors`` maps each field to its message."""

    def __init__(self, errors: dict[str, str]):
        self.errors = dict(errors)
        super().__init__("; ".join(f"{field}: {message}" for field, message in self.errors.items()))


def lease() -> timedelta:
    return timedelta(seconds=settings.STRATA_PARTICIPANT_LEASE_S)


def heartbeat_seconds() -> float:
    """How often a participant is told to heartbeat: a third of the lease."""
    return round(settings.STRATA_PARTICIPANT_LEASE_S / 3, 3)


# --- checking what a participant sends ------------------------------------------------------------------------

def _unknown(body: dict, allowed: tuple[str, ...], errors: dict[str, str]) -> None:
    for name in body:
        if name not in allowed:
            errors[safe_name(str(name))] = f"unknown field; allowed: {', '.join(allowed)}"


def check_info(info: Any, errors: dict[str, str]) -> dict:
    """``info`` when it is a JSON object of at most MAX_INFO_BYTES; else an error on ``info``."""
    if not isinstance(info, dict):
        errors["info"] = "must be a JSON object"
        return {}
    size = len(json.dumps(info, separators=(",", ":"), ensure_ascii=False, default=str).encode())
    if size > MAX_INFO_BYTES:
        errors["info"] = f"at most {MAX_INFO_BYTES} bytes of JSON, got {size}"
        return {}
    return info


def check_metrics(metrics: Any, errors: dict[str, str]) -> dict[str, float]:
    """``metrics`` as ``{name: float}``: a JSON object of at most MAX_METRICS names (1 to MAX_METRIC_NAME
    characters) each with a finite number; every bad entry is an error of its own, ``metrics.<name>``."""
    if not isinstance(metrics, dict):
        errors["metrics"] = "must be a JSON object of {name: number}"
        return {}
    if len(metrics) > MAX_METRICS:
        errors["metrics"] = f"at most {MAX_METRICS} metrics, got {len(metrics)}"
        return {}
    clean = {}
    for name, value in metrics.items():
        where = f"metrics.{safe_name(str(name))[:MAX_METRIC_NAME]}"
        if not isinstance(name, str) or not 1 <= len(name) <= MAX_METRIC_NAME:
            errors[where] = f"a metric's name is 1 to {MAX_METRIC_NAME} characters"
        elif isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            errors[where] = "must be a finite number"
        else:
            clean[name] = float(value)
    return clean


def join_fields(body: Any) -> dict[str, Any]:
    """The checked fields of a join: ``{"job": UUID, "name", "gpus", "info"}``; ParticipantInvalid naming every bad
    field at once."""
    if not isinstance(body, dict):
        raise ParticipantInvalid({"non_field_errors": "the body must be a JSON object"})
    errors: dict[str, str] = {}
    _unknown(body, JOIN_FIELDS, errors)
    job_id = None
    if "job" not in body:
        errors["job"] = "required: the id of the running job to join"
    else:
        try:
            job_id = uuid.UUID(body["job"]) if isinstance(body["job"], str) else None
        except ValueError:
            job_id = None
        if job_id is None:
            errors["job"] = "must be a job id"
    name = body.get("name", "")
    if not isinstance(name, str):
        errors["name"] = "must be a string"
    elif len(name.strip()) > MAX_NAME:
        errors["name"] = f"at most {MAX_NAME} characters"
    gpus = body.get("gpus", 0)
    if isinstance(gpus, bool) or not isinstance(gpus, int | float) or not math.isfinite(gpus) \
            or not 0 <= gpus <= MAX_GPUS:
        errors["gpus"] = f"must be a number from 0 to {MAX_GPUS:g}: the GPUs this participant brings"
    info = check_info(body.get("info", {}), errors)
    if errors:
        raise ParticipantInvalid(errors)
    return {"job": job_id, "name": name.strip(), "gpus": float(gpus), "info": info}


def heartbeat_fields(body: Any) -> dict[str, Any]:
    """The checked fields of a heartbeat: ``metrics`` and ``info`` (None: unchanged) and ``subject`` (None: no
    credential wanted); ParticipantInvalid naming every bad field at once."""
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise ParticipantInvalid({"non_field_errors": "the body must be a JSON object"})
    errors: dict[str, str] = {}
    _unknown(body, HEARTBEAT_FIELDS, errors)
    metrics = check_metrics(body["metrics"], errors) if body.get("metrics") is not None else None
    info = check_info(body["info"], errors) if body.get("info") is not None else None
    subject = body.get("subject")
    if subject is not None and (problem := subject_problem(subject)):
        errors["subject"] = problem
    if errors:
        raise ParticipantInvalid(errors)
    return {"metrics": metrics, "info": info, "subject": subject}


# --- credentials of the routes ----------------------------------------------------------------------------------

def _presented(raw: Any) -> str | None:
    if not isinstance(raw, str) or not raw or len(raw) > MAX_TOKEN_CHARS:
        return None
    return token_digest(raw)


def job_token_working(raw_token: Any) -> JobToken:
    """The working access token (of any job) that ``raw_token`` is, or ParticipantDenied: checked before the body
    of a join is read, so a caller without a token learns nothing from the answer."""
    digest = _presented(raw_token)
    token = JobToken.objects.filter(digest=digest).first() if digest is not None else None
    if token is None or not token.is_active:
        raise ParticipantDenied("the access token is not valid (unknown, revoked or expired): ask the job's team for "
                                "one (strata job-token create)")
    return token


def participant_authorize(raw_token: Any, job_id) -> tuple[Job, JobToken]:
    """The job and the token when ``raw_token`` is a working access token of job ``job_id`` (ParticipantDenied
    otherwise, the same for an unknown job, another job's token, a revoked or an expired one); then the job's kind
    must take participants (a 400 on ``job``) and the job must be RUNNING (ParticipantConflict)."""
    from components.runtime.contract.registry import get_kind

    denied = ParticipantDenied(f"the access token is not valid for job {job_id} (unknown, revoked, expired or "
                               "another job's): ask the job's team for one (strata job-token create)")
    digest = _presented(raw_token)
    job = Job.objects.filter(pk=job_id).first() if digest is not None else None
    if job is None:
        raise denied
    match = None
    for token in JobToken.objects.filter(job_id=job.pk):
        if hmac.compare_digest(token.digest, digest):
            match = token
    if match is None or not match.is_active:
        raise denied
    try:
        takes = bool(get_kind(job.kind).accepts_participants)
    except Exception:  # noqa: BLE001 - a kind no longer installed takes none
        takes = False
    if not takes:
        raise SubmitRejected("job", f"{job.kind} jobs take no participants")
    if job.state != JobState.RUNNING:
        raise ParticipantConflict(f"job {job.pk} is {job.state}: participants join a running job")
    return job, match


def participant_for_secret(participant_id, raw_secret: Any) -> Participant:
    """The participant whose secret ``raw_secret`` is: ParticipantUnknown for an unknown id, ParticipantDenied
    for a wrong secret."""
    participant = Participant.objects.select_related("job").filter(pk=participant_id).first()
    if participant is None:
        raise ParticipantUnknown(f"no participant {participant_id}")
    digest = _presented(raw_secret)
    if digest is None or not hmac.compare_digest(digest, participant.secret_digest):
        raise ParticipantDenied("the participant's secret is not valid: join again")
    return participant


# --- the life of a participant ------------------------------------------------------------------------------

def participant_join(raw_token: Any, job_id, *, name: str = "", gpus: float = 0.0,
                     info: dict | None = None) -> tuple[Participant, str]:
    """A participant joins job ``job_id`` with one of its access tokens; returns the row and its raw secret (shown
    once). See :func:`participant_authorize` for the checks; the team's quota must have room for ``gpus``
    (ParticipantConflict), checked under the quota row's lock like admission."""
    job, token = participant_authorize(raw_token, job_id)
    secret = f"sp_{secrets.token_urlsafe(32)}"
    participant_id = uuid.uuid4()
    name = (name or "").strip()[:MAX_NAME] or f"p-{participant_id.hex[:8]}"
    with transaction.atomic():
        # The job's row first (a concurrent end of the job waits for this join, and then stops it too).
        state = Job.objects.select_for_update().filter(pk=job.pk).values_list("state", flat=True).first()
        if state != JobState.RUNNING:
            raise ParticipantConflict(f"job {job.pk} is {state}: participants join a running job")
        if problem := participant_admission(job.team_id, float(gpus)):
            raise ParticipantConflict(f"cannot join: {problem}")
        now = timezone.now()
        participant = Participant.objects.create(
            id=participant_id, job=job, token=token, name=name, gpus=float(gpus), info=info or {},
            secret_digest=token_digest(secret), joined_at=now, last_seen=now)
        job_event(job.pk, "participant", f"participant {name} joined (gpus {float(gpus):g})",
                  participant=str(participant.pk), gpus=float(gpus))
    return participant, secret


def _end(participant: Participant, state: str, reason: str, *, ended_at=None, request: bool = True) -> bool:
    """Move an active participant to ``state`` (once; False if it was no longer active) with a job event, and ask
    for a scheduling pass on commit when it held GPUs (pending jobs may fit now)."""
    now = timezone.now()
    ended = Participant.objects.filter(pk=participant.pk, state=P.ACTIVE).update(
        state=state, reason=reason[:500], ended_at=ended_at or now)
    if not ended:
        return False
    participant.state, participant.reason, participant.ended_at = state, reason[:500], ended_at or now
    said = "left" if state == P.LEFT else f"{state}: {reason}"
    job_event(participant.job_id, "participant", f"participant {participant.name} {said}",
              participant=str(participant.pk), state=state)
    if request and participant.gpus > 0:
        from strata.celery import request_pass

        transaction.on_commit(request_pass)
    return True


def _token_problem(token: JobToken | None, now) -> str | None:
    if token is None:
        return "its access token no longer exists"
    if token.revoked_at is not None:
        return f"its access token {token.prefix}… was revoked"
    if token.expires_at is not None and token.expires_at <= now:
        return f"its access token {token.prefix}… expired"
    return None


def _stop_reason(participant: Participant, now) -> str | None:
    """Why ``participant`` must stop now (ending it if it was active), or None when it runs on."""
    if participant.state != P.ACTIVE:
        return participant.reason or f"the participant {participant.state}"
    if participant.last_seen <= now - lease():
        age = (now - participant.last_seen).total_seconds()
        _end(participant, P.LOST, f"missed its lease: no heartbeat for {age:.0f} s "
             f"(lease {settings.STRATA_PARTICIPANT_LEASE_S:g} s)", ended_at=participant.last_seen + lease())
        return participant.reason
    if participant.job.state in TERMINAL_STATES:
        _end(participant, P.STOPPED, f"the job ended ({participant.job.state})")
        return participant.reason
    if problem := _token_problem(participant.token, now):
        _end(participant, P.STOPPED, problem)
        return participant.reason
    return None


def participant_heartbeat(participant: Participant, *, metrics: dict | None = None, info: dict | None = None,
                          subject: str | None = None) -> dict[str, Any]:
    """Record a heartbeat (``metrics`` and ``info`` replace the stored ones when given) and answer ``{"state":
    "run" | "stop", "reason"}``, with ``credential`` (``strata.jobs.credentials.sign``) for ``subject`` when it is
    given and the answer is ``run``. ParticipantInvalid for bad fields."""
    checked = heartbeat_fields({key: value for key, value in
                                (("metrics", metrics), ("info", info), ("subject", subject)) if value is not None})
    now = timezone.now()
    with transaction.atomic():
        current = Participant.objects.select_for_update(of=("self",)).select_related("job", "token").get(pk=participant.pk)
        reason = _stop_reason(current, now)
        if reason is not None:
            return {"state": "stop", "reason": reason}
        updates: dict[str, Any] = {"last_seen": now}
        if checked["metrics"] is not None:
            updates["metrics"] = checked["metrics"]
        if checked["info"] is not None:
            updates["info"] = checked["info"]
        Participant.objects.filter(pk=current.pk).update(**updates)
    answer: dict[str, Any] = {"state": "run", "reason": ""}
    if checked["subject"] is not None:
        from strata.jobs.credentials import sign

        answer["credential"] = sign(current.job_id, checked["subject"], f"participant {current.pk}")
    return answer


def participant_leave(participant: Participant) -> Participant:
    """The participant says it leaves (idempotent: an ended one stays as it ended)."""
    with transaction.atomic():
        Participant.objects.filter(pk=participant.pk, state=P.ACTIVE).update(last_seen=timezone.now())
        _end(participant, P.LEFT, "left")
    participant.refresh_from_db()
    return participant


def participant_evict(participant: Participant, user) -> Participant:
    """A member of the job's team sends the participant away: its next heartbeat answers stop (idempotent)."""
    with transaction.atomic():
        _end(participant, P.STOPPED, f"evicted by {user}")
    participant.refresh_from_db()
    return participant


def participants_expire(now=None) -> dict[str, int]:
    """Housekeeping (the scheduler's reaper): active participants whose lease expired become ``lost``; those whose
    token was revoked or expired, or whose job ended, ``stopped``. Returns the counts."""
    now = now or timezone.now()
    lost = stopped = 0
    for participant in Participant.objects.filter(state=P.ACTIVE, last_seen__lte=now - lease()):
        age = (now - participant.last_seen).total_seconds()
        lost += _end(participant, P.LOST, f"missed its lease: no heartbeat for {age:.0f} s "
                     f"(lease {settings.STRATA_PARTICIPANT_LEASE_S:g} s)",
                     ended_at=participant.last_seen + lease(), request=False)
    ended = (Q(token__isnull=True) | Q(token__revoked_at__isnull=False) | Q(token__expires_at__lte=now)
             | Q(job__state__in=list(TERMINAL_STATES)))
    for participant in Participant.objects.filter(state=P.ACTIVE).filter(ended).select_related("job", "token"):
        reason = (f"the job ended ({participant.job.state})" if participant.job.state in TERMINAL_STATES
                  else _token_problem(participant.token, now))
        stopped += _end(participant, P.STOPPED, reason or "stopped", request=False)
    return {"lost": lost, "stopped": stopped}


# --- reading -----------------------------------------------------------------------------------------------

def participant_entry(participant: Participant, now=None) -> dict[str, Any]:
    """How a participant is shown (the API's list, ``PanelData.participants``): ``id``, ``name``, ``gpus``,
    ``state``, ``reason``, ``info``, ``metrics``, ``joined_at``, ``last_seen``, ``ended_at`` (datetimes). An active
    one that missed its lease (the reaper has not run yet) shows ``lost``."""
    now = now or timezone.now()
    state, reason = participant.state, participant.reason
    if state == P.ACTIVE and participant.last_seen <= now - lease():
        state, reason = P.LOST, "missed its lease"
    return {"id": str(participant.pk), "name": participant.name, "gpus": participant.gpus, "state": state,
            "reason": reason, "info": participant.info, "metrics": participant.metrics,
            "joined_at": participant.joined_at, "last_seen": participant.last_seen, "ended_at": participant.ended_at}


def job_participants(job: Job, limit: int = 5000) -> list[dict[str, Any]]:
    """The job's participants, oldest first, as :func:`participant_entry` shows them."""
    now = timezone.now()
    return [participant_entry(p, now) for p in Participant.objects.filter(job=job).order_by("joined_at", "id")[:limit]]
