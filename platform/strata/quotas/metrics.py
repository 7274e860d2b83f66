"""Stored bytes in the web process's ``/metrics`` (docs/operations/metrics.md): a collector registered in
``strata.telemetry.metrics.CLUSTER_REGISTRY`` when the app is ready, computed from the database at scrape time."""

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


_registered = False


def register() -> None:
    """Add the collector to the cluster registry once per process (QuotasConfig.ready)."""
    global _registered
    if not _registered:
        from strata.telemetry.metrics import CLUSTER_REGISTRY

        CLUSTER_REGISTRY.register(StorageCollector())
        _registered = True
