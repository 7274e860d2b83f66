"""A Jepsen-style checker of a run's history: what the control plane recorded (``strata.jobs.history``, one JSON line
per committed change) next to what a client asked and was told (its own JSON lines), and what the API says at the
end. Used by the chaos suite (``tests/chaos``, ``make chaos``); pure functions over plain data, no Django.

The client's lines (written by the chaos driver) are ``{"op": ..., "time": ...}`` with ``op`` one of:

=================  ===================================================================================
``submit-ack``     the API answered a submit with 201 or 200 (``job``, ``key``: its Idempotency-Key)
``submit-fail``    a submit got no acknowledgement (``key``, ``error``): it may or may not exist
``cancel-ack``     the API answered a cancel (``job``, ``state`` in the answer)
``request``        a replica of a deployment accepted a call (``rid``, ``endpoint``)
``answer``         ... and answered it (``rid``)
``status``         ... or ended it with a gRPC status (``rid``, ``code``)
``fault``          a fault was injected (``name``, ``target``)
=================  ===================================================================================

:func:`check` asserts, over every job the control plane recorded (children too):

1. **one terminal state**: every acknowledged submit was recorded, and every recorded job reached exactly one
   terminal state, the one the API shows at the end;
2. **no overlap**: the attempts of a job never overlap in time (each one ended before the next was dispatched),
   and no node started an attempt after it ended;
3. **bounded attempts**: attempts that count (not ended by node or service loss, preemption or a cancel) never
   exceed ``max_attempts``;
4. **terminal is final**: no state change after a terminal one;
5. **billing**: the GPU-seconds the API bills each team equal the sum, over the history's attempts, of (end -
   dispatch) x share, and every attempt of a finished job ended;
6. **replica requests**: every call a replica accepted got an answer or a status.

It returns the figures (jobs, attempts, faults, rejected stale calls, requests) and every violation, each one line
naming the job or request.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
# Attempt outcomes that do not use up one of the job's attempts.
UNCOUNTED = frozenset({"node_lost", "service_lost", "preempted", "cancelled"})
CHECKS = ("one_terminal_state", "no_overlap", "bounded_attempts", "terminal_is_final", "billing", "replica_requests")
BILLING_TOLERANCE_S = 0.05  # GPU-seconds; both sides are sums of the same database timestamps


@dataclass
class Report:
    figures: dict[str, Any] = field(default_factory=dict)
    violations: dict[str, list[str]] = field(default_factory=lambda: {name: [] for name in CHECKS})

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    def summary(self) -> str:
        lines = [f"history check: {'PASS' if self.ok else 'FAIL'}"]
        lines += [f"  {name}: {value}" for name, value in self.figures.items()]
        for name in CHECKS:
            found = self.violations[name]
            lines.append(f"  [{'ok' if not found else 'VIOLATED'}] {name}: {len(found)} violation(s)")
            lines += [f"      - {problem}" for problem in found[:20]]
            if len(found) > 20:
                lines.append(f"      ... and {len(found) - 20} more")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "figures": self.figures,
                "violations": {name: len(found) for name, found in self.violations.items()},
                "problems": {name: found for name, found in self.violations.items() if found}}


def read_lines(path: str | Path) -> list[dict]:
    """The JSON lines of ``path`` ([] when it does not exist); a torn last line (a writer killed mid-write) is
    skipped."""
    path = Path(path)
    if not path.exists():
        return []
    lines = []
    for text in path.read_text(errors="replace").splitlines():
        try:
            lines.append(json.loads(text))
        except json.JSONDecodeError:
            continue
    return lines


def check(server: Iterable[dict], client: Iterable[dict], final: dict[str, dict],
          billed: dict[str, float]) -> Report:
    """``server``: the control plane's history lines; ``client``: the driver's; ``final``: the API's record of
    each job at the end (``{"state", "max_attempts", "attempts": [{"id", "outcome"}...]}``) by id, for at least
    every job in the history; ``billed``: GPU-seconds the API bills each team (by slug)."""
    server = sorted(server, key=lambda line: line.get("time", 0.0))
    client = sorted(client, key=lambda line: line.get("time", 0.0))
    report = Report()
    bad = report.violations

    submitted: dict[str, dict] = {}
    states: dict[str, list[dict]] = defaultdict(list)
    dispatches: dict[str, dict] = {}
    finishes: dict[str, dict] = {}
    starts: dict[str, list[dict]] = defaultdict(list)
    for line in server:
        op, job = line.get("op"), line.get("job")
        if op == "submit":
            submitted[job] = line
        elif op == "state":
            states[job].append(line)
        elif op == "dispatch":
            dispatches[line["attempt"]] = line
        elif op == "finish":
            if line["attempt"] in finishes:
                bad["no_overlap"].append(f"attempt {line['attempt']} of job {job} ended twice")
            finishes[line["attempt"]] = line
        elif op == "start":
            starts[line["attempt"]].append(line)

    acked = {line["job"] for line in client if line.get("op") == "submit-ack"}
    # 1. Every acknowledged submit was recorded; every recorded job reached exactly one terminal state, the final one.
    for job in sorted(acked - set(submitted)):
        bad["one_terminal_state"].append(f"job {job}: acknowledged but never recorded (lost)")
    terminal_counts: Counter = Counter()
    for job in sorted(set(submitted) | acked):
        ends = [line["target"] for line in states.get(job, []) if line.get("target") in TERMINAL]
        record = final.get(job)
        final_state = record.get("state") if record else None
        if not ends:
            bad["one_terminal_state"].append(f"job {job}: no terminal state (now {final_state})")
        elif len(ends) > 1:
            bad["one_terminal_state"].append(f"job {job}: {len(ends)} terminal states {ends}")
        elif final_state != ends[0]:
            bad["one_terminal_state"].append(f"job {job}: ended {ends[0]} but the API shows {final_state}")
        if ends:
            terminal_counts[ends[0]] += 1
    # 4. No state change after a terminal one.
    for job, lines in states.items():
        seen_end = None
        for line in lines:
            if seen_end is not None:
                bad["terminal_is_final"].append(
                    f"job {job}: {line.get('source')} -> {line['target']} after it ended {seen_end}")
            if line.get("target") in TERMINAL and seen_end is None:
                seen_end = line["target"]

    # 2. Attempts of one job never overlap; nobody starts an attempt that ended.
    by_job: dict[str, list[dict]] = defaultdict(list)
    for line in dispatches.values():
        by_job[line["job"]].append(line)
    for job, lines in by_job.items():
        lines.sort(key=lambda line: line["number"])
        numbers = [line["number"] for line in lines]
        if len(set(numbers)) != len(numbers):
            bad["no_overlap"].append(f"job {job}: attempt numbers repeat {numbers}")
        for before, after in zip(lines, lines[1:], strict=False):
            ended = finishes.get(before["attempt"])
            if ended is None:
                bad["no_overlap"].append(f"job {job}: attempt {before['number']} never ended, yet attempt "
                                         f"{after['number']} was dispatched")
            elif ended["ended_at"] > after["dispatched_at"]:
                bad["no_overlap"].append(
                    f"job {job}: attempt {before['number']} ended {ended['ended_at'] - after['dispatched_at']:.3f} s "
                    f"after attempt {after['number']} was dispatched")
    for attempt, lines in starts.items():
        ended = finishes.get(attempt)
        for line in lines:
            if ended is not None and line["time"] > ended["time"] and line.get("started_at", 0) > ended["ended_at"]:
                bad["no_overlap"].append(f"attempt {attempt}: started by {line.get('node')} after it ended")

    # 3. Attempts that count never exceed max_attempts.
    for job, record in final.items():
        if job not in submitted:
            continue
        counted = [a for a in record.get("attempts", []) if a.get("outcome") not in UNCOUNTED]
        limit = int(submitted[job].get("max_attempts") or record.get("max_attempts") or 0)
        if limit and len(counted) > limit:
            bad["bounded_attempts"].append(f"job {job}: {len(counted)} counted attempts, max_attempts {limit} "
                                           f"({[a.get('outcome') for a in record['attempts']]})")
        recorded = {a["id"] for a in record.get("attempts", [])}
        missing = recorded - set(dispatches)
        if missing:
            bad["billing"].append(f"job {job}: attempt(s) {sorted(missing)} in the API but never dispatched in the "
                                  "history")

    # 5. Billing: the API's GPU-seconds per team equal the history's attempt spans times their shares.
    history_seconds: dict[str, float] = defaultdict(float)
    for attempt, line in dispatches.items():
        job = line["job"]
        team = submitted.get(job, {}).get("team")
        ended = finishes.get(attempt)
        if ended is None:
            if final.get(job, {}).get("state") in TERMINAL:
                bad["billing"].append(f"job {job}: attempt {line['number']} never ended; it is billed forever")
            continue
        if team is not None and line.get("share", 0) > 0:
            history_seconds[team] += max(0.0, ended["ended_at"] - line["dispatched_at"]) * line["share"]
    for team in sorted(set(history_seconds) | set(billed)):
        expected, got = history_seconds.get(team, 0.0), billed.get(team)
        if got is None:
            continue
        if abs(expected - got) > BILLING_TOLERANCE_S + 1e-6 * expected:
            bad["billing"].append(f"team {team}: billed {got:.3f} GPU-s, the history's attempts add up to "
                                  f"{expected:.3f}")

    # 6. Every call a replica accepted got an answer or a status.
    requests = {line["rid"]: line for line in client if line.get("op") == "request"}
    closed = {line["rid"]: line for line in client if line.get("op") in {"answer", "status"}}
    for rid in sorted(set(requests) - set(closed)):
        bad["replica_requests"].append(f"request {rid} to {requests[rid].get('endpoint')}: no answer and no status")

    outcomes = Counter(line.get("outcome") for line in finishes.values())
    statuses = Counter(line.get("code") for line in client if line.get("op") == "status")
    report.figures = {
        "jobs acknowledged": len(acked),
        "jobs recorded (children included)": len(submitted),
        "terminal states": dict(sorted(terminal_counts.items())),
        "attempts": len(dispatches),
        "attempt outcomes": dict(sorted((k or "", v) for k, v in outcomes.items())),
        "stale calls rejected": sum(1 for line in server if line.get("op") == "rejected"),
        "cancels acknowledged": sum(1 for line in client if line.get("op") == "cancel-ack"),
        "cancels at completion (won, lost)": [sum(1 for line in client if line.get("op") == "cancel-race"
                                                  and line.get("won") is value) for value in (True, False)],
        "submits unacknowledged": sum(1 for line in client if line.get("op") == "submit-fail"),
        "faults injected": dict(sorted(Counter(line.get("name") for line in client
                                                if line.get("op") == "fault").items())),
        "replica requests": len(requests),
        "replica answers": sum(1 for line in closed.values() if line["op"] == "answer"),
        "replica statuses": dict(sorted(statuses.items())),
        "GPU-seconds billed": round(sum(v for v in billed.values() if v is not None), 3),
    }
    return report
