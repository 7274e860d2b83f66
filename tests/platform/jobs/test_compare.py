"""Compare runs (``GET /api/v1/compare/``, ``strata compare``; ``strata.jobs.compare``): metric series and final
values, the spec diff's exact paths, the billed GPU- and CPU-seconds (the quota's own count), state, attempts and
duration; a viewer of the team may compare; another team's job is a 404 naming it; bad input a 400."""

from __future__ import annotations

import argparse
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from components.runtime.client.client import ApiError
from strata.cli import client_commands
from strata.cli.compare import compare as compare_command
from strata.cluster.models import Device
from strata.jobs import compare
from strata.jobs.models import Allocation, Attempt, Job, JobState, MetricPoint
from strata.quotas.selectors import cpu_seconds, gpu_seconds, job_usage

T0 = timezone.now().replace(microsecond=0) - timedelta(hours=2)


def make_job(team, owner, name, *, spec, resources, state=JobState.SUCCEEDED, ran_s: float | None = 100.0,
             **fields) -> Job:
    started = T0 if ran_s is not None else None
    return Job.objects.create(team=team, owner=owner, kind="train", name=name, spec=spec, resources=resources,
                              state=state, started_at=started,
                              finished_at=started + timedelta(seconds=ran_s) if started else None, **fields)


def attempt(job, number, *, share, seconds, outcome=Attempt.Outcome.SUCCEEDED, start_after=0.0) -> Attempt:
    dispatched = T0 + timedelta(seconds=start_after)
    return Attempt.objects.create(job=job, number=number, fencing_token=uuid.uuid4().hex, gpu_share=share,
                                  dispatched_at=dispatched, ended_at=dispatched + timedelta(seconds=seconds),
                                  outcome=outcome)


def points(job, name, pairs):
    MetricPoint.objects.bulk_create(MetricPoint(job=job, name=name, step=step, value=value) for step, value in pairs)


@pytest.fixture
def world(make_team, make_user, make_token, api, make_node):
    alpha, beta = make_team("alpha"), make_team("beta")
    alice, vera, bob = make_user("alice", alpha), make_user("vera", alpha, role="viewer"), make_user("bob", beta)
    node = make_node("node-1", gpus=2, cpus=8, host_memory=16 * 2**30)
    cpu = Device.objects.get(node=node, kind=Device.Kind.CPU)
    base = {"workload": "mlp-digits", "epochs": 1, "optimizer": "adam", "batch_size": 32}
    first = make_job(alpha, alice, "lr-a", spec={**base, "lr": 0.1},
                     resources={"gpus": 1.0, "gpu_memory": None, "workers": 1, "cpus": 2.0})
    second = make_job(alpha, alice, "lr-b", spec={**base, "lr": 0.01, "epochs": 3},
                      resources={"gpus": 0.5, "gpu_memory": None, "workers": 2}, state=JobState.FAILED,
                      ran_s=250.0, failures=1)
    third = make_job(alpha, alice, "queued", spec={**base, "lr": 0.1, "schedule": {"warmup": 5}},
                     resources={"gpus": 1.0, "gpu_memory": None, "workers": 1, "cpus": 2.0},
                     state=JobState.QUEUED, ran_s=None, priority=3)
    one = attempt(first, 1, share=1.0, seconds=100)
    Allocation.objects.create(attempt=one, device=cpu, share=2.0, memory=0)
    attempt(second, 1, share=1.0, seconds=40, outcome=Attempt.Outcome.FAILED)
    attempt(second, 2, share=1.0, seconds=30, start_after=60)
    points(first, "loss", [(2, 0.25), (0, 1.0), (1, 0.5)])  # reported out of step order
    points(first, "accuracy", [(0, 0.5), (2, 0.9)])
    points(second, "loss", [(0, 2.0), (1, float("inf")), (2, 1.5)])
    foreign = make_job(beta, bob, "beta-secret", spec=base, resources={"gpus": 1.0, "workers": 1})
    return {"alpha": alpha, "first": first, "second": second, "third": third, "foreign": foreign,
            "alice": api(make_token(alice, alpha)), "vera": api(make_token(vera, alpha)),
            "bob": api(make_token(bob, beta))}


def ids(*jobs) -> str:
    return ",".join(str(job.pk) for job in jobs)


def test_two_jobs_side_by_side(world):
    response = world["alice"].get("/api/v1/compare/", {"jobs": ids(world["first"], world["second"])})
    assert response.status_code == 200, response.content
    answer = response.json()
    first, second = answer["jobs"]
    assert [first["id"], second["id"]] == [str(world["first"].pk), str(world["second"].pk)]
    assert answer["metrics"] == ["accuracy", "loss"]
    assert first["series"]["loss"] == {"steps": [0, 1, 2], "values": [1.0, 0.5, 0.25]}
    assert second["series"]["loss"] == {"steps": [0, 1, 2], "values": [2.0, None, 1.5]}  # infinite: a gap
    assert first["final_metrics"] == {"accuracy": {"step": 2, "value": 0.9}, "loss": {"step": 2, "value": 0.25}}
    assert second["final_metrics"] == {"loss": {"step": 2, "value": 1.5}}
    # Billed as the quota bills: attempt time x GPU share; CPUs reserved x time.
    assert (first["gpu_seconds"], first["cpu_seconds"]) == (100.0, 200.0)
    assert (second["gpu_seconds"], second["cpu_seconds"]) == (70.0, 0.0)
    assert (first["attempts"], second["attempts"]) == (1, 2)
    assert (first["failures"], second["failures"]) == (0, 1)
    assert (first["state"], second["state"]) == ("SUCCEEDED", "FAILED")
    assert (first["duration_s"], second["duration_s"]) == (100.0, 250.0)
    assert (first["gpus"], second["gpus"]) == (1.0, 1.0)  # 0.5 per worker x 2 workers
    assert answer["spec_diff"] == [
        {"path": "spec.epochs", "values": [1, 3], "present": [True, True]},
        {"path": "spec.lr", "values": [0.1, 0.01], "present": [True, True]},
        {"path": "resources.cpus", "values": [2.0, None], "present": [True, False]},
        {"path": "resources.gpus", "values": [1.0, 0.5], "present": [True, True]},
        {"path": "resources.workers", "values": [1, 2], "present": [True, True]},
    ]


def test_three_jobs_and_a_job_that_never_ran(world):
    answer = world["alice"].get("/api/v1/compare/", {"jobs": ids(world["first"], world["second"], world["third"])}).json()
    assert [row["path"] for row in answer["spec_diff"]] == [
        "spec.epochs", "spec.lr", "spec.schedule.warmup", "resources.cpus", "resources.gpus", "resources.workers",
        "priority"]
    warmup = next(row for row in answer["spec_diff"] if row["path"] == "spec.schedule.warmup")
    assert warmup == {"path": "spec.schedule.warmup", "values": [None, None, 5], "present": [False, False, True]}
    third = answer["jobs"][2]
    assert third["state"] == "QUEUED" and third["duration_s"] is None and third["attempts"] == 0
    assert (third["gpu_seconds"], third["cpu_seconds"]) == (0.0, 0.0)
    assert third["series"] == {} and third["final_metrics"] == {}


def test_a_viewer_compares_the_teams_jobs_and_the_order_is_the_callers(world):
    response = world["vera"].get("/api/v1/compare/", {"jobs": ids(world["second"], world["first"])})
    assert response.status_code == 200
    assert [job["name"] for job in response.json()["jobs"]] == ["lr-b", "lr-a"]
    repeated = world["vera"].get(f"/api/v1/compare/?jobs={world['second'].pk}&jobs={world['first'].pk}")
    assert [job["name"] for job in repeated.json()["jobs"]] == ["lr-b", "lr-a"]


def test_another_teams_job_or_a_missing_one_is_a_404_naming_it(world):
    missing = uuid.uuid4()
    for other in (world["foreign"].pk, missing):
        response = world["alice"].get("/api/v1/compare/", {"jobs": f"{world['first'].pk},{other}"})
        assert response.status_code == 404
        assert str(other) in response.json()["detail"] and str(world["first"].pk) not in response.json()["detail"]
    # Bob sees his own job, never alpha's.
    response = world["bob"].get("/api/v1/compare/", {"jobs": ids(world["foreign"], world["first"])})
    assert response.status_code == 404 and str(world["first"].pk) in response.json()["detail"]


@pytest.mark.parametrize("query,problem", [
    ("", "at least 2"),
    ("jobs=", "at least 2"),
    ("jobs={first}", "at least 2"),
    ("jobs={first},{first}", "at least 2"),  # the same job twice is one job
    ("jobs={first},nope", "not job ids: 'nope'"),
    ("jobs=" + ",".join(str(uuid.UUID(int=n)) for n in range(1, 22)), "at most 20"),
])
def test_bad_input_is_a_400_on_jobs(world, query, problem):
    response = world["alice"].get("/api/v1/compare/?" + query.format(first=world["first"].pk))
    assert response.status_code == 400
    assert problem in response.json()["jobs"][0]


def test_a_parents_children_are_compared_with_parent(world):
    parent = world["third"]
    Job.objects.filter(pk__in=[world["first"].pk, world["second"].pk]).update(parent=parent)
    response = world["vera"].get("/api/v1/compare/", {"parent": str(parent.pk)})
    assert response.status_code == 200
    assert [job["name"] for job in response.json()["jobs"]] == ["lr-a", "lr-b"]  # oldest first
    assert all(job["parent"] == str(parent.pk) for job in response.json()["jobs"])
    lonely = world["alice"].get("/api/v1/compare/", {"parent": str(world["first"].pk)})
    assert lonely.status_code == 400 and "has 0 child jobs" in lonely.json()["parent"][0]
    assert world["alice"].get("/api/v1/compare/", {"parent": "nope"}).json() == {"parent": ["not a job id: 'nope'"]}
    foreign = world["alice"].get("/api/v1/compare/", {"parent": str(world["foreign"].pk)})
    assert foreign.status_code == 404 and str(world["foreign"].pk) in foreign.json()["detail"]
    # Named jobs win over a parent.
    both = world["alice"].get("/api/v1/compare/", {"parent": str(parent.pk), "jobs": ids(world["second"], world["third"])})
    assert [job["name"] for job in both.json()["jobs"]] == ["lr-b", "queued"]


def test_anonymous_and_node_callers_are_refused(world, api, node_token):
    query = {"jobs": ids(world["first"], world["second"])}
    assert api().get("/api/v1/compare/", query).status_code in (401, 403)
    assert api(node_token).get("/api/v1/compare/", query).status_code == 403


def test_long_series_are_thinned_to_the_budget_keeping_the_first_and_last(world, monkeypatch):
    monkeypatch.setattr(compare, "POINT_BUDGET", 30)
    monkeypatch.setattr(compare, "MIN_POINTS", 5)
    points(world["third"], "loss", [(step, 1000.0 - step) for step in range(500)])
    answer = world["alice"].get("/api/v1/compare/", {"jobs": ids(world["first"], world["second"], world["third"])}).json()
    assert answer["points_per_series"] == 10
    thinned = answer["jobs"][2]["series"]["loss"]
    assert 10 <= len(thinned["steps"]) <= 11
    assert thinned["steps"][0] == 0 and thinned["steps"][-1] == 499 and thinned["steps"] == sorted(thinned["steps"])
    assert answer["jobs"][2]["final_metrics"]["loss"] == {"step": 499, "value": 501.0}
    assert answer["jobs"][0]["series"]["loss"]["steps"] == [0, 1, 2]  # short ones are whole


def test_job_usage_is_the_quotas_count_split_by_job(world):
    until = timezone.now()
    jobs = [world[name].pk for name in ("first", "second", "third")]
    usage = job_usage(jobs, until=until)
    team = world["alpha"].pk
    assert sum(row["gpu_seconds"] for row in usage.values()) == pytest.approx(gpu_seconds(team, until=until))
    assert sum(row["cpu_seconds"] for row in usage.values()) == pytest.approx(cpu_seconds(team, until=until))
    assert usage[world["first"].pk] == {"gpu_seconds": 100.0, "cpu_seconds": 200.0}
    # A running attempt counts up to now.
    running = attempt(world["third"], 1, share=0.5, seconds=0)
    Attempt.objects.filter(pk=running.pk).update(ended_at=None)
    later = T0 + timedelta(seconds=40)
    assert job_usage([world["third"].pk], until=later)[world["third"].pk]["gpu_seconds"] == 20.0


# --- strata compare ----------------------------------------------------------------------------------------

class ApiClientAdapter:
    """The CLI's REST client's GETs, answered by the Django test client."""

    def __init__(self, api):
        self.api = api

    def get(self, path, params=None, **_kwargs):
        response = self.api.get(f"/api/v1/{path}", params or {})
        if response.status_code >= 400:
            raise ApiError(response.status_code, response.content.decode()[:300])
        return response.json()


def run_cli(world, monkeypatch, *jobs, as_json=False, parent=None):
    monkeypatch.setattr(client_commands, "connect", lambda args: ApiClientAdapter(world["alice"]))
    return compare_command(argparse.Namespace(jobs=[str(job.pk) for job in jobs], parent=parent, json=as_json))


def test_cli_prints_the_table_and_one_line_per_differing_path(world, monkeypatch, capsys):
    assert run_cli(world, monkeypatch, world["first"], world["second"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["JOB", "NAME", "STATE", "ATTEMPTS", "DURATION", "GPUS", "GPU-S", "CPU-S",
                                "accuracy", "loss"]
    assert lines[1].split() == [str(world["first"].pk)[:8], "lr-a", "SUCCEEDED", "1", "1m40s", "1", "100", "200",
                                "0.9", "0.25"]
    assert lines[2].split() == [str(world["second"].pk)[:8], "lr-b", "FAILED", "2", "4m10s", "1", "70", "0",
                                "-", "1.5"]
    assert lines[3] == ""
    assert lines[4].startswith("spec diff (5 paths")
    assert lines[5:] == ["spec.epochs: 1 | 3", "spec.lr: 0.1 | 0.01", "resources.cpus: 2.0 | -",
                         "resources.gpus: 1.0 | 0.5", "resources.workers: 1 | 2"]


def test_cli_json_and_errors(world, monkeypatch, capsys):
    import json

    assert run_cli(world, monkeypatch, world["first"], world["second"], as_json=True) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["jobs"][0]["series"]["loss"]["values"] == [1.0, 0.5, 0.25]
    with pytest.raises(ApiError) as refused:
        run_cli(world, monkeypatch, world["first"], world["foreign"])
    assert refused.value.status == 404 and str(world["foreign"].pk) in str(refused.value)
    Job.objects.filter(pk__in=[world["first"].pk, world["second"].pk]).update(parent=world["third"])
    assert run_cli(world, monkeypatch, parent=str(world["third"].pk)) == 0
    assert "spec.lr: 0.1 | 0.01" in capsys.readouterr().out.splitlines()
    with pytest.raises(ValueError, match="not both"):
        run_cli(world, monkeypatch, world["first"], parent=str(world["third"].pk))
