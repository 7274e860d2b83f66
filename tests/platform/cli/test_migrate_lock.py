"""Every server and scheduler replica migrates at start: on PostgreSQL, replicas starting together on an empty
database take turns under an advisory lock instead of colliding on the same CREATE TABLE."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(300)]


def test_replicas_migrating_one_empty_database_at_once_all_succeed(tmp_path):
    import psycopg

    admin = os.environ["STRATA_DATABASE_URL"].rsplit("/", 1)[0] + "/postgres"
    name = f"strata_migrate_{secrets.token_hex(4)}"
    with psycopg.connect(admin, autocommit=True) as db:
        db.execute(f'CREATE DATABASE "{name}"')
    try:
        env = {**os.environ, "STRATA_DATABASE_URL": admin.rsplit("/", 1)[0] + f"/{name}",
               "STRATA_HOME": str(tmp_path)}
        script = "from strata.cli.server_commands import migrate; migrate()"
        replicas = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True) for _ in range(3)]
        outputs = [(replica.wait(timeout=240), replica.stdout.read()) for replica in replicas]
        assert all(code == 0 for code, _ in outputs), outputs
        with psycopg.connect(admin.rsplit("/", 1)[0] + f"/{name}") as db:
            applied = db.execute("SELECT count(*) FROM django_migrations").fetchone()[0]
            doubled = db.execute("SELECT count(*) FROM (SELECT app, name FROM django_migrations "
                                 "GROUP BY app, name HAVING count(*) > 1) d").fetchone()[0]
        assert applied > 20 and doubled == 0
    finally:
        with psycopg.connect(admin, autocommit=True) as db:
            db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
