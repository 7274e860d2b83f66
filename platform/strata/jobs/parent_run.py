"""Child jobs that their parent runs itself ("by parent"): recorded, visible and cancellable like any job, but
never placed by the scheduler. The parent's attempt runs them in processes it already holds (warm workers inside
its own allocation) and reports, in batches, when each starts and ends, its metric points, its log lines and its
files.

Such a child is ``nested`` (inside its parent's allocation, no quota of its own) and ``held`` (the scheduler
never places a held job). Its states:

- submitted: QUEUED, held, reason "waiting for its parent to run it";
- started by its parent: QUEUED -> SCHEDULED -> RUNNING (``started_at`` set the first time);
- paused by its parent (it stopped at a checkpoint and will go on later): RUNNING -> QUEUED, still held;
- ended by its parent: RUNNING -> SUCCEEDED, FAILED or CANCELLED;
- cancelled through the API (``job_cancel``): CANCELLED at once; the parent reads the state in its next batch
  and stops running it (a later report about it is ignored);
- its parent's attempt ended: RUNNING -> PREEMPTED (as every nested child) -> QUEUED, held, in the same
  transaction (it has no attempt of its own to end), so the parent's next attempt can run it again from its
  checkpoint. A user who releases it lets the scheduler place it as an ordinary nested child.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from strata.jobs import log_search
from strata.jobs.models import TERMINAL_STATES, Attempt, Job, JobState, LogLine, MetricPoint
from strata.jobs.states import InvalidTransition, transition

S = JobState
WAITING = "waiting for its parent to run it"
END_STATES = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.QUEUED})


def mark_by_parent(job: Job) -> None:
    """Make a just-submitted nested child one its parent runs itself: held, so it is never placed."""
    Job.objects.filter(pk=job.pk, state__in=[S.PENDING, S.QUEUED]).update(held=True, reason=WAITING)
    job.held, job.reason = True, WAITING


def runs_by_parent(job: Job) -> bool:
    """Whether the parent may run ``job`` itself: a nested, held child without an attempt that has not ended."""
    return (job.parent_id is not None and job.nested and job.held
            and not Attempt.objects.filter(job_id=job.pk, ended_at__isnull=True).exists())


def start(attempt: Attempt, child: Job) -> bool:
    """The parent starts running ``child`` now. False when it cannot (ended, cancelled, not run by its parent)."""
    if child.terminal or not runs_by_parent(child):
        return False
    reason = f"run by its parent's attempt {attempt.number}"
    try:
        if child.state == S.PREEMPTED:
            transition(child, S.PREEMPTED, S.QUEUED, WAITING)
        if child.state == S.QUEUED:
            transition(child, S.QUEUED, S.SCHEDULED, reason)
        fields = {} if child.started_at else {"started_at": timezone.now()}
        transition(child, S.SCHEDULED, S.RUNNING, reason, **fields)
    except InvalidTransition:
        return False
    return True


def end(child: Job, state: str, reason: str) -> bool:
    """The parent stopped running ``child``: it ended in ``state`` (SUCCEEDED, FAILED, CANCELLED) or paused
    (QUEUED: it goes on later from its checkpoint). False when the child was no longer running (cancelled
    through the API meanwhile, say)."""
    if state not in END_STATES:
        raise ValueError(f"a child ends SUCCEEDED, FAILED, CANCELLED or QUEUED, not {state}")
    try:
        fields = {"failures": child.failures + 1} if state == S.FAILED else {}
        transition(child, S.RUNNING, state, reason or state.lower(), **fields)
    except InvalidTransition:
        return False
    return True


def record(child: Job, *, metrics: list[dict[str, Any]] = (), logs: list[dict[str, Any]] = ()) -> None:  # type: ignore[assignment]
    """Store metric points (``{name, step, value, time?}``) and log lines (``{message, level?, time?}``) the
    parent measured for ``child``."""
    from django.conf import settings

    now = timezone.now()
    if metrics:
        MetricPoint.objects.bulk_create([
            MetricPoint(job_id=child.pk, attempt=None, name=str(item["name"])[:100], step=int(item["step"]),
                        value=float(item["value"]), time=item.get("time") or now) for item in metrics])
    if logs:
        room = settings.STRATA_MAX_LOG_LINES_PER_JOB - LogLine.objects.filter(job_id=child.pk).count()
        LogLine.objects.bulk_create([
            LogLine(job_id=child.pk, attempt=None, level=str(item.get("level", "info"))[:16],
                    message=str(item.get("message", ""))[:10000], time=item.get("time") or now,
                    rank=log_search.rank_of(str(item.get("message", ""))))
            for item in logs[: max(room, 0)]])
        log_search.note_dropped(child.pk, list(logs[max(room, 0):]), now)


def batch(attempt: Attempt, *, submitted: list[Job] = (), start_ids: list[str] = (),  # type: ignore[assignment]
          ends: dict[str, dict[str, str]] | None = None, metrics: dict[str, list[dict]] | None = None,
          logs: dict[str, list[dict]] | None = None, watch: list[str] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    """One round trip of a parent that runs its children itself, after its new children were submitted
    (``submitted``, by ``child_submit(..., by_parent=True)``): start some, record their points and lines, end
    some, and answer the state of every child named anywhere in the call (``watch`` included), so the parent
    learns of a cancellation in the same call. Reports about a child that is no longer running are dropped.
    Returns ``{"submitted": [job], "started": [id], "ended": [id], "states": {id: {"state", "reason"}}}``."""
    ends, metrics, logs = ends or {}, metrics or {}, logs or {}
    named = {str(i) for i in [*start_ids, *ends, *metrics, *logs, *watch]}
    with transaction.atomic():
        children = {str(job.pk): job for job in Job.objects.filter(parent_id=attempt.job_id, pk__in=list(named))}
        # Starts first: the points of a child started in this same call are its own.
        started = [str(i) for i in start_ids if str(i) in children and start(attempt, children[str(i)])]
        for job_id, points in metrics.items():
            child = children.get(str(job_id))
            if child is not None and child.state == S.RUNNING:
                record(child, metrics=points)
        for job_id, lines in logs.items():
            child = children.get(str(job_id))
            if child is not None and not child.terminal:
                record(child, logs=lines)
        ended = [job_id for job_id, item in ends.items()
                 if str(job_id) in children and end(children[str(job_id)], item["state"], item.get("reason", ""))]
    states = {job_id: {"state": child.state, "reason": child.reason} for job_id, child in children.items()}
    for job in submitted:
        job.refresh_from_db()
    return {"submitted": list(submitted), "started": started, "ended": ended, "states": states}


def requeue_after_parent(attempt: Attempt) -> None:
    """Called when ``attempt`` ended, after its nested children were preempted: the ones it ran itself have no
    attempt of their own to end, so they go back to waiting (held) at once, for the parent's next attempt."""
    for child in Job.objects.filter(parent_id=attempt.job_id, nested=True, held=True, state=S.PREEMPTED):
        if Attempt.objects.filter(job_id=child.pk, ended_at__isnull=True).exists():
            continue
        try:
            transition(child, S.PREEMPTED, S.QUEUED, f"its parent's attempt {attempt.number} ended; {WAITING}")
        except InvalidTransition:
            continue


__all__ = ["END_STATES", "TERMINAL_STATES", "batch", "end", "mark_by_parent", "record", "requeue_after_parent",
           "runs_by_parent", "start"]
