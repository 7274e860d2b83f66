"""Prometheus metrics of the control plane (docs/operations/metrics.md).

Two kinds of metrics live here:

* **process-local instruments** (:data:`SUBMIT_SECONDS`, :data:`PASS_SECONDS`, :data:`LAST_PASS`): observed by
  the process that does the work, in prometheus_client's default registry. The web process observes submits;
  the scheduler process (``strata scheduler``) observes its passes and serves them on its own port
  (:func:`start_scheduler_server`). A web process that runs passes inline (``STRATA_SCHEDULE_INLINE``, tests)
  shows its own passes too. Nothing is shared between processes: each process says what it did.
* **cluster state** (:class:`ClusterCollector`): jobs by state, queue depth, nodes by state, stored bytes,
  computed from the database at scrape time with aggregate queries (never stale gauges). Only aggregate counts:
  no label names a team, a user, a job or a node. Apps above may register collectors of their own in
  :data:`CLUSTER_REGISTRY` (the stored bytes: ``strata.quotas.metrics``).

Light: prometheus_client and Django only.
"""

from __future__ import annotations

import functools
import logging
import time

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

log = logging.getLogger(__name__)

SUBMIT_SECONDS = Histogram(
    "strata_job_submit_seconds",
    "Time to handle POST /api/v1/jobs/ (envelope and spec validation, idempotency, quota check, record), "
    "observed by the web process.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
PASS_SECONDS = Histogram(
    "strata_scheduler_pass_seconds",
    "Duration of scheduling passes (admission and placement) run by this process.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
PASS_FAILURES = Counter(
    "strata_scheduler_pass_failures",
    "Scheduling passes run by this process that raised (not observed in strata_scheduler_pass_seconds).",
)
LAST_PASS = Gauge(
    "strata_scheduler_last_pass_timestamp_seconds",
    "Unix time at which the last scheduling pass of this process ended (0: none yet).",
)
LAST_PASS_SECONDS = Gauge(
    "strata_scheduler_last_pass_seconds",
    "Duration of the last scheduling pass of this process.",
)


def timed_pass(function):
    """Decorate ``schedule_pass``: observe each pass's duration in this process's metrics."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            result = function(*args, **kwargs)
        except Exception:
            PASS_FAILURES.inc()
            raise
        seconds = time.perf_counter() - started
        PASS_SECONDS.observe(seconds)
        LAST_PASS_SECONDS.set(seconds)
        LAST_PASS.set(time.time())
        return result

    return wrapper


# --- cluster state, from the database at scrape time ---------------------------------------------------------


class ClusterCollector:
    """Jobs and nodes from the database, one family per scrape (two aggregate queries)."""

    def describe(self):
        return []  # computed at scrape time: no registration-time query

    def collect(self):
        from django.db.models import Count, Min, Q
        from django.utils import timezone

        from strata.cluster.models import Node
        from strata.jobs.models import Job, JobState

        now = timezone.now()
        by_state = {state: (0, None) for state in JobState.values}
        for row in Job.objects.order_by().values("state").annotate(n=Count("id"), oldest=Min("created_at")):
            by_state[row["state"]] = (row["n"], row["oldest"])
        jobs = GaugeMetricFamily("strata_jobs", "Jobs in the database, by state.", labels=["state"])
        for state, (count, _) in sorted(by_state.items()):
            jobs.add_metric([state], count)
        yield jobs
        depth = GaugeMetricFamily(
            "strata_queue_depth",
            "Jobs waiting: QUEUED (admitted, waiting for a place) and PENDING (waiting for admission under the "
            "team's quota).", labels=["state"])
        oldest = GaugeMetricFamily(
            "strata_queue_oldest_age_seconds",
            "Age (since submit) of the oldest job waiting in each state; 0 when none waits.", labels=["state"])
        for state in (JobState.QUEUED, JobState.PENDING):
            count, created = by_state[state]
            depth.add_metric([state], count)
            oldest.add_metric([state], max(0.0, (now - created).total_seconds()) if created else 0.0)
        yield depth
        yield oldest

        nodes = {state: 0 for state in Node.State.values}
        leased = 0
        for row in Node.objects.order_by().values("state").annotate(
                n=Count("id"), leased=Count("id", filter=Q(lease_expires_at__gt=now))):
            nodes[row["state"]] = row["n"]
            if row["state"] == Node.State.UP:
                leased = row["leased"]
        family = GaugeMetricFamily("strata_nodes", "Registered nodes, by state (up, down, draining).",
                                   labels=["state"])
        for state, count in sorted(nodes.items()):
            family.add_metric([state], count)
        yield family
        yield GaugeMetricFamily("strata_nodes_schedulable",
                                "Nodes up with a valid lease: the ones the scheduler places work on.",
                                value=leased)


CLUSTER_REGISTRY = CollectorRegistry(auto_describe=False)
CLUSTER_REGISTRY.register(ClusterCollector())


def exposition() -> tuple[bytes, str]:
    """The web process's ``/metrics`` body and content type: this process's own metrics (default registry),
    then the cluster state from the database."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return generate_latest(REGISTRY) + generate_latest(CLUSTER_REGISTRY), CONTENT_TYPE_LATEST


def start_scheduler_server(port: int, address: str):
    """Serve this process's metrics (its passes) on ``address:port`` in a daemon thread; 0 turns it off.

    A port that cannot be bound is logged and costs only the metrics, never the scheduler. Returns the server
    (or None)."""
    if not port:
        return None
    from prometheus_client import start_http_server

    try:
        server, _ = start_http_server(port, addr=address)
    except (OSError, OverflowError, ValueError) as error:
        log.error("scheduler metrics: cannot listen on %s:%s (%s); metrics are not served", address, port, error)
        return None
    log.info("scheduler metrics on http://%s:%s/metrics", address, port)
    return server
