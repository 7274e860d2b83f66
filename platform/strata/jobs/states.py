"""The job state machine. Every change is a compare-and-set; terminal states never change."""

from __future__ import annotations

from django.utils import timezone

from strata.jobs import history
from strata.jobs.models import TERMINAL_STATES, Job, JobEvent, JobState

S = JobState
TRANSITIONS: dict[str, frozenset[str]] = {
    S.PENDING: frozenset({S.QUEUED, S.CANCELLED}),
    S.QUEUED: frozenset({S.SCHEDULED, S.CANCELLED}),
    S.SCHEDULED: frozenset({S.RUNNING, S.QUEUED, S.PREEMPTED, S.FAILED, S.CANCELLED}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.PREEMPTED, S.QUEUED}),
    S.PREEMPTED: frozenset({S.QUEUED, S.CANCELLED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}
assert set(TRANSITIONS) == set(JobState.values)
assert all(not TRANSITIONS[state] for state in TERMINAL_STATES)


class InvalidTransition(Exception):
    def __init__(self, job_id, expected, target, actual=None):
        self.job_id, self.expected, self.target, self.actual = job_id, expected, target, actual
        super().__init__(f"job {job_id}: cannot move to {target} from {actual or 'its current state'}")


def allowed(source: str, target: str) -> bool:
    return target in TRANSITIONS[source]


def transition(job: Job | str, sources, target: str, reason: str = "", **fields) -> None:
    """Move a job from one of ``sources`` to ``target`` atomically, or raise :class:`InvalidTransition`.

    The UPDATE's WHERE clause carries the expected state, so two racing writers cannot both win.
    """
    job_id = job.pk if isinstance(job, Job) else job
    if isinstance(sources, str):
        sources = (sources,)
    sources = [source for source in sources if allowed(source, target)]
    now = timezone.now()
    updates = {"state": target, "reason": reason[:500], "updated_at": now, **fields}
    if target == S.QUEUED:
        updates.setdefault("queued_at", now)
    if target in TERMINAL_STATES:
        updates.setdefault("finished_at", now)
    changed = Job.objects.filter(pk=job_id, state__in=sources).update(**updates) if sources else 0
    if changed != 1:
        actual = Job.objects.filter(pk=job_id).values_list("state", flat=True).first()
        raise InvalidTransition(job_id, sources, target, actual)
    JobEvent.objects.create(job_id=job_id, kind="state", message=f"{target}: {reason}" if reason else target,
                            data={"state": target})
    history.record("state", job=job_id, source=job.state if isinstance(job, Job) else
                   (sources[0] if len(sources) == 1 else None), target=target, reason=reason[:200])
    if target in TERMINAL_STATES:
        _stop_participants(job_id, target, now)
    _announce(job, job_id, sources, target, reason)
    if isinstance(job, Job):
        for name, value in updates.items():
            setattr(job, name, value)


def _stop_participants(job_id, target: str, now) -> None:
    """A job that ended stops its active participants in the same transaction: their next heartbeat answers stop,
    and they no longer count against the team's quota."""
    from strata.jobs.models import Participant

    stopped = Participant.objects.filter(job_id=job_id, state=Participant.State.ACTIVE).update(
        state=Participant.State.STOPPED, reason=f"the job ended ({target})", ended_at=now)
    if stopped:
        JobEvent.objects.create(job_id=job_id, kind="participant",
                                message=f"{stopped} participant(s) stopped: the job ended ({target})",
                                data={"stopped": stopped})


def _announce(job, job_id, sources, target: str, reason: str) -> None:
    """The lifecycle event of a transition, delivered to plugins after commit (strata.jobs.events)."""
    from strata.jobs.events import emit, subscribers

    if not subscribers("job.transitioned"):
        return
    from components.runtime.contract.events import JobTransitioned

    if isinstance(job, Job):
        team_id, kind, before = job.team_id, job.kind, job.state
    else:
        team_id, kind = Job.objects.filter(pk=job_id).values_list("team_id", "kind").first() or (None, "")
        before = None
    source = before if before in sources else (sources[0] if len(sources) == 1 else None)
    emit(JobTransitioned(job_id=str(job_id), team_id=team_id, kind=kind, source=source, target=target,
                         reason=reason))

