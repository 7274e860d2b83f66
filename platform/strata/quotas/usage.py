"""Billing by actual use: what a job (and a team) was allocated against what it used, and a team's GPU-hour budget.

One place computes it, for the API (``GET /api/v1/usage/<team>/``, ``?format=csv``), the dashboard's Usage page,
``strata usage`` and the Prometheus counters (``strata.quotas.metrics``):

* **allocated** GPU-seconds are what ``quotas.selectors`` bills (each attempt's GPU share from dispatch to release,
  plus the GPUs its participants brought): the same count as the quota and the compare page;
* **used** GPU-seconds, per allocation (one attempt's share of one device, ``jobs.Allocation``), from the best
  source there is:

  - **measured** device time: where a plugin's report series (``telemetry.ReportSeries``) has rows that name both
    the attempt and the device, each row is a stretch of device time the attempt ran (the GPU-sharing service's
    slices of kernel time); their union, clipped to the allocation and the period, is what it used (in whole-device
    seconds: a slice has the device to itself);
  - **telemetry** otherwise: the device's utilization samples (``telemetry.DeviceSample`` and the minute/hour
    rollups, read by ``telemetry.selectors.device_grid``), each bucket's busy time (utilization times the time
    the device was held in it) shared among the allocations that held the device then, in proportion to
    share × time held. A job alone on a device gets all of its busy time (a 0.5 share that keeps the device
    at 100 % used 1 GPU-second a second); two jobs at 0.5 split it;

* **unmeasured** GPU-seconds: allocated time with neither (buckets without samples, participants' own GPUs): not
  counted as idle, since nothing says it was;
* **idle** = allocated - used - unmeasured (never below 0): the reservations nobody used.

Device memory is attributed the same way as utilization (byte-seconds), reported as the mean bytes used.

Budgets (``Quota.budget_gpu_hours``) are charged the **allocated** GPU-hours of a period (a calendar month, UTC,
or ``Quota.budget_period_days`` days counted from 1970-01-01): a reservation blocks others whether or not it
computes. The forecast divides what is left by the allocated rate over the last ``rate_hours``.

**Lost work** (``lost_work``): what the team's attempts lost in the period when they had to stop -- preempted,
shrunk (restarted smaller) or lost with their node: how many of each, the steps and GPU-hours lost since the last
checkpoint, and the jobs that lost the most. Recorded per attempt by ``strata.scheduling.lost_work``, which hands
its reader to :func:`provide_lost_work` when its app is ready (the scheduler sits above quotas: never imported).
"""

from __future__ import annotations

import csv
import io
import logging
import math
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

from django.db.models import Q
from django.utils import timezone

from strata.cluster.models import Device
from strata.jobs.models import Allocation, Job
from strata.quotas.selectors import _clipped, _gpu_spans

log = logging.getLogger(__name__)

RATE_HOURS = 24.0  # the default span the forecast's rate is measured over
GRID_POINTS = 3000  # about a bucket per tier resolution: 2 h of 3 s samples, 2 days of minutes, 4 months of hours
TOP_IDLE = 10


@dataclass
class JobUse:
    """One job's GPU time in a period, in GPU-seconds (``measured`` is the part of ``used`` that came from device
    time a plugin measured; the rest came from telemetry)."""

    job_id: uuid.UUID
    allocated: float = 0.0
    used: float = 0.0
    measured: float = 0.0
    unmeasured: float = 0.0
    memory_byte_seconds: float = 0.0
    held_seconds: float = 0.0  # allocation-seconds on devices (not share-weighted), for the mean memory

    @property
    def idle(self) -> float:
        return max(0.0, self.allocated - self.used - self.unmeasured)

    @property
    def memory_used_mean(self) -> float:
        return self.memory_byte_seconds / self.held_seconds if self.held_seconds else 0.0

    @property
    def source(self) -> str:
        if self.used <= 0 and self.unmeasured > 0:
            return "none"
        if self.measured > 0:
            return "measured" if self.measured >= self.used - 1e-9 else "mixed"
        return "telemetry"


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def _overlap(a: float, b: float, c: float, d: float) -> float:
    return max(0.0, min(b, d) - max(a, c))


def job_uses(jobs: dict, since: datetime | None = None, until: datetime | None = None) -> dict[uuid.UUID, JobUse]:
    """Allocated, used, measured and unmeasured GPU-seconds (and memory) in [since, until] of each job the
    ``jobs`` lookups (on Job) select that held a GPU in it; see the module docstring."""
    from strata.telemetry.models import ReportSeries
    from strata.telemetry.selectors import device_grid

    until = until or timezone.now()
    uses: dict[uuid.UUID, JobUse] = {}
    for job_id, began, ended, share in _gpu_spans(jobs, since, until):
        use = uses.setdefault(job_id, JobUse(job_id))
        use.allocated += _clipped(began, ended, since, until) * share
    scope = {f"attempt__job__{lookup}": value for lookup, value in jobs.items()}
    window = Q(attempt__ended_at__isnull=True) | Q(attempt__ended_at__gt=since) if since is not None else Q()
    held = (Allocation.objects.filter(window, **scope, nested=False, share__gt=0, attempt__gpu_share__gt=0,
                                      attempt__dispatched_at__isnull=False, attempt__dispatched_at__lt=until)
            .exclude(device__kind=Device.Kind.CPU)
            .values_list("id", "attempt_id", "attempt__job_id", "device_id", "share", "attempt__dispatched_at",
                         "attempt__ended_at"))
    lo_t = since.timestamp() if since is not None else None
    hi_t = until.timestamp()
    mine = []  # (allocation id, attempt, job, device, share, start, end) clipped to the period, in Unix seconds
    for pk, attempt, job_id, device, share, began, ended in held:
        start = max(began.timestamp(), lo_t) if lo_t is not None else began.timestamp()
        end = min(ended.timestamp() if ended else hi_t, hi_t)
        if end > start:
            mine.append((pk, attempt, job_id, device, share, start, end))
    # Participants (and anything else without a device of the cluster): allocated, never measured.
    on_devices: dict[uuid.UUID, float] = defaultdict(float)
    for _, _, job_id, _, share, start, end in mine:
        on_devices[job_id] += (end - start) * share
    for job_id, use in uses.items():
        use.unmeasured += max(0.0, use.allocated - on_devices.get(job_id, 0.0))
    if not mine:
        return uses
    first = min(row[5] for row in mine)
    devices = {row[3] for row in mine}

    # Measured device time: the plugins' series rows that name the attempt and the device.
    slices: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    rows = (ReportSeries.objects.filter(attempt_id__in={row[1] for row in mine}, device_id__in=devices,
                                        end__gt=datetime.fromtimestamp(first, tz=UTC), start__lt=until)
            .values_list("attempt_id", "device_id", "start", "end"))
    for attempt, device, start, end in rows:
        slices[(attempt, device)].append((start.timestamp(), end.timestamp()))
    measured_pairs = {pair for pair in slices}

    # Telemetry: everyone's allocations on these devices (another team's only weigh in the sharing).
    origin_dt = datetime.fromtimestamp(first, tz=UTC)
    grid = device_grid(devices, origin_dt, until, points=GRID_POINTS)
    step, count, origin = grid.step, grid.count, grid.start.timestamp()
    holders: dict[int, list[tuple[float, float, float]]] = defaultdict(list)
    others = (Allocation.objects.filter(Q(attempt__ended_at__isnull=True) | Q(attempt__ended_at__gt=origin_dt),
                                        device_id__in=devices, nested=False, share__gt=0,
                                        attempt__dispatched_at__isnull=False, attempt__dispatched_at__lt=until)
              .values_list("device_id", "share", "attempt__dispatched_at", "attempt__ended_at"))
    for device, share, began, ended in others:
        start, end = max(began.timestamp(), first), min(ended.timestamp() if ended else hi_t, hi_t)
        if end > start:
            holders[device].append((start, end, share))
    weight: dict[int, list[float]] = {}
    covered: dict[int, list[float]] = {}
    for device, spans in holders.items():
        w, c = [0.0] * count, [0.0] * count
        for start, end, share in spans:
            for i in range(max(0, int((start - origin) // step)), min(count, math.ceil((end - origin) / step))):
                w[i] += _overlap(start, end, origin + i * step, origin + (i + 1) * step) * share
        for start, end in _union([(start, end) for start, end, _ in spans]):
            for i in range(max(0, int((start - origin) // step)), min(count, math.ceil((end - origin) / step))):
                c[i] += _overlap(start, end, origin + i * step, origin + (i + 1) * step)
        weight[device], covered[device] = w, c

    for _, attempt, job_id, device, share, start, end in mine:
        use = uses.setdefault(job_id, JobUse(job_id))
        use.held_seconds += end - start
        utilization, memory = grid.utilization.get(device, []), grid.memory_used.get(device, [])
        w, c = weight.get(device, []), covered.get(device, [])
        for i in range(max(0, int((start - origin) // step)), min(count, math.ceil((end - origin) / step))):
            held = _overlap(start, end, origin + i * step, origin + (i + 1) * step)
            if held <= 0:
                continue
            mean = memory[i] if i < len(memory) else None
            if mean is not None and w[i] > 0:
                use.memory_byte_seconds += mean * c[i] * held * share / w[i]
            if (attempt, device) in measured_pairs:
                continue
            value = utilization[i] if i < len(utilization) else None
            if value is None or w[i] <= 0:
                use.unmeasured += held * share
                continue
            use.used += value / 100.0 * c[i] * held * share / w[i]
        if (attempt, device) in measured_pairs:
            seconds = sum(_overlap(a, b, start, end) for a, b in _union(slices[(attempt, device)]))
            use.used += seconds
            use.measured += seconds
    return uses


# --- a team over a period -----------------------------------------------------------------------------------

def budget_period(quota, now: datetime | None = None) -> tuple[datetime, datetime]:
    """[start, end) of the budget period ``now`` is in: the calendar month (UTC), or the ``budget_period_days``
    days long period counted from 1970-01-01 (UTC)."""
    now = (now or timezone.now()).astimezone(UTC)
    days = getattr(quota, "budget_period_days", None)
    if days:
        length = days * 86400.0
        start = math.floor(now.timestamp() / length) * length
        return datetime.fromtimestamp(start, tz=UTC), datetime.fromtimestamp(start + length, tz=UTC)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = (start + timedelta(days=32)).replace(day=1)
    return start, end


def forecast(budget_seconds: float, charged_seconds: float, rate: float, now: datetime,
             period_end: datetime) -> dict:
    """When the budget runs out at ``rate`` GPU-seconds per second: ``{"exhausted", "runs_out_at" (a datetime or
    None), "text"}``. None when it does not before the period ends (the budget starts over then)."""
    left = budget_seconds - charged_seconds
    if left <= 0:
        return {"exhausted": True, "runs_out_at": None, "text": "the budget is used up for this period"}
    if rate <= 0:
        return {"exhausted": False, "runs_out_at": None, "text": "not at this rate (nothing used recently)"}
    at = now + timedelta(seconds=left / rate)
    if at >= period_end:
        return {"exhausted": False, "runs_out_at": None,
                "text": f"not at this rate (the period ends {period_end:%Y-%m-%d %H:%M} UTC first)"}
    return {"exhausted": False, "runs_out_at": at, "text": f"at this rate the budget runs out on {at:%Y-%m-%d %H:%M} UTC"}


def _job_row(use: JobUse, job: Job | None) -> dict:
    return {"job": str(use.job_id), "name": job.name if job else "", "kind": job.kind if job else "",
            "owner": job.owner.username if job and job.owner_id else "", "state": job.state if job else "",
            "allocated_gpu_hours": use.allocated / 3600, "used_gpu_hours": use.used / 3600,
            "measured_gpu_hours": use.measured / 3600, "unmeasured_gpu_hours": use.unmeasured / 3600,
            "idle_gpu_hours": use.idle / 3600,
            "efficiency": (use.used / use.allocated) if use.allocated > use.unmeasured else None,
            "memory_used_mean": round(use.memory_used_mean), "source": use.source}


def team_billing(team, since: datetime | None = None, until: datetime | None = None, *, rate_hours: float = RATE_HOURS,
                 top: int | None = TOP_IDLE, now: datetime | None = None) -> dict:
    """A team's allocated against used GPU-hours in [since, until] (default: its current budget period up to now),
    its jobs (the ``top`` idlest, or all with ``top=None``), and its budget with the forecast."""
    from strata.quotas.models import Quota

    now = now or timezone.now()
    quota = Quota.objects.filter(team_id=team.pk).first() or Quota(team_id=team.pk)
    period_start, period_end = budget_period(quota, now)
    since = since if since is not None else period_start
    until = min(until or now, now)
    uses = job_uses({"team_id": team.pk}, since, until)
    totals = JobUse(uuid.UUID(int=0))
    for use in uses.values():
        for name in ("allocated", "used", "measured", "unmeasured", "memory_byte_seconds", "held_seconds"):
            setattr(totals, name, getattr(totals, name) + getattr(use, name))
    ranked = sorted(uses.values(), key=lambda use: (-use.idle, -use.allocated, str(use.job_id)))
    if top is not None:
        ranked = ranked[:top]
    jobs = Job.objects.select_related("owner").in_bulk([use.job_id for use in ranked])
    summary = _job_row(totals, None)
    for key in ("job", "name", "kind", "owner", "state"):
        summary.pop(key)
    answer = {"team": team.slug, "since": since, "until": until, **summary, "jobs_counted": len(uses),
              "jobs": [_job_row(use, jobs.get(use.job_id)) for use in ranked], "budget": None,
              "lost_work": lost_work(team.pk, since, until, top=top if top is None else min(top, TOP_LOST))}
    if quota.budget_gpu_hours is not None:
        charged = _allocated(team.pk, period_start, now)
        rate_since = max(now - timedelta(hours=rate_hours), period_start - timedelta(hours=rate_hours))
        rate = _allocated(team.pk, rate_since, now) / max(1.0, (now - rate_since).total_seconds())
        outlook = forecast(quota.budget_gpu_hours * 3600, charged, rate, now, period_end)
        answer["budget"] = {
            "gpu_hours": quota.budget_gpu_hours, "period_start": period_start, "period_end": period_end,
            "period_days": quota.budget_period_days, "charged_gpu_hours": charged / 3600,
            "left_gpu_hours": max(0.0, quota.budget_gpu_hours - charged / 3600),
            "rate_gpu_hours_per_day": rate * 86400 / 3600, "rate_hours": rate_hours, **outlook}
    return answer


# --- work lost to preemption, shrinks and node losses ---------------------------------------------------------

TOP_LOST = 10  # the jobs that lost the most GPU-seconds, in the report
LOST_COUNTS = ("preemptions", "shrinks", "node_losses")
LOST_CAUSES = ("preempted", "shrunk", "node_lost")  # by_cause's keys
LostWorkSource = Callable[[int | None, datetime | None, datetime | None, int | None], dict]
_lost_work_source: LostWorkSource | None = None


def provide_lost_work(source: LostWorkSource | None) -> None:
    """Where :func:`lost_work` reads from: ``source(team_id or None for every team, since, until, top)``
    (``strata.scheduling.lost_work.team_summary``, given when the scheduling app is ready)."""
    global _lost_work_source
    _lost_work_source = source


def lost_work(team_id: int | None, since: datetime | None, until: datetime | None, top: int | None = TOP_LOST
              ) -> dict:
    """The work a team (None: every team) lost in [since, until]: ``{preemptions, shrinks, node_losses, steps,
    seconds, gpu_hours, by_cause, jobs}``; ``by_cause`` ``{preempted|shrunk|node_lost: {attempts, steps,
    gpu_hours}}``; ``jobs`` the ``top`` that lost the most GPU-seconds (all with None), each ``{job, name,
    attempts, preemptions, shrinks, node_losses, steps, seconds, gpu_hours}``. Nothing lost when no source was
    given (or it failed: the report still answers)."""
    empty = {**{name: 0 for name in LOST_COUNTS}, "steps": 0, "seconds": 0.0, "gpu_hours": 0.0,
             "by_cause": {cause: {"attempts": 0, "steps": 0, "gpu_hours": 0.0} for cause in LOST_CAUSES},
             "jobs": []}
    if _lost_work_source is None:
        return empty
    try:
        return _lost_work_source(team_id, since, until, top)
    except Exception:  # noqa: BLE001 - a report without lost work beats no report
        log.exception("could not read the lost work of team %s", team_id)
        return empty


def _allocated(team_id: int, since: datetime, until: datetime) -> float:
    from strata.quotas.selectors import gpu_seconds

    return gpu_seconds(team_id, since=since, until=until)


# --- CSV ----------------------------------------------------------------------------------------------------

CSV_COLUMNS = ["team", "job", "name", "kind", "owner", "state", "since", "until", "allocated_gpu_hours",
               "used_gpu_hours", "measured_gpu_hours", "unmeasured_gpu_hours", "idle_gpu_hours", "efficiency",
               "memory_used_mean", "source", "preemptions", "shrinks", "node_losses", "lost_steps",
               "lost_gpu_hours"]
LOST_COLUMNS = {"preemptions": "preemptions", "shrinks": "shrinks", "node_losses": "node_losses",
                "lost_steps": "steps", "lost_gpu_hours": "gpu_hours"}  # CSV column -> lost_work job field


def _cell(value) -> str:
    """A CSV cell; a text a spreadsheet would run as a formula gets a leading quote."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float):
        return f"{value:.6f}"
    text = str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def billing_csv(billing: dict) -> str:
    """``team_billing``'s jobs as CSV (CSV_COLUMNS), one row a job, idlest first, with the work each lost (its
    ``lost_work`` jobs; 0 for a job that lost none)."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    lost = {row["job"]: row for row in (billing.get("lost_work") or {}).get("jobs", [])}
    for row in billing["jobs"]:
        data = {**row, "team": billing["team"], "since": billing["since"], "until": billing["until"]}
        mine = lost.get(row["job"], {})
        data.update({column: mine.get(field, 0.0 if column == "lost_gpu_hours" else 0)
                     for column, field in LOST_COLUMNS.items()})
        writer.writerow([_cell(data[column]) for column in CSV_COLUMNS])
    return out.getvalue()


def as_dict(use: JobUse) -> dict:
    return {**asdict(use), "idle": use.idle}
