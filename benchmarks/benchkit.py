"""The one benchmark harness: percentiles, repeated runs, arrival schedules, tables and the common JSON.

Every ``strata bench NAME --output F`` writes the same document::

    {"benchmark": NAME, "quick": bool, "date": ISO time, "machine": {...},
     "figures": {key: {"figure": what is measured, "mechanism": number, "baseline": number, "unit": str,
                       "ratio": number or null, "target": number or null, "met": bool or null,
                       "mechanism_text": str, "baseline_text": str, ...optional "runs", "range", "note"}},
     "details": {...whatever else the benchmark measured}}

``ratio`` is oriented so that higher is better for us: ``baseline / mechanism`` for a figure where lower is
better (latency, time), ``mechanism / baseline`` where higher is better (throughput, utilization). ``met`` is
``ratio >= target`` (None when there is no target or no ratio). A benchmark builds :class:`Figure` objects and
calls :func:`document` and :func:`write`; :func:`validate_document` checks the shape (tests use it).

Light: standard library only (the control plane's own benchmarks use it too).
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from components.runtime.contract.panels import finite
from components.runtime.shared.stats import (
    percentile,  # the one definition (the product's figures use it too)
)

FIGURE_KEYS = ("figure", "mechanism", "baseline", "unit", "ratio", "target", "met")


def summary(values: Iterable[float]) -> dict[str, Any]:
    """``{"count", "mean", "p50", "p90", "p99", "min", "max"}`` of ``values`` (Nones when empty)."""
    values = list(values)
    if not values:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "min": None, "max": None}
    return {"count": len(values), "mean": sum(values) / len(values), "p50": percentile(values, 0.5),
            "p90": percentile(values, 0.9), "p99": percentile(values, 0.99), "min": min(values),
            "max": max(values)}


def repeat(measure: Callable[[], float], runs: int = 3) -> dict[str, Any]:
    """Run ``measure`` ``runs`` times: ``{"runs": [...], "median", "range": [min, max]}``. Machines are noisy:
    report the median and the range, never the best run."""
    if runs < 1:
        raise ValueError("runs must be at least 1")
    values = [float(measure()) for _ in range(runs)]
    return {"runs": values, "median": percentile(values, 0.5), "range": [min(values), max(values)]}


def poisson_arrivals(rate_per_s: float, count: int, seed: int = 0) -> list[float]:
    """``count`` arrival times (seconds from 0) of a Poisson process of ``rate_per_s``: exponential gaps,
    seeded, so two runs (and the mechanism and its baseline) see the same schedule."""
    if rate_per_s <= 0 or count < 0:
        raise ValueError("rate must be > 0 and count >= 0")
    rng = random.Random(seed)
    times, now = [], 0.0
    for _ in range(count):
        now += rng.expovariate(rate_per_s)
        times.append(now)
    return times


def uniform_arrivals(interval_s: float, count: int, jitter: float = 0.0, seed: int = 0) -> list[float]:
    """``count`` arrivals every ``interval_s`` seconds, each moved by up to ``jitter`` × interval (seeded)."""
    if interval_s <= 0 or count < 0 or not 0 <= jitter < 1:
        raise ValueError("interval must be > 0, count >= 0 and jitter within [0, 1)")
    rng = random.Random(seed)
    return [(index + 1) * interval_s + (rng.uniform(-jitter, jitter) * interval_s if jitter else 0.0)
            for index in range(count)]


@dataclass
class Figure:
    """One mechanism-against-baseline figure. ``lower_is_better``: how the raw numbers compare (latency: True;
    throughput: False); the ratio is oriented from it so that higher is always better for us."""

    key: str
    figure: str
    mechanism: float | None
    baseline: float | None
    unit: str
    lower_is_better: bool = True
    target: float | None = None
    mechanism_text: str = ""
    baseline_text: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        if not self.mechanism or not self.baseline or any(
                not math.isfinite(value) for value in (self.mechanism, self.baseline)):
            return None
        return self.baseline / self.mechanism if self.lower_is_better else self.mechanism / self.baseline

    @property
    def met(self) -> bool | None:
        ratio = self.ratio
        if self.target is None or ratio is None:
            return None if self.target is None else False
        return ratio >= self.target

    def as_dict(self) -> dict[str, Any]:
        return {"figure": self.figure, "mechanism": self.mechanism, "baseline": self.baseline, "unit": self.unit,
                "ratio": self.ratio, "target": self.target, "met": self.met,
                "mechanism_text": self.mechanism_text or _number(self.mechanism, self.unit),
                "baseline_text": self.baseline_text or _number(self.baseline, self.unit), **self.extra}


def _number(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "s":
        return f"{value * 1000:.2f} ms" if value < 1 else f"{value:.2f} s"
    return f"{value:.4g} {unit}".strip()


def machine_facts() -> dict[str, Any]:
    """CPUs, platform, Python, and torch and the CUDA device when torch is already imported (never imported
    here: the control plane's benchmarks must not pay for it)."""
    facts: dict[str, Any] = {"cpus": os.cpu_count(), "platform": platform.platform(),
                             "python": platform.python_version()}
    torch = sys.modules.get("torch")
    if torch is not None:
        facts["torch"] = getattr(torch, "__version__", None)
        try:
            facts["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU (virtual GPUs)"
        except Exception:  # noqa: BLE001 - a broken driver must not cost the results
            facts["device"] = "unknown"
    return facts


def document(benchmark: str, quick: bool, figures: Sequence[Figure], details: dict[str, Any] | None = None,
             machine: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """The common results document (see the module docstring)."""
    keys = [figure.key for figure in figures]
    if len(set(keys)) != len(keys):
        raise ValueError(f"figure keys must be unique: {keys}")
    return {"benchmark": benchmark, "quick": bool(quick), "date": datetime.now(UTC).isoformat(),
            "machine": {**machine_facts(), **(machine or {})},
            "figures": {figure.key: figure.as_dict() for figure in figures}, "details": details or {}, **extra}


def validate_document(doc: Any) -> list[str]:
    """What is wrong with a results document; empty when it has the common shape."""
    problems = []
    if not isinstance(doc, dict):
        return ["the document must be an object"]
    for key, kind in (("benchmark", str), ("quick", bool), ("machine", dict), ("figures", dict)):
        if not isinstance(doc.get(key), kind):
            problems.append(f"{key} must be a {kind.__name__}")
    for name, figure in (doc.get("figures") or {}).items() if isinstance(doc.get("figures"), dict) else []:
        if not isinstance(figure, dict):
            problems.append(f"figures.{name} must be an object")
            continue
        for key in FIGURE_KEYS:
            if key not in figure:
                problems.append(f"figures.{name}.{key} is missing")
        for key in ("mechanism", "baseline", "ratio", "target"):
            value = figure.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not math.isfinite(value)):
                problems.append(f"figures.{name}.{key} must be a finite number or null")
        if figure.get("met") is not None and not isinstance(figure.get("met"), bool):
            problems.append(f"figures.{name}.met must be true, false or null")
        ratio, target = figure.get("ratio"), figure.get("target")
        if isinstance(ratio, int | float) and isinstance(target, int | float) and isinstance(figure.get("met"), bool) \
                and figure["met"] != (ratio >= target):
            problems.append(f"figures.{name}.met disagrees with ratio and target")
    return problems


def _json_default(value: Any) -> Any:
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)




def write(doc: dict[str, Any], output: str | Path | None) -> None:
    """Write ``doc`` as JSON to ``output`` (nothing when None); non-finite numbers become null."""
    if output:
        Path(output).write_text(json.dumps(finite(doc), indent=2, default=_json_default) + "\n")


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """An aligned plain-text table with a rule under the header."""
    cells = [[str(cell) for cell in header]] + [["-" if cell is None else str(cell) for cell in row]
                                                for row in rows]
    widths = [max(len(row[index]) for row in cells) for index in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
             for row in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def figures_table(doc: dict[str, Any]) -> str:
    """The figures of a results document as a table: figure, ours, baseline, ratio, target, met."""
    rows = []
    for figure in doc["figures"].values():
        ratio, target, met = figure.get("ratio"), figure.get("target"), figure.get("met")
        rows.append([figure["figure"], figure.get("mechanism_text", ""), figure.get("baseline_text", ""),
                     "-" if ratio is None else f"{ratio:.2f}x", "-" if target is None else f">= {target:g}x",
                     "-" if met is None else ("yes" if met else "MISSED")])
    return table(rows, ["figure", "ours", "baseline", "ratio", "target", "met"])


def progress(prefix: str, stream=None) -> Callable[[str], None]:
    """A ``say(line)`` function that prints progress lines, flushed at once (long runs show where they are)."""
    out = stream or sys.stdout

    def say(line: str) -> None:
        print(f"{prefix}{line}" if line else "", file=out, flush=True)

    return say


def peers_python(environment: str = "peers") -> str:
    """The interpreter with the real peer systems benchmarks compare with: ``make bench-peers`` builds
    ``.venv-<environment>`` beside the project (``peers``: Ray; ``triton``: nvidia-pytriton, whose pins clash with
    Ray's); ``STRATA_<ENVIRONMENT>_PYTHON`` names another. Raises a one-line error naming the fix when there is
    none."""
    import os
    from pathlib import Path

    named = os.environ.get(f"STRATA_{environment.upper()}_PYTHON")
    path = Path(named) if named else Path(__file__).resolve().parents[1] / f".venv-{environment}" / "bin" / "python"
    if not path.exists():
        raise RuntimeError(f"no {environment} interpreter at {path}: run `make bench-peers` (it installs the peer "
                           f"systems beside the project) or set STRATA_{environment.upper()}_PYTHON")
    return str(path)
