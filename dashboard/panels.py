"""Component panels on dashboard pages: the render loop (the database-backed PanelData is strata.jobs.panel_data).

Components declare panels on their ``KindSpec.panels`` (see :mod:`components.runtime.contract.panels`); this module is the
only place the dashboard touches them, so a new component's panels appear without editing any page.
"""

from __future__ import annotations

import logging
from typing import Any

from components.runtime.contract import registry
from components.runtime.contract.panels import (
    PanelData,
    finite,  # noqa: F401 - the one definition, used here and by views
)
from dashboard.figures import cell_text
from strata.jobs.panel_data import (  # noqa: F401 - the panels' data lives in the jobs app; re-exported here
    MAX_PANEL_ATTEMPTS,
    MAX_PANEL_POINTS,
    MAX_PANEL_SLICES,
    DatabasePanelData,
    cluster_devices,
    plugin_reports,
)

log = logging.getLogger(__name__)


def render_panels(placement: str, data: PanelData, kind: str | None = None) -> list[dict[str, Any]]:
    """Render every registered panel for ``placement``; job panels only for the job's own ``kind``.

    A panel that cannot be imported, built or rendered is shown as an error box instead of breaking the page:
    one buggy component must not take the dashboard down. Non-finite numbers in what a panel returns become
    null, so a NaN loss cannot make the page's JSON invalid.
    """
    rendered = []
    for panel_kind, path, panel_class, load_error in registry.panels(placement):
        if placement == "job" and panel_kind is not None and panel_kind != kind:
            continue
        if panel_class is None:
            rendered.append({"slug": path.rpartition(":")[2].lower(), "title": path, "kind": panel_kind,
                             "error": f"could not load the panel: {load_error}"})
            continue
        entry = {"slug": panel_class.slug, "title": panel_class.title, "kind": panel_kind}
        try:
            panel = panel_class()
            if placement == "job" and not panel.applies(data.job or {}):
                continue
            content = panel.render(data)
        except Exception as error:  # noqa: BLE001 - isolate third-party panels
            log.exception("panel %s of kind %s failed", panel_class.slug, panel_kind)
            content = {"error": f"{type(error).__name__}: {error}"}
        if content is None:
            continue
        entry.update(_shown(finite(content)))
        rendered.append(entry)
    return rendered


def _shown(content: dict[str, Any]) -> dict[str, Any]:
    """A panel's table with its numbers as the dashboard shows every number (:func:`dashboard.figures.cell_text`:
    a rung's 0.2785515320334262 reads 0.2786)."""
    table = content.get("table") if isinstance(content, dict) else None
    if isinstance(table, dict) and isinstance(table.get("rows"), list):
        rows = [[cell_text(cell) for cell in row] if isinstance(row, list) else row for row in table["rows"]]
        content = {**content, "table": {**table, "rows": rows}}
    return content
