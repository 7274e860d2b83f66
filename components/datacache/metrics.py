"""datacache's node metrics (its report schema's ``metrics``; light): the node cache's latest report as
Prometheus samples.

The report (:mod:`components.datacache.report`) is checked by the plugin's own schema first, so a malformed
one raises and costs only these samples. Cache size and budget are gauges; hits, misses, evictions, corrupt
entries and uncached reads are the store's own running counts (kept in its database across restarts), so they
are counters. No dataset or entry key is a label.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from components.runtime.contract.plugins import Sample

COUNTER_HELP = {
    "hits": "Cache lookups that found the prepared samples.",
    "misses": "Cache lookups that had to prepare the samples.",
    "evictions": "Entries evicted to keep the cache within its budget.",
    "corrupt": "Entries found corrupt and dropped.",
    "uncached": "Prepared parts returned without caching (larger than the whole budget, or the cache unusable).",
}


def metrics(stats: dict[str, Any]) -> Iterator[Sample]:
    """The samples of a report :meth:`DataCacheReport.node` checked (``DataCacheReport.metrics`` calls this)."""
    yield Sample("strata_datacache_bytes", stats["bytes"], help="Bytes held by the node's cache.")
    yield Sample("strata_datacache_budget_bytes", stats["budget"], help="The node cache's budget in bytes.")
    yield Sample("strata_datacache_entries_reported", len(stats["entries"]),
                 help="Entries in the last report (the most recently used, at most 100).")
    for name, text in COUNTER_HELP.items():
        yield Sample(f"strata_datacache_{name}_total", stats[name], kind="counter", help=text)
    lookups = stats["hits"] + stats["misses"]
    if lookups:
        yield Sample("strata_datacache_hit_ratio", stats["hits"] / lookups,
                     help="Hits per lookup since the cache was created.")
