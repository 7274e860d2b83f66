"""``strata secrets set|list|delete``: the value is read from stdin (never from the command line), nothing the
command prints holds it, and errors are one line. The REST calls go to the real API views (a test client stands
in for HTTP)."""

from __future__ import annotations

import io
import sys

import pytest

from components.runtime.client.client import ApiError
from strata.accounts import team_secrets
from strata.accounts.models import Secret
from strata.cli.main import build_parser, main

VALUE = "sk-cli-secret-0123456789"


class Adapter:
    """The CLI's REST client's calls, answered by the Django test client (errors as the real client words them)."""

    def __init__(self, api):
        self.api = api

    def request(self, method, path, *, json=None, params=None, **_kwargs):
        from components.runtime.client.client import _describe

        url = f"/api/v1/{path}"
        if method == "POST":
            response = self.api.post(url, json, format="json")
        elif method == "DELETE":
            response = self.api.delete(url + ("?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else ""))
        else:
            response = self.api.get(url, params or {})
        if response.status_code >= 400:
            response.text = response.content.decode()
            message, payload = _describe(response)
            raise ApiError(response.status_code, message, payload)
        return None if response.status_code == 204 else response.json()

    def get(self, path, **kwargs):
        return self.request("GET", path, **kwargs)

    def post(self, path, json=None, **kwargs):
        return self.request("POST", path, json=json, **kwargs)

    def delete(self, path, **kwargs):
        return self.request("DELETE", path, **kwargs)


@pytest.fixture
def cli(make_team, make_user, make_token, api, monkeypatch):
    team = make_team("alpha")
    client = Adapter(api(make_token(make_user("alice", team, "team-admin"), team)))
    monkeypatch.setattr("strata.cli.client_commands.connect", lambda args: client)

    def run(*argv, stdin: bytes = b""):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
        return main(list(argv))

    run.team = team
    return run


def test_set_reads_the_value_from_stdin_list_and_delete(cli, capsys):
    assert cli("secrets", "set", "HF_TOKEN", stdin=f"{VALUE}\n".encode()) == 0  # echo adds a newline: dropped
    assert team_secrets.secret_values(cli.team.pk, ["HF_TOKEN"])[0] == {"HF_TOKEN": VALUE}
    assert cli("secrets", "set", "RAW", stdin=VALUE.encode()) == 0  # echo -n
    assert cli("secrets", "set", "PEM", stdin=b"line 1\nline 2\n\n") == 0  # only the one final newline goes
    assert team_secrets.secret_values(cli.team.pk, ["RAW", "PEM"])[0] == {"RAW": VALUE, "PEM": "line 1\nline 2\n"}
    assert cli("secrets", "list") == 0
    assert cli("secrets", "delete", "RAW") == 0
    out = capsys.readouterr().out
    assert "secret HF_TOKEN of team alpha set" in out and "deleted secret RAW" in out
    listing = out.split("NAME")[1]
    assert "HF_TOKEN" in listing and "alice" in listing
    assert VALUE not in out
    assert sorted(Secret.objects.values_list("name", flat=True)) == ["HF_TOKEN", "PEM"]


def test_the_value_is_never_an_argument():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["secrets", "set", "HF_TOKEN", VALUE])


def test_errors_are_one_line_and_never_echo_the_value(cli, capsys):
    assert cli("secrets", "set", "HF_TOKEN", stdin=b"") == 2  # nothing on stdin
    assert cli("secrets", "set", "path", stdin=VALUE.encode()) == 1
    assert cli("secrets", "set", "BIG", stdin=b"x" * (64 * 1024 + 10)) == 2
    assert cli("secrets", "set", "BIN", stdin=b"\xff\xfe") == 2
    assert cli("secrets", "delete", "MISSING") == 1
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 5 and all(line.startswith("strata: error: ") for line in lines), err
    assert "name:" in lines[1] and "64 KiB" in lines[2] and "UTF-8" in lines[3] and "404" in lines[4]
    assert VALUE not in err
    assert not Secret.objects.exists()
