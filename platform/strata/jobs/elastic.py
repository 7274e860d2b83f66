"""Elastic jobs: how far a job may be shrunk instead of preempted (``resources.elastic``: ``min_share``, the fewest
GPUs per worker it keeps; ``min_workers``, the fewest workers). The scheduler shrinks them
(``strata.scheduling.services.choose_victims``); this module says what a request's floor is, fills in its kind's
default at submit (``KindSpec.elastic_for``) and checks that the kind could run at the floor."""

from __future__ import annotations

from typing import Any


def elastic_floor(resources: dict) -> dict | None:
    """The smallest request ``resources`` may be shrunk to, or None when it is not elastic (no declaration, an
    empty one, or one it is already at). ``min_workers`` wins where both could apply to a job of several
    workers."""
    declared = resources.get("elastic")
    if not declared:
        return None
    gpus, workers = float(resources.get("gpus", 0)), int(resources.get("workers", 1))
    if declared.get("min_workers") is not None and int(declared["min_workers"]) < workers:
        return {**resources, "workers": int(declared["min_workers"])}
    if declared.get("min_share") is not None and 0 < float(declared["min_share"]) < gpus:
        return {**resources, "gpus": float(declared["min_share"])}
    return None


def with_kind_default(kind_spec: Any, spec: dict, resources: dict) -> dict:
    """``resources`` with its kind's elastic default (``kind_spec.elastic_for(spec)``) when it states none and the
    default applies to it (fewer workers or a smaller share than it asks for, at which the kind could run)."""
    if "elastic" in resources:
        return resources
    default = kind_spec.elastic_for(spec)
    if not default:
        return resources
    candidate = {**resources, "elastic": dict(default)}
    floor = elastic_floor(candidate)
    if floor is None or kind_spec.resource_problems(spec, floor):
        return resources
    return candidate


def floor_problems(kind_spec: Any, spec: dict, resources: dict) -> dict[str, str]:
    """What would be wrong with the job at its floor (a gang strategy that needs more workers, say), keyed
    ``resources.elastic.<field>``: a job must be able to run at the size it may be shrunk to."""
    floor = elastic_floor(resources)
    if floor is None:
        return {}
    field = "min_workers" if floor.get("workers") != resources.get("workers") else "min_share"
    return {f"resources.elastic.{field}": f"the job could not run shrunk to it: {message}"
            for message in kind_spec.resource_problems(spec, floor).values()}
