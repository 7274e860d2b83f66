"""``migrate()`` (what ``strata server`` and ``strata scheduler`` run first, in their main thread) leaves no database
connection open behind it. The server's main thread never serves a request, so a connection left there stayed
open for the life of the process: an idle PostgreSQL backend per server, and on SQLite its POSIX locks made
SQLite defer closing every request thread's connection, so the server kept one open descriptor of the database
file per thread that had ever served a request (found by the soak test, benchmarks.core.soak)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = r"""
import json, os, threading
import psutil
from strata.cli.server_commands import migrate

migrate()
from django.conf import settings
from django.db import connection

main_open = connection.connection is not None
path = os.path.realpath(settings.DATABASES["default"]["NAME"]) if connection.vendor == "sqlite" else None

def request_thread(started, release):
    # What a request thread does: open its own connection, query, close it at the end of the request.
    from django.db import connection as own
    with own.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM django_migrations")
    started.wait()
    release.wait()
    own.close()

started, release = threading.Barrier(5), threading.Event()
threads = [threading.Thread(target=request_thread, args=(started, release)) for _ in range(4)]
for thread in threads:
    thread.start()
started.wait()  # four connections open at once
release.set()
for thread in threads:
    thread.join()
left = None if path is None else sum(1 for item in psutil.Process().open_files() if item.path == path)
print(json.dumps({"main_open": main_open, "vendor": connection.vendor, "descriptors_left": left}))
"""


def test_migrate_leaves_no_connection_and_request_threads_release_theirs(tmp_path):
    env = {key: value for key, value in os.environ.items() if key not in ("STRATA_HOME", "STRATA_SCHEDULE_INLINE")}
    env["STRATA_HOME"] = str(tmp_path)
    if env.get("STRATA_DATABASE_URL", "").startswith("postgres"):
        env.pop("STRATA_DATABASE_URL")  # the descriptors checked are those of the SQLite file
    completed = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=180)
    assert completed.returncode == 0, completed.stderr[-3000:]
    answer = json.loads(completed.stdout.strip().splitlines()[-1])
    assert answer["vendor"] == "sqlite"
    assert answer["main_open"] is False
    assert answer["descriptors_left"] == 0  # before the fix: 5, the main thread's and one per request thread
