"""The retention collector: deletes the stored bytes no policy keeps (docs/operations.md, *Retention*).

Policies (``strata.jobs.keep``) are resolved per job, each field on its own: the job's ``keep``, else its nearest
ancestor's (a child job follows its parent's), else its team's (``Quota.keep``), else the cluster's
(``STRATA_RETENTION_*``). What is stored, and so what the rules act on:

* A job keeps **one checkpoint per name** (``Artifact``, kind checkpoint): every attempt writes ``checkpoint.pt``
  over the previous one, so earlier attempts' checkpoints no longer exist; a child started with
  ``checkpoint_from`` holds a copy of its sibling's, which is its own.
* ``latest``: each job keeps its newest checkpoint (the one it resumes from); its other names go.
  ``all``: nothing goes. ``best: N``: of the checkpoints of the jobs the rule governs together (the job that set
  it and its descendants that follow it; for a team's or the cluster's rule, each tree of jobs from its root),
  the N with the best value of the metric are kept: a checkpoint's value is the last value of the metric its job
  reported at or before the checkpoint was stored (by the points' times); one without such a value ranks after
  every one with a value, newest first. The metric is the rule's, else the objective of the governing job's kind
  (``KindSpec.objective``); with neither, the rule acts as ``latest``.
* ``artifacts_days``: a job's artifacts go that many days after it ended (or after they were stored, if later).

Only the bytes of jobs that ended (SUCCEEDED, FAILED, CANCELLED) are ever deleted, and never:

* the newest checkpoint of a job whose parent has not ended (a sibling may start from it: ``checkpoint_from``);
* an artifact that a job that has not ended reads (its kind's ``KindSpec.sources()``: a model being served), also
  a job submitted while the collector runs (checked again in each deletion's transaction);
* a code bundle a job references (``Job.code`` protects it); one that no job ever referenced goes
  ``STRATA_RETENTION_UNUSED_CODE_DAYS`` after its upload. Data sets are the team's own and never collected.

Each deletion locks the job's row, checks again that the job ended and the artifact is the one chosen, deletes the
row and its bytes (``get_storage().delete``) and writes a job event (kind ``retention``) in one transaction: bytes
that cannot be deleted leave the row in place for the next run. It runs on the scheduler's leader only
(``strata.scheduling.tasks.retention_task``).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, IntegrityError, transaction
from django.utils import timezone

from strata.jobs.keep import cluster_keep
from strata.jobs.log_search import collect_lines
from strata.jobs.models import TERMINAL_STATES, Artifact, CodeBundle, Job, MetricPoint
from strata.jobs.services import job_event
from strata.jobs.storage import get_storage
from strata.quotas.models import Quota

log = logging.getLogger(__name__)
CHECKPOINT, ARTIFACT = Artifact.Kind.CHECKPOINT, Artifact.Kind.ARTIFACT


@dataclass
class Collected:
    """What one run deleted: counts and bytes."""

    checkpoints: int = 0
    artifacts: int = 0
    code: int = 0
    bytes: int = 0
    log_lines: int = 0
    skipped: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"checkpoints": self.checkpoints, "artifacts": self.artifacts, "code": self.code, "bytes": self.bytes}


@dataclass(frozen=True)
class Rule:
    """A job's resolved policy for one field: the value, and which group it comes from (``("job", id)`` when a
    job (or an ancestor) set it, ``("tree", root id)`` for the team's or the cluster's) and where (for events)."""

    value: Any
    group: tuple[str, str]
    source: str
    owner: str  # the job whose kind gives the objective: the one that set it, or the tree's root


class Jobs:
    """The jobs that hold stored artifacts and their ancestors, as plain rows, and their resolved policies."""

    def __init__(self, job_ids, team_keep: dict[int, dict], cluster: dict):
        self.rows: dict[str, dict] = {}
        self.team_keep, self.cluster = team_keep, cluster
        wanted = {str(pk) for pk in job_ids}
        while wanted:  # each round loads the parents not loaded yet (trees are shallow)
            batch = list(wanted)[:1000]
            wanted -= set(batch)
            for row in Job.objects.filter(pk__in=batch).values("id", "parent_id", "team_id", "state", "keep", "kind",
                                                               "finished_at"):
                row["id"] = str(row["id"])
                row["parent_id"] = str(row["parent_id"]) if row["parent_id"] else None
                self.rows[row["id"]] = row
                if row["parent_id"] and row["parent_id"] not in self.rows:
                    wanted.add(row["parent_id"])

    def root(self, job_id: str) -> str:
        seen = set()
        while (parent := self.rows[job_id]["parent_id"]) and parent in self.rows and parent not in seen:
            seen.add(job_id)
            job_id = parent
        return job_id

    def rule(self, job_id: str, name: str) -> Rule:
        current, seen = job_id, set()
        while current and current in self.rows and current not in seen:
            seen.add(current)
            keep = self.rows[current]["keep"] or {}
            if name in keep:
                return Rule(keep[name], ("job", current), f"job {current}'s keep", current)
            current = self.rows[current]["parent_id"]
        root = self.root(job_id)
        team = self.rows[job_id]["team_id"]
        if name in (self.team_keep.get(team) or {}):
            return Rule(self.team_keep[team][name], ("tree", root), "the team's keep", root)
        return Rule(self.cluster.get(name), ("tree", root), "the cluster's STRATA_RETENTION", root)

    def terminal(self, job_id: str) -> bool:
        return self.rows[job_id]["state"] in TERMINAL_STATES


def _objective(rule: Rule) -> tuple[str, str] | None:
    """The metric and mode a ``best`` rule ranks by: the rule's own, else the governing job's kind's objective."""
    from components.runtime.contract.registry import get_kind

    metric, mode = rule.value.get("metric"), rule.value.get("mode")
    if metric is None or mode is None:
        job = Job.objects.filter(pk=rule.owner).only("kind", "spec").first()
        objective = None
        if job is not None:
            try:
                objective = get_kind(job.kind).objective(job.spec)
            except Exception:  # noqa: BLE001 - a kind no longer installed: no objective known
                objective = None
        if metric is None:
            if objective is None:
                return None
            metric, mode = objective[0], mode or objective[1]
        elif objective is not None and objective[0] == metric:
            mode = mode or objective[1]
    return metric, mode or "max"


def _score(artifact: Artifact, metric: str) -> float | None:
    """The last value of ``metric`` the checkpoint's job reported at or before the checkpoint was stored."""
    return (MetricPoint.objects.filter(job_id=artifact.job_id, name=metric, time__lte=artifact.created_at)
            .order_by("-time", "-id").values_list("value", flat=True).first())


def _newest(artifacts: list[Artifact]) -> Artifact:
    return max(artifacts, key=lambda a: (a.created_at, a.name))


def readers(jobs) -> tuple[set[tuple[str, str]], set[int]]:
    """What the given jobs (not ended) read: ``{(source job id, artifact name)}`` from their kinds' ``sources()``,
    and the teams of jobs whose sources cannot be known (a kind no longer installed: nothing of those teams'
    artifacts is collected)."""
    from components.runtime.contract.registry import get_kind

    read, unknown = set(), set()
    for kind, spec, team_id in jobs.values_list("kind", "spec", "team_id"):
        try:
            refs = get_kind(kind).sources(spec)
        except Exception:  # noqa: BLE001 - cannot tell what it reads: keep its team's artifacts
            unknown.add(team_id)
            continue
        read.update((str(ref.job), ref.artifact) for ref in refs)
    return read, unknown


def _unended(since: datetime | None = None):
    jobs = Job.objects.exclude(state__in=TERMINAL_STATES)
    return jobs.filter(created_at__gte=since) if since is not None else jobs


def _delete(artifact: Artifact, reason: str, since: datetime, collected: Collected) -> bool:
    """Delete ``artifact`` (row, bytes, job event) if its job has still ended and nothing began to need it."""
    try:
        with transaction.atomic():
            job = Job.objects.select_for_update().filter(pk=artifact.job_id).only("state", "parent_id", "team_id").first()
            if job is None or job.state not in TERMINAL_STATES:
                return False
            row = Artifact.objects.filter(pk=artifact.pk, storage_key=artifact.storage_key,
                                          created_at=artifact.created_at).first()
            if row is None:
                return False
            if row.kind == ARTIFACT:
                read, unknown = readers(_unended(since))
                if (str(row.job_id), row.name) in read or job.team_id in unknown:
                    return False
            elif job.parent_id and _unended().filter(pk=job.parent_id).exists():
                newest = (Artifact.objects.filter(job_id=row.job_id, kind=CHECKPOINT)
                          .order_by("-created_at", "-name").first())
                if newest is not None and newest.pk == row.pk:
                    return False
            row.delete()
            job_event(row.job_id, "retention", f"{row.kind} {row.name} deleted ({row.size} bytes): {reason}",
                      artifact=row.name, artifact_kind=row.kind, size=row.size, reason=reason)
            if not Artifact.objects.filter(storage_key=row.storage_key).exists():
                get_storage().delete(row.storage_key)  # a failure rolls the row back: tried again next run
    except (OSError, DatabaseError) as error:
        log.warning("retention: %s %s of job %s not deleted (%s); next run tries again", artifact.kind, artifact.name,
                    artifact.job_id, error)
        collected.skipped.append(f"{artifact.job_id}/{artifact.kind}/{artifact.name}")
        return False
    if row.kind == CHECKPOINT:
        collected.checkpoints += 1
    else:
        collected.artifacts += 1
    collected.bytes += row.size
    return True


def _checkpoint_victims(jobs: Jobs, checkpoints: dict[str, list[Artifact]],
                        protected: set) -> list[tuple[Artifact, str]]:
    """The checkpoints of ended jobs no rule keeps, with the reason."""
    victims: list[tuple[Artifact, str]] = []
    groups: dict[tuple, list[Artifact]] = defaultdict(list)
    best: dict[tuple, Rule] = {}
    for job_id, stored in checkpoints.items():
        rule = jobs.rule(job_id, "checkpoints")
        if rule.value == "all" or not stored:
            continue
        if isinstance(rule.value, dict):  # best: N, ranked over the group below
            key = (rule.group, rule.source, repr(sorted(rule.value.items())))
            groups[key].extend(stored)
            best[key] = rule
            continue
        newest = _newest(stored)  # latest (and anything unknown: the safest rule)
        victims += [(a, f"not the job's latest checkpoint ({rule.source}: latest)") for a in stored if a is not newest]
    for key, stored in groups.items():
        rule = best[key]
        objective = _objective(rule)
        if objective is None:  # no metric to rank by: each job keeps its latest
            for job_id in {a.job_id for a in stored}:
                mine = [a for a in stored if a.job_id == job_id]
                newest = _newest(mine)
                victims += [(a, f"not the job's latest checkpoint ({rule.source}: best, but no metric to rank by)")
                            for a in mine if a is not newest]
            continue
        metric, mode = objective
        scored = [(a, _score(a, metric)) for a in stored]
        with_value = sorted((item for item in scored if item[1] is not None),
                            key=lambda item: (-item[1] if mode == "max" else item[1], -item[0].created_at.timestamp()))
        without = sorted((item for item in scored if item[1] is None), key=lambda item: -item[0].created_at.timestamp())
        count = int(rule.value["best"])
        for rank, (artifact, value) in enumerate([*with_value, *without]):
            if rank >= count:
                shown = "no value" if value is None else f"{metric}={value:g}"
                victims.append((artifact, f"not among the {count} best by {metric} ({mode}) of its group ({shown}; "
                                          f"{rule.source}: best {count})"))
    return [(a, reason) for a, reason in victims if jobs.terminal(str(a.job_id)) and a.pk not in protected]


def _artifact_victims(jobs: Jobs, artifacts: dict[str, list[Artifact]], now: datetime,
                      read: set[tuple[str, str]], unknown_teams: set[int]) -> list[tuple[Artifact, str]]:
    victims = []
    for job_id, stored in artifacts.items():
        row = jobs.rows[job_id]
        if not jobs.terminal(job_id) or row["team_id"] in unknown_teams:
            continue
        rule = jobs.rule(job_id, "artifacts_days")
        if rule.value is None:
            continue
        for artifact in stored:
            since = max(artifact.created_at, row["finished_at"] or artifact.created_at)
            if now - since < timedelta(days=float(rule.value)) or (job_id, artifact.name) in read:
                continue
            victims.append((artifact, f"older than {float(rule.value):g} days after the job ended "
                                      f"({rule.source}: artifacts_days {float(rule.value):g})"))
    return victims


def _unused_code(now: datetime, collected: Collected) -> None:
    days = settings.STRATA_RETENTION_UNUSED_CODE_DAYS
    if days is None:
        return
    for bundle in CodeBundle.objects.filter(jobs__isnull=True, created_at__lt=now - timedelta(days=days)):
        try:
            with transaction.atomic():
                locked = CodeBundle.objects.select_for_update().filter(pk=bundle.pk).first()
                if locked is None or Job.objects.filter(code=locked).exists():
                    continue
                locked.delete()
                get_storage().delete(locked.storage_key)
        except (OSError, DatabaseError, IntegrityError) as error:  # a job took it meanwhile, or the store failed
            log.warning("retention: code bundle %s not deleted (%s)", bundle.digest[:12], error)
            continue
        log.info("retention: code bundle %s of team %s deleted (%s bytes): no job used it in %g days",
                 bundle.digest[:12], bundle.team_id, bundle.size, days)
        collected.code += 1
        collected.bytes += bundle.size


def retention_collect(now: datetime | None = None) -> Collected:
    """Delete what no policy keeps (the rules are in this module's docstring). Returns what was deleted."""
    now = now or timezone.now()
    started = timezone.now()
    collected = Collected()
    team_keep = dict(Quota.objects.exclude(keep=None).values_list("team_id", "keep"))
    stored = list(Artifact.objects.order_by())
    jobs = Jobs({a.job_id for a in stored}, team_keep, cluster_keep())
    checkpoints: dict[str, list[Artifact]] = defaultdict(list)
    artifacts: dict[str, list[Artifact]] = defaultdict(list)
    for artifact in stored:
        (checkpoints if artifact.kind == CHECKPOINT else artifacts)[str(artifact.job_id)].append(artifact)
    # In use: the newest checkpoint of a job whose parent has not ended; what jobs that have not ended read.
    protected = set()
    for job_id, mine in checkpoints.items():
        parent = jobs.rows[job_id]["parent_id"]
        if parent and parent in jobs.rows and not jobs.terminal(parent):
            protected.add(_newest(mine).pk)
    read, unknown_teams = readers(_unended())
    for artifact, reason in _checkpoint_victims(jobs, checkpoints, protected):
        _delete(artifact, reason, started, collected)
    for artifact, reason in _artifact_victims(jobs, artifacts, now, read, unknown_teams):
        _delete(artifact, reason, started, collected)
    _unused_code(now, collected)
    # Log lines of ended jobs past STRATA_RETENTION_LOG_DAYS; each job records how many went (its logs say so).
    collected.log_lines = collect_lines(now, settings.STRATA_RETENTION_LOG_DAYS)
    if collected.checkpoints or collected.artifacts or collected.code or collected.log_lines:
        log.info("retention: deleted %s, %s log lines", collected.as_dict(), collected.log_lines)
    return collected
