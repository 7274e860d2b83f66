"""Work lost when a job had to stop: one :class:`~strata.scheduling.models.LostWork` row per attempt that ended
preempted (a higher-priority job took its place, or it was held), shrunk (restarted at a smaller size instead of
being preempted: ``jobs.services.job_resize`` with a reason starting "shrunk") or lost with its node.

Recorded when the attempt ends, by a subscriber of the ``attempt.ended`` lifecycle event (:func:`connect`, from
``SchedulingConfig.ready``): the jobs app sits below the scheduler and never imports it. Recording never breaks an
attempt's end: a failure is logged and the attempt ends as it would have. :func:`record_missing` records the
attempts an event missed (delivery is at most once: a process that died right after the commit).

What an attempt lost (:func:`measure`), from its metric points (``jobs.MetricPoint``) and the job's checkpoints
(``jobs.Artifact`` of kind checkpoint), the latest one written before the attempt ended:

* ``steps``: the attempt's last reported step minus the step reached at that checkpoint (the highest step the job
  reported at or before the checkpoint's ``created_at``). When the job has no checkpoint -- or its checkpoint was
  written before this attempt and the attempt's steps did not go on from it (it started over) -- everything the
  attempt did since its first step is lost (last - first + 1). Never below 0; null when the attempt reported no
  steps.
* ``seconds``: the attempt's end minus the later of the checkpoint and the attempt's start (0 when the checkpoint
  came at or after the last step: nothing was lost; 0 for an attempt that never started).
* ``gpu_seconds``: ``seconds`` times the attempt's GPU share.

The team's usage report (``strata.quotas.usage.team_billing``) reads the sums through :func:`team_summary`, which
:func:`connect` hands to it (quotas sits below the scheduler too).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import Max, Min

from strata.jobs.models import Artifact, Attempt, Job, JobEvent, JobState, MetricPoint
from strata.scheduling.models import LostWork

log = logging.getLogger(__name__)

Cause = LostWork.Cause
PREEMPTED_PREFIX = "preempted by"  # the scheduler's own stops: "preempted by higher-priority job <id>"
SHRUNK_PREFIX = "shrunk"
TOP_JOBS = 10


def cause_of(attempt: Attempt) -> str | None:
    """Why ``attempt`` (ended) lost work: preempted (by the scheduler), shrunk, node_lost; None for any other end
    (finished, failed, cancelled, or stopped because its owner or parent held or resized it)."""
    if attempt.outcome == Attempt.Outcome.NODE_LOST:
        return Cause.NODE_LOST
    if attempt.outcome != Attempt.Outcome.PREEMPTED:
        return None
    if attempt.exit_reason.startswith(SHRUNK_PREFIX):
        return Cause.SHRUNK
    # The job's move to PREEMPTED that stopped this attempt: the latest before it ended ("PREEMPTED: <reason>").
    stops = JobEvent.objects.filter(job_id=attempt.job_id, kind="state", data__state=JobState.PREEMPTED,
                                    time__gte=attempt.created_at)
    if attempt.ended_at is not None:
        stops = stops.filter(time__lte=attempt.ended_at)
    message = stops.order_by("-time", "-id").values_list("message", flat=True).first() or ""
    reason = message.split(":", 1)[1].strip() if ":" in message else ""
    if reason.startswith(SHRUNK_PREFIX):
        return Cause.SHRUNK
    # A stop the job's owner or parent asked for (a hold, a sweep pausing a trial between rungs or resizing it) is
    # not work lost to the scheduler: only its own preemptions count (and a stop whose reason was not kept).
    if reason.startswith(PREEMPTED_PREFIX) or not reason:
        return Cause.PREEMPTED
    return None


def measure(attempt: Attempt) -> dict:
    """What ``attempt`` (ended) lost: ``{steps, seconds, gpu_seconds, checkpoint, checkpoint_step}`` (module
    docstring)."""
    ended = attempt.ended_at
    points = MetricPoint.objects.filter(attempt_id=attempt.pk)
    span = points.aggregate(first=Min("step"), last=Max("step"))
    first, last = span["first"], span["last"]
    last_time = (points.filter(step=last).aggregate(at=Max("time"))["at"] if last is not None else None)
    checkpoints = Artifact.objects.filter(job_id=attempt.job_id, kind=Artifact.Kind.CHECKPOINT)
    if ended is not None:
        checkpoints = checkpoints.filter(created_at__lte=ended)
    checkpoint = checkpoints.order_by("-created_at").values_list("created_at", flat=True).first()
    checkpoint_step = None
    if checkpoint is not None:
        checkpoint_step = (MetricPoint.objects.filter(job_id=attempt.job_id, time__lte=checkpoint)
                           .aggregate(step=Max("step"))["step"])

    steps = None
    if last is not None:
        mine = points.filter(time__lte=checkpoint).aggregate(step=Max("step"))["step"] if checkpoint else None
        if mine is not None:  # written during this attempt, after some of its steps
            checkpoint_step = mine
            baseline = mine
        elif checkpoint_step is not None and checkpoint_step < first:  # this attempt went on from it
            baseline = checkpoint_step
        else:  # no checkpoint, or the attempt started over: all it did is lost
            baseline = first - 1
        steps = max(0, last - baseline)

    began = attempt.started_at
    if began is None or ended is None:
        seconds = 0.0
    elif steps == 0 or (checkpoint is not None and last_time is not None and checkpoint >= last_time):
        seconds = 0.0
    else:
        since = max(began, checkpoint) if checkpoint is not None else began
        seconds = max(0.0, (ended - since).total_seconds())
    return {"steps": steps, "seconds": seconds, "gpu_seconds": seconds * float(attempt.gpu_share or 0.0),
            "checkpoint": checkpoint is not None, "checkpoint_step": checkpoint_step}


def record(attempt_id) -> LostWork | None:
    """Record what the ended attempt ``attempt_id`` lost, once (again: the row it has); None when it did not end
    preempted, shrunk or with its node."""
    existing = LostWork.objects.filter(attempt_id=attempt_id).first()
    if existing is not None:
        return existing
    attempt = Attempt.objects.filter(pk=attempt_id, ended_at__isnull=False).first()
    if attempt is None:
        return None
    cause = cause_of(attempt)
    if cause is None:
        return None
    team_id = Job.objects.filter(pk=attempt.job_id).values_list("team_id", flat=True).first()
    if team_id is None:
        return None
    try:
        with transaction.atomic():
            return LostWork.objects.create(job_id=attempt.job_id, attempt=attempt, team_id=team_id, cause=cause,
                                           time=attempt.ended_at, **measure(attempt))
    except IntegrityError:  # recorded meanwhile (a backfill racing the event)
        return LostWork.objects.filter(attempt_id=attempt_id).first()


def on_attempt_ended(event) -> None:
    """The ``attempt.ended`` subscriber: record the attempt's lost work; an error is logged, never raised."""
    if event.outcome not in (Attempt.Outcome.PREEMPTED, Attempt.Outcome.NODE_LOST):
        return
    try:
        record(event.attempt_id)
    except Exception:  # noqa: BLE001 - recording must never break an attempt's end
        log.exception("could not record the work attempt %s lost (%s)", event.attempt_id, event.outcome)


def record_missing(since: datetime | None = None) -> int:
    """Record the attempts that ended preempted or with their node (since ``since``) and have no row yet: those
    whose event was never delivered. Returns how many were recorded."""
    attempts = Attempt.objects.filter(outcome__in=[Attempt.Outcome.PREEMPTED, Attempt.Outcome.NODE_LOST],
                                      ended_at__isnull=False, lost_work__isnull=True)
    if since is not None:
        attempts = attempts.filter(ended_at__gte=since)
    count = 0
    for attempt_id in attempts.values_list("pk", flat=True).iterator():
        try:
            count += record(attempt_id) is not None
        except Exception:  # noqa: BLE001 - one attempt's failure leaves the others
            log.exception("could not record the work attempt %s lost", attempt_id)
    return count


# --- per team ------------------------------------------------------------------------------------------------

COUNTS = {Cause.PREEMPTED: "preemptions", Cause.SHRUNK: "shrinks", Cause.NODE_LOST: "node_losses"}


def _empty() -> dict:
    return {"preemptions": 0, "shrinks": 0, "node_losses": 0, "steps": 0, "seconds": 0.0, "gpu_seconds": 0.0}


def _add(totals: dict, cause: str, steps: int | None, seconds: float, gpu_seconds: float) -> None:
    totals[COUNTS[cause]] += 1
    totals["steps"] += steps or 0
    totals["seconds"] += seconds
    totals["gpu_seconds"] += gpu_seconds


def _shown(totals: dict) -> dict:
    """Totals as the report shows them: GPU-hours, not GPU-seconds."""
    shown = {key: value for key, value in totals.items() if key != "gpu_seconds"}
    shown["gpu_hours"] = totals["gpu_seconds"] / 3600
    return shown


def team_summary(team_id: int | None, since: datetime | None, until: datetime | None, top: int | None = TOP_JOBS
                 ) -> dict:
    """The work team ``team_id`` (None: every team) lost in [since, until]: ``{preemptions, shrinks,
    node_losses, steps, seconds, gpu_hours, by_cause, jobs}``; ``by_cause``: ``{cause: {attempts, steps,
    gpu_hours}}`` for each cause (preempted, shrunk, node_lost); ``jobs`` the ``top`` jobs that lost the most
    GPU-seconds (all with ``top=None``), each with the totals' figures and ``job``, ``name``, ``attempts``."""
    rows = LostWork.objects.all()
    if team_id is not None:
        rows = rows.filter(team_id=team_id)
    if since is not None:
        rows = rows.filter(time__gte=since)
    if until is not None:
        rows = rows.filter(time__lte=until)
    totals = _empty()
    per_job: dict = defaultdict(_empty)
    by_cause = {cause: {"attempts": 0, "steps": 0, "gpu_seconds": 0.0} for cause in COUNTS}
    for job_id, cause, steps, seconds, gpu_seconds in rows.values_list("job_id", "cause", "steps", "seconds",
                                                                        "gpu_seconds"):
        if cause not in COUNTS:
            continue
        _add(totals, cause, steps, seconds, gpu_seconds)
        _add(per_job[job_id], cause, steps, seconds, gpu_seconds)
        by_cause[cause]["attempts"] += 1
        by_cause[cause]["steps"] += steps or 0
        by_cause[cause]["gpu_seconds"] += gpu_seconds
    ranked = sorted(per_job.items(), key=lambda item: (-item[1]["gpu_seconds"], -item[1]["steps"], str(item[0])))
    if top is not None:
        ranked = ranked[:top]
    names = dict(Job.objects.filter(pk__in=[job_id for job_id, _ in ranked]).values_list("pk", "name"))
    jobs = [{"job": str(job_id), "name": names.get(job_id, ""),
             "attempts": figures["preemptions"] + figures["shrinks"] + figures["node_losses"], **_shown(figures)}
            for job_id, figures in ranked]
    return {**_shown(totals), "by_cause": {str(cause): _shown(figures) for cause, figures in by_cause.items()},
            "jobs": jobs}


def connect() -> None:
    """Subscribe to attempt ends and give the usage report its source of lost work; from
    ``SchedulingConfig.ready``."""
    from strata.jobs.events import subscribe
    from strata.quotas.usage import provide_lost_work

    subscribe(on_attempt_ended, ["attempt.ended"])
    provide_lost_work(team_summary)
