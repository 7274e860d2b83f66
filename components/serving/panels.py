"""The serve kind's job panel (light: the control plane imports it)."""

from __future__ import annotations

from typing import Any, ClassVar

from components.runtime.panels import Panel, PanelData

NOTE = ("It listens on the node's loopback interface only and has no authentication yet, so only processes on "
        "that node can call it.")


class ServeEndpointPanel(Panel):
    """How to call a running serve job: its gRPC endpoint, the CLI verb, and who can reach it."""

    slug: ClassVar[str] = "serve-endpoint"
    title: ClassVar[str] = "Serving endpoint"

    def render(self, data: PanelData) -> dict[str, Any] | None:
        job = data.job or {}
        endpoint = job.get("endpoint")
        if not endpoint:
            return None
        return {"text": f"gRPC Predict on {endpoint}: strata infer {job.get('id')} --input rows.json. {NOTE}"}
