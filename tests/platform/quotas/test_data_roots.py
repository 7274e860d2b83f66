"""Data roots per team (strata.quotas.roots): cluster admins grant them through the quota API, and a record that
names a path on the nodes (a dataset) must lie under one, never under the platform's own state nor under another
team's root; a root granted to both teams is shared."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings

from strata.jobs.models import PluginRecord
from strata.quotas.models import Quota

DATASETS = "/api/v1/datasets/"


def dataset(name: str, path: str) -> dict:
    return {"name": name, "source": {"path": path}, "format": "image-folder", "size": 16}


@pytest.fixture
def teams(make_team, make_user, make_token, api):
    alpha, beta = make_team("alpha"), make_team("beta")
    alice, bob = make_user("alice", alpha), make_user("bob", beta)
    boss = make_user("boss", alpha, role="team-admin")
    root = make_user("root", alpha, admin=True)
    return {"alpha": alpha, "beta": beta, "alice": api(make_token(alice, alpha)), "bob": api(make_token(bob, beta)),
            "boss": api(make_token(boss, alpha)), "admin": api(make_token(root, alpha)),
            "admin-beta": api(make_token(root, beta))}  # an admin's token sees its one team, as any token


def grant(teams, slug: str, *roots: str):
    admin = teams["admin" if slug == "alpha" else f"admin-{slug}"]
    response = admin.patch(f"/api/v1/quotas/{slug}/", {"data_roots": list(roots)}, format="json")
    assert response.status_code == 200, response.content
    return response.json()["data_roots"]


def refused(response) -> str:
    assert response.status_code == 400, response.content
    errors = response.json()
    assert list(errors) == ["source.path"], errors
    (message,) = errors["source.path"]
    assert message and "\n" not in message
    return message


# --- granting ------------------------------------------------------------------------------------------------

def test_admins_grant_roots_normalized_and_members_read_their_own(teams):
    assert grant(teams, "alpha", "/srv/data/", "/srv//shared/./x", "/srv/data") == ["/srv/data", "/srv/shared/x"]
    assert Quota.objects.get(team=teams["alpha"]).data_roots == ["/srv/data", "/srv/shared/x"]
    assert teams["alice"].get("/api/v1/quotas/alpha/").json()["data_roots"] == ["/srv/data", "/srv/shared/x"]
    assert teams["alice"].get("/api/v1/quotas/alpha/usage/").json()["quota"]["data_roots"] == ["/srv/data",
                                                                                                "/srv/shared/x"]
    assert teams["bob"].get("/api/v1/quotas/beta/").json()["data_roots"] == []
    # Another team's quota stays a 404; changing roots is for cluster admins only (a team admin too is a 403).
    assert teams["bob"].get("/api/v1/quotas/alpha/").status_code == 404
    for caller in ("alice", "boss"):
        response = teams[caller].patch("/api/v1/quotas/alpha/", {"data_roots": ["/"]}, format="json")
        assert response.status_code == 403, response.content
    assert teams["bob"].patch("/api/v1/quotas/alpha/", {"data_roots": ["/"]}, format="json").status_code in (403, 404)
    assert Quota.objects.get(team=teams["alpha"]).data_roots == ["/srv/data", "/srv/shared/x"]
    assert grant(teams, "alpha") == []


@pytest.mark.parametrize("value", [
    "/srv/data", ["relative/path"], ["/srv/../etc"], [5], [None], ["/a" * 3000], [f"/r{n}" for n in range(65)],
    [""], {"path": "/srv"}, None,
])
def test_bad_roots_are_a_400_naming_data_roots(teams, value):
    response = teams["admin"].patch("/api/v1/quotas/alpha/", {"data_roots": value}, format="json")
    assert response.status_code == 400 and "data_roots" in response.json(), response.content
    assert Quota.objects.get(team=teams["alpha"]).data_roots == []


def test_a_root_under_the_platforms_state_cannot_be_granted(teams):
    for inside in (Path(settings.HOME) / "data", Path(settings.STRATA_ARTIFACT_ROOT) / "x"):
        response = teams["admin"].patch("/api/v1/quotas/alpha/", {"data_roots": [str(inside)]}, format="json")
        assert response.status_code == 400, response.content
        assert "no team may register data there" in response.json()["data_roots"][0]


# --- registering ---------------------------------------------------------------------------------------------

def test_a_team_without_roots_or_outside_them_is_refused(teams):
    assert "has no data roots" in refused(teams["alice"].post(DATASETS, dataset("pets", "/srv/data/pets"),
                                                             format="json"))
    grant(teams, "alpha", "/srv/data")
    for path in ("/srv/other/pets", "/srv/database", "/srv", "/etc/passwd"):
        assert "outside the data roots granted to team alpha" in refused(
            teams["alice"].post(DATASETS, dataset("pets", path), format="json"))
    created = teams["alice"].post(DATASETS, dataset("pets", "/srv/data/pets"), format="json")
    assert created.status_code == 201, created.content
    assert teams["alice"].post(DATASETS, dataset("root", "/srv/data"), format="json").status_code == 201
    assert teams["alice"].post(DATASETS, dataset("dots", "/srv/./data//x"), format="json").status_code == 201


def test_the_platforms_own_directories_are_refused_even_inside_a_granted_root(teams, settings, tmp_path):
    settings.STRATA_ARTIFACT_ROOT = str(tmp_path / "store")  # an artifact store outside the state directory
    home, artifacts = Path(settings.HOME), Path(settings.STRATA_ARTIFACT_ROOT)
    grant(teams, "alpha", "/")  # everything, as far as roots go
    for path, what in ((home, "state directory"), (home / "node" / "attempts", "state directory"),
                       (artifacts / "jobs", "artifact store"), (artifacts, "artifact store"),
                       (tmp_path, "artifact store"), (home.parent, "state directory")):
        message = refused(teams["alice"].post(DATASETS, dataset("sneaky", str(path)), format="json"))
        assert what in message and "no team may register data there" in message, message
    assert str(home) not in message  # the reason names what, not where
    assert not PluginRecord.objects.filter(name="sneaky").exists()


def test_a_symbolic_link_into_the_state_directory_is_refused(teams, tmp_path):
    link = tmp_path / "innocent"
    link.symlink_to(Path(settings.HOME))
    grant(teams, "alpha", str(tmp_path))
    assert "state directory" in refused(teams["alice"].post(DATASETS, dataset("link", str(link / "x")),
                                                           format="json"))


def test_another_teams_root_is_refused_unless_granted_to_both(teams):
    grant(teams, "alpha", "/srv/alpha", "/srv/shared")
    grant(teams, "beta", "/srv/beta", "/srv/shared", "/srv/alpha/loaned")
    # alpha's root holds beta's /srv/alpha/loaned: alpha may not register it, nor anything that contains it.
    assert "another team" in refused(teams["alice"].post(DATASETS, dataset("x", "/srv/alpha/loaned/x"),
                                                        format="json"))
    assert "contains a data root granted to another team" in refused(
        teams["alice"].post(DATASETS, dataset("x", "/srv/alpha"), format="json"))
    # beta registering under alpha's root: outside its own roots.
    assert "outside the data roots" in refused(teams["bob"].post(DATASETS, dataset("x", "/srv/alpha/x"),
                                                                format="json"))
    # The shared root: both may register there, even the very same path.
    for caller in ("alice", "bob"):
        response = teams[caller].post(DATASETS, dataset("common", "/srv/shared/common"), format="json")
        assert response.status_code == 201, response.content
    assert teams["alice"].post(DATASETS, dataset("own", "/srv/alpha/own"), format="json").status_code == 201
    assert teams["bob"].post(DATASETS, dataset("own", "/srv/beta/own"), format="json").status_code == 201
    # The reason does not name the other team or its root.
    message = refused(teams["alice"].post(DATASETS, dataset("x", "/srv/alpha/loaned/x"), format="json"))
    assert "beta" not in message and "loaned" not in message


def test_other_bad_fields_are_named_beside_the_path(teams):
    grant(teams, "alpha", "/srv/data")
    response = teams["alice"].post(DATASETS, {**dataset("pets", "/elsewhere/pets"), "size": 1000}, format="json")
    assert response.status_code == 400 and {"size"} <= set(response.json()), response.content


def test_records_registered_before_keep_working(teams, job_body):
    """A dataset stored before data roots existed (or under a root revoked since) is read and named as before."""
    record = {"description": "", "source": {"path": "/old/place/pets"}, "format": "image-folder",
              "task": "classification", "size": 16, "channels": 3, "test_fraction": 0.2, "augment": None}
    PluginRecord.objects.create(collection="datasets", team=teams["alpha"], name="old-pets", body=record)
    assert teams["alice"].get(f"{DATASETS}old-pets/").json()["source"] == {"path": "/old/place/pets"}
    assert "old-pets" in {item["name"] for item in teams["alice"].get(DATASETS).json()["results"]}
    submitted = teams["alice"].post("/api/v1/jobs/", job_body(spec={"workload": "cnn-dataset",
                                                                    "data": {"dataset": "old-pets"}}),
                                    format="json")
    assert submitted.status_code == 201, submitted.content
    # A record with no creator is no member's own: a team-admin deletes it (strata.accounts.roles).
    assert teams["alice"].delete(f"{DATASETS}old-pets/").status_code == 403
    assert teams["boss"].delete(f"{DATASETS}old-pets/").status_code == 204


def test_a_collection_view_without_rules_refuses_every_path(teams):
    from strata.jobs.api.records import CollectionView

    context = CollectionView()._context(teams["alpha"])
    assert context.path_problem("/srv/data") and context.path_problem("/")
