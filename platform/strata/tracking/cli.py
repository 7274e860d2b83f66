"""``strata tracking set URL [--experiment E] [--token-stdin] | show | clear``: a team's MLflow tracking server, over
``/api/v1/tracking/`` (team-admins). The token, like a secret's value, is read from stdin, never the command line.
The rounds run in ``strata notifier``, the worker of the calls out to services beyond the cluster (strata.notify.cli)."""

from __future__ import annotations


def add_parser(commands) -> None:
    tracking = commands.add_parser("tracking", help="the team's MLflow tracking server: its jobs' params, metrics, "
                                   "artifacts and GPU cost mirrored to MLflow runs").add_subparsers(
        dest="tracking_command", required=True)
    set_ = tracking.add_parser("set", help="set (or replace) the team's tracking server")
    set_.add_argument("url", help="the MLflow tracking server's base URL, e.g. http://mlflow.internal:5000")
    set_.add_argument("--experiment", help="the MLflow experiment's name (default: strata-<team>)")
    set_.add_argument("--token-stdin", action="store_true",
                      help="read a bearer token for the server from stdin (echo -n TOKEN | strata tracking set ...)")
    set_.add_argument("--no-token", action="store_true", help="remove the token the server was set with")
    set_.add_argument("--team")
    show = tracking.add_parser("show", help="the team's tracking server and how its mirroring goes")
    show.add_argument("--team")
    clear = tracking.add_parser("clear", help="stop mirroring: remove the team's tracking server (runs stay)")
    clear.add_argument("--team")


def _print(answer: dict) -> None:
    if not answer.get("configured"):
        print(f"team {answer['team']}: no tracking server")
        return
    print(f"team        {answer['team']}")
    print(f"url         {answer['url']}")
    print(f"experiment  {answer['experiment']}" + (f" (id {answer['experiment_id']})" if answer.get("experiment_id")
                                                    else ""))
    print(f"token       {'set' if answer.get('token_set') else 'none'}")
    print(f"runs        {answer.get('runs', 0)} ({answer.get('runs_active', 0)} still mirroring)")
    print(f"synced      {answer.get('synced_at') or 'not yet'}")
    if answer.get("error"):
        print(f"error       {answer['error']} (failures in a row: {answer.get('failures')}, next try "
              f"{answer.get('retry_at')})")


def run(args) -> int:
    from strata.cli.client_commands import connect, read_secret_value

    client = connect(args)
    params = {"team": args.team} if args.team else {}
    if args.tracking_command == "set":
        if args.token_stdin and args.no_token:
            raise ValueError("--token-stdin and --no-token do not go together")
        body: dict = {"url": args.url, **params}
        if args.experiment is not None:
            body["experiment"] = args.experiment
        if args.token_stdin:
            body["token"] = read_secret_value()
        elif args.no_token:
            body["token"] = ""
        answer = client.request("PUT", "tracking/", json=body)
        print(f"tracking server of team {answer['team']} set: {answer['url']} (experiment {answer['experiment']})")
        return 0
    if args.tracking_command == "clear":
        client.delete("tracking/", params=params)
        print("tracking server removed" + (f" from team {args.team}" if args.team else ""))
        return 0
    _print(client.get("tracking/", params=params))
    return 0
