"""``strata quota what-if``: replay the last days of submissions under a proposed quota or node count
(``POST /api/v1/quotas/what-if/``, cluster admins) and print the per-team comparison."""

from __future__ import annotations

import json

REPLAY_TIMEOUT_S = 900.0
FIGURES = (("wait_p50", "wait p50"), ("wait_p90", "wait p90"), ("jct_p50", "JCT p50"),
           ("utilization", "GPU util"), ("preemptions", "preempted"))


def add_arguments(parser) -> None:
    group = parser.add_argument_group("what-if (strata quota what-if --team T --max-gpus 8)")
    group.add_argument("--team", dest="what_if_team", metavar="TEAM", help="the team whose quota changes")
    group.add_argument("--max-gpus", type=float, help="the proposed max_gpus")
    group.add_argument("--weight", type=float, help="the proposed fair-share weight")
    group.add_argument("--days", type=float, default=7.0, help="days of history to replay (default 7)")
    group.add_argument("--add-nodes", type=int, help="nodes to add (of --node-gpus GPUs each)")
    group.add_argument("--node-gpus", type=int, default=8, help="GPUs of each added node (default 8)")
    group.add_argument("--remove-nodes", type=int, help="nodes to remove")
    group.add_argument("--json", action="store_true", help="print the API's answer")
    group.add_argument("--timeout", dest="what_if_timeout", type=float, default=REPLAY_TIMEOUT_S,
                       help=f"seconds to wait for the replay (default {REPLAY_TIMEOUT_S:g}; a busy week of a large "
                            "cluster takes about a minute)")


def request_body(args) -> dict:
    body: dict = {"days": args.days}
    changes = {name: value for name, value in (("max_gpus", args.max_gpus), ("weight", args.weight))
               if value is not None}
    if args.what_if_team:
        body["changes"] = {args.what_if_team: changes}
    elif changes:
        raise ValueError("--max-gpus and --weight need --team: strata quota what-if --team T --max-gpus 8")
    nodes: dict = {}
    if args.add_nodes:
        nodes["add"] = [{"count": args.add_nodes, "gpus": args.node_gpus}]
    if args.remove_nodes:
        nodes["remove"] = [{"count": args.remove_nodes}]
    if nodes:
        body["nodes"] = nodes
    return body


def _text(value) -> str:
    if value is None:
        return "-"
    return f"{value:g}" if isinstance(value, float) else str(value)  # the API's numbers, as they are


def what_if(args, client) -> int:
    import sys

    body = request_body(args)
    timeout = getattr(args, "what_if_timeout", REPLAY_TIMEOUT_S)
    print(f"replaying the last {args.days:g} days (up to {timeout:g} s)...", file=sys.stderr, flush=True)
    # One request, never retried: a replay runs to its end on the server, and a retry after a client-side
    # timeout would only start it again (the default client gives up after 30 s and retries three times).
    answer = client.post("quotas/what-if/", body, timeout=timeout, retries=0)
    if args.json:
        print(json.dumps(answer, indent=2))
        return 0
    cluster = answer["cluster"]
    print(f"{answer['jobs']} jobs of the last {answer['days']:g} days replayed; nodes "
          f"{cluster['current']['nodes']} -> {cluster['proposed']['nodes']}, GPU utilization "
          f"{cluster['current']['utilization']:.1%} -> {cluster['proposed']['utilization']:.1%}")
    print(f"{'TEAM':16} {'FIGURE':10} {'CURRENT':>10} {'PROPOSED':>10} {'RECORDED':>10}")
    for team in answer["teams"]:
        for key, title in FIGURES:
            print(f"{team['team']:16} {title:10} {_text(team['current'].get(key)):>10} "
                  f"{_text(team['proposed'].get(key)):>10} {_text(team['actual'].get(key)):>10}")
    return 0
