"""The serve kind's job panel (light: the control plane imports it)."""

from __future__ import annotations

from typing import Any, ClassVar

from components.runtime.panels import Panel, PanelData

NOTE = ("It listens on the node's loopback interface only and has no authentication (auth: none), so only "
        "processes on that node can call it.")
TOKEN_NOTE = ("Every call needs one of the job's deployment tokens (gRPC metadata 'authorization: Bearer <token>'): "
              "strata job-token create {job} prints a new one; strata infer mints a short-lived one by itself.")


class ServeEndpointPanel(Panel):
    """How to call a running serve job: its gRPC endpoint, the CLI verb, and who can reach it."""

    slug: ClassVar[str] = "serve-endpoint"
    title: ClassVar[str] = "Serving endpoint"

    def render(self, data: PanelData) -> dict[str, Any] | None:
        job = data.job or {}
        endpoint = job.get("endpoint")
        if not endpoint:
            return None
        note = NOTE if (job.get("spec") or {}).get("auth") == "none" else TOKEN_NOTE.format(job=job.get("id"))
        return {"text": f"gRPC Predict on {endpoint}: strata infer {job.get('id')} --input rows.json. {note}"}
