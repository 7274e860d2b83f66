"""`strata check --deploy`: clean on the documented production environment (docs/operations/production.md),
the expected warnings on the laptop defaults, the broker persistence check against Redis (a stand-in that
answers CONFIG as told, and this machine's Redis where one is reachable)."""

from __future__ import annotations

import os
import re
import secrets
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest

from strata import checks

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs" / "operations" / "production.md"


def documented_environment() -> dict[str, str]:
    """The variables of the ```sh block after ``<!-- production-env -->`` in the production guide."""
    text = DOCS.read_text()
    block = text.split("<!-- production-env -->", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    return dict(line.split("=", 1) for line in block.strip().splitlines())


def strata_check(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """``strata check --deploy`` in a subprocess with exactly ``env`` (no STRATA_* of the test run)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_") and k != "DJANGO_SETTINGS_MODULE"}
    script = Path(sys.executable).with_name("strata")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "strata.cli.main"]
    return subprocess.run([*command, "check", "--deploy", *args], env={**base, **env}, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def problem_ids(output: str) -> set[str]:
    return set(re.findall(r"^(?:CRITICAL|ERROR|WARNING|INFO|DEBUG) (\S+):", output, re.MULTILINE))


class FakeRedis:
    """A RESP server answering ``CONFIG GET appendonly|save`` with the given values (``None``: CONFIG is
    disabled, an error) and ``+OK`` to anything else (AUTH, CLIENT SETINFO, SELECT...)."""

    def __init__(self, appendonly: str | None = "yes", save: str = "3600 1 300 100"):
        self.config = None if appendonly is None else {"appendonly": appendonly, "save": save}
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.stopping = False

    @staticmethod
    def _read_command(stream) -> list[str] | None:
        header = stream.readline()
        if not header:
            return None
        if not header.startswith(b"*"):
            return header.decode().split()
        parts = []
        for _ in range(int(header[1:])):
            length = int(stream.readline()[1:])
            parts.append(stream.read(length + 2)[:-2].decode())
        return parts

    def _serve(self, connection: socket.socket) -> None:
        with connection, connection.makefile("rb") as stream:
            while (command := self._read_command(stream)) is not None:
                if [part.lower() for part in command[:2]] == ["config", "get"]:
                    if self.config is None:
                        connection.sendall(b"-ERR unknown command 'CONFIG'\r\n")
                        continue
                    key, value = command[2].lower(), self.config.get(command[2].lower(), "")
                    connection.sendall(b"*2\r\n" + b"".join(
                        b"$%d\r\n%s\r\n" % (len(item.encode()), item.encode()) for item in (key, value)))
                elif command[0].lower() == "hello":  # RESP3 negotiation: an old server's answer
                    connection.sendall(b"-ERR unknown command 'HELLO'\r\n")
                else:
                    connection.sendall(b"+OK\r\n")

    def _accept(self) -> None:
        while not self.stopping:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    @contextmanager
    def running(self):
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.stopping = True
            try:
                self.server.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() alone does not
            except OSError:
                pass
            self.server.close()
            thread.join(timeout=10)


def production_env(tmp_path: Path, redis_address: str) -> dict[str, str]:
    """The documented environment with its site-specific values replaced: the Redis host and password, the
    state directory and the key file (the database is never connected to by the checks)."""
    key_file = tmp_path / "secret_key"
    key_file.write_text(secrets.token_urlsafe(64))
    env = {}
    for name, value in documented_environment().items():
        value = value.replace(":REDIS_PASSWORD@redis.internal:6379", f":pw@{redis_address}")
        value = value.replace("/etc/strata/secret_key", str(key_file))
        value = value.replace("/var/lib/strata", str(tmp_path / "home"))
        env[name] = value
    return env


def test_the_documented_production_environment_is_clean(tmp_path):
    env = documented_environment()
    assert {"STRATA_DATABASE_URL", "STRATA_BROKER_URL", "STRATA_SECRET_KEY_FILE", "STRATA_HTTPS",
            "STRATA_ALLOWED_HOSTS", "STRATA_PUBLIC_URL"} <= set(env)
    with FakeRedis(appendonly="yes").running() as redis:
        result = strata_check(production_env(tmp_path, f"127.0.0.1:{redis.port}"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert problem_ids(result.stdout) == set(), result.stdout
    assert "strata check --deploy: no problems" in result.stdout


def test_the_laptop_defaults_list_the_expected_problems(tmp_path):
    result = strata_check({"STRATA_HOME": str(tmp_path)})
    assert result.returncode == 0, result.stdout + result.stderr  # warnings only: not an error
    assert problem_ids(result.stdout) == {
        "strata.W001",  # filesystem broker: single host
        "strata.W010",  # SQLite
        "strata.W020",  # generated secret key
        "strata.W031",  # loopback-only ALLOWED_HOSTS
        "strata.W040",  # http public URL
        "strata.W050",  # per-process cache
        "security.W004", "security.W008", "security.W012", "security.W016",  # HSTS, redirect, cookies
    }, result.stdout
    lines = [line for line in result.stdout.splitlines() if problem_ids(line)]
    assert len(lines) == 10  # one line per problem
    # A pipeline fails on warnings with --fail-level WARNING; DEBUG on is Django's security.W018.
    strict = strata_check({"STRATA_HOME": str(tmp_path), "STRATA_DEBUG": "1"}, "--fail-level", "WARNING")
    assert strict.returncode == 1 and "security.W018" in problem_ids(strict.stdout)


@pytest.mark.parametrize(("appendonly", "save", "expected"), [
    ("no", "", "strata.W002"),  # no persistence
    (None, "", "strata.W003"),  # CONFIG disabled: cannot tell
    ("no", "3600 1", None),  # RDB snapshots count as persistence
])
def test_redis_broker_persistence(tmp_path, appendonly, save, expected):
    with FakeRedis(appendonly=appendonly, save=save).running() as redis:
        result = strata_check(production_env(tmp_path, f"127.0.0.1:{redis.port}"))
    assert problem_ids(result.stdout) == ({expected} if expected else set()), result.stdout
    assert result.returncode == 0


def test_an_unreachable_redis_cannot_be_verified(tmp_path):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = strata_check(production_env(tmp_path, f"127.0.0.1:{port}"))
    assert problem_ids(result.stdout) == {"strata.W003"}, result.stdout


def _local_redis_persistence() -> bool | None:
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=1):
            pass
    except OSError:
        return None
    return checks.redis_persistence("redis://127.0.0.1:6379/0")


def test_this_machines_redis(tmp_path):
    """Against the Redis at 127.0.0.1:6379 where one runs (CI's runs with --save "" --appendonly no)."""
    persistent = _local_redis_persistence()
    if persistent is None:
        pytest.skip("no Redis with CONFIG at 127.0.0.1:6379")
    env = {**production_env(tmp_path, "unused"), "STRATA_BROKER_URL": "redis://127.0.0.1:6379/0"}
    result = strata_check(env)
    assert problem_ids(result.stdout) == (set() if persistent else {"strata.W002"}), result.stdout


# --- the checks, in process ----------------------------------------------------------------------------------

def test_https_redirect_without_the_proxy_header_is_flagged(settings):
    settings.STRATA_PUBLIC_URL = "https://strata.example.org"
    settings.CSRF_TRUSTED_ORIGINS = ["https://strata.example.org"]
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_PROXY_SSL_HEADER = None
    assert [m.id for m in checks.check_https()] == ["strata.W041"]
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    assert checks.check_https() == []
    settings.CSRF_TRUSTED_ORIGINS = []
    assert [m.id for m in checks.check_https()] == ["strata.W042"]


def test_hosts(settings):
    settings.STRATA_PUBLIC_URL = "https://strata.example.org"
    settings.ALLOWED_HOSTS = ["*"]
    assert [m.id for m in checks.check_hosts()] == ["strata.W030"]
    settings.ALLOWED_HOSTS = ["other.example.org"]
    assert [m.id for m in checks.check_hosts()] == ["strata.W032"]
    settings.ALLOWED_HOSTS = [".example.org"]
    assert checks.check_hosts() == []


def test_secret_key_and_lease(settings, monkeypatch):
    monkeypatch.setenv("STRATA_SECRET_KEY", "x" * 60)
    settings.SECRET_KEY = "x" * 60
    assert [m.id for m in checks.check_secret_key()] == ["strata.W021"]
    settings.SECRET_KEY = secrets.token_urlsafe(64)
    assert checks.check_secret_key() == []
    settings.STRATA_SCHEDULER_TICK_SECONDS, settings.STRATA_LEADER_LEASE_SECONDS = 2.0, 5.0
    assert [m.id for m in checks.check_leader_lease()] == ["strata.W060"]


def test_production_settings_from_the_environment(tmp_path):
    """STRATA_HTTPS and friends become Django's settings (read in a fresh process)."""
    env = production_env(tmp_path, "127.0.0.1:1")
    base = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_") and k != "DJANGO_SETTINGS_MODULE"}
    code = ("import django, json; django.setup(); from django.conf import settings as s; print(json.dumps(["
            "s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS, s.SECURE_HSTS_INCLUDE_SUBDOMAINS, s.SESSION_COOKIE_SECURE,"
            " s.CSRF_COOKIE_SECURE, s.SECURE_PROXY_SSL_HEADER, s.CSRF_TRUSTED_ORIGINS, s.SECURE_REDIRECT_EXEMPT]))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env={**base, **env, "DJANGO_SETTINGS_MODULE": "strata.settings"})
    assert result.returncode == 0, result.stderr
    import json

    assert json.loads(result.stdout.strip().splitlines()[-1]) == [
        True, 31_536_000, True, True, True, ["HTTP_X_FORWARDED_PROTO", "https"], ["https://strata.example.org"],
        ["^healthz$", "^readyz$", "^metrics$"]]


@pytest.mark.django_db
def test_nodes_without_the_sandbox_are_flagged(make_node):
    sandboxed, open_node = make_node("boxed", gpus=1), make_node("open", gpus=1)
    sandboxed.info = {"sandbox": "bwrap"}
    sandboxed.save(update_fields=["info"])
    open_node.info = {"sandbox": "none"}
    open_node.save(update_fields=["info"])
    found = checks.check_node_sandboxes()
    assert [m.id for m in found] == ["strata.W070"] and "open (none)" in found[0].msg and "boxed" not in found[0].msg
    open_node.info = {"sandbox": "bwrap"}
    open_node.save(update_fields=["info"])
    assert checks.check_node_sandboxes() == []


def test_object_storage_that_does_not_answer_is_a_warning(tmp_path, seaweedfs):
    from support import free_port

    base = {"STRATA_HOME": str(tmp_path), **seaweedfs.settings("check/")}
    assert "strata.W080" not in problem_ids(strata_check(base).stdout)
    for broken in ({"STRATA_S3_ENDPOINT": f"http://127.0.0.1:{free_port()}"},  # nothing listens
                   {"STRATA_S3_SECRET_ACCESS_KEY": "wrong"},  # refused
                   {"STRATA_S3_BUCKET": "no-such-bucket"},
                   {"STRATA_S3_BUCKET": ""}):  # not configured
        result = strata_check({**base, **broken})
        assert result.returncode == 0 and "strata.W080" in problem_ids(result.stdout), (broken, result.stdout)
        assert seaweedfs.secret_key not in result.stdout
