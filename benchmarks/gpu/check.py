"""``make gpu-check``: every plugin's CUDA path and GPU figure in one prepared script, for a lent GPU.

GPU machines are lent rarely and briefly (one call, a few minutes), so this script is built to be run once and to
bring back everything it measured:

- **One part per plugin**, each in a process of its own with its own time budget (:data:`PARTS`); a part that
  crashes, hangs or runs out of its budget is killed with its whole process group, recorded with the tail of its
  output, and the script goes on with the next part. A **total deadline** (default 480 s: 8 minutes on one H100 or
  H200) bounds the whole run: a part gets the smaller of its budget and what is left, and a part that can no
  longer start is recorded as skipped.
- **Each part writes its results as it goes** (``<output>/<part>.json``, the common document of
  :mod:`benchmarks.benchkit`): a part killed half way still leaves what it measured before. A measurement inside a
  part that raises is recorded under ``errors`` and the part goes on with the next one.
- At the end, ``<output>/gpu-check.json`` holds every part's status, time and figures (keys ``part.figure``). A
  rerun of some parts (``--parts``, after a fix) keeps the other parts' last results in it, marked
  ``earlier_run`` with their date.

``DRY=1`` (``--dry``) runs the same script on the CPU at toy sizes (the test suite does, so GPU minutes are never
spent on a crash): the same parts, the same code paths, tiny models, a handful of steps and requests. Its figures
are numbers, not GPU figures.

    python -m benchmarks.gpu.check [--dry] [--output DIR] [--parts a,b] [--deadline S] [--device cuda:0]
                                   [--archive $OUT/gpu-check.tgz]

The default output is ``docs/bench/gpu`` (``--dry``: a scratch directory, printed). The parts and what each
measures: see :data:`PARTS` and each part's module docstring. Only the standard library is imported here: the
parts import torch in their own processes.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUTPUT = ROOT / "docs" / "bench" / "gpu"
DEFAULT_DEADLINE_S = 480.0  # 8 minutes on one H100 or H200: a 10-minute device call leaves room for the transfers
DRY_DEADLINE_S = 300.0
MIN_START_S = 10.0  # a part is not started with less than this left of the total deadline
TAIL_LINES = 40
SUMMARY = "gpu-check"


@dataclass(frozen=True)
class Part:
    name: str
    module: str  # benchmarks.gpu.<module> with run(rec)
    budget_s: float  # on the GPU
    dry_budget_s: float  # on the CPU at toy sizes
    what: str


PARTS: tuple[Part, ...] = (
    Part("gpushare", "benchmarks.gpu.gpushare", 95, 60,
         "GPU sharing on CUDA: switch time, memory admission with real allocations, JCT, utilization, inference "
         "p99 next to training"),
    Part("migration", "benchmarks.gpu.migration", 30, 30,
         "SwitchFlow's stage migration: a preempted job's stages on the CPU while the device is held"),
    Part("serving", "benchmarks.gpu.serving", 75, 60,
         "serving on CUDA: per-request overhead over a direct call, finish rate within the SLO (Orloj, FIFO, EDF)"),
    Part("tuning", "benchmarks.gpu.tuning", 75, 60,
         "tuning: trials packed 4 to a GPU (Fluid's slots) against one trial per GPU and Ray Tune with "
         "fractional num_gpus"),
    Part("distributed", "benchmarks.gpu.distributed", 40, 45,
         "distributed training: DDP with gloo on CUDA tensors (2 ranks, one device), NCCL where one device allows"),
    Part("decentral", "benchmarks.gpu.decentral", 35, 30,
         "decentral: layer swapping on CUDA (a model 4x the device budget) against in memory"),
    Part("datacache", "benchmarks.gpu.datacache", 60, 60,
         "PerFect: the train loop on CUDA with the node cache and reuse, against the plain stream"),
    Part("embeddings", "benchmarks.gpu.embeddings", 60, 45,
         "embeddings: Saec's compression with training and evaluation on CUDA"),
)
PART_NAMES = tuple(part.name for part in PARTS)
# Statuses a part can end with. "ok": every measurement ran; "partial": some raised (see errors); "failed": the
# part's process exited non-zero; "timeout": killed at its budget; "skipped": the deadline left no time; "not
# built": the mechanism it measures does not exist yet.
FINE = ("ok", "not built")


# -- inside a part's process -------------------------------------------------------------------------------------

class Recorder:
    """What a part measured, written to ``output`` after every change (a part killed half way keeps the rest).

    ``device``: the torch device the part measures on (``cuda:0``, or ``cpu`` in a dry run); ``dry``: toy sizes.
    """

    def __init__(self, part: str, output: Path, device: str, dry: bool):
        self.part, self.output, self.device, self.dry = part, Path(output), device, dry
        self.figures: list[Any] = []
        self.details: dict[str, Any] = {}
        self.errors: dict[str, str] = {}
        self.missing: list[str] = []
        self.status = "running"
        self.began = time.perf_counter()

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def size(self, dry: Any, gpu: Any) -> Any:
        return dry if self.dry else gpu

    def say(self, line: str) -> None:
        print(f"[{self.part} {time.perf_counter() - self.began:6.1f}s] {line}", flush=True)

    def figure(self, figure: Any) -> None:
        self.figures = [known for known in self.figures if known.key != figure.key] + [figure]
        self.flush()

    def detail(self, key: str, value: Any) -> None:
        self.details[key] = value
        self.flush()

    def lack(self, what: str) -> None:
        """Record a missing prerequisite (a peer system not installed here); the part goes on without it."""
        self.missing.append(what)
        self.say(f"missing: {what}")
        self.flush()

    def step(self, name: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run one measurement; on an exception record its tail under ``errors[name]`` and return None."""
        self.say(f"{name} ...")
        began = time.perf_counter()
        try:
            result = function(*args, **kwargs)
        except Exception:  # noqa: BLE001 -- one measurement's failure must not cost the others
            self.errors[name] = _tail(traceback.format_exc(), 25)
            self.say(f"{name} FAILED:\n{self.errors[name]}")
            self.flush()
            return None
        self.details.setdefault("seconds", {})[name] = round(time.perf_counter() - began, 3)
        self.say(f"{name} done in {time.perf_counter() - began:.1f} s")
        self.flush()
        return result

    def document(self) -> dict[str, Any]:
        from benchmarks.benchkit import document

        machine = {"device": _device_name(self.device), "torch_device": self.device, "dry": self.dry}
        return document(f"{SUMMARY}/{self.part}", self.dry, self.figures, details=self.details, machine=machine,
                        part=self.part, status=self.status, errors=self.errors, missing=self.missing,
                        seconds=round(time.perf_counter() - self.began, 3))

    def flush(self) -> None:
        from benchmarks.benchkit import write

        temporary = self.output.with_suffix(".tmp")
        write(self.document(), temporary)
        temporary.replace(self.output)


def _device_name(device: str) -> str:
    torch = sys.modules.get("torch")
    if device.startswith("cuda") and torch is not None:
        try:
            return str(torch.cuda.get_device_name(torch.device(device)))
        except Exception:  # noqa: BLE001
            return "cuda (unknown)"
    return "CPU (dry run)" if device == "cpu" else device


def run_part(name: str, module: str, output: Path, device: str, dry: bool) -> int:
    """The body of a part's process: ``module``'s ``run(rec)``; 0 when it ran (measurements may have failed)."""
    rec = Recorder(name, output, device, dry)
    rec.flush()
    part = next((part for part in PARTS if part.name == name), Part(name, module, 0, 0, module))
    try:
        if dry:
            import torch

            torch.set_num_threads(1)  # a shared CI machine: steady and small
        rec.say(f"on {device}{' (dry run: toy sizes on the CPU)' if dry else ''}: {part.what}")
        importlib.import_module(module).run(rec)
    except BaseException:
        rec.status = "failed"
        rec.errors["part"] = _tail(traceback.format_exc(), 30)
        rec.flush()
        print(rec.errors["part"], file=sys.stderr, flush=True)
        return 1
    if rec.status == "running":
        rec.status = "partial" if rec.errors else "ok"
    rec.flush()
    return 0


# -- the orchestrator --------------------------------------------------------------------------------------------

def _tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def resolve_device(requested: str | None, dry: bool) -> str:
    """``cpu`` for a dry run; else the device asked for, or ``cuda:0``. A real run needs CUDA (checked in a child,
    so this process never imports torch)."""
    if dry:
        return "cpu"
    device = requested or "cuda:0"
    if not device.startswith("cuda"):
        raise SystemExit(f"gpu-check measures CUDA devices; {device!r} is not one (DRY=1 runs on the CPU)")
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True, timeout=120)
    if probe.stdout.strip() != "True":
        raise SystemExit("gpu-check: no CUDA device here (torch.cuda.is_available() answered "
                         f"{_tail(probe.stdout + probe.stderr, 3) or 'nothing'!r}); `make gpu-check DRY=1` runs the "
                         "same script on the CPU at toy sizes")
    return device


def _run_child(part: Part, output: Path, device: str, dry: bool, budget: float) -> dict[str, Any]:
    """One part in a process group of its own, killed at ``budget``; its document with the orchestrator's
    status, time and output tail."""
    command = [sys.executable, "-m", "benchmarks.gpu.check", "--part", part.name, "--module", part.module,
               "--device", device, "--output", str(output.parent), *(["--dry"] if dry else [])]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])])}
    if dry:
        env.update({"OMP_NUM_THREADS": "1", "STRATA_TORCH_THREADS": "1"})
    with contextlib.suppress(FileNotFoundError):
        output.unlink()
    began = time.monotonic()
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    lines: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            print(line, end="", flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        process.wait(timeout=budget)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        _kill_group(process)
    reader.join(5)
    seconds = time.monotonic() - began
    with contextlib.suppress(FileNotFoundError):
        output.with_suffix(".tmp").unlink()  # a write the kill cut short
    doc = _read(output)
    if doc is None:
        from_scratch = Recorder(part.name, output, device, dry)
        doc = from_scratch.document()
    errors = doc.setdefault("errors", {})
    if timed_out:
        doc["status"] = "timeout"
        errors["part"] = f"killed at its budget of {budget:.0f} s\n" + "\n".join(lines)
    elif process.returncode != 0:
        doc["status"] = "failed"
        errors.setdefault("part", "\n".join(lines))
        errors["exit"] = f"exit code {process.returncode}"
    elif doc.get("status") == "running":  # exited 0 without a final write: should not happen
        doc["status"] = "failed"
        errors["part"] = "the part exited without recording its end\n" + "\n".join(lines)
    doc.update({"seconds": round(seconds, 3), "budget_s": round(budget, 3), "output_tail": "\n".join(lines)})
    _write(doc, output)
    return doc


def _kill_group(process: subprocess.Popen) -> None:
    """Stop the part's whole process group (its workers, servers and trials with it)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=5)
            if sig == signal.SIGTERM:
                # the leader is gone; make sure nothing of its group outlives it
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
            return
        except subprocess.TimeoutExpired:
            continue


def _read(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _write(doc: dict[str, Any], path: Path) -> None:
    from benchmarks.benchkit import write

    temporary = path.with_suffix(".tmp")
    write(doc, temporary)
    temporary.replace(path)


def skipped_document(part: Part, device: str, dry: bool, reason: str) -> dict[str, Any]:
    from benchmarks.benchkit import document

    return document(f"{SUMMARY}/{part.name}", dry, [], details={}, machine={"torch_device": device, "dry": dry},
                    part=part.name, status="skipped", errors={"part": reason}, missing=[], seconds=0.0)


def archive_results(output: Path, archive: Path) -> None:
    """``output``'s JSON files as one gzipped tar at ``archive`` (rewritten whole, atomically): a device call brings
    back a few files only, and one killed at its limit still brings back the parts done before."""
    import tarfile

    temporary = archive.with_name(archive.name + ".tmp")
    with tarfile.open(temporary, "w:gz") as tar:
        for path in sorted(output.glob("*.json")):
            tar.add(path, arcname=path.name)
    temporary.replace(archive)


def run_all(*, dry: bool, device: str, output: Path, parts: tuple[str, ...] | None = None,
            deadline_s: float | None = None, catalogue: tuple[Part, ...] = PARTS,
            archive: Path | None = None) -> dict[str, Any]:
    """Every part of ``catalogue`` named in ``parts`` (default: all), one after another, inside the total deadline;
    returns the summary document (also written to ``output/gpu-check.json``). ``archive``: also keep a gzipped tar
    of the results there, rewritten after every part."""
    from benchmarks.benchkit import Figure, document

    output.mkdir(parents=True, exist_ok=True)
    deadline_s = deadline_s or (DRY_DEADLINE_S if dry else DEFAULT_DEADLINE_S)
    began = time.monotonic()
    summary: dict[str, Any] = {}
    figures: list[Figure] = []
    parts = tuple(part.name for part in catalogue) if parts is None else parts
    print(f"gpu-check{' (dry run)' if dry else ''}: {len(parts)} parts on {device}, deadline {deadline_s:.0f} s, "
          f"results in {output}", flush=True)
    for part in catalogue:
        path = output / f"{part.name}.json"
        earlier = None if part.name in parts else _read(path)
        if part.name not in parts and earlier is None:
            continue
        left = deadline_s - (time.monotonic() - began)
        if earlier is not None:  # a rerun of some parts: the summary keeps the others' last results
            doc = earlier
        elif left < MIN_START_S:
            doc = skipped_document(part, device, dry, f"the total deadline of {deadline_s:.0f} s left "
                                                      f"{max(left, 0):.0f} s")
            _write(doc, path)
        else:
            budget = min(part.dry_budget_s if dry else part.budget_s, left)
            print(f"== {part.name} (budget {budget:.0f} s): {part.what}", flush=True)
            doc = _run_child(part, path, device, dry, budget)
        summary[part.name] = {"status": doc.get("status"), "seconds": doc.get("seconds"),
                              "budget_s": doc.get("budget_s"), "figures": len(doc.get("figures") or {}),
                              "errors": sorted(doc.get("errors") or {}), "missing": doc.get("missing") or [],
                              "file": path.name, **({"earlier_run": doc.get("date")} if earlier is not None else {})}
        for key, item in (doc.get("figures") or {}).items():
            figures.append(_as_figure(f"{part.name}.{key}", item))
        if archive is not None:
            archive_results(output, archive)
        print(f"== {part.name}: {doc.get('status')} in {doc.get('seconds') or 0:.1f} s"
              + (f" (an earlier run's, {doc.get('date')})" if earlier is not None else "") + ", "
              f"{summary[part.name]['figures']} figures"
              + (f", errors in {', '.join(summary[part.name]['errors'])}" if summary[part.name]["errors"] else "")
              + (f", missing {'; '.join(summary[part.name]['missing'])}" if summary[part.name]["missing"] else ""),
              flush=True)
    total = time.monotonic() - began
    doc = document(SUMMARY, dry, figures, details={"parts": summary},
                   machine={"torch_device": device, "dry": dry, **_machine_of(output, summary)},
                   deadline_s=deadline_s, seconds=round(total, 3),
                   statuses={name: item["status"] for name, item in summary.items()})
    _write(doc, output / f"{SUMMARY}.json")
    if archive is not None:
        archive_results(output, archive)
    from benchmarks.benchkit import figures_table

    print(figures_table(doc) if figures else "no figures", flush=True)
    print("parts: " + ", ".join(f"{name} {item['status']}" for name, item in summary.items())
          + f"; total {total:.1f} s of {deadline_s:.0f} s", flush=True)
    return doc


def _machine_of(output: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """The device name and torch version a part's process saw (this process never imports torch)."""
    for item in summary.values():
        doc = _read(output / item["file"]) or {}
        machine = doc.get("machine") or {}
        if machine.get("torch"):
            return {key: machine[key] for key in ("device", "torch") if key in machine}
    return {}


def _as_figure(key: str, item: dict[str, Any]):
    from benchmarks.benchkit import Figure

    def number(value: Any) -> float | None:
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
            and math.isfinite(value) else None

    ratio = number(item.get("ratio"))
    mechanism, baseline = number(item.get("mechanism")), number(item.get("baseline"))
    # Keep the part's orientation: lower-is-better when its ratio is baseline / mechanism.
    lower = True
    if ratio is not None and mechanism and baseline:
        lower = abs(ratio - baseline / mechanism) <= abs(ratio - mechanism / baseline)
    extra = {key: value for key, value in item.items()
             if key not in ("figure", "mechanism", "baseline", "unit", "ratio", "target", "met")}
    return Figure(key, str(item.get("figure", key)), mechanism, baseline, str(item.get("unit", "")),
                  lower_is_better=lower, target=number(item.get("target")), extra=extra)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry", action="store_true", help="the same script on the CPU at toy sizes")
    parser.add_argument("--output", help="directory for the JSON files (default docs/bench/gpu; dry: a scratch one)")
    parser.add_argument("--parts", default=",".join(PART_NAMES), help="comma-separated, of: " + ", ".join(PART_NAMES))
    parser.add_argument("--deadline", type=float, help=f"total seconds (default {DEFAULT_DEADLINE_S:.0f}; "
                                                       f"dry {DRY_DEADLINE_S:.0f})")
    parser.add_argument("--device", help="the CUDA device (default cuda:0)")
    parser.add_argument("--archive", help="also keep the results as one .tgz here, rewritten after every part "
                                          "(for the device tool: $OUT/gpu-check.tgz)")
    parser.add_argument("--part", help=argparse.SUPPRESS)  # inside a part's own process: its name ...
    parser.add_argument("--module", help=argparse.SUPPRESS)  # ... and the module whose run(rec) it runs
    arguments = parser.parse_args(argv)
    if arguments.part:
        output = Path(arguments.output) / f"{arguments.part}.json"
        module = arguments.module or next(part.module for part in PARTS if part.name == arguments.part)
        return run_part(arguments.part, module, output, arguments.device or "cpu", arguments.dry)
    parts = tuple(name.strip() for name in arguments.parts.split(",") if name.strip())
    unknown = [name for name in parts if name not in PART_NAMES]
    if unknown:
        parser.error(f"unknown parts {unknown}; known: {', '.join(PART_NAMES)}")
    device = resolve_device(arguments.device, arguments.dry)
    if arguments.output:
        output = Path(arguments.output)
    elif arguments.dry:
        output = Path(tempfile.gettempdir()) / "strata-gpu-check-dry"
    else:
        output = DEFAULT_OUTPUT
    doc = run_all(dry=arguments.dry, device=device, output=output.resolve(), parts=parts,
                  deadline_s=arguments.deadline, archive=Path(arguments.archive).resolve() if arguments.archive else None)
    bad = [name for name, status in doc["statuses"].items() if status not in FINE]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
