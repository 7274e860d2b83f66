"""The CLI's notification verbs: ``strata webhooks list|create|delete|test`` (REST) and ``strata notifier`` (the
worker of the notify queue, next to the scheduler)."""

from __future__ import annotations

import argparse
import os

from strata.notify.names import EVENTS


def add_parsers(commands) -> None:
    """Add ``webhooks`` and ``notifier`` to the CLI's subcommands."""
    webhooks = commands.add_parser("webhooks", help="a team's webhooks: its jobs' ends, its quota, lost nodes "
                                   "POSTed (signed) to a URL; team-admins").add_subparsers(
        dest="webhooks_command", required=True)
    listing = webhooks.add_parser("list", help="the team's webhooks (never their secrets)")
    listing.add_argument("--team")
    create = webhooks.add_parser("create", help="create a webhook; its signing secret is printed this once")
    create.add_argument("url")
    create.add_argument("--team")
    create.add_argument("--format", choices=("json", "slack"), default="json")
    create.add_argument("--event", action="append", choices=EVENTS, dest="events",
                        help="an event to send (repeat it; default: every event)")
    create.add_argument("--disabled", action="store_true", help="create it disabled")
    delete = webhooks.add_parser("delete", help="delete a webhook and its delivery log")
    delete.add_argument("id", type=int)
    test = webhooks.add_parser("test", help="send a test notification now and wait for its outcome")
    test.add_argument("id", type=int)
    test.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the outcome (0: do not wait)")
    notifier = commands.add_parser("notifier", help="run the worker of the calls out of the cluster (webhooks, "
                                   "e-mail, MLflow mirroring: the notify and tracking queues), next to strata scheduler")
    notifier.add_argument("--concurrency", type=int, default=None,
                          help="calls at once, one thread each (default STRATA_NOTIFY_CONCURRENCY)")
    notifier.add_argument("--loglevel", default="INFO")


def webhooks(args: argparse.Namespace) -> int:
    import time

    from strata.cli.client_commands import connect

    client = connect(args)
    if args.webhooks_command == "create":
        body = {"url": args.url, "format": args.format, "enabled": not args.disabled}
        if args.team:
            body["team"] = args.team
        if args.events:
            body["events"] = args.events
        answer = client.post("webhooks/", body)
        print(f"webhook {answer['id']} of team {answer['team']} created: {answer['url']} ({answer['format']}; "
              f"{', '.join(answer['events'])})")
        print(f"signing secret (shown this once): {answer['secret']}")
        return 0
    if args.webhooks_command == "delete":
        client.delete(f"webhooks/{args.id}/")
        print(f"deleted webhook {args.id}")
        return 0
    if args.webhooks_command == "test":
        delivery = client.post(f"webhooks/{args.id}/test/", {})
        deadline = time.monotonic() + max(args.wait, 0.0)
        while delivery["status"] in ("pending", "retrying") and time.monotonic() < deadline:
            time.sleep(0.5)
            rows = client.get(f"webhooks/{args.id}/deliveries/", params={"page_size": 20}).get("results", [])
            delivery = next((row for row in rows if row["id"] == delivery["id"]), delivery)
        code = f" HTTP {delivery['response_code']}" if delivery.get("response_code") else ""
        error = f": {delivery['error']}" if delivery.get("error") else ""
        print(f"test delivery {delivery['id']} to webhook {args.id}: {delivery['status']} after "
              f"{delivery['attempts']} tr{'y' if delivery['attempts'] == 1 else 'ies'}{code}{error}")
        return 0 if delivery["status"] in ("succeeded", "pending") else 1
    params = {"team": args.team} if args.team else {}
    rows, page = [], 1
    while True:
        answer = client.get("webhooks/", params={**params, "page": page, "page_size": 200})
        rows += answer.get("results", [])
        if not answer.get("next"):
            break
        page += 1
    print(f"{'ID':>6} {'TEAM':16} {'FORMAT':6} {'ENABLED':7} {'EVENTS':40} URL")
    for row in rows:
        print(f"{row['id']:>6} {row['team']:16} {row['format']:6} {'yes' if row['enabled'] else 'no':7} "
              f"{','.join(row['events'])[:40]:40} {row['url']}")
    return 0


def worker_arguments(concurrency: int, loglevel: str = "INFO") -> list[str]:
    """The Celery worker of the calls out to services beyond the cluster: the ``notify`` queue (webhook and e-mail
    deliveries) and the ``tracking`` queue (the MLflow rounds, strata.tracking). Threads, so that one hanging receiver
    or tracking server holds one of them for at most the timeouts while the others go on; the scheduler
    (``-Q control``) never carries such a call."""
    return ["worker", "-Q", "notify,tracking", "--pool", "threads", "--concurrency", str(concurrency),
            "-n", f"notifier-{os.getpid()}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat",
            "--loglevel", loglevel]


def notifier(args: argparse.Namespace) -> int:
    from strata.cli.server_commands import migrate

    migrate()
    from django.conf import settings

    from strata.celery import app

    concurrency = args.concurrency or settings.STRATA_NOTIFY_CONCURRENCY
    if concurrency < 1:
        raise ValueError("--concurrency must be at least 1")
    app.worker_main(worker_arguments(concurrency, args.loglevel))
    return 0
