"""The team's Notifications page (``/team/notifications/``): create a webhook (its secret shown this once), the
"Send a test" button delivering to a real receiver on 127.0.0.1, the delivery log, disable and delete; for
team-admins only (a member gets a 403, another team a 404)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.test import Client

from strata.notify.models import Delivery, Webhook
from strata.notify.signing import verify_signature

URL = "/team/notifications/"


@pytest.fixture
def receiver():
    got: list[tuple[dict, bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            got.append((dict(self.headers.items()), body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/in", got
    server.shutdown()
    server.server_close()
    thread.join(timeout=30)


@pytest.fixture
def alpha(make_team, settings):
    settings.STRATA_WEBHOOK_ALLOW_PRIVATE = True
    return make_team("alpha")


def login(make_user, team, name, role):
    client = Client()
    client.force_login(make_user(name, team, role))
    return client


def test_create_test_and_delete_a_webhook(make_user, alpha, receiver, monkeypatch,
                                          django_capture_on_commit_callbacks):
    from strata.notify import services
    from strata.notify.tasks import deliver_task

    url, got = receiver
    queued: list[int] = []
    monkeypatch.setattr(services, "send", lambda delivery_id, countdown=0.0: queued.append(delivery_id))
    browser = login(make_user, alpha, "ada", "team-admin")
    page = browser.get(URL)
    assert page.status_code == 200 and "No webhooks yet" in page.content.decode()
    bad = browser.post(URL, {"team": "alpha", "action": "create", "url": "not a url", "format": "json",
                             "events": ["job.failed"]})
    assert bad.status_code == 400 and 'data-field="url"' in bad.content.decode()
    created = browser.post(URL, {"team": "alpha", "action": "create", "url": url, "format": "json",
                                 "events": ["job.failed", "node.lost"]})
    assert created.status_code == 201
    hook = Webhook.objects.get()
    html = created.content.decode()
    secret = html.split("data-secret>", 1)[1].split("<", 1)[0]
    assert secret.startswith("whsec_") and hook.events == ["job.failed", "node.lost"]
    assert secret not in browser.get(URL).content.decode()  # shown once
    with django_capture_on_commit_callbacks(execute=True):
        tested = browser.post(URL, {"team": "alpha", "action": "test", "target": f"webhook:{hook.pk}"})
    assert tested.status_code == 302
    for delivery_id in queued:
        deliver_task(delivery_id)
    ((headers, body),) = got
    assert json.loads(body)["event"] == "webhook.test"
    verify_signature(secret, body, headers["Strata-Signature"])
    html = browser.get(URL).content.decode()
    assert 'data-status="succeeded"' in html and "204" in html
    assert Delivery.objects.get().response_code == 204
    assert browser.post(URL, {"team": "alpha", "action": "disable", "target": f"webhook:{hook.pk}"}).status_code == 302
    assert Webhook.objects.get().enabled is False
    assert browser.post(URL, {"team": "alpha", "action": "delete", "target": f"webhook:{hook.pk}"}).status_code == 302
    assert not Webhook.objects.exists()


def test_members_are_refused_and_other_teams_are_hidden(make_user, make_team, alpha):
    member = login(make_user, alpha, "mel", "member")
    assert member.get(URL).status_code == 403
    assert member.post(URL, {"team": "alpha", "action": "create", "url": "http://x.example"}).status_code == 403
    other = make_team("beta")
    hook = Webhook.objects.create(team=other, url="http://x.example/", events=["job.failed"], secret_ciphertext="x")
    admin = login(make_user, alpha, "ada", "team-admin")
    assert admin.get(URL, {"team": "beta"}).status_code == 404
    assert admin.post(URL, {"team": "alpha", "action": "delete", "target": f"webhook:{hook.pk}"}).status_code == 404
    assert Webhook.objects.filter(pk=hook.pk).exists()
