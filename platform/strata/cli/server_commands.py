"""CLI commands that run parts of the platform: up, server, scheduler, node, and local token creation."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests


def _django():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "strata.settings")
    import django

    django.setup()


MIGRATE_LOCK_KEY = 0x5374726174614D67  # PostgreSQL advisory lock held while migrating ("StrataMg")


def migrate(quiet: bool = True) -> None:
    """Apply the migrations. Every server and scheduler replica does this at start; on PostgreSQL they take turns
    under an advisory lock (two replicas migrating one empty database at once would collide), on SQLite the
    write lock serializes them.

    The calling thread's connection is closed afterwards: the server's main thread never serves a request, so
    that connection would otherwise stay open for the life of the process (an idle PostgreSQL backend; on SQLite,
    its POSIX locks make SQLite defer closing every request thread's connection, so the server kept one open
    descriptor per thread that ever served a request)."""
    _django()
    from django.core.management import call_command
    from django.db import connection

    try:
        if connection.vendor != "postgresql":
            call_command("migrate", interactive=False, verbosity=0 if quiet else 1)
            return
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [MIGRATE_LOCK_KEY])
        try:
            call_command("migrate", interactive=False, verbosity=0 if quiet else 1)
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [MIGRATE_LOCK_KEY])
    finally:
        connection.close()


def server_limits():
    """The hardened server's limits from the STRATA_SERVER_* settings (docs/security.md)."""
    from django.conf import settings

    from strata.api.middleware import CODE_ARCHIVE_SLACK, body_limit
    from strata.api.server import ServerLimits

    # Waitress refuses bodies over this before buffering them; the middleware enforces the real, per-route
    # limits (an artifact upload's is the largest) with a JSON 413, so leave it a little room above them.
    max_body = max(settings.STRATA_MAX_UPLOAD_BYTES, settings.STRATA_MAX_BODY_BYTES,
                   settings.STRATA_MAX_CODE_BYTES + CODE_ARCHIVE_SLACK, settings.STRATA_MAX_DATA_CHUNK_BYTES) + 2**20
    return ServerLimits(connection_limit=settings.STRATA_SERVER_CONNECTION_LIMIT,
                        idle_timeout=settings.STRATA_SERVER_IDLE_TIMEOUT,
                        header_timeout=settings.STRATA_SERVER_HEADER_TIMEOUT,
                        node_threads=settings.STRATA_SERVER_NODE_THREADS,
                        max_body_bytes=max_body, body_limit=body_limit)


def server(args) -> int:
    from dataclasses import replace

    _django()
    from django.conf import settings

    if not args.worker:
        migrate()
    from strata.api.server import create_server
    from strata.wsgi import application

    workers = args.workers if args.workers is not None else settings.STRATA_SERVER_WORKERS
    if workers < 1:
        raise ValueError("--workers must be at least 1")
    if workers > 1 and not args.worker:
        return _server_workers(args, workers)
    limits = replace(server_limits(), reuse_port=args.worker)
    http = create_server(application, host=args.host, port=args.port, threads=args.threads, limits=limits)
    port = getattr(http, "effective_port", args.port)  # --port 0 picks a free port: say which
    if not args.worker:
        print(f"strata server listening on http://{args.host}:{port}", flush=True)
    http.run()
    return 0


def _server_workers(args, workers: int) -> int:
    """``strata server --workers N``: N server processes bound to one port with SO_REUSEPORT (the kernel spreads
    the connections over them), each a whole hardened server with its own threads and connection limit. This
    process supervises them: one that exits is started again (at most 5 times a minute), SIGTERM stops all."""
    if args.port == 0:
        raise ValueError("--workers needs a fixed --port (each process binds the same port)")
    command = [sys.executable, "-m", "strata.cli.main", "server", "--host", args.host, "--port", str(args.port),
               "--threads", str(args.threads), "--worker"]
    env = {**os.environ, "STRATA_SERVER_WORKERS": "1"}
    stopping: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    processes = [subprocess.Popen(command, env=env) for _ in range(workers)]
    print(f"strata server listening on http://{args.host}:{args.port} ({workers} processes)", flush=True)
    restarts: list[float] = []
    try:
        while not stopping:
            for index, process in enumerate(processes):
                if process.poll() is not None and not stopping:
                    restarts = [t for t in restarts if time.monotonic() - t < 60] + [time.monotonic()]
                    if len(restarts) > 5:
                        raise RuntimeError(f"server processes keep exiting (last code {process.returncode})")
                    print(f"strata server: process {process.pid} exited with {process.returncode}; starting "
                          "another", flush=True)
                    processes[index] = subprocess.Popen(command, env=env)
            time.sleep(0.5)
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
    return 0


def scheduler(args) -> int:
    migrate()
    from django.conf import settings

    from strata.celery import app

    schedule_file = str(Path(settings.HOME) / "celerybeat-schedule")
    # This process runs the passes (solo pool): expose its metrics (docs/operations/metrics.md).
    from strata.telemetry.metrics import start_scheduler_server

    start_scheduler_server(settings.STRATA_SCHEDULER_METRICS_PORT, settings.STRATA_METRICS_BIND)
    app.worker_main(["worker", "-Q", "control", "-B", "-s", schedule_file, "--pool", "solo", "--concurrency", "1",
                     "-n", f"scheduler-{os.getpid()}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat",
                     "--loglevel", args.loglevel])
    return 0


def migrate_command(args) -> int:
    """``strata migrate``: apply the migrations, saying which (an upgrade's first step; docs/operations.md)."""
    migrate(quiet=False)
    return 0


def check(args) -> int:
    """``strata check [--deploy]``: Django's system checks (with ``--deploy`` its deployment checks and Strata's,
    strata/checks.py), one line per problem; exit 1 when one is at ``--fail-level`` (ERROR) or worse."""
    _django()
    from django.core import checks

    levels = {"DEBUG": checks.DEBUG, "INFO": checks.INFO, "WARNING": checks.WARNING, "ERROR": checks.ERROR,
              "CRITICAL": checks.CRITICAL}
    problems = [message for message in checks.run_checks(include_deployment_checks=args.deploy)
                if not message.is_silenced()]
    names = {checks.DEBUG: "DEBUG", checks.INFO: "INFO", checks.WARNING: "WARNING", checks.ERROR: "ERROR",
             checks.CRITICAL: "CRITICAL"}
    for message in sorted(problems, key=lambda m: (-m.level, m.id or "")):
        text = " ".join(str(message.msg).split())
        hint = f" HINT: {' '.join(str(message.hint).split())}" if message.hint else ""
        where = f"{message.obj}: " if message.obj is not None else ""
        print(f"{names.get(message.level, message.level)} {message.id}: {where}{text}{hint}")
    failing = [message for message in problems if message.level >= levels[args.fail_level]]
    counts = {name: sum(1 for m in problems if names.get(m.level) == name) for name in names.values()}
    summary = ", ".join(f"{count} {name.lower()}{'s' if count != 1 else ''}" for name, count in counts.items()
                        if count)
    print(f"strata check{' --deploy' if args.deploy else ''}: "
          f"{'no problems' if not problems else summary}", flush=True)
    return 1 if failing else 0


def node(args) -> int:
    from components.runtime.node.agent import NodeAgent, NodeOptions
    from components.runtime.shared.units import parse_bytes

    token = args.token or os.environ.get("STRATA_NODE_TOKEN")
    token_file = os.environ.get("STRATA_NODE_TOKEN_FILE")
    if not token and token_file:  # a mounted secret (Kubernetes, systemd credentials): never in the process list
        try:
            token = Path(token_file).read_text().strip()
        except OSError as error:
            raise ValueError(f"STRATA_NODE_TOKEN_FILE={token_file!r} cannot be read: {error}") from None
    if not token:
        raise ValueError("a node token is required: --token, STRATA_NODE_TOKEN or STRATA_NODE_TOKEN_FILE "
                         "(strata token create --kind node)")
    labels = {}
    for item in args.label or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--label expects key=value, got {item!r}")
        labels[key] = value
    options = NodeOptions(server=args.server, token=token, virtual_gpus=args.virtual_gpus,
                          virtual_gpu_memory=parse_bytes(args.virtual_gpu_memory), labels=labels,
                          slots=args.slots, broker_url=args.broker, address=args.address,
                          metrics_port=args.metrics_port, metrics_bind=args.metrics_bind, cpus=args.cpus,
                          memory=parse_bytes(args.memory) if args.memory else None,
                          sandbox=args.sandbox or os.environ.get("STRATA_SANDBOX") or "auto")
    if args.name:
        options.name = args.name
    if args.state_dir:
        options.state_dir = Path(args.state_dir)
    end_time = args.end_time if args.end_time is not None else os.environ.get("STRATA_NODE_END_TIME") or None
    options.end_time = float(end_time) if end_time is not None else None
    if args.drain_before is not None:
        if args.drain_before < 0:
            raise ValueError(f"--drain-before cannot be negative, got {args.drain_before:g}")
        if options.end_time is None:
            print("strata node: --drain-before without --end-time (or STRATA_NODE_END_TIME): drains on SIGUSR1 "
                  "only", file=sys.stderr)
        options.drain_before = args.drain_before
    return NodeAgent(options).run()


def bootstrap(home: Path, url: str) -> dict:
    """First start: an admin, a demo team with its token, a node token. Saved to HOME/credentials.json."""
    path = home / "credentials.json"
    if path.exists():
        return json.loads(path.read_text())
    from strata.accounts import services
    from strata.accounts.models import ApiToken, Membership

    password = secrets.token_urlsafe(12)
    admin = services.user_create("admin", password, admin=True)
    team = services.team_create("demo", "Demo team")
    services.membership_set(admin, team, Membership.Role.TEAM_ADMIN)
    _, user_token = services.token_create(admin, team=team, name="strata up", ttl_days=365)
    _, node_token = services.token_create(admin, kind=ApiToken.Kind.NODE, name="local node", ttl_days=365)
    credentials = {"url": url, "username": "admin", "password": password, "team": "demo",
                   "token": user_token, "node_token": node_token}
    path.write_text(json.dumps(credentials, indent=2))
    path.chmod(0o600)
    return credentials


def local_data_roots(requested: list[str] | None) -> list[str]:
    """The data roots ``strata up`` grants its team: ``--data-root`` as given, else this machine's usual places
    for data, the home directory of the user running it and the system's temporary directory."""
    import tempfile

    if requested:
        return [str(Path(root).expanduser().absolute()) for root in requested]
    return [str(Path.home()), tempfile.gettempdir()]


def grant_local_data_roots(team_slug: str, requested: list[str] | None) -> list[str]:
    """Grant ``strata up``'s team its data roots (strata.quotas.roots): the ``--data-root`` directories given,
    replacing what it had; without any, the defaults (:func:`local_data_roots`) when the team has none yet. A
    default the rules refuse (one inside the state directory) is left out. Returns the team's roots."""
    from strata.accounts.models import Team
    from strata.quotas.models import Quota
    from strata.quotas.roots import clean_data_roots, team_roots

    team = Team.objects.filter(slug=team_slug).first()
    if team is None:
        return []
    if not requested and team_roots(team.pk):
        return team_roots(team.pk)
    roots = []
    for root in local_data_roots(requested):
        try:
            roots += clean_data_roots([root])
        except ValueError as error:
            if requested:
                raise RuntimeError(f"--data-root {root}: {error}") from None
            print(f"strata up: not granting {root} as a data root: {error}", flush=True)
    roots = clean_data_roots(roots)  # each was checked; this drops repeats
    Quota.objects.update_or_create(team=team, defaults={"data_roots": roots})  # no limit changed: nothing to admit
    return roots


def _wait_healthy(url: str, processes: list, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, process in processes:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with code {process.returncode} during start-up")
        try:
            if requests.get(f"{url}/healthz", timeout=1).ok:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server did not answer at {url} within {timeout:g} s")


def up(args) -> int:
    home = Path(args.home or os.environ.get("STRATA_HOME") or Path.home() / ".strata").expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["STRATA_HOME"] = str(home)
    url = f"http://127.0.0.1:{args.port}"
    os.environ.setdefault("STRATA_PUBLIC_URL", url)
    print(f"strata up: state in {home}", flush=True)
    migrate()
    credentials = bootstrap(home, url)
    credentials["url"] = url
    roots = grant_local_data_roots(credentials["team"], getattr(args, "data_root", None))
    print(f"strata up: team {credentials['team']} may register data under {', '.join(roots) or 'nothing'}",
          flush=True)
    from django.db import connection

    connection.close()  # this process only supervises from here on: no idle database connection for its life
    from strata.cli.config import write_client_config

    write_client_config(home / "client.yaml", url, credentials["token"])
    env = {**os.environ, "STRATA_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    strata = [sys.executable, "-m", "strata.cli.main"]
    specs = [("server", strata + ["server", "--port", str(args.port)], {}),
             ("scheduler", strata + ["scheduler"], {}),
             ("notifier", strata + ["notifier", "--concurrency", "2"], {})]  # webhooks, e-mail, MLflow mirroring
    if args.virtual_gpus != 0:
        specs.append(("node", strata + ["node", "--server", url, "--name", args.node_name, "--virtual-gpus",
                                        str(args.virtual_gpus), "--virtual-gpu-memory", args.virtual_gpu_memory,
                                        "--state-dir", str(home / "node")],
                      {"STRATA_NODE_TOKEN": credentials["node_token"]}))
    logs_dir = home / "logs"
    logs_dir.mkdir(exist_ok=True)
    processes = []
    for name, command, extra in specs:
        log_file = (logs_dir / f"{name}.log").open("ab")
        processes.append((name, subprocess.Popen(command, env={**env, **extra}, stdout=log_file,
                                                 stderr=subprocess.STDOUT)))
    stopping = []
    restarts: dict[str, list[float]] = {name: [] for name, _, _ in specs}

    def stop(*_):
        stopping.append(True)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        _wait_healthy(url, processes)
        print(f"""
Strata is running at {url}
  Web UI:       {url}/   (log in as admin; the password is in {home / 'credentials.json'})
  API docs:     {url}/api/v1/docs/
  Django admin: {url}/admin/
  Credentials:  {home / 'credentials.json'}
  CLI:          export STRATA_CONFIG={home / 'client.yaml'}
                strata submit examples/jobs/digits.yaml --wait
  Logs:         {logs_dir}/
Press Ctrl+C to stop.""", flush=True)
        while not stopping:
            for index, (name, process) in enumerate(processes):
                if process.poll() is not None and not stopping:
                    recent = [t for t in restarts[name] if time.monotonic() - t < 60] + [time.monotonic()]
                    restarts[name] = recent
                    if len(recent) > 5:
                        raise RuntimeError(f"{name} keeps exiting (code {process.returncode}); "
                                           f"see {logs_dir / (name + '.log')}")
                    print(f"strata up: {name} exited with {process.returncode}; restarting it "
                          f"(see {logs_dir / (name + '.log')})", flush=True)
                    command, extra = specs[index][1], specs[index][2]
                    log_file = (logs_dir / f"{name}.log").open("ab")
                    processes[index] = (name, subprocess.Popen(command, env={**env, **extra}, stdout=log_file,
                                                               stderr=subprocess.STDOUT))
            time.sleep(0.5)
    finally:
        for _, process in reversed(processes):
            if process.poll() is None:
                process.terminate()
        for _, process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
        print("strata up: stopped", flush=True)
    return 0


def token_create_local(args) -> int:
    """Create a token straight in the database (for the head node's operator, before any token exists)."""
    migrate()
    from django.contrib.auth import get_user_model

    from strata.accounts import services
    from strata.accounts.models import Team
    from strata.audit.services import local_actor

    user = get_user_model().objects.filter(username=args.user).first()
    if user is None:
        raise ValueError(f"no user {args.user!r}")
    team = Team.objects.filter(slug=args.team).first() if args.team else None
    if args.kind == "user" and team is None:
        raise ValueError("a user token needs --team")
    _, raw = services.token_create(user, team=team, kind=args.kind, name=args.name or "", ttl_days=args.ttl_days,
                                   actor=local_actor("strata token create --local"))
    print(raw)
    return 0


def user_create_local(args) -> int:
    """Create a web UI user in the local database, add it to teams, and print its password once."""
    migrate()
    from django.contrib.auth import get_user_model
    from django.contrib.auth.password_validation import validate_password
    from django.core.exceptions import ValidationError

    from strata.accounts import services

    existing = get_user_model().objects.filter(username=args.username).first()
    generated = False
    if args.password_file:
        source = sys.stdin if args.password_file == "-" else open(args.password_file)
        with source:
            password = source.readline().strip()
    elif existing is None:
        password, generated = secrets.token_urlsafe(12), True
    else:
        password = None  # an existing user keeps its password unless a new one is given
    if password is not None:
        try:
            validate_password(password)
        except ValidationError as error:
            raise ValueError("password: " + " ".join(error.messages)) from None
    # Adding an existing admin to a team must not demote it: --admin only ever grants.
    admin = args.admin or bool(existing and existing.is_staff)
    user = services.user_create(args.username, password, admin=admin)
    for slug in args.team:
        services.membership_set(user, services.team_create(slug), args.role)
    teams = ", ".join(args.team) or "no team"
    print(f"user {user.username} ({'cluster admin' if admin else 'user'}; {teams})")
    if generated:
        print(f"password: {password}")
    return 0


def user_unlock_local(args) -> int:
    """Clear a user's failed-login counters (every address) in the local database, ending a lockout."""
    migrate()
    from strata.accounts import login_guard

    cleared = login_guard.unlock(args.username, args.address)
    where = f" and address {args.address}" if args.address else ""
    print(f"user {args.username}{where}: {cleared} failed-login counter(s) cleared")
    return 0


def secrets_rotate_local(args) -> int:
    """Re-encrypt every team secret under the current secret key, in the local database (after rotating the key,
    with the old one in STRATA_SECRET_KEY_FALLBACKS; afterwards the old key can leave the fallbacks)."""
    migrate()
    from strata.accounts.team_secrets import SecretUnreadable, secrets_rotate

    try:
        count = secrets_rotate()
    except SecretUnreadable as error:
        raise RuntimeError(str(error)) from None
    print(f"{count} secret(s) re-encrypted under the current secret key")
    return 0
