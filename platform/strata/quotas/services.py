"""Quota admission and exact usage accounting.

Admission runs inside a transaction holding the team's quota row (``select_for_update``; on SQLite the
IMMEDIATE transaction's write lock plays that role), so concurrent submits cannot overrun a limit.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import Count, Sum
from django.utils import timezone

from strata.cluster.capacity import FULL, gpu_free, placement_problem, share_to_milli
from strata.jobs.models import ADMITTED_STATES, Attempt, Job, JobState
from strata.jobs.selectors import participants_active
from strata.jobs.states import transition
from strata.quotas.models import Quota
from strata.quotas.selectors import cpu_seconds, gpu_seconds

# The smallest share of a device the scheduler places (one thousandth): a job always holds at least this.
MIN_SHARE = 0.001


class ClusterView:
    """What admission needs to know of the cluster's hardware, read once per admission: whether a request
    could ever be placed on some registered node (``problem``), and how many GPUs a request is accounted as
    (``gpus``), which for a request sized by memory alone (``gpus: 0`` plus ``gpu_memory``) is the share it
    would take of the largest device, at least MIN_SHARE, so no job holds a device for free."""

    def __init__(self, nodes: list | None = None):
        from strata.cluster.selectors import registered_nodes

        self.nodes = registered_nodes() if nodes is None else nodes
        self.largest_memory = max((d.memory_total for n in self.nodes for d in n.devices), default=None)
        self._problems: dict[str, str | None] = {}

    def problem(self, resources: dict) -> str | None:
        """Why no registered node could ever run ``resources``; None if one could, or if no node has
        registered yet (nothing is known about the hardware then)."""
        if not self.nodes:
            return None
        key = json.dumps(resources, sort_keys=True, default=str)
        if key not in self._problems:
            self._problems[key] = placement_problem(resources, self.nodes)
        return self._problems[key]

    def gpus(self, resources: dict) -> float:
        workers = int(resources.get("workers", 1))
        gpus = float(resources.get("gpus", 0))
        if gpu_free(resources):  # it runs on CPUs, and holds (and is accounted) its CPUs instead
            return 0.0
        if gpus <= 0:
            memory = int(resources.get("gpu_memory") or 0)
            milli = share_to_milli(memory / self.largest_memory) if self.largest_memory else 1
            gpus = max(MIN_SHARE, milli / FULL)
        return gpus * workers


@dataclass
class TeamLoad:
    """What a team's admitted (queued or running) jobs hold against its quota."""

    jobs: int = 0
    gpus: float = 0.0  # the jobs' GPUs and the active participants' (volunteers that joined the team's jobs)
    gpu_memory: int = 0
    participants: int = 0  # active participants of the team's jobs
    cpus: float = 0.0  # the CPUs the jobs reserve (resources.cpus per worker)
    memory: int = 0  # the host memory they reserve, bytes

    def add(self, job: Job, gpus: float) -> None:
        workers = int(job.resources.get("workers", 1))
        self.jobs += 1
        self.gpus += gpus
        self.gpu_memory += int(job.resources.get("gpu_memory") or 0) * workers
        self.cpus += job_cpus(job.resources)
        self.memory += int(job.resources.get("memory") or 0) * workers


def job_cpus(resources: dict) -> float:
    """The CPUs a job with ``resources`` reserves, all workers together (0 for a GPU job that states none)."""
    return float(resources.get("cpus") or 0) * int(resources.get("workers", 1))


def team_load(team_id: int, view: ClusterView | None = None) -> TeamLoad:
    """The team's admitted jobs: a placed job counts the share its live attempt holds, a waiting one what it
    asks for (``ClusterView.gpus``)."""
    view = view or ClusterView()
    held: dict = defaultdict(float)
    for job_id, share in Attempt.objects.filter(job__team_id=team_id, ended_at__isnull=True).values_list(
            "job_id", "gpu_share"):
        held[job_id] += share
    load = TeamLoad()
    # Nested children run inside their parent's allocation: the parent counts for them.
    for job in Job.objects.filter(team_id=team_id, state__in=ADMITTED_STATES, nested=False).only("resources"):
        load.add(job, held[job.pk] if job.pk in held else view.gpus(job.resources))
    # Volunteers that joined the team's jobs hold the GPUs they brought while they are active (within their lease).
    participants = participants_active().filter(job__team_id=team_id).aggregate(count=Count("id"), gpus=Sum("gpus"))
    load.participants = participants["count"] or 0
    load.gpus += participants["gpus"] or 0.0
    return load


def blocking_limit(quota: Quota, load: TeamLoad, job: Job, window_gpu_seconds: float | None,
                   view: ClusterView) -> str | None:
    """The first limit that admitting ``job`` would break, as a human reason; None when it fits."""
    workers = int(job.resources.get("workers", 1))
    gpus = view.gpus(job.resources)
    memory = int(job.resources.get("gpu_memory") or 0) * workers
    if quota.max_concurrent_jobs is not None and load.jobs + 1 > quota.max_concurrent_jobs:
        return f"team at max_concurrent_jobs ({load.jobs}/{quota.max_concurrent_jobs})"
    if problem := _max_gpus_problem(quota, load, gpus):
        return problem
    if quota.max_gpu_memory is not None and load.gpu_memory + memory > quota.max_gpu_memory:
        return f"team at max_gpu_memory ({load.gpu_memory + memory} > {quota.max_gpu_memory} bytes)"
    cpus = job_cpus(job.resources)
    if quota.max_cpus is not None and cpus > 0 and load.cpus + cpus > quota.max_cpus + 1e-9:
        return f"team at max_cpus ({load.cpus:g} held + {cpus:g} requested > {quota.max_cpus:g})"
    host_memory = int(job.resources.get("memory") or 0) * workers
    if quota.max_memory is not None and host_memory > 0 and load.memory + host_memory > quota.max_memory:
        return f"team at max_memory ({load.memory + host_memory} > {quota.max_memory} bytes)"
    if gpus <= 0:  # a job that holds no GPU uses no GPU-hours either
        return None
    return _gpu_hours_problem(quota, window_gpu_seconds)


def _max_gpus_problem(quota: Quota, load: TeamLoad, gpus: float) -> str | None:
    if quota.max_gpus is not None and load.gpus + gpus > quota.max_gpus + 1e-9:
        return f"team at max_gpus ({load.gpus:g} held + {gpus:g} requested > {quota.max_gpus:g})"
    return None


def _gpu_hours_problem(quota: Quota, window_gpu_seconds: float | None) -> str | None:
    if quota.gpu_hours is not None and window_gpu_seconds is not None:
        used_hours = window_gpu_seconds / 3600
        if used_hours >= quota.gpu_hours:
            return f"team used {used_hours:.2f} of {quota.gpu_hours:g} GPU-hours in the last {quota.window_hours:g} h"
    return None


@dataclass
class MemberLimits:
    """One user's own limits inside a team (``Membership.max_concurrent_jobs``, ``max_gpus``; null: none) and
    what their admitted jobs of the team hold against them."""

    username: str
    max_concurrent_jobs: int | None
    max_gpus: float | None
    jobs: int = 0
    gpus: float = 0.0


def member_limits(team_id: int, view: ClusterView | None = None, *, everyone: bool = False
                  ) -> dict[int, MemberLimits]:
    """The team's members that have a per-user limit (``everyone``: all its members), by user id, with their
    admitted jobs' load (counted as :func:`team_load` counts the team's: a placed job the share its live attempt
    holds, a waiting one what it asks for; nested children inside their parent's)."""
    from strata.accounts.models import Membership

    members = Membership.objects.filter(team_id=team_id)
    if not everyone:
        members = members.exclude(max_concurrent_jobs=None, max_gpus=None)
    limited = {user_id: MemberLimits(username, jobs, gpus) for user_id, username, jobs, gpus in
               members.values_list("user_id", "user__username", "max_concurrent_jobs", "max_gpus")}
    if not limited:
        return limited
    view = view or ClusterView()
    held: dict = defaultdict(float)
    for job_id, share in Attempt.objects.filter(job__team_id=team_id, job__owner_id__in=limited,
                                                ended_at__isnull=True).values_list("job_id", "gpu_share"):
        held[job_id] += share
    for job in Job.objects.filter(team_id=team_id, owner_id__in=limited, state__in=ADMITTED_STATES,
                                  nested=False).only("resources", "owner_id"):
        entry = limited[job.owner_id]
        entry.jobs += 1
        entry.gpus += held[job.pk] if job.pk in held else view.gpus(job.resources)
    return limited


def member_blocking_limit(limits: MemberLimits | None, gpus: float) -> str | None:
    """The first of a user's own limits that admitting a job of theirs holding ``gpus`` would break; None when
    it fits (or the user has none)."""
    if limits is None:
        return None
    if limits.max_concurrent_jobs is not None and limits.jobs + 1 > limits.max_concurrent_jobs:
        return f"user {limits.username} at max_concurrent_jobs ({limits.jobs}/{limits.max_concurrent_jobs})"
    if limits.max_gpus is not None and gpus > 0 and limits.gpus + gpus > limits.max_gpus + 1e-9:
        return (f"user {limits.username} at max_gpus ({limits.gpus:g} held + {gpus:g} requested > "
                f"{limits.max_gpus:g})")
    return None


def member_never_fits(job: Job, view: ClusterView | None = None) -> str | None:
    """A reason why ``job`` can never be admitted under its owner's own limits in its team (checked at submit),
    or None."""
    from strata.accounts.models import Membership

    row = Membership.objects.filter(team_id=job.team_id, user_id=job.owner_id).values_list(
        "user__username", "max_concurrent_jobs", "max_gpus").first()
    if row is None:
        return None
    username, jobs, max_gpus = row
    if jobs == 0:
        return f"user {username} may run no jobs in this team (max_concurrent_jobs=0)"
    gpus = (view or ClusterView()).gpus(job.resources)
    if max_gpus is not None and gpus > max_gpus + 1e-9:
        return f"user {username} may hold at most {max_gpus:g} GPUs in this team (max_gpus), and it asks for {gpus:g}"
    return None


def participant_refusal(team_id: int, gpus: float) -> str | None:
    """Why a participant bringing ``gpus`` GPUs cannot join a job of the team now: the team's load (its admitted
    jobs and active participants) plus ``gpus`` would break ``max_gpus``, or its GPU-hours window is used up.
    None when it fits, and always for a participant with no GPU (it holds and bills nothing). Call inside a
    transaction: the team's quota row is locked as :func:`admit_pending` locks it, so joins and admissions cannot
    overrun a limit together."""
    with transaction.atomic():
        quota = Quota.objects.select_for_update().filter(team_id=team_id).first()
        if quota is None or gpus <= 0:
            return None
        window = None
        if quota.gpu_hours is not None:
            window = gpu_seconds(team_id, since=timezone.now() - timedelta(hours=quota.window_hours))
        return _max_gpus_problem(quota, team_load(team_id), gpus) or _gpu_hours_problem(quota, window)


def never_fits(quota: Quota, job: Job, view: ClusterView | None = None) -> str | None:
    """A reason why ``job`` can never be admitted under ``quota`` (checked at submit), or None."""
    if quota.max_concurrent_jobs == 0:
        return "team quota allows no jobs (max_concurrent_jobs=0)"
    view = view or ClusterView()
    if quota.max_gpus == 0 and view.gpus(job.resources) > 0:
        return "team quota allows no GPUs (max_gpus=0), and every GPU job holds a share of one"
    if quota.max_cpus == 0 and job_cpus(job.resources) > 0:
        return "team quota allows no CPUs (max_cpus=0), and the job reserves some"
    return blocking_limit(quota, TeamLoad(), job, None, view)


def never_placeable(job: Job, view: ClusterView | None = None) -> str | None:
    """Why no registered node could ever run ``job`` (checked at submit), or None."""
    return (view or ClusterView()).problem(job.resources)


def admit_pending(team_id: int) -> list[Job]:
    """Admit the team's PENDING jobs, in priority then submission order, while its quota has room.

    A job no registered node could ever run stays PENDING with the reason and holds nothing: it never takes
    one of the team's concurrent-job slots or GPUs away from jobs that can run.
    """
    admitted = []
    with transaction.atomic():
        quota = Quota.objects.select_for_update().filter(team_id=team_id).first()
        pending = list(Job.objects.filter(team_id=team_id, state=JobState.PENDING, nested=False)
                       .order_by("-priority", "created_at"))
        if not pending:
            return admitted
        if quota is None:
            quota = Quota.objects.create(team_id=team_id)
        view = ClusterView()
        load = team_load(team_id, view)
        window = None
        if quota.gpu_hours is not None:
            window = gpu_seconds(team_id, since=timezone.now() - timedelta(hours=quota.window_hours))
        members = member_limits(team_id, view)
        reached: dict[str, tuple[str, list[str]]] = {}  # limit -> (reason, the jobs that started waiting on it)
        for job in pending:
            if problem := view.problem(job.resources):
                reason = f"no node could ever run it: {problem}"
            else:
                reason = (member_blocking_limit(members.get(job.owner_id), view.gpus(job.resources))
                          or blocking_limit(quota, load, job, window, view))
            if reason is None:
                transition(job, JobState.PENDING, JobState.QUEUED, "admitted under quota")
                load.add(job, view.gpus(job.resources))
                if (member := members.get(job.owner_id)) is not None:
                    member.jobs += 1
                    member.gpus += view.gpus(job.resources)
                admitted.append(job)
            elif job.reason != f"waiting: {reason}":
                limit = quota_limit(reason)
                if limit is not None and quota_limit(job.reason.removeprefix("waiting: ")) != limit:
                    reached.setdefault(limit, (reason, []))[1].append(str(job.pk))
                Job.objects.filter(pk=job.pk, state=JobState.PENDING).update(reason=f"waiting: {reason}")
        if reached:
            _announce_reached(team_id, reached)
    return admitted


def quota_limit(reason: str) -> str | None:
    """The team quota field a waiting reason of :func:`blocking_limit` names (max_gpus, gpu_hours...), or None for
    any other reason (no node could ever run the job, a user's own limit, none yet)."""
    if reason.startswith("team at "):
        return reason.removeprefix("team at ").split(" ", 1)[0]
    if reason.startswith("team used ") and "GPU-hours" in reason:
        return "gpu_hours"
    return None


def _announce_reached(team_id: int, reached: dict[str, tuple[str, list[str]]]) -> None:
    """One ``quota.reached`` lifecycle event per limit that newly holds back jobs of the team, after commit."""
    from components.runtime.contract.events import QuotaReached
    from strata.jobs.events import emit_many

    emit_many([QuotaReached(team_id=team_id, limit=limit, reason=reason, job_ids=tuple(jobs))
               for limit, (reason, jobs) in reached.items()])


def teams_with_pending() -> list[int]:
    return list(Job.objects.filter(state=JobState.PENDING, nested=False).values_list("team_id", flat=True).distinct())


def team_usage(team_id: int) -> dict:
    quota = Quota.objects.filter(team_id=team_id).first() or Quota(team_id=team_id)
    load = team_load(team_id)
    now = timezone.now()
    return {
        "jobs": load.jobs,
        "gpus": load.gpus,
        "gpu_memory": load.gpu_memory,
        "gpu_hours_window": gpu_seconds(team_id, since=now - timedelta(hours=quota.window_hours), until=now) / 3600,
        "gpu_hours_total": gpu_seconds(team_id, until=now) / 3600,
        "cpus": load.cpus,
        "memory": load.memory,
        "cpu_hours_window": cpu_seconds(team_id, since=now - timedelta(hours=quota.window_hours), until=now) / 3600,
        "cpu_hours_total": cpu_seconds(team_id, until=now) / 3600,
        "window_hours": quota.window_hours,
        "pending": Job.objects.filter(team_id=team_id, state=JobState.PENDING).count(),
        "participants": load.participants,
        "storage": team_storage(team_id),
    }


# --- stored bytes -------------------------------------------------------------------------------------------

STORAGE_PARTS = ("artifacts", "checkpoints", "code", "data", "uploads")


class StorageQuotaExceeded(Exception):
    """Storing more would pass the team's ``max_storage_bytes`` (an HTTP 413 naming the limit and the use)."""

    def __init__(self, team: str, limit: int, used: int, requested: int | None):
        self.team, self.limit, self.used, self.requested = team, limit, used, requested
        needs = f"{requested} more bytes" if requested is not None else "more bytes"
        super().__init__(f"team {team} is at its storage quota: max_storage_bytes is {limit}, {used} bytes are "
                         f"stored, and this needs {needs}; delete data sets or code bundles, or ask an admin to "
                         "raise the limit or set a shorter retention (keep)")


def storage_by_team(team_id: int | None = None) -> dict[int, dict[str, int]]:
    """Bytes each team keeps stored, by part (``STORAGE_PARTS``: artifacts and checkpoints of its jobs, code
    bundles, data sets, and the chunks of its unfinished data uploads) and ``total``; one team when ``team_id``
    is given. Teams with nothing stored are absent. A few aggregate queries; unfinished uploads (at most
    ``STRATA_MAX_OPEN_UPLOADS`` a team) are summed chunk by chunk."""
    from strata.jobs.data import chunk_length
    from strata.jobs.models import Artifact, CodeBundle, DataSet, DataUpload

    only = {} if team_id is None else {"team_id": team_id}
    result: dict[int, dict[str, int]] = defaultdict(lambda: dict.fromkeys((*STORAGE_PARTS, "total"), 0))

    def add(team: int, part: str, size) -> None:
        result[team][part] += int(size or 0)
        result[team]["total"] += int(size or 0)

    artifacts = Artifact.objects.filter(**{f"job__{k}": v for k, v in only.items()}).order_by()
    for row in artifacts.values("job__team_id", "kind").annotate(size=Sum("size")):
        add(row["job__team_id"], "checkpoints" if row["kind"] == Artifact.Kind.CHECKPOINT else "artifacts",
            row["size"])
    for model, part in ((CodeBundle, "code"), (DataSet, "data")):
        for row in model.objects.filter(**only).order_by().values("team_id").annotate(size=Sum("size")):
            add(row["team_id"], part, row["size"])
    for upload in DataUpload.objects.filter(**only).order_by():
        add(upload.team_id, "uploads", sum(chunk_length(upload, int(index)) for index in upload.received or {}))
    return dict(result)


def team_storage(team_id: int) -> dict[str, int]:
    """Bytes the team keeps stored, by part and ``total`` (see :func:`storage_by_team`)."""
    return storage_by_team(team_id).get(team_id) or dict.fromkeys((*STORAGE_PARTS, "total"), 0)


def storage_allowed(team_id: int, extra_bytes: int | None, *, replaces: int = 0) -> None:
    """Raise :class:`StorageQuotaExceeded` when the team may not store ``extra_bytes`` more under its quota's
    ``max_storage_bytes`` (null: no limit): when what it stores, less ``replaces`` (the bytes of an object the new
    one overwrites), plus ``extra_bytes`` would pass the limit; for a size not known before it is stored (a
    stream: ``extra_bytes`` None), when what it stores, less ``replaces``, is already at the limit, so a stream
    may pass it by one object. The one check every store calls (artifacts and checkpoints, their copies, code
    bundles, data uploads; direct uploads before they start). Not serialized: stores that run at once are each
    checked against the use before them."""
    row = Quota.objects.filter(team_id=team_id).values_list("max_storage_bytes", "team__slug").first()
    if row is None or row[0] is None:
        return
    limit, slug = row
    used = team_storage(team_id)["total"]
    base = max(0, used - max(0, replaces))
    if (extra_bytes is None and base >= limit) or (extra_bytes is not None and base + extra_bytes > limit):
        raise StorageQuotaExceeded(slug, limit, used, extra_bytes)


# --- changing a quota ---------------------------------------------------------------------------------------

class QuotaInvalid(ValueError):
    """Some quota fields have bad values; ``errors`` maps each field to its message. Nothing was changed."""

    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors.items()))
        self.errors = errors


# field -> (type, nullable, minimum, maximum). A null limit is unlimited; window, priority and weight are
# always set. The API serializer and the web form both go through quota_clean, so the rules live here once.
QUOTA_FIELDS: dict[str, tuple[type, bool, float | None, float | None]] = {
    "max_gpus": (float, True, 0, None),
    "max_gpu_memory": (int, True, 0, 2**60),  # 1 EiB: a 64-bit column holds it
    "max_cpus": (float, True, 0, None),
    "max_memory": (int, True, 0, 2**60),
    "max_storage_bytes": (int, True, 0, 2**60),
    "max_concurrent_jobs": (int, True, 0, 2**31 - 1),
    "gpu_hours": (float, True, 0, None),
    "window_hours": (float, False, 0.01, 24 * 366),
    "budget_gpu_hours": (float, True, 0, None),
    "budget_period_days": (int, True, 1, 366),
    "priority": (int, False, -100, 100),
    "weight": (float, False, 0.001, 1000),
}

BYTE_FIELDS = frozenset({"max_gpu_memory", "max_memory", "max_storage_bytes"})  # sizes: bytes, or a string such as "16GiB"
# Not a limit: the directories on the nodes under which the team may register data (strata.quotas.roots).
ROOTS_FIELD = "data_roots"
# Not a limit either: the team's retention policy (strata.jobs.keep), checked by keep_clean.
KEEP_FIELD = "keep"


def _clean_value(name: str, value):
    from components.runtime.shared.units import parse_bytes

    kind, nullable, minimum, maximum = QUOTA_FIELDS[name]
    if isinstance(value, str):
        value = value.strip()
        if value == "":
            value = None
    if value is None:
        if not nullable:
            raise ValueError("this field is required")
        return None
    if isinstance(value, bool):
        raise ValueError("expected a number")
    if name in BYTE_FIELDS:
        try:
            number = parse_bytes(value)
        except ValueError:
            negative = isinstance(value, int | float) or str(value).strip().startswith("-")
            raise ValueError("must be at least 0" if negative else "enter a size such as 64GiB, or bytes") from None
    elif kind is int:
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            raise ValueError("enter a whole number") from None
        if not math.isfinite(number) or number != int(number):
            raise ValueError("enter a whole number")
        number = int(number)
    else:
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            raise ValueError("enter a finite number") from None
        if not math.isfinite(number):
            raise ValueError("enter a finite number")
    if minimum is not None and number < minimum:
        raise ValueError(f"must be at least {minimum:g}")
    if maximum is not None and number > maximum:
        raise ValueError(f"must be at most {maximum} bytes" if name in BYTE_FIELDS else f"must be at most {maximum:g}")
    return number


def quota_clean(changes: dict) -> dict:
    """Typed, range-checked values for the quota fields in ``changes`` (numbers or strings: "" is unlimited,
    ``max_gpu_memory`` and ``max_memory`` accept sizes such as "16GiB"; ``data_roots`` is a list of directories,
    see ``strata.quotas.roots.clean_data_roots``). Raises QuotaInvalid listing every bad field."""
    from strata.jobs.keep import KeepInvalid, keep_clean
    from strata.quotas.roots import clean_data_roots

    cleaned, errors = {}, {}
    for name, value in changes.items():
        if name == ROOTS_FIELD:
            try:
                cleaned[name] = clean_data_roots(value)
            except ValueError as error:
                errors[name] = str(error)
            continue
        if name == KEEP_FIELD:
            try:
                cleaned[name] = keep_clean(value)
            except KeepInvalid as error:
                errors.update(error.errors)
            continue
        if name not in QUOTA_FIELDS:
            errors[name] = "not a quota field"
            continue
        try:
            cleaned[name] = _clean_value(name, value)
        except ValueError as error:
            errors[name] = str(error)
    if errors:
        raise QuotaInvalid(errors)
    return cleaned


def _audit_quota(quota: Quota, before: dict, *, request, actor) -> None:
    from strata.audit.services import record

    limits = [name for name in before if name != ROOTS_FIELD]
    target = f"quota {quota.team.slug}"
    if limits:
        record("quota.change", request=request, actor=actor, team=quota.team, target=target,
               before={name: before[name] for name in limits}, after={name: getattr(quota, name) for name in limits})
    if ROOTS_FIELD in before:
        record("data_roots.grant", request=request, actor=actor, team=quota.team, target=target,
               before={ROOTS_FIELD: before[ROOTS_FIELD]}, after={ROOTS_FIELD: getattr(quota, ROOTS_FIELD)})


@dataclass
class QuotaChange:
    quota: Quota
    changed: list[str]
    admitted: list[Job]


def quota_update(team_id: int, changes: dict, *, request=None, actor=None) -> QuotaChange:
    """Validate and apply ``changes`` to the team's quota, admit the PENDING jobs the new limits allow, and
    request a scheduling pass on commit so they are placed at once. Raises QuotaInvalid (nothing changed).
    The audit log gets a ``quota.change`` entry for changed limits and a ``data_roots.grant`` one for changed
    data roots (old and new values of the changed fields only)."""
    from strata.celery import request_pass

    cleaned = quota_clean(changes)
    with transaction.atomic():
        quota = Quota.objects.select_for_update().filter(team_id=team_id).first() or Quota.objects.create(team_id=team_id)
        changed = [name for name, value in cleaned.items() if getattr(quota, name) != value]
        if changed:
            before = {name: getattr(quota, name) for name in changed}
            for name in changed:
                setattr(quota, name, cleaned[name])
            quota.save(update_fields=changed)
            _audit_quota(quota, before, request=request, actor=actor)
    admitted = admit_pending(team_id)
    # Also when nothing was admitted: a new priority or weight reorders the queue.
    transaction.on_commit(request_pass)
    return QuotaChange(quota=quota, changed=changed, admitted=admitted)
