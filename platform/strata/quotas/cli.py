"""``strata usage [TEAM]``: allocated against used GPU-hours over REST (``GET /api/v1/usage/...``): per team
(every team the caller sees, or one), the work it lost to preemption, shrinks and node losses, its idlest jobs (and
those that lost the most) and its budget's forecast; ``--json``, or ``--csv`` (every job, to stdout or ``--output``)."""

from __future__ import annotations

import argparse
import json
import sys


def add_parser(commands) -> None:
    usage = commands.add_parser("usage", help="GPU-hours allocated against used (idle reservations), per team and "
                                              "per job, and each team's budget forecast")
    usage.add_argument("team", nargs="?", help="one team (slug): its idlest jobs too; default: every team you see")
    usage.add_argument("--since", help="from: an ISO 8601 time or a time ago (90m, 24h, 7d); default: the start "
                                       "of the team's budget period")
    usage.add_argument("--until", help="to (as --since); default: now")
    usage.add_argument("--limit", type=int, help="how many jobs, idlest first (default 10)")
    shown = usage.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="the API's answer as JSON")
    shown.add_argument("--csv", action="store_true", help="a team's every job as CSV")
    usage.add_argument("--output", "-o", help="with --csv: write to this file instead of stdout")


def _hours(value) -> str:
    return f"{value:.2f}"


def team_lines(team: dict) -> list[str]:
    share = f" ({100 * team['efficiency']:.0f} % used)" if team.get("efficiency") is not None else ""
    lines = [f"team {team['team']}  {str(team['since'])[:16].replace('T', ' ')} .. "
             f"{str(team['until'])[:16].replace('T', ' ')} UTC",
             f"  allocated {_hours(team['allocated_gpu_hours'])} GPU-h   used {_hours(team['used_gpu_hours'])} GPU-h"
             f"{share}   idle {_hours(team['idle_gpu_hours'])}   unmeasured {_hours(team['unmeasured_gpu_hours'])}"]
    lost = team.get("lost_work")
    if lost:
        lines.append(f"  lost work: {lost['preemptions']} preempted, {lost['shrinks']} shrunk, "
                     f"{lost['node_losses']} node lost; {lost['steps']} steps, {_hours(lost['gpu_hours'])} GPU-h "
                     "since their last checkpoint")
    budget = team.get("budget")
    if budget:
        lines.append(f"  budget {budget['charged_gpu_hours']:.1f} of {budget['gpu_hours']:g} GPU-h this period "
                     f"(to {str(budget['period_end'])[:10]}), {budget['rate_gpu_hours_per_day']:.1f} GPU-h/day: "
                     f"{budget['text']}")
    return lines


def job_table(jobs: list[dict]) -> list[str]:
    if not jobs:
        return ["  no job held a GPU in this range"]
    lines = [f"  {'JOB':36}  {'NAME':20}  {'STATE':10}  {'ALLOC':>8}  {'USED':>8}  {'IDLE':>8}  SOURCE"]
    for job in jobs:
        lines.append(f"  {job['job']:36}  {job['name'][:20]:20}  {job['state'][:10]:10}  "
                     f"{job['allocated_gpu_hours']:8.3f}  {job['used_gpu_hours']:8.3f}  {job['idle_gpu_hours']:8.3f}  "
                     f"{job['source']}")
    return lines


def lost_table(lost: dict | None) -> list[str]:
    """The jobs that lost the most GPU-hours to preemption, shrinks and node losses (none: no lines)."""
    if not lost or not lost.get("jobs"):
        return []
    lines = [f"  {'LOST WORK: JOB':36}  {'NAME':20}  {'PREEMPT':>7}  {'SHRUNK':>6}  {'NODE':>4}  {'STEPS':>8}  "
             f"{'GPU-H':>8}"]
    for job in lost["jobs"]:
        lines.append(f"  {job['job']:36}  {job['name'][:20]:20}  {job['preemptions']:7d}  {job['shrinks']:6d}  "
                     f"{job['node_losses']:4d}  {job['steps']:8d}  {job['gpu_hours']:8.3f}")
    return lines


def run(args: argparse.Namespace) -> int:
    from strata.cli.client_commands import connect

    client = connect(args)
    params = {name: getattr(args, name) for name in ("since", "until", "limit") if getattr(args, name) is not None}
    if args.csv:
        if not args.team:
            raise ValueError("--csv needs a team: strata usage TEAM --csv")
        response = client.request("GET", f"usage/{args.team}/", params={**params, "format": "csv"}, raw=True)
        if args.output:
            with open(args.output, "wb") as out:
                out.write(response.content)
        else:
            sys.stdout.write(response.content.decode())
        return 0
    answer = client.get(f"usage/{args.team}/" if args.team else "usage/", params=params)
    if args.json:
        print(json.dumps(answer, indent=2))
        return 0
    teams = [answer] if args.team else answer["results"]
    if not teams:
        print("no teams")
    for team in teams:
        print("\n".join(team_lines(team)))
        if args.team:
            print("\n".join(job_table(team["jobs"]) + lost_table(team.get("lost_work"))))
    return 0
