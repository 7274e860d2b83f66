"""Dashboard panels of the ``train`` kind. Light, like spec.py: the control plane imports this module."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from components.runtime.contract.panels import Panel, PanelData

EVAL_PREFIXES = ("test_", "val_", "eval_")


def _finite(points) -> list[tuple[int, float]]:
    return [(step, value) for step, value, *_ in points if value is not None and math.isfinite(value)]


def _number(value: float) -> str:
    if value == 0 or 1e-3 <= abs(value) < 1e5:
        return f"{value:.4f}".rstrip("0").rstrip(".")
    return f"{value:.3e}"


def _percent_or_number(value: float) -> str:
    return f"{value * 100:.2f}%" if 0 <= value <= 1 else _number(value)


class TrainSummaryPanel(Panel):
    """Where a training run stands: progress, best and last loss, best accuracy, throughput, checkpoints.

    Derived from the metrics the train loop reports (``loss``, ``accuracy``, ``samples_per_s`` every
    ``log_every`` steps; ``test_*``/``val_*`` at each epoch end) and the job's spec, so it needs nothing the
    runtime does not already send.
    """

    slug: ClassVar[str] = "train-summary"
    kinds: ClassVar[tuple[str, ...]] = ("train",)
    title: ClassVar[str] = "Run summary"
    placement: ClassVar[str] = "job"

    def render(self, data: PanelData) -> dict[str, Any] | None:
        job = data.job or {}
        spec = job.get("spec") or {}
        metrics = {name: _finite(points) for name, points in data.metrics().items()}
        metrics = {name: points for name, points in metrics.items() if points}
        rows: list[list[Any]] = []

        if spec.get("entrypoint"):
            rows.append(["Entrypoint", spec["entrypoint"]])
        else:
            rows.append(["Workload", spec.get("workload") or "—"])

        steps = max((points[-1][0] for points in metrics.values()), default=0)
        limit = f" (stops at {spec['max_steps']:,})" if spec.get("max_steps") else ""
        rows.append(["Steps done", f"{steps:,}{limit}" if metrics else "none reported yet"])

        eval_steps = {step for name, points in metrics.items() if name.startswith(EVAL_PREFIXES)
                      for step, _ in points}
        if spec.get("epochs"):
            # One evaluation per finished epoch, plus one at the end of a run that stops mid-epoch.
            rows.append(["Epochs", f"{min(len(eval_steps), spec['epochs'])} of {spec['epochs']} evaluated"])

        if "loss" in metrics:
            loss = metrics["loss"]
            best_step, best = min(loss, key=lambda point: point[1])
            rows.append(["Training loss (last)", f"{_number(loss[-1][1])} at step {loss[-1][0]:,}"])
            rows.append(["Training loss (best)", f"{_number(best)} at step {best_step:,}"])
        for name in sorted(metrics):
            if name != "loss" and "loss" in name:
                best_step, best = min(metrics[name], key=lambda point: point[1])
                rows.append([f"Best {name}", f"{_number(best)} at step {best_step:,}"])

        accuracy = [name for name in metrics if "acc" in name]
        # Held-out accuracy says more than training accuracy: show it first when there is one.
        for name in sorted(accuracy, key=lambda name: (not name.startswith(EVAL_PREFIXES), name)):
            best_step, best = max(metrics[name], key=lambda point: point[1])
            rows.append([f"Best {name}", f"{_percent_or_number(best)} at step {best_step:,}"])

        if "samples_per_s" in metrics:
            rows.append(["Throughput (last)", f"{metrics['samples_per_s'][-1][1]:,.0f} samples/s"])

        every = spec.get("checkpoint_every")
        saved = len(data.events("checkpoint"))
        if not saved and every and steps:
            # The loop checkpoints every `checkpoint_every` steps and once more at the end of the run.
            saved = steps // every + (1 if job.get("state") == "SUCCEEDED" and steps % every else 0)
        if every:
            rows.append(["Checkpoints", f"{saved} (every {every:,} steps)"])

        attempts = job.get("attempts") or []
        if len(attempts) > 1:
            rows.append(["Attempts", f"{len(attempts)} (resumed from checkpoints)"])
        return {"table": {"columns": [], "rows": rows}}
