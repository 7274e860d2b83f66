"""``strata audit``: the audit log over REST (``GET /api/v1/audit/``): a table, ``--json``, or ``--csv`` (the
export, streamed to stdout or ``--output``). Cluster admins read every entry, team-admins their teams'."""

from __future__ import annotations

import argparse
import json
import sys

FILTERS = ("action", "actor", "team", "target", "since", "until")


def add_parser(commands) -> None:
    audit = commands.add_parser("audit", help="the audit log: logins, tokens, secrets, quotas, memberships, other "
                                              "people's jobs (cluster admins; team-admins: their teams)")
    audit.add_argument("--action", help="actions starting with this: token, login.failure, quota.change")
    audit.add_argument("--actor", help="the user who acted")
    audit.add_argument("--team", help="the team (slug)")
    audit.add_argument("--target", help="targets starting with this: 'job 1234', 'token ab12'")
    audit.add_argument("--since", help="at or after: an ISO 8601 time or a duration before now (15m, 2h, 7d)")
    audit.add_argument("--until", help="at or before (as --since)")
    audit.add_argument("--limit", type=int, default=50, help="newest entries shown (table, --json; at most 500)")
    shown = audit.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="the entries as JSON")
    shown.add_argument("--csv", action="store_true", help="every matching entry as CSV (no limit)")
    audit.add_argument("--output", "-o", help="with --csv: write to this file instead of stdout")


def _change(entry: dict) -> str:
    before, after = entry.get("before"), entry.get("after")
    if before is None and after is None:
        return ""
    text = json.dumps(after if before is None else {"before": before, "after": after}, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def table(entries: list[dict]) -> str:
    columns = [("TIME", "time"), ("ACTOR", "actor"), ("TEAM", "team"), ("ACTION", "action"), ("TARGET", "target"),
               ("ADDRESS", "address")]
    rows = [{**entry, "time": str(entry["time"])[:19].replace("T", " ")} for entry in entries]
    widths = {key: max([len(title), *(len(str(row.get(key) or "-")) for row in rows)]) for title, key in columns}
    lines = ["  ".join(f"{title:{widths[key]}}" for title, key in columns) + "  CHANGE"]
    for row in rows:
        lines.append("  ".join(f"{str(row.get(key) or '-'):{widths[key]}}" for _, key in columns) + "  "
                     + _change(row))
    return "\n".join(line.rstrip() for line in lines)


def run(args: argparse.Namespace) -> int:
    from strata.cli.client_commands import connect

    client = connect(args)
    params = {name: getattr(args, name) for name in FILTERS if getattr(args, name)}
    if args.csv:
        response = client.request("GET", "audit/export.csv", params=params, raw=True, stream=True)
        out = open(args.output, "wb") if args.output else sys.stdout.buffer
        try:
            for chunk in response.iter_content(chunk_size=65536):
                out.write(chunk)
        finally:
            if args.output:
                out.close()
            else:
                out.flush()
        return 0
    if args.limit < 1:
        raise ValueError("--limit must be at least 1")
    page = client.get("audit/", params={**params, "page_size": min(args.limit, 500)})
    if args.json:
        print(json.dumps(page["results"], indent=2))
    else:
        print(table(page["results"]) if page["results"] else "no entries")
    return 0
