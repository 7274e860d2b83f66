"""A plugin's collection or job route can never take a name the core's URL map already serves.

The URL map matches the core's routes first, so a plugin's collection named like a core resource would be
unreachable, never an error: the registry must refuse it (``RESERVED_COLLECTIONS``, ``RESERVED_JOB_ROUTES``).
``secrets`` was missing from the collections' list.
"""

from components.runtime.contract import registry
from strata.docs_tables import _route_path, _walk


def _core_paths():
    from django.urls import get_resolver

    for raw, pattern in _walk(get_resolver().url_patterns):
        path = _route_path(raw)
        if path.startswith("/api/v1/") and pattern.name not in ("collection", "collection-item", "job-route") \
                and "{format}" not in path:
            yield path


def test_every_core_resource_is_reserved_for_collections():
    tops = {path.split("/")[3] for path in _core_paths()} - {""}
    assert "jobs" in tops and not tops - registry.RESERVED_COLLECTIONS, sorted(tops - registry.RESERVED_COLLECTIONS)


def test_every_core_job_sub_resource_is_reserved_for_job_routes():
    subs = {path.split("/")[5] for path in _core_paths() if path.startswith("/api/v1/jobs/{pk}/")} - {""}
    assert "cancel" in subs and not subs - registry.RESERVED_JOB_ROUTES, sorted(subs - registry.RESERVED_JOB_ROUTES)
