"""The ``strata`` command line."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="strata", description="Strata: a deep-learning cluster platform.")
    parser.add_argument("--url", help="control plane URL (default: STRATA_URL or the config file)")
    parser.add_argument("--token", help="API token (default: STRATA_TOKEN or the config file)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = commands.add_parser("up", help="run everything on this machine (control plane, scheduler, a node)")
    up.add_argument("--port", type=int, default=8000)
    up.add_argument("--home", help="state directory (default: STRATA_HOME or ~/.strata)")
    up.add_argument("--virtual-gpus", type=int, default=2, help="virtual GPUs on the local node (0: no node)")
    up.add_argument("--virtual-gpu-memory", default="8GiB")
    up.add_argument("--node-name", default="local")
    up.add_argument("--data-root", action="append", metavar="DIR",
                    help="a directory the local team may register data under (repeatable; default: your home "
                         "directory and the temporary directory, granted when the team has none; the state "
                         "directory stays off limits)")

    server = commands.add_parser("server", help="run the API and web server")
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=int, default=8000)
    server.add_argument("--threads", type=int, default=16)
    server.add_argument("--workers", type=int, default=None,
                        help="server processes sharing the port (SO_REUSEPORT; default STRATA_SERVER_WORKERS or 1): "
                             "one process uses about one core")
    server.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # one of --workers' processes

    commands.add_parser("migrate", help="apply the database migrations (replicas take turns; docs/operations.md)")

    check = commands.add_parser("check", help="check the configuration (--deploy: for production), one line "
                                               "per problem; exit 1 on errors")
    check.add_argument("--deploy", action="store_true",
                       help="also run the production checks (Django's and Strata's, docs/operations/production.md)")
    check.add_argument("--fail-level", default="ERROR", choices=["CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG"],
                       help="exit 1 on problems of this level or worse (default ERROR)")

    scheduler = commands.add_parser("scheduler", help="run the scheduler (Celery worker with beat)")
    scheduler.add_argument("--loglevel", default="WARNING")
    from strata.notify.cli import add_parsers as notify_parsers

    notify_parsers(commands)  # webhooks, notifier

    node = commands.add_parser("node", help="run a node agent on this machine")
    node.add_argument("--server", required=True, help="control plane URL")
    node.add_argument("--token", dest="token", help="node token (or STRATA_NODE_TOKEN)")
    node.add_argument("--name", help="node name (default: the host name)")
    node.add_argument("--virtual-gpus", type=int, help="expose N virtual GPUs instead of CUDA devices")
    node.add_argument("--virtual-gpu-memory", default="8GiB")
    node.add_argument("--label", action="append", help="node label key=value (repeatable)")
    node.add_argument("--state-dir")
    node.add_argument("--slots", type=int, help="concurrent attempts (default: 4 per device, at least 2)")
    node.add_argument("--cpus", type=float, help="CPUs offered to jobs that reserve CPUs (default: "
                                                 "STRATA_NODE_CPUS, else the CPUs this process may use)")
    node.add_argument("--memory", help="host memory offered to them, e.g. 16GiB (default: STRATA_NODE_MEMORY, "
                                       "else the machine's)")
    node.add_argument("--broker", help="broker URL (default: the one the control plane announces)")
    node.add_argument("--address", default="127.0.0.1",
                      help="this node's address as other nodes reach it: where a gang's ranks meet and "
                           "listen (default 127.0.0.1: one machine)")
    node.add_argument("--end-time", type=float,
                      help="when the node's allocation ends, in Unix seconds (a batch system's time limit; or "
                           "STRATA_NODE_END_TIME): it leaves shortly before")
    node.add_argument("--drain-before", type=float, metavar="SECONDS",
                      help="drain this long before --end-time: take no new work, leave once idle (SIGUSR1 "
                           "drains at once)")
    node.add_argument("--metrics-port", type=int, default=0,
                      help="expose the node's Prometheus metrics on this port (default 0: off; 9108 is usual)")
    node.add_argument("--sandbox", choices=["auto", "bwrap", "none"], default=None,
                      help="run a job's own code in a bubblewrap sandbox as its team's uid (default auto, or "
                           "STRATA_SANDBOX: bwrap when it is installed; docs/security.md)")
    node.add_argument("--metrics-bind",
                      help="address the metrics server listens on (default: the node's --address)")

    token = commands.add_parser("token", help="API tokens").add_subparsers(dest="token_command", required=True)
    create = token.add_parser("create", help="create a token (printed once)")
    create.add_argument("--team")
    create.add_argument("--name")
    create.add_argument("--kind", choices=["user", "node"], default="user")
    create.add_argument("--ttl-days", type=float)
    create.add_argument("--local", action="store_true", help="write to the local database instead of the API")
    create.add_argument("--user", default="admin", help="with --local: the token's user")

    login = commands.add_parser("login", help="get a token from a browser session (single sign-on or password) "
                                "and save it with the URL to the config file")
    login.add_argument("--team", help="preselect this team on the approval page")
    login.add_argument("--sso", action="store_true",
                       help="log the browser in through the single sign-on provider (not the login page)")
    login.add_argument("--no-browser", action="store_true", help="only print the link (open it anywhere)")
    login.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the approval (default 600)")

    job_token = commands.add_parser("job-token", help="a job's access tokens (for the services its attempts run)")
    job_token_commands = job_token.add_subparsers(dest="job_token_command", required=True)
    job_token_create = job_token_commands.add_parser("create", help="issue a token for a job (printed once)")
    job_token_create.add_argument("job")
    job_token_create.add_argument("--name", default="")
    job_token_create.add_argument("--expires-in", type=int, metavar="SECONDS",
                                  help="stop working after this many seconds (default: until revoked)")
    job_token_list = job_token_commands.add_parser("list", help="list a job's tokens (never their values)")
    job_token_list.add_argument("job")
    job_token_revoke = job_token_commands.add_parser("revoke", help="revoke one of a job's tokens")
    job_token_revoke.add_argument("job")
    job_token_revoke.add_argument("token_id")

    participants = commands.add_parser("participants", help="list the machines outside the cluster that joined a job")
    participants.add_argument("job")
    participants.add_argument("--json", action="store_true")

    user = commands.add_parser("user", help="web UI users (head node, local database)").add_subparsers(
        dest="user_command", required=True)
    user_create = user.add_parser("create", help="create a user (or reset its password) and add it to teams")
    user_create.add_argument("username")
    user_create.add_argument("--team", action="append", default=[], help="team slug (repeatable; created if new)")
    user_create.add_argument("--role", choices=["viewer", "member", "team-admin"], default="member")
    user_create.add_argument("--admin", action="store_true", help="make a cluster admin (staff)")
    user_create.add_argument("--password-file", help="read the password from this file ('-': stdin); "
                             "default: generate one and print it")
    user_unlock = user.add_parser("unlock", help="clear a user's failed-login counters (a login lockout)")
    user_unlock.add_argument("username")
    user_unlock.add_argument("--address", help="also clear this client address's counters (any user name)")

    submit = commands.add_parser("submit", help="submit a job from a YAML or JSON file ('-' for stdin)")
    submit.add_argument("file")
    submit.add_argument("--wait", action="store_true", help="wait and exit 0 only if the job SUCCEEDED")
    submit.add_argument("--team")
    submit.add_argument("--idempotency-key")
    submit.add_argument("--timeout", type=float, help="with --wait: give up after this many seconds")
    submit.add_argument("--code", metavar="DIR", help="ship this project directory with the job (a code bundle; "
                        "honours .gitignore and .strataignore); the job file's 'code:' may name one too")

    code = commands.add_parser("code", help="code bundles: a project directory uploaded once per content").add_subparsers(
        dest="code_command", required=True)
    code_push = code.add_parser("push", help="pack and upload a directory; prints its digest")
    code_push.add_argument("directory")
    code_push.add_argument("--team")
    code_list = code.add_parser("list", help="the team's code bundles")
    code_list.add_argument("--team")
    code_show = code.add_parser("show", help="a bundle's files")
    code_show.add_argument("digest")

    data = commands.add_parser("data", help="data sets: files or directories uploaded once, mounted read-only "
                               "into jobs (spec.data.mount)").add_subparsers(dest="data_command", required=True)
    data_upload = data.add_parser("upload", help="upload a file or a directory as a named data set (chunked; an "
                                  "interrupted upload of the same contents resumes)")
    data_upload.add_argument("name")
    data_upload.add_argument("path")
    data_upload.add_argument("--team")
    data_upload.add_argument("--chunk-size", default="8MiB", help="bytes per chunk (default 8MiB)")
    for action, about in (("list", "the team's data sets"), ("show", "a data set's files"),
                          ("delete", "delete a data set no unfinished job mounts")):
        parser_ = data.add_parser(action, help=about)
        if action != "list":
            parser_.add_argument("name")
        parser_.add_argument("--team")

    from strata.cli import member_commands

    member_commands.add_parser(commands)
    from strata.tracking import cli as tracking_commands

    tracking_commands.add_parser(commands)
    from strata.audit import cli as audit_commands

    audit_commands.add_parser(commands)
    from strata.quotas import cli as usage_commands

    usage_commands.add_parser(commands)
    secrets = commands.add_parser("secrets", help="team secrets: values jobs get as environment variables "
                                  "(spec.environment.secrets)").add_subparsers(dest="secrets_command", required=True)
    secrets_set = secrets.add_parser("set", help="create or replace a secret; the value is read from stdin "
                                     "(e.g. echo -n VALUE | strata secrets set NAME), never from the command line")
    secrets_set.add_argument("name")
    secrets_set.add_argument("--team")
    secrets_list = secrets.add_parser("list", help="the team's secrets (names only: a value is never shown)")
    secrets_list.add_argument("--team")
    secrets_delete = secrets.add_parser("delete", help="delete a secret")
    secrets_delete.add_argument("name")
    secrets_delete.add_argument("--team")
    secrets.add_parser("rotate", help="head node, local database: re-encrypt every team's secrets under the "
                       "current secret key (after rotating it, with the old key in STRATA_SECRET_KEY_FALLBACKS)")

    env = commands.add_parser("env", help="job environments").add_subparsers(dest="env_command", required=True)
    env_build = env.add_parser("build", help="build a job file's environment on a node (a short CPU job) and "
                               "print what it installed, before a big sweep")
    env_build.add_argument("file")
    env_build.add_argument("--code", metavar="DIR", help="the project directory (for environment.requirements)")
    env_build.add_argument("--team")
    env_build.add_argument("--timeout", type=float, default=1800.0)

    jobs = commands.add_parser("jobs", help="list jobs")
    jobs.add_argument("--state")
    jobs.add_argument("--kind")
    jobs.add_argument("--team")
    jobs.add_argument("--limit", type=int, default=50)
    jobs.add_argument("--json", action="store_true")

    logs = commands.add_parser("logs", help="print a job's logs; --grep PATTERN: its matching lines; --search "
                                            "WORDS: the team's jobs' lines with these words, best first")
    logs.add_argument("job", nargs="?", help="the job (leave out with --search: every job of the team)")
    logs.add_argument("-f", "--follow", action="store_true")
    logs.add_argument("--grep", metavar="PATTERN", help="only lines matching this regular expression")
    logs.add_argument("-F", "--fixed-strings", dest="fixed", action="store_true", help="--grep's PATTERN as written")
    logs.add_argument("-i", "--ignore-case", dest="icase", action="store_true", help="--grep ignores case")
    logs.add_argument("--search", metavar="WORDS", help='words to find, ranked ("a phrase", OR, -without)')
    logs.add_argument("--since", help="lines at or after: a time (ISO 8601) or a duration before now (2h)")
    logs.add_argument("--until", help="lines at or before (as --since)")
    logs.add_argument("--rank", help="only lines of these worker ranks (0 or 0,1)")
    logs.add_argument("--team", help="--search this team's jobs (default: the token's team)")
    logs.add_argument("--limit", type=int, default=50, help="--search: at most this many lines (default 50)")

    artifacts = commands.add_parser("artifacts", help="list a job's artifacts, or download them (straight from "
                                                      "the object store where the cluster has one)")
    artifacts.add_argument("job")
    artifacts.add_argument("names", nargs="*", metavar="NAME", help="download these (default: list them)")
    artifacts.add_argument("--all", action="store_true", help="download every artifact")
    artifacts.add_argument("-o", "--output", default=".", metavar="DIR", help="where to write them (default .)")

    cancel = commands.add_parser("cancel", help="cancel a job")
    cancel.add_argument("job")

    compare = commands.add_parser("compare", help="compare 2 to 20 jobs: states, resources, GPU- and CPU-seconds, "
                                                  "final metrics and the spec diff (one line per differing path)")
    compare.add_argument("jobs", nargs="*", metavar="JOB")
    compare.add_argument("--parent", metavar="JOB", help="compare this job's first 20 children (a sweep's trials)")
    compare.add_argument("--json", action="store_true", help="print the API's answer (metric series included)")

    quota = commands.add_parser("quota", help="show quotas, usage and data roots; admins: --set field=value "
                                              "(data_roots=/srv/a,/srv/b grants data roots)")
    quota.add_argument("team", nargs="?")
    quota.add_argument("--set", action="append", metavar="FIELD=VALUE")
    # `strata quota what-if --team T --max-gpus 8`: replay history under a proposed quota (strata.cli.whatif_cli).
    from strata.cli.whatif_cli import add_arguments as what_if_arguments

    what_if_arguments(quota)

    from components.runtime.contract import registry

    bench = commands.add_parser("bench", help="run a benchmark")
    bench.add_argument("component", help="what to measure (strata plugins lists the benchmarks)")
    bench.add_argument("--quick", action="store_true", help="smaller sizes, for smoke tests")
    bench.add_argument("--output", help="also write the results as JSON here")
    bench.add_argument("--peers", action="store_true",
                       help="also run the real peer systems it compares with (install them: make bench-peers)")

    commands.add_parser("plugins", help="list the plugins and what each contributes")
    for name, command_class in sorted(registry.commands().items()):
        command_class().arguments(commands.add_parser(name, help=command_class.help))
    return parser


def dispatch(args) -> int:
    from strata.cli import client_commands as client
    from strata.cli import server_commands as local

    if args.command == "token":
        return local.token_create_local(args) if args.local else client.token_create(args)
    if args.command == "user":
        return local.user_unlock_local(args) if args.user_command == "unlock" else local.user_create_local(args)
    if args.command == "bench":
        from strata.cli.bench import run_benchmark

        return run_benchmark(args.component, quick=args.quick, output=args.output, peers=args.peers)
    if args.command == "plugins":
        return client.plugins(args)
    if args.command == "compare":
        from strata.cli.compare import compare

        return compare(args)
    if args.command == "job-token":
        return client.job_token(args)
    if args.command == "login":
        from strata.cli.login import login

        return login(args)
    if args.command == "members":
        from strata.cli.member_commands import members

        return members(args)
    if args.command == "tracking":
        from strata.tracking import cli as tracking_cli

        return tracking_cli.run(args)
    if args.command == "audit":
        from strata.audit.cli import run as audit

        return audit(args)
    if args.command == "usage":
        from strata.quotas.cli import run as usage

        return usage(args)
    if args.command in ("webhooks", "notifier"):
        from strata.notify import cli as notify_cli

        return notify_cli.webhooks(args) if args.command == "webhooks" else notify_cli.notifier(args)
    if args.command == "secrets":
        return local.secrets_rotate_local(args) if args.secrets_command == "rotate" else client.secrets(args)
    handlers = {"up": local.up, "server": local.server, "scheduler": local.scheduler, "node": local.node,
                "check": local.check, "migrate": local.migrate_command,
                "submit": client.submit, "jobs": client.jobs, "logs": client.logs, "cancel": client.cancel,
                "quota": client.quota, "participants": client.participants, "code": client.code,
                "env": client.env_build, "data": client.data, "artifacts": client.artifacts}
    if args.command in handlers:
        return handlers[args.command](args)
    from components.runtime.contract import registry

    command = registry.commands()[args.command]()
    return command.run(args, client.connect(args) if command.needs_server else None)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from django.core.exceptions import ImproperlyConfigured

    from components.runtime.client.client import ApiError
    from strata.cli.config import ConfigError

    try:
        return dispatch(args)
    except KeyboardInterrupt:
        return 130
    except (ApiError, ConfigError, ImproperlyConfigured, ValueError, OSError, RuntimeError) as error:
        print(f"strata: error: {error}", file=sys.stderr)
        return 2 if not isinstance(error, ApiError) else 1


if __name__ == "__main__":
    sys.exit(main())
