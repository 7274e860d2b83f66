"""Stored bytes, and GPU-seconds allocated, used and lost, in the web process's ``/metrics`` (docs/operations/metrics.md):
collectors registered in ``strata.telemetry.metrics.CLUSTER_REGISTRY`` when the app is ready, computed from the
database at scrape time."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily


class StorageCollector:
    """Stored bytes: cluster totals by part, and per team behind the metrics token."""

    def describe(self):
        return []  # computed at scrape time: no registration-time query

    def collect(self):
        yield from storage_families()


def storage_families():
    """Stored bytes (quotas.services.storage_by_team): cluster totals by part, always; per team only when
    ``STRATA_METRICS_TOKEN`` guards ``/metrics`` (an open endpoint names no team)."""
    from django.conf import settings

    from strata.accounts.models import Team
    from strata.quotas.models import Quota
    from strata.quotas.services import STORAGE_PARTS, storage_by_team

    by_team = storage_by_team()
    total = GaugeMetricFamily("strata_storage_bytes", "Bytes stored for all teams, by part: artifacts, checkpoints, "
                                                      "code (bundles), data (sets), uploads (unfinished).",
                              labels=["part"])
    for part in STORAGE_PARTS:
        total.add_metric([part], sum(parts[part] for parts in by_team.values()))
    yield total
    if not getattr(settings, "STRATA_METRICS_TOKEN", None):
        return
    slugs = dict(Team.objects.values_list("id", "slug"))
    used = GaugeMetricFamily("strata_team_storage_bytes", "Bytes a team keeps stored (every part); only with "
                                                          "STRATA_METRICS_TOKEN set.", labels=["team"])
    for team_id, slug in sorted(slugs.items(), key=lambda item: item[1]):
        used.add_metric([slug], by_team.get(team_id, {}).get("total", 0))
    yield used
    limit = GaugeMetricFamily("strata_team_storage_limit_bytes", "A team's max_storage_bytes, for teams that have "
                                                                 "one; only with STRATA_METRICS_TOKEN set.",
                              labels=["team"])
    for team_id, bytes_ in Quota.objects.exclude(max_storage_bytes=None).values_list("team_id", "max_storage_bytes"):
        if team_id in slugs:
            limit.add_metric([slugs[team_id]], bytes_)
    yield limit


class BillingCollector:
    """GPU-seconds allocated and used this month (strata.quotas.usage): cluster totals, and per team behind the
    metrics token."""

    def describe(self):
        return []

    def collect(self):
        yield from billing_families()


# The highest value each counter showed in this process, per month: used GPU-seconds are attributed from telemetry
# buckets, which the rollups may regroup (raw samples into minutes into hours), so a recount may come out a hair
# lower; a counter never goes down within its month.
_shown: dict[tuple, float] = {}


def _monotonic(key: tuple, value: float) -> float:
    value = max(value, _shown.get(key, 0.0))
    _shown[key] = value
    return value


def billing_families(now=None):
    """``strata_gpu_seconds_{allocated,used}_total`` (the cluster) and, only when ``STRATA_METRICS_TOKEN`` guards
    ``/metrics``, ``strata_team_gpu_seconds_{allocated,used}_total{team}``: GPU-seconds since the start of the
    calendar month (UTC); they start over each month (a counter reset to Prometheus: ``rate``/``increase`` cope)."""
    from django.conf import settings
    from django.utils import timezone
    from prometheus_client.core import CounterMetricFamily

    from strata.accounts.models import Team
    from strata.jobs.models import Job
    from strata.quotas.usage import budget_period, job_uses

    now = now or timezone.now()
    start, _ = budget_period(None, now)
    for key in [key for key in _shown if key[0] != start]:
        del _shown[key]
    uses = job_uses({"team__isnull": False}, start, now)
    teams = dict(Job.objects.filter(pk__in=list(uses)).values_list("pk", "team_id"))
    by_team: dict[int, list[float]] = {}
    for job_id, use in uses.items():
        totals = by_team.setdefault(teams.get(job_id, 0), [0.0, 0.0])
        totals[0] += use.allocated
        totals[1] += use.used
    since = start.timestamp()
    for kind, index, text in (("allocated", 0, "GPU share held by attempts from dispatch to release, and "
                                                "participants' GPUs"),
                              ("used", 1, "GPU time used: devices' measured time, else utilization from telemetry")):
        total = CounterMetricFamily(f"strata_gpu_seconds_{kind}", f"GPU-seconds {kind} this month (UTC), all "
                                                                  f"teams: {text}.", created=since)
        total.add_metric([], _monotonic((start, kind), sum(values[index] for values in by_team.values())),
                         created=since)
        yield total
    if not getattr(settings, "STRATA_METRICS_TOKEN", None):
        return
    slugs = dict(Team.objects.values_list("id", "slug"))
    for kind, index in (("allocated", 0), ("used", 1)):
        family = CounterMetricFamily(f"strata_team_gpu_seconds_{kind}", f"GPU-seconds a team was {kind} this "
                                                                        "month (UTC); only with "
                                                                        "STRATA_METRICS_TOKEN set.", labels=["team"])
        for team_id, slug in sorted(slugs.items(), key=lambda item: item[1]):
            value = by_team.get(team_id, [0.0, 0.0])[index]
            family.add_metric([slug], _monotonic((start, kind, slug), value), created=since)
        yield family


class LostWorkCollector:
    """GPU-seconds lost to preemption, shrinks and node losses this month (strata.quotas.usage.lost_work)."""

    def describe(self):
        return []

    def collect(self):
        yield from lost_work_families()


def lost_work_families(now=None):
    """``strata_gpu_seconds_lost_total`` and ``strata_attempts_interrupted_total`` by ``cause`` (preempted,
    shrunk, node_lost: all teams) and, only when ``STRATA_METRICS_TOKEN`` guards ``/metrics``,
    ``strata_team_gpu_seconds_lost_total{team}``: since the start of the calendar month (UTC), as the billing
    counters; GPU-seconds since each stopped attempt's last checkpoint (``strata.scheduling.lost_work``)."""
    from django.conf import settings
    from django.utils import timezone
    from prometheus_client.core import CounterMetricFamily

    from strata.accounts.models import Team
    from strata.quotas.usage import LOST_CAUSES, budget_period, lost_work

    now = now or timezone.now()
    start, _ = budget_period(None, now)
    for key in [key for key in _shown if key[0] != start]:
        del _shown[key]
    since = start.timestamp()
    by_cause = lost_work(None, start, now, top=0)["by_cause"]
    lost = CounterMetricFamily("strata_gpu_seconds_lost", "GPU-seconds lost this month (UTC), all teams, by "
                                                          "cause: since each stopped attempt's last checkpoint.",
                               labels=["cause"], created=since)
    stopped = CounterMetricFamily("strata_attempts_interrupted", "Attempts that had to stop this month (UTC), all "
                                                                 "teams, by cause: preempted, shrunk, node_lost.",
                                  labels=["cause"], created=since)
    for cause in LOST_CAUSES:
        figures = by_cause.get(cause, {"attempts": 0, "gpu_hours": 0.0})
        lost.add_metric([cause], _monotonic((start, "lost-cause", cause), figures["gpu_hours"] * 3600),
                        created=since)
        stopped.add_metric([cause], _monotonic((start, "interrupted", cause), figures["attempts"]), created=since)
    yield lost
    yield stopped
    if not getattr(settings, "STRATA_METRICS_TOKEN", None):
        return
    family = CounterMetricFamily("strata_team_gpu_seconds_lost", "GPU-seconds a team lost this month (UTC) to "
                                                                 "preemption, shrinks and node losses; only with "
                                                                 "STRATA_METRICS_TOKEN set.", labels=["team"])
    for team_id, slug in sorted(Team.objects.values_list("id", "slug"), key=lambda item: item[1]):
        value = lost_work(team_id, start, now, top=0)["gpu_hours"] * 3600
        family.add_metric([slug], _monotonic((start, "lost-team", slug), value), created=since)
    yield family


_registered = False


def register() -> None:
    """Add the collector to the cluster registry once per process (QuotasConfig.ready)."""
    global _registered
    if not _registered:
        from strata.telemetry.metrics import CLUSTER_REGISTRY

        CLUSTER_REGISTRY.register(StorageCollector())
        CLUSTER_REGISTRY.register(BillingCollector())
        CLUSTER_REGISTRY.register(LostWorkCollector())
        _registered = True
