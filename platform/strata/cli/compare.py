"""``strata compare JOB JOB ...``: jobs side by side over ``GET /api/v1/compare/`` (``strata.jobs.compare``): a
table of states, attempts, durations, GPUs, GPU- and CPU-seconds and final metrics, then the spec diff, one line
per path whose values differ. ``--parent JOB`` compares a job's first children instead; ``--json`` prints the
API's answer as it is."""

from __future__ import annotations

import json


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def _value(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))


def table(answer: dict) -> list[str]:
    """The runs table: one line per job, then a blank line and the spec diff."""
    metrics = answer["metrics"]
    header = ["JOB", "NAME", "STATE", "ATTEMPTS", "DURATION", "GPUS", "GPU-S", "CPU-S", *metrics]
    rows = [header]
    for job in answer["jobs"]:
        finals = job["final_metrics"]
        rows.append([job["id"][:8], job["name"][:24], job["state"], str(job["attempts"]), _duration(job["duration_s"]),
                     _cell(job["gpus"]), _cell(job["gpu_seconds"]), _cell(job["cpu_seconds"]),
                     *[_cell(finals[name]["value"]) if name in finals else "-" for name in metrics]])
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    diff = answer["spec_diff"]
    lines.append("")
    if not diff:
        lines.append("spec diff: none (same kind, spec, resources and limits)")
    else:
        lines.append(f"spec diff ({len(diff)} path{'s' if len(diff) != 1 else ''}; values in the table's order):")
        for row in diff:
            values = [_value(value) if present else "-" for value, present in zip(row["values"], row["present"], strict=True)]
            lines.append(f"{row['path']}: {' | '.join(values)}")
    return lines


def compare(args) -> int:
    from strata.cli.client_commands import connect

    if args.jobs and args.parent:
        raise ValueError("name the jobs or --parent, not both")
    params = {"jobs": ",".join(args.jobs)} if args.jobs or not args.parent else {"parent": args.parent}
    answer = connect(args).get("compare/", params=params)
    if args.json:
        print(json.dumps(answer, indent=2))
        return 0
    print("\n".join(table(answer)))
    return 0
