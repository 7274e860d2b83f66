"""Roles within a team (``strata.accounts.roles``): viewer < member < team-admin < cluster admin, on jobs, tokens,
secrets, members and per-user limits; and the per-user limits at admission (``strata.quotas.services``)."""

from __future__ import annotations

import pytest

from strata.accounts.models import ApiToken, Membership, Secret, token_digest
from strata.jobs.models import Job, JobState

PREFIX = "/api/v1/"
JOB = {"kind": "train", "name": "j", "spec": {"workload": "mlp-digits", "epochs": 1}, "resources": {"gpus": 1}}


@pytest.fixture
def team(make_team, make_user, make_token, make_node, api):
    alpha, beta = make_team("alpha", max_gpus=8.0, max_concurrent_jobs=10), make_team("beta")
    make_node("n1", gpus=4)
    users = {
        "viewer": make_user("vera", alpha, "viewer"),
        "member": make_user("mia", alpha, "member"),
        "other": make_user("max", alpha, "member"),
        "team-admin": make_user("ada", alpha, "team-admin"),
        "cluster-admin": make_user("root", admin=True),
        "foreign": make_user("bob", beta, "team-admin"),
    }
    raw = {role: make_token(user, beta if role == "foreign" else alpha) for role, user in users.items()}
    clients = {role: api(value) for role, value in raw.items()}
    clients["anonymous"] = api()
    return {"alpha": alpha, "beta": beta, "users": users, "raw": raw, "c": clients}


def _job(team, role="member", **extra):
    response = team["c"][role].post(f"{PREFIX}jobs/", {**JOB, **extra}, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def _refused(response, role_needed: str):
    assert response.status_code == 403, (response.status_code, response.content)
    detail = response.json()["detail"]
    assert f"the {role_needed} role in team alpha is needed" in detail, detail
    return detail


# --- roles module -----------------------------------------------------------------------------------------------

def test_role_of_each_caller(team, rf):
    from strata.accounts import roles

    alpha = team["alpha"]
    expected = {"viewer": "viewer", "member": "member", "other": "member", "team-admin": "team-admin",
                "cluster-admin": "cluster-admin", "foreign": None}
    for role, user in team["users"].items():
        assert roles.user_role(user, alpha) == expected[role], role
    # A cluster admin's session sees every team; a foreign team-admin's token sees none of alpha.
    request = rf.get("/")
    request.user = team["users"]["cluster-admin"]
    assert roles.role_in(request, alpha) == "cluster-admin"
    assert roles.has_role(request, alpha, "team-admin")
    request.user = team["users"]["foreign"]
    assert roles.role_in(request, alpha) is None and not roles.has_role(request, alpha, "viewer")
    assert roles.team_ids_with(request, "team-admin") == [team["beta"].pk]
    request.user = team["users"]["viewer"]
    assert roles.has_role(request, alpha, "viewer") and not roles.has_role(request, alpha, "member")
    with pytest.raises(ValueError):
        roles.has_role(request, alpha, "owner")
    assert set(Membership.Role.values) == set(roles.TEAM_ROLES)


# --- jobs -------------------------------------------------------------------------------------------------------

def test_submit_needs_the_member_role_and_a_viewer_gets_a_json_403(team):
    c = team["c"]
    assert c["anonymous"].post(f"{PREFIX}jobs/", JOB, format="json").status_code == 401
    detail = _refused(c["viewer"].post(f"{PREFIX}jobs/", JOB, format="json"), "member")
    assert "you are a viewer" in detail
    # Even with a malformed body: the role is checked first (a viewer learns nothing from the validation).
    _refused(c["viewer"].post(f"{PREFIX}jobs/", {"kind": 3}, format="json"), "member")
    assert not Job.objects.exists()
    for role in ("member", "team-admin", "cluster-admin"):
        assert c[role].post(f"{PREFIX}jobs/", JOB, format="json").status_code == 201, role
    # Another team's member naming alpha: alpha is unknown to them (a 400 on team, as before).
    answer = c["foreign"].post(f"{PREFIX}jobs/", {**JOB, "team": "alpha"}, format="json")
    assert answer.status_code == 400 and "team" in answer.json()


@pytest.mark.parametrize("action", ["cancel", "resubmit"])
def test_own_and_others_jobs_by_role(team, action):
    c = team["c"]
    expected = {"viewer": 403, "other": 403, "member": None, "team-admin": None, "cluster-admin": None,
                "foreign": 404}
    ok = 200 if action == "cancel" else 201
    for role, status in expected.items():
        job = _job(team)  # mia's
        response = c[role].post(f"{PREFIX}jobs/{job}/{action}/")
        if status is None:
            assert response.status_code == ok, (role, response.content)
        else:
            assert response.status_code == status, (role, response.status_code, response.content)
            if status == 403:
                _refused(response, "team-admin")
            if status == 404:
                assert "alpha" not in response.content.decode()
        if action == "cancel":
            state = Job.objects.get(pk=job).state
            assert (state == JobState.CANCELLED) == (status is None), (role, state)
    # Every role reads the team's jobs; the foreign team sees none.
    for role in ("viewer", "member", "other", "team-admin", "cluster-admin"):
        assert c[role].get(f"{PREFIX}jobs/").json()["count"] > 0, role
        assert c[role].get(f"{PREFIX}jobs/{job}/").status_code == 200, role
    assert c["foreign"].get(f"{PREFIX}jobs/").json()["count"] == 0


def test_a_demoted_owner_is_told_the_member_role_is_needed(team):
    c = team["c"]
    job = _job(team)
    Membership.objects.filter(user=team["users"]["member"]).update(role="viewer")
    detail = _refused(c["member"].post(f"{PREFIX}jobs/{job}/cancel/"), "member")
    assert "you are a viewer" in detail
    assert Job.objects.get(pk=job).state != JobState.CANCELLED


def test_job_access_tokens_by_role(team):
    from strata.jobs.models import JobToken

    c = team["c"]
    job = _job(team)
    _refused(c["viewer"].post(f"{PREFIX}jobs/{job}/tokens/", {"name": "x"}, format="json"), "team-admin")
    _refused(c["other"].post(f"{PREFIX}jobs/{job}/tokens/", {"name": "x"}, format="json"), "team-admin")
    assert c["foreign"].post(f"{PREFIX}jobs/{job}/tokens/", {"name": "x"}, format="json").status_code == 404
    # Past the role check: what the kind says (a train job takes no access tokens).
    for role in ("member", "team-admin"):
        answer = c[role].post(f"{PREFIX}jobs/{job}/tokens/", {"name": "mine"}, format="json")
        assert answer.status_code == 400 and "kind" in answer.json(), (role, answer.content)
    token = JobToken.objects.create(job_id=job, name="t", prefix="abcd", digest="0" * 64)
    assert [t["name"] for t in c["viewer"].get(f"{PREFIX}jobs/{job}/tokens/").json()] == ["t"]  # reading: any role
    _refused(c["viewer"].delete(f"{PREFIX}jobs/{job}/tokens/{token.pk}/"), "team-admin")
    _refused(c["other"].delete(f"{PREFIX}jobs/{job}/tokens/{token.pk}/"), "team-admin")
    assert c["team-admin"].delete(f"{PREFIX}jobs/{job}/tokens/{token.pk}/").status_code == 200
    token.refresh_from_db()
    assert token.revoked_at is not None


# --- API tokens -------------------------------------------------------------------------------------------------

def test_api_tokens_own_for_every_role_and_the_teams_for_a_team_admin(team, api):
    c, raw = team["c"], team["raw"]
    # A viewer holds tokens (which only read, as the viewer does).
    made = c["viewer"].post(f"{PREFIX}tokens/", {"name": "ro"}, format="json")
    assert made.status_code == 201, made.content
    viewer_client = api(made.json()["token"])
    assert viewer_client.get(f"{PREFIX}jobs/").status_code == 200
    _refused(viewer_client.post(f"{PREFIX}jobs/", JOB, format="json"), "member")
    mia_token = ApiToken.objects.get(digest=token_digest(raw["member"]))
    # A member sees only their own; the team-admin sees the team's, with whose they are.
    assert {t["user"] for t in c["other"].get(f"{PREFIX}tokens/").json()["results"]} == {"max"}
    listed = {t["user"] for t in c["team-admin"].get(f"{PREFIX}tokens/").json()["results"]}
    assert {"vera", "mia", "max", "ada"} <= listed and "bob" not in listed
    assert c["other"].delete(f"{PREFIX}tokens/{mia_token.pk}/").status_code == 404
    assert c["foreign"].delete(f"{PREFIX}tokens/{mia_token.pk}/").status_code == 404
    assert c["team-admin"].delete(f"{PREFIX}tokens/{mia_token.pk}/").status_code == 204
    assert c["member"].get(f"{PREFIX}jobs/").status_code == 401  # revoked by the team-admin


# --- secrets ----------------------------------------------------------------------------------------------------

def test_secrets_are_read_by_every_role_and_set_by_team_admins(team):
    c = team["c"]
    body = {"name": "HF_TOKEN", "value": "s3cret-value"}
    _refused(c["viewer"].post(f"{PREFIX}secrets/", body, format="json"), "team-admin")
    _refused(c["member"].post(f"{PREFIX}secrets/", body, format="json"), "team-admin")
    _refused(c["member"].post(f"{PREFIX}secrets/", {}, format="json"), "team-admin")
    assert not Secret.objects.exists()
    assert c["team-admin"].post(f"{PREFIX}secrets/", body, format="json").status_code == 201
    assert c["cluster-admin"].post(f"{PREFIX}secrets/", {**body, "value": "v2"}, format="json").status_code == 200
    for role in ("viewer", "member"):
        assert [s["name"] for s in c[role].get(f"{PREFIX}secrets/").json()["results"]] == ["HF_TOKEN"]
    _refused(c["member"].delete(f"{PREFIX}secrets/HF_TOKEN/"), "team-admin")
    assert c["foreign"].delete(f"{PREFIX}secrets/HF_TOKEN/").status_code == 404
    assert c["team-admin"].delete(f"{PREFIX}secrets/HF_TOKEN/").status_code == 204


# --- members ----------------------------------------------------------------------------------------------------

def test_members_read_by_every_role_and_managed_by_team_admins(team, make_user):
    c = team["c"]
    url = f"{PREFIX}teams/alpha/members/"
    make_user("newbie")
    listed = c["viewer"].get(url)
    assert listed.status_code == 200
    assert {m["username"]: m["role"] for m in listed.json()} == {"vera": "viewer", "mia": "member", "max": "member",
                                                                "ada": "team-admin"}
    assert c["foreign"].get(url).status_code == 404
    assert c["anonymous"].get(url).status_code == 401
    for role in ("viewer", "member"):
        _refused(c[role].post(url, {"username": "newbie"}, format="json"), "team-admin")
        _refused(c[role].patch(f"{url}max/", {"role": "team-admin"}, format="json"), "team-admin")
        _refused(c[role].delete(f"{url}max/"), "team-admin")
    assert c["foreign"].post(url, {"username": "newbie"}, format="json").status_code == 404
    # Bad bodies: every bad field named.
    bad = c["team-admin"].post(url, {"username": "nobody", "role": "owner", "extra": 1}, format="json")
    assert bad.status_code == 400 and set(bad.json()) == {"role", "extra"}, bad.content
    missing = c["team-admin"].post(url, {"username": "nobody"}, format="json")
    assert missing.status_code == 400 and "username" in missing.json()
    added = c["team-admin"].post(url, {"username": "newbie", "role": "viewer"}, format="json")
    assert added.status_code == 201 and added.json()["role"] == "viewer"
    assert c["team-admin"].post(url, {"username": "newbie"}, format="json").status_code == 409
    changed = c["team-admin"].patch(f"{url}newbie/", {"role": "member"}, format="json")
    assert changed.status_code == 200 and changed.json()["role"] == "member"
    assert c["team-admin"].delete(f"{url}newbie/").status_code == 204
    assert c["team-admin"].get(f"{url}newbie/").status_code == 404
    # The last team-admin stays (409) unless a cluster admin acts.
    assert c["team-admin"].patch(f"{url}ada/", {"role": "member"}, format="json").status_code == 409
    assert c["team-admin"].delete(f"{url}ada/").status_code == 409
    assert c["cluster-admin"].patch(f"{url}max/", {"role": "team-admin"}, format="json").status_code == 200
    assert c["team-admin"].patch(f"{url}ada/", {"role": "member"}, format="json").status_code == 200
    # ada, now a member, may no longer manage members.
    _refused(c["team-admin"].delete(f"{url}vera/"), "team-admin")


def test_a_removed_members_tokens_stop_working(team):
    c = team["c"]
    assert c["member"].get(f"{PREFIX}jobs/").status_code == 200
    assert c["team-admin"].delete(f"{PREFIX}teams/alpha/members/mia/").status_code == 204
    assert c["member"].get(f"{PREFIX}jobs/").status_code == 401
    assert not Membership.objects.filter(user=team["users"]["member"]).exists()


def test_member_changes_are_audited(team):
    from strata.audit.models import AuditEntry

    c = team["c"]
    url = f"{PREFIX}teams/alpha/members/"
    assert c["team-admin"].patch(f"{url}mia/", {"role": "viewer"}, format="json").status_code == 200
    assert c["team-admin"].patch(f"{url}mia/", {"max_gpus": 2}, format="json").status_code == 200
    assert c["team-admin"].delete(f"{url}mia/").status_code == 204
    entries = list(AuditEntry.objects.filter(team_slug="alpha", action__startswith="member").order_by("id").values_list(
        "action", "actor_name", "target", "before", "after"))
    assert [e[0] for e in entries] == ["membership.role", "member_limits.change", "membership.remove"]
    assert entries[0][1:] == ("ada", "user mia", {"role": "member"}, {"role": "viewer"})
    assert entries[1][3:] == ({"max_concurrent_jobs": None, "max_gpus": None},
                              {"max_concurrent_jobs": None, "max_gpus": 2.0})


# --- per-user limits --------------------------------------------------------------------------------------------

def test_limits_must_be_numbers_within_the_teams_quota(team):
    c = team["c"]
    url = f"{PREFIX}teams/alpha/members/mia/"
    over = c["team-admin"].patch(url, {"max_gpus": 9, "max_concurrent_jobs": 11}, format="json")
    assert over.status_code == 400 and set(over.json()) == {"max_gpus", "max_concurrent_jobs"}, over.content
    assert "team's quota" in over.json()["max_gpus"][0]
    bad = c["team-admin"].patch(url, {"max_gpus": -1, "max_concurrent_jobs": 1.5}, format="json")
    assert bad.status_code == 400 and set(bad.json()) == {"max_gpus", "max_concurrent_jobs"}, bad.content
    ok = c["team-admin"].patch(url, {"max_gpus": 8, "max_concurrent_jobs": 1}, format="json")
    assert ok.status_code == 200 and ok.json()["max_gpus"] == 8 and ok.json()["max_concurrent_jobs"] == 1
    cleared = c["team-admin"].patch(url, {"max_gpus": None}, format="json")
    assert cleared.json()["max_gpus"] is None and cleared.json()["max_concurrent_jobs"] == 1


def test_a_user_at_max_concurrent_jobs_waits_while_a_teammate_runs(team, run_pass):
    c = team["c"]
    assert c["team-admin"].patch(f"{PREFIX}teams/alpha/members/mia/", {"max_concurrent_jobs": 1},
                                 format="json").status_code == 200
    first, second = _job(team), _job(team)
    mate = _job(team, "other")
    run_pass()
    states = {pk: Job.objects.get(pk=pk) for pk in (first, second, mate)}
    assert states[first].state != JobState.PENDING
    assert states[mate].state != JobState.PENDING  # behind mia's waiting job, admitted
    assert states[second].state == JobState.PENDING
    assert states[second].reason == "waiting: user mia at max_concurrent_jobs (1/1)"
    assert c["viewer"].get(f"{PREFIX}jobs/{second}/").json()["reason"] == states[second].reason
    # Raising the limit lets it in at once.
    assert c["team-admin"].patch(f"{PREFIX}teams/alpha/members/mia/", {"max_concurrent_jobs": 2},
                                 format="json").status_code == 200
    assert Job.objects.get(pk=second).state != JobState.PENDING


def test_a_user_at_max_gpus_waits_and_a_job_over_it_is_refused_at_submit(team, run_pass):
    c = team["c"]
    assert c["team-admin"].patch(f"{PREFIX}teams/alpha/members/mia/", {"max_gpus": 1.5},
                                 format="json").status_code == 200
    refused = c["member"].post(f"{PREFIX}jobs/", {**JOB, "resources": {"gpus": 2}}, format="json")
    assert refused.status_code == 400, refused.content
    assert "max_gpus" in refused.json()["resources"][0] and "mia" in refused.json()["resources"][0]
    first, second = _job(team), _job(team)
    run_pass()
    assert Job.objects.get(pk=first).state != JobState.PENDING
    waiting = Job.objects.get(pk=second)
    assert waiting.state == JobState.PENDING
    assert waiting.reason == "waiting: user mia at max_gpus (1 held + 1 requested > 1.5)"
    # A teammate is not limited by mia's limit.
    assert Job.objects.get(pk=_job(team, "other")).state != JobState.PENDING
    assert c["team-admin"].patch(f"{PREFIX}teams/alpha/members/mia/", {"max_concurrent_jobs": 0},
                                 format="json").status_code == 200
    zero = c["member"].post(f"{PREFIX}jobs/", JOB, format="json")
    assert zero.status_code == 400 and "max_concurrent_jobs=0" in zero.json()["resources"][0]


# --- code, data and records: own by member, others' by team-admin ------------------------------------------------

def test_code_bundles_by_role(team):
    import io
    import tarfile

    c = team["c"]
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        info = tarfile.TarInfo("main.py")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"1\n"))
    body = archive.getvalue()
    _refused(c["viewer"].generic("POST", f"{PREFIX}code/", data=body, content_type="application/gzip"), "member")
    uploaded = c["member"].generic("POST", f"{PREFIX}code/", data=body, content_type="application/gzip")
    assert uploaded.status_code == 201, uploaded.content
    digest = uploaded.json()["digest"]
    _refused(c["other"].delete(f"{PREFIX}code/{digest}/"), "team-admin")
    assert c["foreign"].delete(f"{PREFIX}code/{digest}/").status_code == 404
    assert c["team-admin"].delete(f"{PREFIX}code/{digest}/").status_code == 204


# --- the dashboard ----------------------------------------------------------------------------------------------

def test_members_page(team, client, make_user):
    import re

    make_user("newbie")
    _job(team)  # mia's, admitted: 1 job, 1 GPU held
    client.force_login(team["users"]["viewer"])
    page = client.get("/team/members/")
    assert page.status_code == 200
    text = page.content.decode()
    assert 'data-member="mia"' in text and 'id="member-add"' not in text and 'id="my-role">viewer' in text
    held = dict(re.findall(r'data-member="(\w+)">.*?<td class="held"[^>]*>([^<]*)</td>', text, re.S))
    assert held["mia"] == "1 jobs, 1 GPUs" and held["max"] == "0 jobs, 0 GPUs", held
    assert client.post("/team/members/", {"team": "alpha", "action": "add", "username": "newbie"}).status_code == 403
    assert client.get("/team/members/?team=beta").status_code == 404
    client.force_login(team["users"]["team-admin"])
    assert 'id="member-add"' in client.get("/team/members/").content.decode()
    added = client.post("/team/members/", {"team": "alpha", "action": "add", "username": "newbie", "role": "viewer"})
    assert added.status_code == 302
    assert Membership.objects.get(user__username="newbie").role == "viewer"
    over = client.post("/team/members/", {"team": "alpha", "action": "change", "username": "newbie",
                                           "role": "member", "max_gpus": "99", "max_concurrent_jobs": ""})
    assert over.status_code == 400 and "team&#x27;s quota" in over.content.decode()
    changed = client.post("/team/members/", {"team": "alpha", "action": "change", "username": "newbie",
                                              "role": "member", "max_gpus": "2", "max_concurrent_jobs": "3"})
    assert changed.status_code == 302
    membership = Membership.objects.get(user__username="newbie")
    assert (membership.role, membership.max_gpus, membership.max_concurrent_jobs) == ("member", 2.0, 3)
    assert client.post("/team/members/", {"team": "alpha", "action": "remove", "username": "newbie"}).status_code == 302
    assert not Membership.objects.filter(user__username="newbie").exists()


def test_dashboard_cancel_and_secrets_by_role(team, client):
    job = _job(team)
    client.force_login(team["users"]["other"])
    assert client.post(f"/jobs/{job}/cancel/").status_code == 403
    assert client.post("/team/secrets/", {"team": "alpha", "action": "set", "name": "K", "value": "v" * 8}) \
        .status_code == 403
    client.force_login(team["users"]["viewer"])
    assert client.post(f"/jobs/{job}/cancel/").status_code == 403
    assert Job.objects.get(pk=job).state != JobState.CANCELLED
    client.force_login(team["users"]["team-admin"])
    assert client.post(f"/jobs/{job}/cancel/").status_code == 302
    assert Job.objects.get(pk=job).state == JobState.CANCELLED
