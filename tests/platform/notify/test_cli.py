"""``strata webhooks list|create|delete|test``: the REST calls go to the real API views (a test client stands in
for HTTP); the secret is printed once, at create; a refused call is one line. And signing.py stays light."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from components.runtime.client.client import ApiError
from strata.cli.main import main
from strata.notify.models import Delivery, Webhook


class Adapter:
    """The CLI's REST client, answered by the Django test client (errors raised as the real client raises them)."""

    def __init__(self, api):
        self.api = api

    def _answer(self, response):
        from components.runtime.client.client import _describe

        if response.status_code >= 400:
            response.text = response.content.decode()
            message, payload = _describe(response)
            raise ApiError(response.status_code, message, payload)
        return None if response.status_code == 204 else response.json()

    def get(self, path, params=None, **_):
        return self._answer(self.api.get(f"/api/v1/{path}", params or {}))

    def post(self, path, json=None, **_):
        return self._answer(self.api.post(f"/api/v1/{path}", json, format="json"))

    def delete(self, path, **_):
        return self._answer(self.api.delete(f"/api/v1/{path}"))


@pytest.fixture
def cli(admin_team, monkeypatch, queued):
    clients = {"admin": Adapter(admin_team["client"]), "member": Adapter(admin_team["member_client"])}
    chosen = {"who": "admin"}
    monkeypatch.setattr("strata.cli.client_commands.connect", lambda args: clients[chosen["who"]])

    def run(*argv, who="admin"):
        chosen["who"] = who
        return main(list(argv))

    return run


def test_create_list_test_and_delete(cli, capsys, receiver, queued, django_capture_on_commit_callbacks):
    from strata.notify.tasks import deliver_task

    assert cli("webhooks", "create", receiver.url, "--format", "slack", "--event", "job.failed",
               "--event", "node.lost") == 0
    out = capsys.readouterr().out
    hook = Webhook.objects.get()
    assert f"webhook {hook.pk} of team alpha created: {receiver.url} (slack; job.failed, node.lost)" in out
    secret = out.split("signing secret (shown this once): ")[1].strip()
    assert secret.startswith("whsec_")
    assert cli("webhooks", "list") == 0
    listing = capsys.readouterr().out
    assert receiver.url in listing and "slack" in listing and secret not in listing
    with django_capture_on_commit_callbacks(execute=True):
        assert cli("webhooks", "test", str(hook.pk), "--wait", "0") == 0  # queued: pending, not waited for
    assert "pending" in capsys.readouterr().out
    for delivery_id, _ in list(queued):
        deliver_task(delivery_id)
    assert Delivery.objects.get().status == "succeeded"
    assert receiver.wait_for(1)[0].json()["text"] == "Test notification from Strata for team alpha"
    assert cli("webhooks", "delete", str(hook.pk)) == 0
    assert f"deleted webhook {hook.pk}" in capsys.readouterr().out
    assert not Webhook.objects.exists()


def test_a_member_is_refused_in_one_line(cli, capsys, receiver):
    assert cli("webhooks", "create", receiver.url, who="member") == 1
    err = capsys.readouterr().err
    assert err.startswith("strata: error: ") and "team-admin" in err and len(err.strip().splitlines()) == 1


def test_signing_is_light_enough_to_copy():
    from strata.notify import signing

    tree = ast.parse(Path(signing.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= {"__future__", "hashlib", "hmac", "time"}, imported
