"""A deployment's replicas: the serve job's own endpoint is the first, the others are child serve jobs.

:class:`ReplicaController` runs in the deployment job's own attempt, next to its endpoint. Every ``tick`` it
reconciles: it counts the children that have not ended and submits or cancels children until the deployment has
``want`` replicas (itself included). Each child is an ordinary serve job of the team (``ServeSpec.replica_spec``:
the same model and settings, one replica): the scheduler places it on whatever device fits, on this node or
another, its quota is the team's, and a crash requeues it like any attempt. A child that ends (its attempts
exhausted, or cancelled by someone else) is replaced by a new one. Submissions carry the idempotency key
``{job}:replica:{n}`` with ``n`` the number of children the job ever had, so a restarted deployment attempt never
submits a replica twice.

**Autoscaling** (``spec.autoscale``), once per ``period_s``, from the window since the last decision, over every
running replica (this one's stats and the children's reported metrics ``answered_ok``, ``missed``,
``queue_depth``):

- *attainment* = requests answered within their deadline / (those + requests that missed it:
  ``DEADLINE_EXCEEDED`` or ``RESOURCE_EXHAUSTED``) in the window;
- *queue* = the mean of the replicas' latest queue depths.

Scale **up** by one (up to ``max``) when attainment < ``target_attainment`` or queue ≥ ``queue_per_replica``, and
every replica asked for so far is running (a replica still waiting for a device, or for the team's quota, is not
followed by another: the quota bounds the deployment). Scale **down** by one (down to ``min``) after two
consecutive windows with attainment ≥ target and queue < ``queue_per_replica / 4`` (or no requests at all); the
newest child goes first, and its endpoint drains (requests in flight are answered) as any cancelled serve job's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
CALM_WINDOWS = 2  # consecutive calm windows before a scale-down


@dataclass
class Window:
    """What the replicas did since the last decision."""

    ok: float = 0.0
    missed: float = 0.0
    queues: list[float] = field(default_factory=list)

    @property
    def requests(self) -> float:
        return self.ok + self.missed

    @property
    def attainment(self) -> float | None:
        return self.ok / self.requests if self.requests else None

    @property
    def queue(self) -> float:
        return sum(self.queues) / len(self.queues) if self.queues else 0.0


def decide(want: int, window: Window, autoscale: dict[str, Any], *, all_running: bool, calm: int) -> tuple[int, int]:
    """``(new want, calm windows so far)`` by the rule in the module's docstring."""
    low, high = autoscale["min"], autoscale["max"]
    target, queue_limit = autoscale["target_attainment"], autoscale["queue_per_replica"]
    attainment = window.attainment
    pressed = (attainment is not None and attainment < target) or window.queue >= queue_limit
    if pressed:
        if want < high and all_running:
            return want + 1, 0
        return max(low, min(want, high)), 0
    quiet = attainment is None or (attainment >= target and window.queue < queue_limit / 4)
    if quiet and want > low:
        calm += 1
        if calm >= CALM_WINDOWS:
            return want - 1, 0
        return want, calm
    return max(low, min(want, high)), 0


class ReplicaController:
    """Keeps a deployment at ``want`` replicas (itself the first) and, with ``spec["autoscale"]``, moves ``want``.

    ``own_stats()`` is this replica's endpoint stats (``ServingEndpoint.stats``); ``child_job(spec)`` the body of a
    replica's child job. :meth:`tick` does one step (the tests drive it); :meth:`run` ticks every ``tick_s`` until
    ``ctx.should_stop()``.
    """

    def __init__(self, ctx: Any, spec: dict[str, Any], own_stats: Callable[[], dict[str, Any]],
                 child_job: Callable[[], dict[str, Any]], *, tick_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic):
        self.ctx = ctx
        self.spec = spec
        self.own_stats = own_stats
        self.child_job = child_job
        self.tick_s = tick_s
        self.clock = clock
        self.autoscale = spec.get("autoscale")
        self.want = int(spec["replicas"])
        self.calm = 0
        self.cursors: dict[str, int] = {}
        self.latest: dict[str, dict[str, float]] = {}  # child -> its latest value of each metric
        self.seen: dict[str, dict[str, float]] = {}  # replica -> counters at the last decision
        self.last_decision = clock()
        self.decisions: list[dict[str, Any]] = []

    # -- one step ---------------------------------------------------------------------------------------------
    def tick(self) -> dict[str, Any]:
        children = [child for child in self.ctx.children.list() if child["kind"] == self.ctx_kind]
        live = [child for child in children if child["state"] not in TERMINAL]
        self._read_metrics(live)
        if self.autoscale and self.clock() - self.last_decision >= self.autoscale["period_s"]:
            self._autoscale(live)
        missing = self.want - 1 - len(live)
        for index in range(max(0, missing)):
            key = f"{self.ctx.job_id}:replica:{len(children) + index}"
            summary = self.ctx.children.submit(self.child_job(), key)
            self.ctx.log(f"replica {summary['id']} submitted ({len(live) + index + 2} of {self.want})")
        if missing < 0:  # children come oldest first: the newest go
            for child in list(reversed(live))[: -missing]:
                self.ctx.children.cancel(child["id"])
                self.ctx.log(f"replica {child['id']} cancelled (scaling down to {self.want})")
        return {"want": self.want, "children": len(live)}

    ctx_kind = "serve"

    def _read_metrics(self, live: list[dict[str, Any]]) -> None:
        running = [child["id"] for child in live if child["state"] == "RUNNING"]
        if not running:
            return
        answers = self.ctx.children.metrics_of({job: self.cursors.get(job, 0) for job in running})
        for job, answer in answers.items():
            self.cursors[job] = answer.get("cursor", self.cursors.get(job, 0))
            for point in answer.get("points", []):
                self.latest.setdefault(job, {})[point["name"]] = float(point["value"])

    def _counters(self, live: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
        own = self.own_stats()
        statuses = own.get("errors_by_status", {})
        counters = {"self": {"answered_ok": float(own["requests"] - own["errors"]),
                             "missed": float(statuses.get("DEADLINE_EXCEEDED", 0) + statuses.get("RESOURCE_EXHAUSTED", 0)),
                             "queue_depth": float(own.get("queue_depth", 0))}}
        for child in live:
            if child["state"] == "RUNNING" and child["id"] in self.latest:
                counters[child["id"]] = self.latest[child["id"]]
        return counters

    def _autoscale(self, live: list[dict[str, Any]]) -> None:
        counters = self._counters(live)
        window = Window()
        for replica, values in counters.items():
            before = self.seen.get(replica, {})
            window.ok += max(0.0, values.get("answered_ok", 0.0) - before.get("answered_ok", 0.0))
            window.missed += max(0.0, values.get("missed", 0.0) - before.get("missed", 0.0))
            window.queues.append(values.get("queue_depth", 0.0))
        self.seen = counters
        self.last_decision = self.clock()
        all_running = all(child["state"] == "RUNNING" and child.get("endpoint") for child in live)
        before = self.want
        self.want, self.calm = decide(self.want, window, self.autoscale, all_running=all_running, calm=self.calm)
        decision = {"time": time.time(), "from": before, "to": self.want, "attainment": window.attainment,
                    "queue": window.queue, "requests": window.requests}
        self.decisions.append(decision)
        if self.want != before:
            attainment = "-" if window.attainment is None else f"{window.attainment:.3f}"
            self.ctx.log(f"autoscale: {before} -> {self.want} replicas (window: {window.requests:.0f} requests, "
                         f"SLO attainment {attainment}, mean queue {window.queue:.1f})")

    # -- the loop -------------------------------------------------------------------------------------------
    def run(self, stopped: Callable[[], bool]) -> None:
        while not stopped():
            try:
                self.tick()
            except Exception as error:  # a control-plane hiccup: try again next tick
                log.warning("replica controller of %s: %s: %s", self.ctx.job_id, type(error).__name__, error)
            deadline = self.clock() + self.tick_s
            while not stopped() and self.clock() < deadline:
                time.sleep(min(0.1, self.tick_s))


__all__ = ["ReplicaController", "Window", "decide"]


def replicas_route(data) -> dict[str, Any]:
    """``GET /api/v1/jobs/{id}/replicas/``: a deployment's replicas and where each answers. The serve job itself is
    the first; its child serve jobs the others. ``endpoints`` holds the addresses of the RUNNING ones, which is
    what :class:`components.serving.client.Balancer` dials. ``data`` is the viewer's ``PanelData`` of the job."""
    job = data.job or {}
    spec = job.get("spec") or {}
    rows = [{"job": job.get("id"), "state": job.get("state"), "endpoint": job.get("endpoint"), "primary": True}]
    for child in data.children():
        if child.get("kind") == "serve":
            rows.append({"job": child["id"], "state": child["state"], "endpoint": child.get("endpoint"),
                         "primary": False})
    live = [row for row in rows if row["state"] not in TERMINAL]
    return {"replicas": rows, "live": len(live), "wanted": spec.get("replicas", 1), "autoscale": spec.get("autoscale"),
            "endpoints": [row["endpoint"] for row in rows if row["state"] == "RUNNING" and row["endpoint"]]}


replicas_route.schema = {  # type: ignore[attr-defined]  (the job_routes seam's answer schema)
    "type": "object",
    "description": "The deployment's replicas (the serve job first, then its child serve jobs), how many are live "
                   "and wanted, and the addresses of the running ones.",
    "properties": {
        "replicas": {"type": "array", "items": {"type": "object", "properties": {
            "job": {"type": "string"}, "state": {"type": "string"}, "endpoint": {"type": ["string", "null"]},
            "primary": {"type": "boolean"}}, "required": ["job", "state", "endpoint", "primary"]}},
        "live": {"type": "integer", "minimum": 0},
        "wanted": {"type": "integer"},
        "autoscale": {},
        "endpoints": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["replicas", "live", "wanted", "autoscale", "endpoints"],
}
