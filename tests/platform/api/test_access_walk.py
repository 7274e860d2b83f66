"""A generated access-control walk: every route and verb of the API (each plugin's job routes and collections
included, read from the registry) and of the dashboard, with objects of every registered job kind owned by team
alpha, under every kind of credential that must see nothing of them:

- a foreign team's user token and browser session: 404 on alpha's objects (never 403, never 200 with data),
  lists without alpha's objects;
- an expired token, a revoked token, the child of a revoked token (revoked through the cascade, or by a row
  update that did not cascade), an expired or revoked node token, no credentials: 401 on every API route;
- the dashboard without a session (with or without an API token): the login page (polled endpoints: 401).

And CSRF: every unsafe API request made with a session cookie and no CSRF token, and every dashboard POST, is a
403 that changes nothing; the same request with the token is not refused; bearer-token requests need none.

Each table below must know every route and every registered kind/collection: a new one makes the walk fail until
it is taught how to fill it.
"""

from __future__ import annotations

import hashlib
import io
import re
import tarfile
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from node_protocol import NodeProtocol
from support import api_routes, fill_route

from components.runtime.contract import registry
from strata.accounts.models import ApiToken, Secret, token_digest
from strata.jobs.models import (
    Artifact,
    Attempt,
    CodeBundle,
    DataSet,
    DataUpload,
    Job,
    JobToken,
    Participant,
    PluginRecord,
)
from strata.notify.models import Webhook

PREFIX = "/api/v1/"
UNSAFE = {"post", "put", "patch", "delete"}

# --- what the walk knows: every API route by name ---------------------------------------------------------

NODE_ROUTES = {"node-register", "node-heartbeat", "node-renew", "node-drain", "node-leave", "attempt-claim", "attempt-report",
               "attempt-finish", "attempt-artifact", "attempt-checkpoint", "attempt-source", "attempt-children",
               "attempt-child-cancel", "attempt-child-hold", "attempt-child-release", "attempt-child-resize",
               "attempt-child-metrics", "attempt-children-metrics", "attempt-children-batch", "attempt-child-file",
               "attempt-child-checkpoint", "attempt-tokens", "attempt-rendezvous",
               "attempt-credential", "attempt-code", "attempt-data", "attempt-renew",
               "attempt-upload-start", "attempt-upload-parts", "attempt-upload-complete", "attempt-upload-abort"}
PARTICIPANT_ROUTES = {"participant-join", "participant-heartbeat", "participant-leave"}
DOC_ROUTES = {"schema", "docs", "redoc", "api-root"}
# Routes about one job: filled once per job of every kind (job-route once per registered route name too).
JOB_ROUTES = {"job-detail", "job-artifacts", "job-cancel", "job-download", "job-events", "job-logs", "job-metrics",
              "job-resubmit", "job-route", "job-tokens", "job-revoke-token", "job-participants",
              "job-evict-participant"}
# Lists (the caller's own objects; alpha's must not show) and cluster-wide objects with no team data.
LIST_ROUTES = {"job-list", "node-list", "device-list", "team-list", "quota-list", "token-list", "pool-list",
               "collection", "code-list", "data-list", "upload-list", "secret-list", "logs-search", "usage-list"}
CLUSTER_OBJECTS = {"node-detail", "device-detail"}
# One object of team alpha each: a foreign caller gets 404 (writes that need a cluster admin: 403 first).
TEAM_OBJECTS = {"team-detail", "quota-detail", "quota-usage", "token-detail", "collection-item", "code-detail",
                "code-download", "data-detail", "upload-detail", "upload-chunk", "upload-parts", "upload-complete",
                "secret-detail", "team-members", "team-member", "usage-team"}
# The team's notification targets (strata.notify): every read is for team-admins too (a webhook URL may be a
# credential: Slack's), so alpha's owner reads them as the cluster admin of alpha.
NOTIFY_OBJECTS = {"webhook-detail", "webhook-test", "webhook-deliveries", "email-subscription-detail",
                  "email-subscription-test", "email-subscription-deliveries"}
NOTIFY_LISTS = {"webhook-list", "email-subscription-list"}
ADMIN_ONLY = {"pool-detail"}  # cluster-wide policy: reading is fine, changing it is for cluster admins
# Jobs named in the query (?jobs=a,b: every job of alpha's): a foreign caller gets a 404 that names the ids it sent.
COMPARE_ROUTES = {"compare"}
# The audit log: team-admins and cluster admins only; alice and bob are members (a 403).
AUDIT_ROUTES = {"audit", "audit-export"}
# Cluster admins only (strata.scheduling.whatif): anyone else a 403, before the body is read.
CLUSTER_ADMIN_ROUTES = {"quota-what-if", "eta-calibration"}
# The team's configuration that even reading needs team-admin for (strata.accounts.roles): the MLflow tracking
# server. It names no object: alice and bob (members) are refused for their own team (a 403).
TEAM_ADMIN_ROUTES = {"tracking"}
SECRET_NAME = "ALPHA_SECRET_NAME"
KNOWN = NODE_ROUTES | PARTICIPANT_ROUTES | DOC_ROUTES | JOB_ROUTES | LIST_ROUTES | CLUSTER_OBJECTS | TEAM_OBJECTS \
    | ADMIN_ONLY | COMPARE_ROUTES | AUDIT_ROUTES | NOTIFY_OBJECTS | NOTIFY_LISTS | CLUSTER_ADMIN_ROUTES \
    | TEAM_ADMIN_ROUTES

# A valid spec of every registered kind (the walk submits one job of each); "{train}" is a SUCCEEDED train job.
KIND_SUBMITS = {
    "train": {"spec": {"workload": "mlp-digits", "epochs": 1}},
    "compress-embeddings": {"spec": {"source": {"job": "{train}"}, "ratio": 8}},
    "serve": {"spec": {"model": {"job": "{train}"}}},
    "tune": {"spec": {"space": {"lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1}},
                      "trainable": {"kind": "train", "spec": {"workload": "mlp-digits", "lr": "{{lr}}"}}}},
    "decentralized-train": {"spec": {"model": "tiny", "steps": 10}, "resources": {"gpus": 0.25, "workers": 2}},
}
# A valid record of every registered collection (the walk registers one of each for team alpha).
COLLECTION_RECORDS = {
    "datasets": {"name": "alpha-secret-data", "source": {"path": "/srv/alpha-secret"}, "format": "npz"},
}


API_ROUTES = api_routes()
_fill = fill_route


def test_the_walk_knows_every_route_kind_and_collection():
    assert {name for name, _, _ in API_ROUTES} == KNOWN, "teach the walk the new API route"
    assert set(registry.kinds()) == set(KIND_SUBMITS), "give the walk a valid spec of the new kind"
    assert set(registry.collections()) == set(COLLECTION_RECORDS), "give the walk a record of the new collection"
    assert registry.job_routes(), "the walk expects plugins' job routes to walk"
    assert {name for name, _, _ in _dashboard_routes()} == set(DASHBOARD), "teach the walk the new dashboard route"


# --- the world: one job of every kind (and each kind's objects) owned by team alpha ---------------------------

def _finish(agent, node, attempt, outcome="succeeded"):
    protocol = NodeProtocol(agent, attempt, node)
    assert protocol.claim().status_code == 200
    return protocol.finish(outcome)


@pytest.fixture
def world(make_team, make_user, make_token, make_node, node_token, run_pass, api):
    from strata.jobs.services import artifact_store, attempt_claim, attempt_report, job_token_create

    # Alpha may register records naming paths under /srv (its data root, strata.quotas.roots).
    alpha, beta = make_team("secret-alpha", max_gpus=64.0, data_roots=["/srv"]), make_team("beta")
    alice, bob = make_user("alice", alpha), make_user("bob", beta)
    admin = make_user("root", alpha, admin=True)
    node = make_node("n1", gpus=8, memory=80 * 2**30)
    agent = api(node_token)
    a = api(make_token(alice, alpha))

    def post_job(kind: str, name: str, source: str = "") -> Job:
        body = {"kind": kind, "name": name, "resources": {"gpus": 0.25}, "max_attempts": 1,
                **{key: value for key, value in KIND_SUBMITS[kind].items()}}
        body["spec"] = _substitute(body["spec"], source)
        response = a.post(f"{PREFIX}jobs/", body, format="json")
        assert response.status_code == 201, (kind, response.content)
        return Job.objects.get(pk=response.json()["id"])

    # A SUCCEEDED train job with a model (of a workload every kind reading models accepts): the sources.
    source = post_job("train", "alpha-secret-source")
    run_pass()
    attempt = Attempt.objects.get(job=source)
    Job.objects.filter(pk=source.pk).update(spec={"workload": "dlrm-movielens", "epochs": 1})
    artifact_store(attempt, "model.pt", io.BytesIO(b"alpha-secret-model"))
    assert _finish(agent, node, attempt).status_code == 200
    jobs = {kind: post_job(kind, f"alpha-secret-{kind}", str(source.pk)) for kind in sorted(registry.kinds())}
    run_pass()
    # The train job runs, with logs, metrics and an artifact; every job gets what its kind takes.
    running = jobs["train"]
    attempt = Attempt.objects.get(job=running, ended_at__isnull=True)
    attempt_claim(attempt.pk, attempt.fencing_token, node)
    attempt_report(attempt, logs=[{"message": "alpha-secret-log"}], metrics=[{"name": "loss", "step": 1, "value": 0.5}])
    artifact = artifact_store(attempt, "alpha-secret.bin", io.BytesIO(b"alpha-secret-bytes"))
    job_tokens, participants = {}, {}
    for kind, job in jobs.items():
        spec = registry.get_kind(kind)
        if spec.accepts_tokens:
            job_tokens[kind] = job_token_create(job, user=alice, name="alpha-secret-access")[0]
        if spec.accepts_participants:
            participants[kind] = Participant.objects.create(
                job=job, name="alpha-secret-participant", gpus=0.5, secret_digest="0" * 64,
                info={"address": "alpha-secret-address"})
    assert job_tokens and participants, "some registered kind should take access tokens and participants"
    records = {}
    for collection, record in COLLECTION_RECORDS.items():
        response = a.post(f"{PREFIX}{collection}/", record, format="json")
        assert response.status_code == 201, (collection, response.content)
        records[collection] = PluginRecord.objects.get(collection=collection, team=alpha, name=record["name"])
    jobs["train-source"] = source
    project = io.BytesIO()
    with tarfile.open(fileobj=project, mode="w:gz") as archive:
        data = b"print('alpha-secret-code')\n"
        info = tarfile.TarInfo("alpha_secret_main.py")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    uploaded = a.generic("POST", f"{PREFIX}code/", data=project.getvalue(), content_type="application/gzip")
    assert uploaded.status_code == 201, uploaded.content
    # A data set of alpha's (uploaded in one chunk), mounted by a job, and an upload still open.
    secret = b"alpha-secret-data-set"
    digest = hashlib.sha256(secret).hexdigest()
    opened = a.post(f"{PREFIX}uploads/", {"name": "alpha-secret-set", "size": len(secret), "sha256": digest,
                                         "chunk_size": 1024, "format": "file", "file": "secret.txt"}, format="json")
    assert opened.status_code == 201, opened.content
    assert a.generic("PUT", f"{PREFIX}uploads/{opened.json()['id']}/chunks/0/", data=secret,
                     content_type="application/octet-stream", HTTP_CONTENT_SHA256=digest).status_code == 200
    assert a.post(f"{PREFIX}uploads/{opened.json()['id']}/complete/").status_code == 201
    pending = a.post(f"{PREFIX}uploads/", {"name": "alpha-secret-pending", "size": 5000, "sha256": "1" * 64,
                                          "chunk_size": 1024}, format="json")
    assert pending.status_code == 201, pending.content
    mounting = a.post(f"{PREFIX}jobs/", {"kind": "train", "name": "alpha-secret-mount", "resources": {"gpus": 0.25},
                                         "spec": {"command": ["true"], "data": {"mount": {"d": "alpha-secret-set"}}}},
                      format="json")
    assert mounting.status_code == 201, mounting.content
    # A team secret of alpha's (its name and value are alpha's; no answer, not even alpha's, holds the value).
    # (Set by a team-admin: alice is a member, who reads secret names but sets none.)
    from strata.accounts.team_secrets import secret_set

    secret_set(alpha, SECRET_NAME, "alpha-secret-value", user=admin)
    from strata.notify.services import email_create, webhook_create

    hook, _ = webhook_create(alpha, url="https://hooks.example.org/alpha-secret-hook", user=admin)
    email = email_create(alpha, address="alpha-secret@example.org", user=admin)
    return {
        "webhook": hook.pk, "email": email.pk,
        "code": uploaded.json()["digest"], "data_digest": digest, "upload": pending.json()["id"],
        "alpha": alpha, "beta": beta, "alice": alice, "bob": bob, "admin": admin, "node": node, "agent": agent,
        "a": a, "jobs": jobs, "artifact": artifact, "attempt": attempt, "job_tokens": job_tokens,
        "participants": participants, "records": records, "token_a": ApiToken.objects.get(user=alice),
        "make_token": make_token, "api": api,
    }


def _substitute(value, source: str):
    if isinstance(value, dict):
        return {key: _substitute(item, source) for key, item in value.items()}
    return source if value == "{train}" else value


def _secrets(world) -> list[str]:
    """Strings of team alpha that no other caller may ever see."""
    values = ["alpha-secret", world["alpha"].slug, world["token_a"].prefix, str(world["artifact"].pk)]
    for job in world["jobs"].values():
        values.append(str(job.pk))
        values += [str(attempt.pk) for attempt in job.attempts.all()]
        values += [attempt.fencing_token for attempt in job.attempts.all()]
    values += [str(token.pk) for token in world["job_tokens"].values()]
    values += [token.prefix for token in world["job_tokens"].values()]
    values += [str(p.pk) for p in world["participants"].values()]
    values += [world["code"], world["data_digest"], world["upload"], SECRET_NAME]
    return values


def _body(response) -> str:
    if hasattr(response, "streaming_content"):
        return b"".join(response.streaming_content).decode(errors="replace")
    return response.content.decode(errors="replace")


def _call(client, method: str, url: str, **extra):
    if method in {"post", "put", "patch"}:
        return getattr(client, method)(url, {}, format="json", **extra)
    return getattr(client, method)(url, **extra)


def _requests(world):
    """Every (route name, method, url) of the API, each route filled with team alpha's objects: the job routes
    once per job of every kind (job-route once per registered job route), collections once per registered one."""
    jobs = world["jobs"]
    any_token = next(iter(world["job_tokens"].values()))
    any_participant = next(iter(world["participants"].values()))
    base = {"team": world["alpha"].slug, "slug": world["alpha"].slug, "attempt_id": str(world["attempt"].pk),
            "child_id": str(jobs["train"].pk), "name": "alpha-secret.bin", "participant_id": str(any_participant.pk),
            "pk": str(jobs["train"].pk), "artifact_id": str(world["artifact"].pk), "token_id": str(any_token.pk),
            "digest": world["code"], "username": "alice"}
    for name, text, methods in API_ROUTES:
        fills = []
        if name in JOB_ROUTES:
            for kind, job in jobs.items():
                values = {**base, "pk": str(job.pk)}
                own = job.artifacts.filter(kind="artifact").first()  # else another job's: a 404 for everyone
                values["artifact_id"] = str(own.pk if own else world["artifact"].pk)
                values["token_id"] = str(world["job_tokens"].get(kind, any_token).pk)
                values["participant_id"] = str(world["participants"].get(kind, any_participant).pk)
                routes = sorted(registry.job_routes()) if name == "job-route" else [None]
                fills += [{**values, "route": route} if route else values for route in routes]
        elif name in {"collection", "collection-item"}:
            fills = [{**base, "collection": c, "name": r.name} for c, r in world["records"].items()]
        elif name == "secret-detail":
            fills = [{**base, "name": SECRET_NAME}]
        elif name == "data-detail":
            fills = [{**base, "name": "alpha-secret-set"}]
        elif name.startswith("upload-"):
            fills = [{**base, "pk": world["upload"], "index": "0"}]
        elif name == "attempt-data":
            fills = [{**base, "digest": world["data_digest"]}]
        elif name == "token-detail":
            fills = [{**base, "pk": str(world["token_a"].pk)}]
        elif name == "node-detail":
            fills = [{**base, "pk": str(world["node"].pk)}]
        elif name == "device-detail":
            fills = [{**base, "pk": str(world["node"].devices.first().pk)}]
        elif name == "pool-detail":
            fills = [{**base, "name": "default"}]
        elif name in NOTIFY_OBJECTS:
            fills = [{**base, "pk": str(world["webhook" if name.startswith("webhook") else "email"])}]
        else:
            fills = [base]
        for values in fills:
            url = _fill(text, values)
            if name in COMPARE_ROUTES:
                url += "?jobs=" + ",".join(str(job.pk) for job in jobs.values())
            for method in methods:
                yield name, method, url


def _distinct(requests):
    """One request per route × verb (per job route name, per collection): a dead credential is refused before
    any object is looked up, so the object it names does not matter."""
    seen = set()
    for name, method, url in requests:
        key = (name, method, url.split("/")[-2] if name == "job-route" else "",
               url.split("/")[3] if name.startswith("collection") else "")
        if key not in seen:
            seen.add(key)
            yield name, method, url


def _foreign_expected(name: str, method: str) -> set[int]:
    if name in NODE_ROUTES:
        return {403}
    if name in PARTICIPANT_ROUTES:
        return {401}
    if name in JOB_ROUTES | COMPARE_ROUTES:
        return {404}
    if name in TEAM_OBJECTS:
        # A quota is changed by cluster admins only: refused before the lookup (no object is named).
        return {403} if name == "quota-detail" and method in {"put", "patch"} else {404}
    if name in ADMIN_ONLY:
        return {200} if method == "get" else {403}
    if name in NOTIFY_OBJECTS:
        return {404}
    if name in NOTIFY_LISTS:
        return {200} if method == "get" else {403}  # bob is a member of beta: its targets need team-admin
    if name in CLUSTER_ADMIN_ROUTES:
        return {403}
    if name in AUDIT_ROUTES | TEAM_ADMIN_ROUTES:
        return {403}
    if name in {"job-list", "collection", "code-list", "upload-list"} and method == "post":
        return {400}
    if name == "secret-list" and method == "post":
        return {403}  # bob is a member of beta: setting its secrets needs team-admin (strata.accounts.roles)
    if name == "token-list" and method == "post":
        return {201, 400}  # bob's own new token (a session must name his team: 400)
    if name in LIST_ROUTES | CLUSTER_OBJECTS | DOC_ROUTES:
        return {200}
    raise AssertionError(f"no expectation for {name} {method}")


def _snapshot(world) -> dict:
    return {
        "jobs": sorted((str(j.pk), j.state) for j in Job.objects.all()),
        "tokens": sorted((str(t.pk), t.revoked_at) for t in ApiToken.objects.filter(user=world["alice"])),
        "job_tokens": sorted((str(t.pk), t.revoked_at) for t in JobToken.objects.all()),
        "participants": sorted((str(p.pk), p.state) for p in Participant.objects.all()),
        "records": PluginRecord.objects.count(),
        "code": sorted(CodeBundle.objects.values_list("team_id", "digest")),
        "data": sorted(DataSet.objects.values_list("team_id", "name", "digest")),
        "uploads": sorted((str(pk), str(received)) for pk, received in DataUpload.objects.values_list("pk",
                                                                                                   "received")),
        "secrets": sorted(Secret.objects.values_list("team_id", "name", "ciphertext")),
        "webhooks": sorted(Webhook.objects.values_list("id", "url", "enabled")),
    }


def test_every_api_route_and_verb_shows_a_foreign_team_nothing(world, api, make_token):
    """Bob (team beta), with a token and with a browser session, on every route × verb × alpha object."""
    _owner_reaches_every_object(world)
    session = api()
    session.force_login(world["bob"])
    credentials = {"foreign token": api(make_token(world["bob"], world["beta"])), "foreign session": session}
    secrets = _secrets(world)
    before = _snapshot(world)
    seen = set()
    for label, client in credentials.items():
        # The token on every object of every kind; the session (the same scoping, another authentication) on
        # every route × verb.
        requests = _requests(world) if label == "foreign token" else _distinct(_requests(world))
        for name, method, url in requests:
            if name in DOC_ROUTES:
                continue  # the schema and its viewers describe routes, not data (anonymous gets them too)
            response = _call(client, method, url)
            seen.add((name, method))
            assert response.status_code in _foreign_expected(name, method), (label, name, method, url,
                                                                          response.status_code, _body(response)[:300])
            leaked = [s for s in secrets if s in _body(response) and not _named_by_caller(name, url, s)]
            assert not leaked, (label, name, method, url, response.status_code, leaked)
    assert _snapshot(world) == before  # nothing of alpha's changed: no cancel, resubmit, revoke, evict, delete
    assert {(name, method) for name, method, _ in _requests(world) if name not in DOC_ROUTES} == seen


def _named_by_caller(name: str, url: str, secret: str) -> bool:
    """A compare 404 names the job ids the caller put in its own query: what it already knows, never more."""
    return name in COMPARE_ROUTES and "?jobs=" in url and secret in url.split("?jobs=", 1)[1].split(",")


def _owner_reaches_every_object(world):
    """The walk's URLs are right: alpha's own token reads every one of them (so the 404s mean 'not yours')."""
    a = world["a"]
    team_admin = world["api"](world["make_token"](world["admin"], world["alpha"]))
    for name, method, url in _requests(world):
        if method != "get" or name in NODE_ROUTES | PARTICIPANT_ROUTES | DOC_ROUTES:
            continue
        response = (team_admin if name in NOTIFY_OBJECTS else a).get(url)
        if name == "job-download" and not Artifact.objects.filter(pk=url.split("/")[-3], job_id=url.split("/")[-5]):
            assert response.status_code == 404, url  # a job's URL with another job's artifact
        elif name == "job-route":
            # A plugin's route answers for any job it can read; a kind it has nothing about may say so.
            assert response.status_code in {200, 404}, (url, response.status_code, _body(response)[:300])
            assert response.status_code == 200 or "job route" not in _body(response), url
        elif name in AUDIT_ROUTES | CLUSTER_ADMIN_ROUTES | TEAM_ADMIN_ROUTES:
            assert response.status_code == 403, (name, url, response.status_code)
        else:
            assert response.status_code == 200, (name, url, response.status_code, _body(response)[:300])


def _bad_credentials(world) -> dict[str, str | None]:
    """Raw bearer values that must authenticate nobody (None: no credentials at all)."""
    alice, alpha, make = world["alice"], world["alpha"], world["make_token"]
    expired = make(alice, alpha)
    ApiToken.objects.filter(digest=token_digest(expired)).update(expires_at=timezone.now() - timedelta(seconds=1))
    revoked = make(alice, alpha)
    api = world["api"]
    assert api(revoked).delete(f"{PREFIX}tokens/{ApiToken.objects.get(digest=token_digest(revoked)).pk}/") \
        .status_code == 204
    parent = make(alice, alpha)
    child = api(parent).post(f"{PREFIX}tokens/", {"name": "child"}, format="json").json()["token"]
    grandchild = api(child).post(f"{PREFIX}tokens/", {"name": "grandchild"}, format="json").json()["token"]
    assert api(grandchild).get(f"{PREFIX}jobs/").status_code == 200
    assert api(parent).delete(f"{PREFIX}tokens/{ApiToken.objects.get(digest=token_digest(parent)).pk}/") \
        .status_code == 204
    # A parent revoked by a write that did not cascade (the Django admin's form, a race with a child's creation).
    lone_parent = make(alice, alpha)
    lone_child = api(lone_parent).post(f"{PREFIX}tokens/", {"name": "lone"}, format="json").json()["token"]
    ApiToken.objects.filter(digest=token_digest(lone_parent)).update(revoked_at=timezone.now())
    root = world["admin"]
    node_expired = make(root, kind="node")
    ApiToken.objects.filter(digest=token_digest(node_expired)).update(expires_at=timezone.now() - timedelta(seconds=1))
    node_revoked = make(root, kind="node")
    ApiToken.objects.filter(digest=token_digest(node_revoked)).update(revoked_at=timezone.now())
    return {"expired": expired, "revoked": revoked, "child of a revoked parent": child,
            "grandchild of a revoked parent": grandchild, "child of a parent revoked alone": lone_child,
            "expired node token": node_expired, "revoked node token": node_revoked, "anonymous": None}


def test_every_api_route_and_verb_refuses_dead_credentials(world):
    """401 on every route × verb (documentation included for a dead token) for every credential that must not
    work, and nothing changes."""
    secrets = _secrets(world)
    credentials = _bad_credentials(world)
    before = _snapshot(world)
    count = 0
    for label, raw in credentials.items():
        client = world["api"](raw)
        for name, method, url in _distinct(_requests(world)):
            if raw is None and name in DOC_ROUTES:
                continue  # the published schema needs no login
            response = _call(client, method, url)
            count += 1
            assert response.status_code == 401, (label, name, method, url, response.status_code,
                                                  _body(response)[:200])
            assert not [s for s in secrets if s in _body(response)], (label, name, method)
            if raw is not None:
                assert raw not in _body(response), (label, name)  # a refusal never repeats the token
    assert _snapshot(world) == before
    every = list(_distinct(_requests(world)))
    docs = sum(name in DOC_ROUTES for name, _, _ in every)
    assert count == len(credentials) * len(every) - docs > 400, count


# --- the dashboard --------------------------------------------------------------------------------------------

def _dashboard_routes():
    from dashboard import urls as dashboard_urls

    return [(entry.name, str(entry.pattern), entry) for entry in dashboard_urls.urlpatterns]


# name -> (access, object): access is who may use it (public, login: a page that sends anonymous visitors to
# log in, live: a polled endpoint that answers them 401, admin: cluster admins); object says what fills it.
DASHBOARD = {
    "home": ("public", None), "login": ("public", None), "logout": ("public", None), "plotly-js": ("public", None),
    "jobs": ("login", None), "job-rows": ("live", None), "job-new": ("login", None), "job-validate": ("live", None),
    "job-detail": ("login", "job"), "job-live": ("live", "job"), "job-cancel": ("login", "job"),
    "job-resubmit": ("login", "job"),
    "cluster": ("login", None), "cluster-charts": ("live", None), "cluster-tables": ("live", None),
    "cluster-panels": ("live", None), "usage": ("login", "team"), "quota-editor": ("admin", None),
    "pool-editor": ("admin", None), "team-secrets": ("login", "team"), "team-members": ("login", "team"),
    "team-notifications": ("login", "team"),
    "cli-login": ("login", None),
    "compare": ("login", "jobs"),
    "log-search": ("login", None), "team-tracking": ("login", "team"),
    "audit": ("admin", None),
    "quota-what-if": ("admin", None),
}


def _dashboard_requests(world):
    """(name, access, method, url, data) for every dashboard route: GET and POST, per alpha job of every kind
    for job pages, with a POST body that names team alpha wherever the form takes one."""
    # Logging out last: the walk's session must hold until then.
    for name, text, _ in sorted(_dashboard_routes(), key=lambda route: route[0] == "logout"):
        access, obj = DASHBOARD[name]
        urls = []
        if obj == "job":
            urls = [re.sub(r"<uuid:job_id>", str(job.pk), text) for job in world["jobs"].values()]
        elif obj == "team":
            urls = [f"{text}?team={world['alpha'].slug}"]
        elif obj == "jobs":
            urls = [f"{text}?jobs=" + ",".join(str(job.pk) for job in world["jobs"].values())]
        else:
            urls = [text]
        data = {"team": world["alpha"].slug, "kind": "train", "name": "beta-made", "spec.workload": "mlp-digits",
                "spec.epochs": "1", "pool": "default", "sharing_policy": "exclusive", "max_gpus": "1"}
        for url in urls:
            for method in ("get", "post"):
                yield name, access, method, "/" + url, data


def test_every_dashboard_route_shows_anonymous_and_foreign_visitors_nothing(world):
    _dashboard_anonymous(world)
    _dashboard_foreign(world)


def _dashboard_anonymous(world):
    """No session (an API token in the header changes nothing): pages redirect to the login form, polled
    endpoints answer 401, nothing of alpha's shows and nothing changes."""
    raw = world["make_token"](world["alice"], world["alpha"])
    secrets = _secrets(world)
    before = _snapshot(world)
    for client in (Client(), Client(HTTP_AUTHORIZATION=f"Bearer {raw}")):
        for name, access, method, url, data in _dashboard_requests(world):
            response = getattr(client, method)(url, data) if method == "post" else client.get(url)
            status = response.status_code
            if access in {"login", "admin"}:
                assert status == 302 and response["Location"].startswith("/login/?next="), (name, method, status)
            elif access == "live":
                assert status == 401, (name, method, status)
            assert not [s for s in secrets if s in _body(response)], (name, method)
    assert _snapshot(world) == before


def _dashboard_foreign(world):
    """Bob's session: alpha's job pages are 404 (405 for a verb the page does not take, before any lookup), the
    lists and cluster pages hold nothing of alpha's, a form naming alpha makes nothing, admin pages are 403."""
    client = Client()
    client.force_login(world["bob"])
    secrets = _secrets(world)
    before = _snapshot(world)
    for name, access, method, url, data in _dashboard_requests(world):
        response = getattr(client, method)(url, data) if method == "post" else client.get(url)
        status = response.status_code
        if access == "admin":
            assert status == 403, (name, method, status)
        elif DASHBOARD[name][1] is not None:  # alpha's job, alpha's usage
            assert status in {404, 405}, (name, method, url, status)
        elif access != "public":
            assert status in {200, 302, 405}, (name, method, status)  # his own pages (a form with errors: 200)
        # A form answers with what was typed into it (the team slug): never more of alpha's.
        shown = [s for s in secrets if s in _body(response) and not (method == "post" and s == world["alpha"].slug)
                 and not _named_by_caller(name, url, s)]
        assert not shown, (name, method, url, status)
    assert _snapshot(world) == before
    assert not Job.objects.filter(name="beta-made").exists()


# --- CSRF -----------------------------------------------------------------------------------------------------

def _csrf_token(client: Client) -> str:
    client.get("/jobs/new/")
    return client.cookies["csrftoken"].value


def _user_api_requests(world):
    """Every unsafe verb of every API route a browser session may use."""
    for name, method, url in _distinct(_requests(world)):
        if method in UNSAFE and name not in NODE_ROUTES | PARTICIPANT_ROUTES | DOC_ROUTES:
            yield name, method, url


def test_session_writes_to_the_api_need_the_csrf_token_and_bearer_writes_do_not(world):
    _bearer_writes(world)
    _session_writes(world)


def _session_writes(world):
    """Every unsafe verb with a session cookie and no CSRF token: 403, nothing changes; with it: done."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(world["admin"])  # a cluster admin of alpha: every write is otherwise allowed
    before = _snapshot(world)
    count = 0
    for name, method, url in _user_api_requests(world):
        response = getattr(client, method)(url, "{}", content_type="application/json")
        assert response.status_code == 403 and "CSRF" in _body(response), (name, method, url, response.status_code)
        count += 1
    assert _snapshot(world) == before
    assert count > 10, count
    token = _csrf_token(client)
    for name, method, url in _user_api_requests(world):
        response = getattr(client, method)(url, "{}", content_type="application/json", HTTP_X_CSRFTOKEN=token)
        assert "CSRF" not in _body(response), (name, method, url, response.status_code)
    assert _snapshot(world) != before  # with the token, the same requests did their work


def _bearer_writes(world):
    client = Client(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Bearer {world['make_token'](world['admin'], world['alpha'])}")
    before = _snapshot(world)
    for name, method, url in _user_api_requests(world):
        response = getattr(client, method)(url, "{}", content_type="application/json")
        assert "CSRF" not in _body(response), (name, method, url, response.status_code)
    assert _snapshot(world) != before


def test_every_dashboard_post_needs_the_csrf_token(world):
    client = Client(enforce_csrf_checks=True)
    client.force_login(world["admin"])
    before = _snapshot(world)
    count = 0
    for name, _, method, url, data in _dashboard_requests(world):
        if method != "post":
            continue
        response = client.post(url, data)
        assert response.status_code == 403 and "CSRF" in _body(response), (name, url, response.status_code)
        count += 1
    assert _snapshot(world) == before
    token = _csrf_token(client)
    for name, _, method, url, data in _dashboard_requests(world):
        if method != "post" or name == "logout":
            continue
        response = client.post(url, {**data, "csrfmiddlewaretoken": token})
        assert response.status_code != 403, (name, url, response.status_code)
    assert _snapshot(world) != before
    assert count >= len(DASHBOARD), count
