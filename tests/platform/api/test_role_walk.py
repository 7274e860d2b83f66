"""The access-control walk by role: every route and verb of the API, on the objects of team alpha (the world of
test_access_walk.py: one job of every kind, code, data, an upload, a record, a secret, all owned by alice, a
member), as each role there is: a viewer, another member, a team-admin, a cluster admin, another team's member
and nobody (no credentials).

``EXPECT`` says, for every route name and verb, which access class it is; the class says what each role gets.
A route or verb the table does not know fails the walk: a new route must say who may use it.

- reads (GET) answer every role of alpha exactly what they answer alice; another team's member a 404 on alpha's
  objects (their own lists: 200); nobody a 401;
- a write that makes something new in the team (submit, upload, register) needs the member role;
- a write to alice's object, or to the team's configuration (secrets, members, limits), needs team-admin;
- quotas and pools need a cluster admin; one's own API tokens are anyone's.

A refused write is a JSON 403 (``detail``) and changes nothing; a write the role may make is never a 401 or 403.
"""

from __future__ import annotations

import json

import pytest
from support import sibling_module

walk = sibling_module(__file__, "test_access_walk")
world = walk.world  # the fixture: team alpha's objects of every kind

PREFIX = "/api/v1/"
ROLES = ("anonymous", "foreign", "viewer", "member", "team-admin", "cluster-admin")
SAME = "same"  # what alice (the owner, a member) gets for the same read
PASS = "pass"  # allowed: anything but 401 and 403 (the walk's empty bodies are often a 400)


def _access(viewer, member, team_admin, cluster_admin, foreign, anonymous=frozenset({401})):
    return {"viewer": viewer, "member": member, "team-admin": team_admin, "cluster-admin": cluster_admin,
            "foreign": foreign, "anonymous": anonymous}


R403, R404 = frozenset({403}), frozenset({404})
READ = _access(SAME, SAME, SAME, SAME, R404)  # one of alpha's objects
LIST = _access(SAME, SAME, SAME, SAME, frozenset({200}))  # the caller's own lists, cluster-wide objects
CREATE = _access(R403, PASS, PASS, PASS, PASS)  # something new in the caller's team: member
OTHERS = _access(R403, R403, PASS, PASS, R404)  # alice's object, the team's configuration: team-admin
CLUSTER = _access(R403, R403, R403, PASS, R403)  # quotas, pools: cluster admin
SELF = _access(PASS, PASS, PASS, PASS, PASS)  # one's own API tokens
TEAM_TOKENS = _access(R404, R404, PASS, PASS, R404)  # alice's API token: hers, and her team-admins'
NODE = _access(R403, R403, R403, R403, R403)
PARTICIPANT = _access(*[frozenset({401})] * 5)
# The audit log: team-admins (their team's entries) and cluster admins (all); the foreign caller is beta's member.
AUDIT = _access(R403, R403, frozenset({200}), frozenset({200}), R403)
# The foreign caller is a member of beta: setting a secret in his own team is refused by his role there.
SECRET_SET = {**OTHERS, "foreign": R403}
# The team's notification targets: reads too need team-admin (a webhook URL may be a credential).
ADMIN_READ = _access(R403, R403, PASS, PASS, R404)

EXPECT: dict[str, dict[str, dict]] = {
    # jobs
    "job-list": {"get": LIST, "post": CREATE},
    "job-detail": {"get": READ}, "job-artifacts": {"get": READ}, "job-download": {"get": READ},
    "job-events": {"get": READ}, "job-logs": {"get": READ}, "job-metrics": {"get": READ},
    "job-participants": {"get": READ}, "job-route": {"get": READ},
    "job-tokens": {"get": READ, "post": OTHERS},
    "job-cancel": {"post": OTHERS}, "job-resubmit": {"post": OTHERS},
    "job-revoke-token": {"delete": OTHERS}, "job-evict-participant": {"delete": OTHERS},
    # teams, members, quotas, tokens, secrets
    "team-list": {"get": LIST}, "team-detail": {"get": READ},
    "team-members": {"get": READ, "post": OTHERS},
    "team-member": {"get": READ, "patch": OTHERS, "delete": OTHERS},
    "quota-list": {"get": LIST}, "quota-detail": {"get": READ, "put": CLUSTER, "patch": CLUSTER},
    "quota-usage": {"get": READ},
    "token-list": {"get": LIST, "post": SELF}, "token-detail": {"delete": TEAM_TOKENS},
    "secret-list": {"get": LIST, "post": SECRET_SET},
    "secret-detail": {"get": READ, "delete": OTHERS},
    # notifications (webhooks, e-mail subscriptions)
    "webhook-list": {"get": LIST, "post": SECRET_SET},
    "webhook-detail": {"get": ADMIN_READ, "patch": OTHERS, "delete": OTHERS},
    "webhook-test": {"post": OTHERS}, "webhook-deliveries": {"get": ADMIN_READ},
    "email-subscription-list": {"get": LIST, "post": SECRET_SET},
    "email-subscription-detail": {"get": ADMIN_READ, "delete": OTHERS},
    "email-subscription-test": {"post": OTHERS}, "email-subscription-deliveries": {"get": ADMIN_READ},
    # cluster
    "node-list": {"get": LIST}, "node-detail": {"get": LIST}, "device-list": {"get": LIST},
    "device-detail": {"get": LIST}, "pool-list": {"get": LIST}, "pool-detail": {"patch": CLUSTER},
    # code, data, uploads, collections
    "code-list": {"get": LIST, "post": CREATE},
    "code-detail": {"get": READ, "delete": OTHERS}, "code-download": {"get": READ},
    "data-list": {"get": LIST}, "data-detail": {"get": READ, "delete": OTHERS},
    "upload-list": {"get": LIST, "post": CREATE},
    "upload-detail": {"get": READ, "delete": OTHERS}, "upload-chunk": {"put": OTHERS},
    "upload-parts": {"post": OTHERS}, "upload-complete": {"post": OTHERS},
    "collection": {"get": LIST, "post": CREATE}, "collection-item": {"get": READ, "delete": OTHERS},
    # the audit log
    "audit": {"get": AUDIT}, "audit-export": {"get": AUDIT},
    # reads across jobs: comparing alpha's jobs (named in the query), searching the caller's teams' logs, usage
    "compare": {"get": READ}, "logs-search": {"get": LIST},
    "usage-list": {"get": LIST}, "usage-team": {"get": READ},
    # the team's MLflow tracking server: team-admins, reads included (its answer describes the server); the
    # foreign caller, a member of beta, asks about his own team and is refused by his role there
    "tracking": {"get": SECRET_SET, "put": SECRET_SET, "delete": SECRET_SET},
    # the scheduler's ETA calibration: cluster-wide, cluster admins
    "eta-calibration": {"get": CLUSTER},
    # replaying history under a proposed quota (strata.scheduling.whatif)
    "quota-what-if": {"post": CLUSTER},
}
for _name in walk.NODE_ROUTES:
    EXPECT[_name] = {"get": NODE, "post": NODE, "put": NODE, "patch": NODE, "delete": NODE}
for _name in walk.PARTICIPANT_ROUTES:
    EXPECT[_name] = {"get": PARTICIPANT, "post": PARTICIPANT}


def test_the_role_table_knows_every_route_and_verb():
    """A route (or a verb of one) with no expectation fails here: say which roles may use it."""
    missing = sorted(f"{name} {method}" for name, _, methods in walk.API_ROUTES if name not in walk.DOC_ROUTES
                     for method in methods if method not in EXPECT.get(name, {}))
    assert not missing, f"give these routes an access class in EXPECT: {missing}"


@pytest.fixture
def callers(world, make_user, make_token, api):
    """A client per role; the team's members by token of alpha, the cluster admin by token of alpha too."""
    alpha = world["alpha"]
    users = {"viewer": make_user("vera", alpha, "viewer"), "member": make_user("mia", alpha, "member"),
             "team-admin": make_user("ada", alpha, "team-admin")}
    clients = {role: api(make_token(user, alpha)) for role, user in users.items()}
    clients["cluster-admin"] = api(make_token(world["admin"], alpha))
    clients["foreign"] = api(make_token(world["bob"], world["beta"]))
    clients["anonymous"] = api()
    return clients


def _expected(name: str, method: str, role: str):
    return EXPECT[name][method][role]


def _check(role, name, method, url, response, owner_status, secrets):
    expected = _expected(name, method, role)
    status = response.status_code
    where = (role, name, method, url, status, walk._body(response)[:300])
    if expected == SAME:
        assert status == owner_status, where
    elif expected == PASS:
        assert status not in (401, 403), where
    else:
        assert status in expected, where
    if status == 403:
        body = json.loads(walk._body(response))
        assert isinstance(body.get("detail"), str) and body["detail"], where
    if role in ("foreign", "anonymous"):  # (a compare 404 may name the ids the caller sent: no more)
        assert not [s for s in secrets if s in walk._body(response) and not walk._named_by_caller(name, url, s)], \
            where


def test_every_route_and_verb_as_every_role(world, callers):
    # (A route the table does not know fails test_the_role_table_knows_every_route_and_verb.)
    requests = [(name, method, url) for name, method, url in walk._requests(world)
                if name not in walk.DOC_ROUTES and method in EXPECT.get(name, {})]
    owner = world["a"]
    owner_status = {}
    for name, method, url in requests:
        if method == "get" and name not in walk.NODE_ROUTES | walk.PARTICIPANT_ROUTES:
            owner_status[url] = owner.get(url).status_code
    secrets = walk._secrets(world)
    counts: dict = {}
    # Every role's reads first (nothing has changed yet), then the writes: the roles that must be refused first,
    # checking that their refusals changed nothing, then the team-admin's and the cluster admin's, which do.
    for role in ROLES:
        for name, method, url in requests:
            if method != "get":
                continue
            response = callers[role].get(url)
            _check(role, name, method, url, response, owner_status.get(url), secrets)
            counts[role] = counts.get(role, 0) + 1
    before = walk._snapshot(world)
    for role in ("anonymous", "foreign", "viewer", "member"):
        for name, method, url in walk._distinct(requests) if role != "member" else requests:
            if method == "get":
                continue
            response = walk._call(callers[role], method, url)
            _check(role, name, method, url, response, None, secrets)
            counts[role] += 1
        assert walk._snapshot(world) == before, role
    for role in ("team-admin", "cluster-admin"):
        for name, method, url in requests:
            if method == "get":
                continue
            response = walk._call(callers[role], method, url)
            _check(role, name, method, url, response, None, secrets)
            counts[role] += 1
    assert walk._snapshot(world) != before  # the team-admin's writes did their work
    assert min(counts.values()) > 100, counts


# --- the dashboard ----------------------------------------------------------------------------------------------

# What a POST to each dashboard page may change, by the least role that may: "none" (it changes nothing of the
# team's: a read, a form checked only, the caller's own session), "member" (makes something new in the team: a
# job), "owner" (alice's job: her, or a team-admin), "team-admin" (the team's secrets and members),
# "cluster-admin" (quotas, pools). A dashboard route without an entry fails the walk.
DASHBOARD_WRITES = {
    "home": "none", "login": "none", "logout": "none", "plotly-js": "none", "jobs": "none", "job-rows": "none",
    "job-new": "member", "job-validate": "none", "job-detail": "none", "job-live": "none", "job-cancel": "owner",
    "job-resubmit": "owner", "cluster": "none", "cluster-charts": "none", "cluster-tables": "none",
    "cluster-panels": "none", "usage": "none", "quota-editor": "cluster-admin", "pool-editor": "cluster-admin",
    "team-secrets": "team-admin", "team-members": "team-admin", "audit": "team-admin",
    "team-notifications": "team-admin", "quota-what-if": "cluster-admin",
    "compare": "none", "log-search": "none", "cli-login": "none", "team-tracking": "team-admin",
}
# Pages only a team-admin (and a cluster admin) may even read: alice, a member, gets their 403.
TEAM_ADMIN_READS = {"audit", "team-notifications", "team-tracking"}
# A 403 page for these; a viewer's submit form answers with its errors (the team field names the role needed).
REFUSED = {"viewer": {"owner", "team-admin", "cluster-admin"}, "member": {"owner", "team-admin", "cluster-admin"},
           "team-admin": {"cluster-admin"}}


def test_the_dashboard_table_knows_every_page():
    assert set(DASHBOARD_WRITES) == set(walk.DASHBOARD), "say which role may POST to the new dashboard page"


def test_every_dashboard_page_as_every_team_role(world, make_user):
    from django.test import Client

    from strata.jobs.models import Job

    alpha = world["alpha"]
    users = {"viewer": make_user("vera", alpha, "viewer"), "member": make_user("mia", alpha, "member"),
             "team-admin": make_user("ada", alpha, "team-admin")}
    owner = Client()
    owner.force_login(world["alice"])
    pages = [(name, method, url, data) for name, _, method, url, data in walk._dashboard_requests(world)
             if name in DASHBOARD_WRITES and name != "logout"]
    seen = {url: owner.get(url).status_code for name, method, url, _ in pages if method == "get"}
    for role in ("viewer", "member", "team-admin"):
        client = Client()
        client.force_login(users[role])
        before = walk._snapshot(world)
        jobs_before = Job.objects.count()
        for name, method, url, data in pages:
            if method == "get":
                response = client.get(url)
                expected = 200 if name in TEAM_ADMIN_READS and role == "team-admin" else seen[url]
                assert response.status_code == expected, (role, name, url, response.status_code)
                continue
            least = DASHBOARD_WRITES[name]
            response = client.post(url, data)
            if least == "member" and role == "viewer":
                assert "needs the member role" in walk._body(response), (role, name, url, response.status_code)
            if least in REFUSED[role]:
                assert response.status_code == 403, (role, name, url, response.status_code)
            else:
                assert response.status_code != 403 and response.status_code < 500, (role, name, url,
                                                                                      response.status_code)
        if role == "viewer":
            assert walk._snapshot(world) == before and Job.objects.count() == jobs_before  # nothing at all
        if role == "member":
            after = walk._snapshot(world)
            assert after["secrets"] == before["secrets"] and after["tokens"] == before["tokens"]
            # alice's jobs are as they were (the member's own new job aside)
            assert set(before["jobs"]) <= set(after["jobs"])
