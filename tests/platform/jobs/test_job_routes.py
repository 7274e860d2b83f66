"""Plugins' job routes: `GET /api/v1/jobs/{id}/{route}/` answers a plugin's function of the viewer's PanelData,
with no edit to the core; another team's job and an unknown route are JSON 404s, a failing route a JSON 500, and
a route may not shadow the core's own job actions."""

from __future__ import annotations

from components.runtime.contract.plugins import Plugin


def summary(data):
    """What the route answers: the job's id and state, its children and its metric names."""
    return {"job": data.job["id"], "state": data.job["state"], "children": [c["name"] for c in data.children()],
            "metrics": sorted(data.metrics())}


def broken(data):
    raise RuntimeError("boom")


ROUTES = Plugin(name="routes", job_routes={"summary": f"{__name__}:summary", "broken": f"{__name__}:broken"})
SHADOW = Plugin(name="shadow", job_routes={"cancel": f"{__name__}:summary"})


def test_a_plugin_route_answers_for_the_viewers_jobs_only(install_plugins, make_team, make_user, make_token, api,
                                                          submit):
    from strata.jobs.models import Job, MetricPoint

    install_plugins(f"{__name__}:ROUTES", f"{__name__}:SHADOW")
    from components.runtime.contract import registry

    assert "job route 'cancel' (already core's)" in registry.problems()["shadow"]
    alpha, beta = make_team("alpha"), make_team("beta")
    alice, bob = make_user("alice", alpha), make_user("bob", beta)
    job = submit(alice, alpha, name="parent")
    Job.objects.create(team=alpha, owner=alice, kind="train", name="kid", spec={}, resources={}, parent=job)
    MetricPoint.objects.create(job=job, name="loss", step=1, value=1.0)
    mine = api(make_token(alice, alpha))
    answer = mine.get(f"/api/v1/jobs/{job.pk}/summary/")
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"job": str(job.pk), "state": job.state, "children": ["kid"], "metrics": ["loss"]}
    # The core's own actions are not shadowed, and unknown routes are JSON 404s naming the way out.
    assert mine.post(f"/api/v1/jobs/{job.pk}/cancel/").json()["state"] == "CANCELLED"
    unknown = mine.get(f"/api/v1/jobs/{job.pk}/nothing/")
    assert unknown.status_code == 404 and "strata plugins" in unknown.json()["detail"]
    failing = mine.get(f"/api/v1/jobs/{job.pk}/broken/")
    assert failing.status_code == 500 and "broken route" in failing.json()["detail"]
    # Another team's job is a 404, exactly like a missing one.
    theirs = api(make_token(bob, beta)).get(f"/api/v1/jobs/{job.pk}/summary/")
    assert theirs.status_code == 404
    assert "alpha" not in theirs.content.decode() and "kid" not in theirs.content.decode()
