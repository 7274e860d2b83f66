"""``strata members list|add|set-role|remove|limit``: a team's members, their roles and their own limits inside the
team's quota, over ``/api/v1/teams/{slug}/members/`` (reading: any role; changes: team-admin)."""

from __future__ import annotations

ROLES = ("viewer", "member", "team-admin")


def _team(client, slug: str | None) -> str:
    """The team named, else the only team the token (or user) sees."""
    if slug:
        return slug
    answer = client.get("teams/", params={"page_size": 2})
    teams = answer.get("results", []) if isinstance(answer, dict) else answer
    if len(teams) != 1:
        raise ValueError("--team is required: you see several teams" if teams else "you belong to no team")
    return teams[0]["slug"]


def _limit(text: str | None, whole: bool):
    """A limit as typed: 'none' (or '-') clears it; else a number."""
    if text is None:
        return None
    if text.strip().lower() in {"none", "-", ""}:
        return None
    try:
        return int(text) if whole else float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a {'whole ' if whole else ''}number (or 'none')") from None


def _row(member: dict) -> str:
    def shown(value):
        return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)

    return (f"{member['username']:24} {member['role']:11} {shown(member['max_concurrent_jobs']):>9} "
            f"{shown(member['max_gpus']):>9}")


def members(args) -> int:
    from strata.cli.client_commands import connect

    client = connect(args)
    team = _team(client, args.team)
    base = f"teams/{team}/members/"
    command = args.members_command
    if command == "list":
        rows = client.get(base)
        print(f"{'USER':24} {'ROLE':11} {'MAX JOBS':>9} {'MAX GPUS':>9}")
        for member in rows:
            print(_row(member))
        return 0
    if command == "add":
        member = client.post(base, {"username": args.username, "role": args.role})
        print(f"added {member['username']} to {member['team']} as {member['role']}")
        return 0
    if command == "remove":
        client.delete(f"{base}{args.username}/")
        print(f"removed {args.username} from {team} (their tokens of the team are revoked)")
        return 0
    if command == "set-role":
        body: dict = {"role": args.role}
    else:  # limit
        body = {}
        if args.max_concurrent_jobs is not None:
            body["max_concurrent_jobs"] = _limit(args.max_concurrent_jobs, True)
        if args.max_gpus is not None:
            body["max_gpus"] = _limit(args.max_gpus, False)
        if not body:
            raise ValueError("give --max-concurrent-jobs and/or --max-gpus (a number, or 'none' to clear)")
    member = client.request("PATCH", f"{base}{args.username}/", json=body)
    print(_row(member))
    return 0


def add_parser(commands) -> None:
    """The ``members`` verbs, added to the CLI's subcommands."""
    members_parser = commands.add_parser("members", help="a team's members, roles (viewer, member, team-admin) "
                                         "and per-user limits").add_subparsers(dest="members_command", required=True)
    listing = members_parser.add_parser("list", help="the team's members, roles and per-user limits")
    listing.add_argument("--team")
    add = members_parser.add_parser("add", help="add an existing user to the team (team-admin)")
    add.add_argument("username")
    add.add_argument("--role", choices=ROLES, default="member")
    add.add_argument("--team")
    set_role = members_parser.add_parser("set-role", help="change a member's role (team-admin)")
    set_role.add_argument("username")
    set_role.add_argument("role", choices=ROLES)
    set_role.add_argument("--team")
    remove = members_parser.add_parser("remove", help="remove a member; their tokens of the team are revoked "
                                       "(team-admin)")
    remove.add_argument("username")
    remove.add_argument("--team")
    limit = members_parser.add_parser("limit", help="set a member's own limits inside the team's quota "
                                      "(team-admin; 'none' clears one)")
    limit.add_argument("username")
    limit.add_argument("--max-concurrent-jobs", help="admitted jobs at once (a whole number, or none)")
    limit.add_argument("--max-gpus", help="GPUs held at once (a number, or none)")
    limit.add_argument("--team")
