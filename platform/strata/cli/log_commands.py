"""``strata logs`` with filters: ``JOB --grep PATTERN`` (and ``--since/--until/--rank``, ``-F``, ``-i``) over one
job's lines, oldest first (``-f`` follows); ``--search "words"`` across the jobs of the caller's team, ranked.
One line per hit, the matches highlighted on a terminal (the API's ``highlights``). See
``strata.jobs.log_search`` for what q and grep mean."""

from __future__ import annotations

import sys
import time

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
MARK, UNMARK = "\x1b[1;31m", "\x1b[0m"


def filters(args) -> dict[str, str]:
    params = {"grep": args.grep, "since": args.since, "until": args.until, "rank": args.rank}
    if args.grep and args.fixed:
        params["fixed"] = "true"
    if args.grep and args.icase:
        params["icase"] = "true"
    if args.search:
        params["q"] = args.search
    return {name: str(value) for name, value in params.items() if value}


def marked(text: str, spans, colour: bool) -> str:
    """``text`` with its ``spans`` ([start, end] offsets) in bold red where ``colour``."""
    if not colour or not spans:
        return text
    pieces, at = [], 0
    for start, end in spans:
        pieces += [text[at:start], MARK, text[start:end], UNMARK]
        at = end
    return "".join(pieces) + text[at:]


def logs(args, client) -> int:
    colour = sys.stdout.isatty()
    params = filters(args)
    if not args.job:
        if not args.search and not args.grep:
            print("error: name a job, or search the team's logs with --search WORDS (or --grep PATTERN)",
                  file=sys.stderr)
            return 2
        return _search(args, client, params, colour)
    job = client.get(f"jobs/{args.job}/")
    if job.get("logs_trimmed"):
        print(job["logs_trimmed"]["notice"], file=sys.stderr)
    after = 0
    while True:
        lines = client.get(f"jobs/{args.job}/logs/", params={**params, "after": after})
        for line in lines:
            print(marked(line["message"], line.get("highlights"), colour), flush=True)
        if lines:
            after = lines[-1]["id"]
            continue
        if not args.follow or client.get(f"jobs/{args.job}/")["state"] in TERMINAL:
            return 0
        time.sleep(1.0)


def _search(args, client, params: dict[str, str], colour: bool) -> int:
    """Hits across the team's jobs, best first (newest first for grep alone), at most ``--limit``."""
    if args.team:
        params["team"] = args.team
    shown, page = 0, 1
    while shown < args.limit:
        answer = client.get("logs/search/", params={**params, "page": page, "page_size": min(args.limit, 500)})
        for hit in answer["results"][: args.limit - shown]:
            rank = "-" if hit["rank"] is None else hit["rank"]
            print(f"{hit['job'][:8]}  {hit['time'][:19]}  rank {rank}  "
                  f"{marked(hit['message'], hit.get('highlights'), colour)}", flush=True)
            shown += 1
        if not answer.get("next"):
            break
        page += 1
    if not shown:
        print("no lines found", file=sys.stderr)
        return 1
    return 0
