"""Foresight: the queue simulator runs the scheduler's own decision core, and its start-time estimates."""

from __future__ import annotations

import math
import random
import statistics
from typing import ClassVar

import pytest

from components.runtime.contract.plugins import Plugin
from components.runtime.contract.policies import Candidate, PlacementScore, QueuedJob
from strata.jobs.models import Attempt, Job, JobState
from strata.jobs.services import attempt_claim, attempt_finish
from strata.scheduling import foresight
from strata.scheduling.foresight import RunTime, SimJob, SimNode, Simulator

GiB = 2**30


def _agree(make_team, make_user, submit, make_node, run_pass, monkeypatch, labels=None, simulated_hook=None):
    """Jobs of two teams (whole GPUs, fractions, two-GPU gangs, priorities, node labels) on a constructed cluster,
    each ending after a known run time: the real passes (database, attempts claimed and finished at those times),
    each pass's decisions recorded as the core made them, and the simulator from the same state. Returns both
    placement lists, ``(time, job id, devices)``."""
    from strata.scheduling import services

    alpha, beta = make_team("alpha"), make_team("beta", weight=2.0)
    alice, bob = make_user("alice", alpha), make_user("bob", beta)
    make_node("n1", gpus=2, labels={"pool": "a"})
    make_node("n2", gpus=4, labels={"pool": "b", **(labels or {})})
    rng = random.Random(7)
    shapes = [dict(gpus=1.0), dict(gpus=0.5), dict(gpus=2.0), dict(gpus=0.25), dict(gpus=1.0, node_labels={"pool": "b"})]
    runtime, jobs = {}, []
    for i in range(24):
        user, team = (alice, alpha) if i % 3 else (bob, beta)
        job = submit(user, team, name=f"j{i}", priority=rng.choice([0, 0, 1]), **shapes[i % len(shapes)])
        jobs.append(job)
        runtime[job.pk] = float(rng.choice([60, 120, 180, 300]))

    # The simulator, from the state before the first pass.
    from strata.scheduling.eta import load_state

    state = load_state(now=0.0)
    for job in state.jobs:
        job.runtime = RunTime.exact(runtime[job.id])
    sim = Simulator(state.nodes, state.jobs, state.quotas, now=0.0, **state.options)
    sim.run()
    simulated = [(p.time, p.job_id, p.devices) for p in sim.placements]
    if simulated_hook is not None:
        simulated_hook()

    recorded = []
    real_decide = services.decide

    def spy(state, preempt=None, max_preemptions=32):
        decisions = real_decide(state, preempt, max_preemptions)
        recorded.append([(job_id, tuple(slot.id for _, slot, _, _ in taken))
                         for job_id, taken, _ in decisions.placements])
        return decisions

    monkeypatch.setattr(services, "decide", spy)
    clock, ends, real = 0.0, {}, []
    while True:
        run_pass()
        for job_id, devices in recorded[-1] if recorded else []:
            real.append((clock, job_id, devices))
            attempt = Attempt.objects.get(job_id=job_id, ended_at__isnull=True)
            attempt_claim(attempt.pk, attempt.fencing_token, attempt.node)
            ends[job_id] = (clock + runtime[job_id], attempt)
        recorded.clear()
        if not ends:
            break
        clock = min(end for end, _ in ends.values())
        for job_id in [job_id for job_id, (end, _) in ends.items() if end <= clock]:
            attempt = ends.pop(job_id)[1]
            attempt_finish(attempt.pk, attempt.fencing_token, attempt.node, "succeeded")
    assert Job.objects.filter(state=JobState.SUCCEEDED).count() == len(jobs)
    assert len(real) == len(jobs)
    return simulated, real


def test_simulator_and_scheduler_agree_placement_by_placement(make_team, make_user, submit, make_node, run_pass,
                                                              monkeypatch):
    simulated, real = _agree(make_team, make_user, submit, make_node, run_pass, monkeypatch)
    assert len({time for time, _, _ in real}) > 3  # a history of several passes, not one
    assert simulated == real


class PreferFast(PlacementScore):
    """Places train jobs on nodes labelled fast=yes first, whatever best fit says."""

    kinds: ClassVar[tuple[str, ...]] = ("train",)

    def score(self, job: QueuedJob, candidate: Candidate) -> float:
        SCORED.append(job.id)
        return 0.0 if candidate.labels.get("fast") == "yes" else 1.0


SCORED: list[str] = []
PREFER_FAST = Plugin(name="prefer-fast", hooks=(f"{__name__}:PreferFast",))


def test_they_agree_with_a_plugins_placement_hook(install_plugins, make_team, make_user, submit, make_node, run_pass,
                                                  monkeypatch):
    """The simulator asks the same placement-score hooks (with the nodes' reports the pass reads), the same
    questions as the real passes, and the placements still agree."""
    install_plugins(f"{__name__}:PREFER_FAST")
    SCORED.clear()
    asked_by_the_simulator = []
    simulated, real = _agree(make_team, make_user, submit, make_node, run_pass, monkeypatch, labels={"fast": "yes"},
                             simulated_hook=lambda: asked_by_the_simulator.extend(SCORED))
    assert simulated == real
    assert len(set(asked_by_the_simulator)) == 24  # the simulator asked the hook about every job
    assert len(SCORED) == 2 * len(asked_by_the_simulator)  # and the real passes asked the same questions


def _node(name: str, gpus: int, first: int, labels=None) -> SimNode:
    return SimNode(id=name, name=name, labels=labels or {},
                   devices=[(first + i, i, 16 * GiB) for i in range(gpus)])


def test_estimates_are_exact_on_a_known_queue():
    """Two running jobs on a two-GPU node end at 300 s and 900 s (their known progress / time limits); three
    queued one-GPU jobs of 600 s each start at 300, 900 and 900 s: exactly what the estimate says."""
    nodes = [_node("n1", 2, 1)]
    running = [SimJob(id="r1", team_id=1, kind="k", resources={"gpus": 1.0}, runtime=RunTime.exact(300),
                      state=foresight.RUNNING, started=-100.0, allocs=[(1, 1000, 16 * GiB)], share=1.0),
               SimJob(id="r2", team_id=1, kind="k", resources={"gpus": 1.0}, runtime=RunTime.exact(900),
                      state=foresight.RUNNING, started=-50.0, allocs=[(2, 1000, 16 * GiB)], share=1.0)]
    queued = [SimJob(id=f"q{i}", team_id=1, kind="k", resources={"gpus": 1.0}, runtime=RunTime.exact(600),
                     queued_at=float(i)) for i in range(3)]
    answers = foresight.estimate(nodes, running + queued, now=0.0)
    assert {job: (a.start, a.low, a.high) for job, a in answers.items()} == {
        "q0": (300.0, 300.0, 300.0), "q1": (900.0, 900.0, 900.0), "q2": (900.0, 900.0, 900.0)}
    assert answers["q0"].waits_for == ["r1"]


def test_run_time_comes_from_progress_then_history_then_the_time_limit():
    points = [(0.0, 0.0), (100.0, 1000.0)]  # 10 steps/s, 1,000 of 5,000 done
    assert foresight.runtime_for(time_limit=3600, elapsed=100, total=5000, points=points) == RunTime.exact(400, "progress")
    history = RunTime(100, 200, 400, "history")
    got = foresight.runtime_for(time_limit=3600, elapsed=50, history=history)
    assert (got.p10, got.p50, got.p90, got.source) == (50, 150, 350, "history")
    assert foresight.runtime_for(time_limit=3600, elapsed=600) == RunTime.exact(3000, "time_limit")
    assert foresight.total_steps({"train": {"epochs": 3, "steps_per_epoch": 50}}) == 150


def test_history_model_learns_quantiles_per_kind():
    rng = random.Random(1)
    rows = []
    for _ in range(200):
        kind = rng.choice(["short", "long"])
        base = 100.0 if kind == "short" else 1000.0
        rows.append((1, kind, "python x.py", {"gpus": 1.0}, 7200, base * rng.uniform(0.8, 1.2)))
    model = foresight.HistoryModel(rows)
    short = model.predict(1, "short", "python x.py", {"gpus": 1.0}, 7200)
    long = model.predict(1, "long", "python x.py", {"gpus": 1.0}, 7200)
    assert short is not None and long is not None
    assert 80 <= short.p10 <= short.p50 <= short.p90 <= 125
    assert 800 <= long.p10 <= long.p50 <= long.p90 <= 1250
    assert model.predict(2, "short", "python x.py", {"gpus": 1.0}, 60).p90 <= 60  # never past the time limit


def test_the_80_percent_interval_covers_70_to_90_percent_of_starts():
    """A noisy queue: run times drawn from the distribution the quantiles state. Over many seeds, the actual
    starts fall inside the 80 % interval 70-90 % of the time."""
    covered = total = 0
    for seed in range(30):
        rng = random.Random(seed)
        nodes = [_node("n1", 2, 1), _node("n2", 2, 11)]
        jobs = []
        for i in range(4):
            runtime = RunTime(100, 300, 700)
            device = (1, 2, 11, 12)[i]
            jobs.append(SimJob(id=f"r{i}", team_id=1 + i % 2, kind="k", resources={"gpus": 1.0}, runtime=runtime,
                               state=foresight.RUNNING, started=0.0, allocs=[(device, 1000, 16 * GiB)], share=1.0))
        for i in range(8):
            jobs.append(SimJob(id=f"q{i}", team_id=1 + i % 2, kind="k", resources={"gpus": 1.0},
                               runtime=RunTime(100, 300, 700), queued_at=float(i)))
        answers = foresight.estimate(nodes, jobs, now=0.0, samples=40, seed=seed)
        actual = Simulator(nodes, foresight._copy_jobs(jobs), now=0.0, draw=random.Random(rng.random() + seed))
        starts = actual.run()
        for job_id, answer in answers.items():
            total += 1
            covered += answer.low <= starts[job_id] <= answer.high
    assert 0.70 <= covered / total <= 0.90, covered / total


def test_what_would_make_a_job_run_now():
    """A two-GPU job on a cluster with one free GPU: it would run now with one GPU; a job labelled for a full pool
    would run in the other; a high-priority job would run if its team's low-priority job paused; a pending job
    held back by max_gpus would run with a larger max_gpus."""
    from strata.quotas.models import Quota

    nodes = [_node("n1", 2, 1, {"pool": "a"}), _node("n2", 2, 11, {"pool": "b"})]
    low = SimJob(id="low", team_id=1, kind="k", resources={"gpus": 1.0}, runtime=RunTime.exact(500),
                 state=foresight.RUNNING, started=0.0, allocs=[(1, 1000, 16 * GiB)], share=1.0)
    other = SimJob(id="other", team_id=2, kind="k", resources={"gpus": 2.0}, runtime=RunTime.exact(500),
                   state=foresight.RUNNING, started=0.0, allocs=[(11, 1000, 16 * GiB), (12, 1000, 16 * GiB)],
                   share=2.0)
    big = SimJob(id="big", team_id=1, kind="k", resources={"gpus": 2.0, "workers": 1}, runtime=RunTime.exact(50),
                 priority=5)
    options = foresight.run_now_options(nodes, [low, other, big], {}, "big")
    kinds = {option["kind"]: option for option in options}
    assert kinds["smaller_share"]["resources"] == {"gpus": 1.0, "workers": 1}
    assert kinds["pause"]["job"] == "low"

    pooled = SimJob(id="pooled", team_id=2, kind="k", resources={"gpus": 1.0, "node_labels": {"pool": "b"}},
                    runtime=RunTime.exact(50))
    options = foresight.run_now_options(nodes, [low, other, pooled], {}, "pooled")
    assert [option["kind"] for option in options] == ["other_pool"]

    quota = Quota(team_id=2, max_gpus=2.0)
    pending = SimJob(id="pending", team_id=2, kind="k", resources={"gpus": 1.0}, runtime=RunTime.exact(50),
                     state=foresight.PENDING)
    sim = Simulator(nodes, foresight._copy_jobs([low, other, pending]), {2: quota})
    sim.admit()
    reason = sim.jobs["pending"].reason
    assert reason.startswith("waiting: team at max_gpus")
    pending.reason = reason
    options = foresight.run_now_options(nodes, [low, other, pending], {2: quota}, "pending")
    assert {"kind": "quota", "limit": "max_gpus", "text": "a larger max_gpus for the team"} in options


@pytest.mark.parametrize("preempt", [True])
def test_the_simulator_preempts_through_the_same_victim_choice(preempt):
    nodes = [_node("n1", 1, 1)]
    low = SimJob(id="low", team_id=1, kind="k", resources={"gpus": 1.0}, runtime=RunTime.exact(1000),
                 state=foresight.RUNNING, started=0.0, allocs=[(1, 1000, 16 * GiB)], share=1.0, priority=0)
    high = SimJob(id="high", team_id=2, kind="k", resources={"gpus": 1.0}, runtime=RunTime.exact(100), priority=5)
    sim = Simulator(nodes, [low, high], now=0.0, preempt_delay=10.0)
    starts = sim.run()
    assert sim.preemptions == [(0.0, "high", ["low"])]
    assert starts == {"high": 10.0, "low": 110.0}


def test_refresh_stores_the_estimate_on_the_job_and_the_api_shows_it(make_team, make_user, make_token, submit,
                                                                      make_node, run_pass, api):
    """A one-GPU node runs a job with a one-hour time limit (no history yet: its time limit is its run time); a
    second job waits behind it and is expected to start when the first one's hour is up. Smaller or paused, it
    would not fit either; the estimate is on the job in the API; calibration compares the first one with the
    actual start."""
    from datetime import timedelta

    from strata.scheduling import eta

    team = make_team("alpha")
    alice = make_user("alice", team)
    node = make_node("n1", gpus=1)
    first = submit(alice, team, name="first")
    run_pass()
    attempt = Attempt.objects.get(job=first)
    attempt_claim(attempt.pk, attempt.fencing_token, node)
    second = submit(alice, team, name="second", gpus=1.0)
    run_pass()
    assert Job.objects.get(pk=second.pk).state == JobState.QUEUED
    assert eta.refresh() == 1
    stored = Job.objects.get(pk=second.pk)
    assert 3590 <= stored.eta["in_seconds"] <= 3600
    assert stored.eta["low_seconds"] == stored.eta["in_seconds"] == stored.eta["high_seconds"]
    assert stored.eta["runtime"]["source"] == "time_limit"
    assert stored.eta["waits_for"]["jobs"] == [str(first.pk)]
    assert stored.eta_first["start"] == stored.eta["start"] and stored.eta_first["waiting"] == 1

    client = api(make_token(alice, team))
    detail = client.get(f"/api/v1/jobs/{second.pk}/").json()
    assert detail["eta"]["start"] == stored.eta["start"]
    listed = {job["id"]: job for job in client.get("/api/v1/jobs/").json()["results"]}
    assert listed[str(second.pk)]["eta"]["in_seconds"] == stored.eta["in_seconds"]
    assert listed[str(first.pk)]["eta"] is None  # it runs: no estimate shown
    from django.test import Client
    from django.urls import reverse

    page = Client()
    page.force_login(alice)
    html = page.get(reverse("dashboard:job-detail", args=[second.pk])).content.decode()
    assert 'id="job-eta"' in html and "expected to start in 60 min" in html

    # It starts 100 s after the estimate said: outside the (exact) interval, 100 s of error.
    from datetime import datetime

    started = datetime.fromisoformat(stored.eta["start"]) + timedelta(seconds=100)
    Job.objects.filter(pk=second.pk).update(started_at=started)
    report = eta.calibration()
    assert report["jobs"] == 1 and report["coverage"] == 0.0 and report["median_abs_error_seconds"] == 100.0
    assert report["by_kind"] == {"train": {"jobs": 1, "coverage": 0.0, "median_abs_error_seconds": 100.0}}
    assert list(report["by_queue_length"]) == ["1-4"]
    assert client.get("/api/v1/eta/calibration/").status_code == 403
    admin = api(make_token(make_user("root", admin=True), team))
    answer = admin.get("/api/v1/eta/calibration/?days=7")
    assert answer.status_code == 200 and answer.json()["jobs"] == 1
    assert admin.get("/api/v1/eta/calibration/?days=soon").status_code == 400


def test_a_pending_job_is_told_which_quota_change_would_run_it(make_team, make_user, submit, make_node, run_pass):
    from strata.scheduling import eta

    team = make_team("alpha", max_gpus=1.0)
    alice = make_user("alice", team)
    make_node("n1", gpus=2)
    submit(alice, team, name="first")
    held_back = submit(alice, team, name="second")
    run_pass()
    assert Job.objects.get(pk=held_back.pk).state == JobState.PENDING
    eta.refresh()
    stored = Job.objects.get(pk=held_back.pk).eta
    assert {"kind": "quota", "limit": "max_gpus", "text": "a larger max_gpus for the team"} in stored["run_now"]
    assert stored["in_seconds"] is not None and 3590 <= stored["in_seconds"] <= 3600


def test_the_cli_says_when_a_job_is_expected_to_start():
    from strata.cli import eta_text

    eta = {"in_seconds": 720.0, "low_seconds": 300.0, "high_seconds": 1800.0,
           "waits_for": {"reason": "waiting: no node has free devices that fit", "jobs": ["0123456789abcdef"]},
           "run_now": [{"kind": "smaller_share", "text": "1 worker(s) of 1 GPU"}]}
    assert eta_text.short({"state": "QUEUED", "eta": eta}) == "in ~12 min"
    assert eta_text.short({"state": "RUNNING", "eta": eta}) == ""
    assert eta_text.sentence(eta) == ("expected to start in 12 min (80 %: 5–30 min); waits for no node has free "
                                      "devices that fit (until job 01234567 end); would run now with: 1 worker(s) "
                                      "of 1 GPU")


def test_submit_wait_prints_the_estimate_when_it_changes(monkeypatch, capsys):
    """Three polls see the same estimate (only time passed: printed once), a fourth a later start (printed
    again), then the job runs and succeeds."""
    from strata.cli import client_commands

    def eta(start: str, seconds: float) -> dict:
        return {"start": start, "low": start, "high": start, "in_seconds": seconds, "low_seconds": seconds,
                "high_seconds": seconds, "waits_for": {"reason": "waiting: no node has free devices that fit",
                                                       "jobs": []}, "run_now": []}

    answers = [("QUEUED", eta("2026-12-06T18:10:00+00:00", 600)), ("QUEUED", eta("2026-12-06T18:10:00+00:00", 570)),
               ("QUEUED", eta("2026-12-06T18:10:00+00:00", 540)), ("QUEUED", eta("2026-12-06T18:20:00+00:00", 1110)),
               ("RUNNING", None), ("SUCCEEDED", None)]

    class Client:
        polls = 0

        def get(self, path, params=None):
            if path.endswith("/metrics/"):
                return []
            state, estimate = answers[min(self.polls, len(answers) - 1)]
            self.polls += 1
            return {"id": "j1", "kind": "no-such-kind", "state": state, "reason": "", "eta": estimate}

    monkeypatch.setattr(client_commands.time, "sleep", lambda seconds: None)
    assert client_commands.wait_for_job(Client(), "j1") == 0
    said = [line.split("] ", 1)[1] for line in capsys.readouterr().out.splitlines() if "expected to start" in line]
    assert said == ["expected to start in 10 min; waits for no node has free devices that fit",
                    "expected to start in 18 min; waits for no node has free devices that fit"]


def test_the_beat_task_refreshes_on_the_leader_every_so_often(make_team, make_user, submit, make_node, run_pass,
                                                               settings, monkeypatch):
    from strata.scheduling import eta, tasks

    team = make_team("alpha")
    alice = make_user("alice", team)
    make_node("n1", gpus=1)
    submit(alice, team, name="first")
    waiting = submit(alice, team, name="second")
    run_pass()
    monkeypatch.setattr(eta, "_last_refresh", 0.0)
    settings.STRATA_ETA_SECONDS = 0  # never
    assert tasks.eta_task() == 0 and Job.objects.get(pk=waiting.pk).eta is None
    settings.STRATA_ETA_SECONDS = 30
    assert tasks.eta_task() == 1 and Job.objects.get(pk=waiting.pk).eta is not None
    assert tasks.eta_task() == 0  # not again within 30 s


def test_the_kept_capacity_index_places_as_a_fresh_one_each_pass():
    """A contended replay with priorities, fractions and elastic jobs (preemptions and shrinks): the simulator that
    keeps its free-capacity index from pass to pass places every job where one that rebuilds it for every pass
    does, at the same time."""
    from strata.scheduling import whatif

    class Fresh(Simulator):
        def capacity(self):
            return self.fresh_capacity()

    rng = random.Random(3)
    nodes = [_node(f"n{n}", 4, n * 10) for n in range(3)]
    history = []
    for i in range(120):
        gpus = rng.choice([0.25, 0.5, 1.0, 1.0, 2.0, 4.0])
        resources = {"gpus": gpus, "workers": 1}
        if rng.random() < 0.4:
            resources["elastic"] = {"min_share": gpus / 2}
        history.append(whatif.Past(id=i, team_id=rng.choice([1, 2, 3]), kind="k", resources=resources,
                                   priority=rng.choice([0, 0, 5]), submit=rng.uniform(0, 20000),
                                   runtime=rng.uniform(300, 4000), wait=0.0))
    live = whatif.replay(nodes, history, {})
    original = whatif.Simulator
    try:
        whatif.Simulator = Fresh
        fresh = whatif.replay(nodes, history, {})
    finally:
        whatif.Simulator = original
    assert live.preempted and live.shrunk  # the index was given back and taken again many times
    assert (live.starts, live.ends, live.preempted, live.shrunk) == (fresh.starts, fresh.ends, fresh.preempted,
                                                                    fresh.shrunk)


def _contended(**options):
    nodes = [_node("n1", 1, 1)]
    low = SimJob(id="low", team_id=1, kind="k", resources={"gpus": 1.0, "elastic": {"min_share": 0.5}},
                 runtime=RunTime.exact(4000), state=foresight.RUNNING, started=0.0, allocs=[(1, 1000, 16 * GiB)],
                 share=1.0, checkpoint_every=1000.0)
    high = SimJob(id="high", team_id=2, kind="k", resources={"gpus": 0.5}, runtime=RunTime.exact(100), priority=5,
                  state=foresight.PENDING, submit=2500.0)
    sim = Simulator(nodes, [low, high], now=0.0, preempt_delay=10.0, checkpoint_write=20.0, **options)
    return sim, sim.run()


def test_an_elastic_job_is_shrunk_rather_than_stopped_and_loses_nothing():
    """At 2,500 s an urgent half-GPU job needs the GPU an elastic job holds: the elastic job is shrunk to half a
    GPU (it writes a checkpoint, 10 + 20 s, and queues again with its 1,500 s left at half the share: 3,000 s),
    and loses nothing."""
    sim, starts = _contended()
    assert sim.shrinks == [(2500.0, "high", [("low", {"gpus": 0.5, "elastic": {"min_share": 0.5}})])]
    assert sim.preemptions == []
    assert starts["high"] == 2530.0
    low = sim.jobs["low"]
    assert low.resources["gpus"] == 0.5 and low.shrinks == 1 and low.lost == 0.0
    assert low.ended == 2530.0 + 3000.0
    assert sim.lost_gpu_seconds == 0.0 and sim.checkpoint_gpu_seconds == 20.0


def test_preempt_only_kills_the_job_and_it_loses_the_work_since_its_last_checkpoint():
    """The same queue preempt-only: the elastic job is stopped, not shrunk, and killed (10 s): it keeps the
    2,000 s of its last periodic checkpoint and loses the 500 s since, at one GPU."""
    sim, starts = _contended(preempt_only=True)
    assert sim.shrinks == [] and sim.preemptions == [(2500.0, "high", ["low"])]
    assert starts["high"] == 2510.0
    low = sim.jobs["low"]
    assert low.stops == 1 and low.lost == 500.0 and sim.lost_gpu_seconds == 500.0
    assert low.resources["gpus"] == 1.0 and low.ended == 2610.0 + 2000.0  # after the high job, 2,000 s left


def test_a_job_that_cannot_checkpoint_loses_all_it_ran():
    """Even checkpoint-before-stop keeps nothing of a job that cannot checkpoint: it starts over."""
    nodes = [_node("n1", 1, 1)]
    low = SimJob(id="low", team_id=1, kind="k", resources={"gpus": 1.0}, runtime=RunTime.exact(4000),
                 state=foresight.RUNNING, started=0.0, allocs=[(1, 1000, 16 * GiB)], share=1.0, can_checkpoint=False)
    high = SimJob(id="high", team_id=2, kind="k", resources={"gpus": 1.0}, runtime=RunTime.exact(100), priority=5,
                  state=foresight.PENDING, submit=2500.0)
    sim = Simulator(nodes, [low, high], now=0.0, preempt_delay=10.0, checkpoint_write=20.0)
    sim.run()
    assert sim.jobs["low"].lost == 2500.0 and sim.checkpoint_gpu_seconds == 0.0
    assert sim.jobs["low"].ended == 2610.0 + 4000.0  # it starts over


def test_arrivals_follow_the_learned_rate_and_mix():
    rows = [(1, float(t), "k", {"gpus": 1.0}, 0, RunTime.exact(60)) for t in range(0, 86400, 864)]  # 100 a day
    rows += [(2, float(t), "k", {"gpus": 2.0}, 0, RunTime.exact(60)) for t in range(0, 86400, 2880)]  # 30 a day
    arrivals = foresight.Arrivals.learn(rows, since=0.0, until=86400.0, bins=24)
    stream = arrivals.stream(random.Random(1), 86400.0)
    jobs = []
    for job in stream:
        if job.submit >= 10 * 86400.0:
            break
        jobs.append(job)
    teams = [job.team_id for job in jobs]
    assert 900 <= teams.count(1) <= 1100 and 250 <= teams.count(2) <= 350
    assert all(job.resources == {"gpus": 2.0} for job in jobs if job.team_id == 2)
    assert [job.submit for job in jobs] == sorted(job.submit for job in jobs)


def test_the_recalibrated_interval_covers_about_80_percent_where_the_simulated_one_is_too_narrow():
    """Estimates that are right on average but noisy (their spread unknown to the simulator): an interval learned
    from earlier pairs covers 70-90 % of later actual waits, over many seeds."""
    import random

    from strata.scheduling.foresight import WaitCalibration

    assert WaitCalibration.learn([(100.0, 100.0)] * (WaitCalibration.MIN_PAIRS - 1)) is None
    coverages = []
    for seed in range(20):
        rng = random.Random(seed)

        def pair(rng=rng):
            estimated = rng.uniform(0, 7200)
            return estimated, (estimated + 300) * math.exp(rng.gauss(0.0, 0.6)) - 300

        calibration = WaitCalibration.learn([pair() for _ in range(200)])
        inside = 0
        for _ in range(200):
            estimated, actual = pair()
            low, high = calibration.interval(1000.0, 1000.0 + estimated)
            inside += low <= 1000.0 + actual <= high
        coverages.append(inside / 200)
    assert 0.70 <= statistics.median(coverages) <= 0.90, coverages
    exact = WaitCalibration.learn([(600.0, 600.0)] * 40)
    assert exact.interval(0.0, 600.0) == (600.0, 600.0)  # estimates that held keep an exact interval


def test_refresh_recalibrates_the_interval_from_the_starts_it_recorded(make_team, make_user, submit, make_node,
                                                                      run_pass):
    """With enough recorded first estimates that came true late (actual wait twice the estimate), a new estimate's
    interval covers the later start; the median start stays the simulator's."""
    from datetime import timedelta

    from django.utils import timezone

    from strata.scheduling import eta

    team = make_team("alpha")
    alice = make_user("alice", team)
    node = make_node("n1", gpus=1)
    now = timezone.now()
    for index in range(40):  # history: estimated waits of 10 min that were 20-30 min
        at = now - timedelta(hours=2, minutes=index)
        done = submit(alice, team, name=f"past-{index}")
        Job.objects.filter(pk=done.pk).update(
            state=JobState.SUCCEEDED, started_at=at + timedelta(minutes=20 + index % 10),
            eta_first={"start": (at + timedelta(minutes=10)).isoformat(), "low": None, "high": None,
                       "waiting": 1, "position": 0, "at": at.isoformat()})
    first = submit(alice, team, name="first")
    run_pass()
    attempt = Attempt.objects.get(job=first)
    attempt_claim(attempt.pk, attempt.fencing_token, node)
    second = submit(alice, team, name="second")
    run_pass()
    assert eta.refresh() == 1
    stored = Job.objects.get(pk=second.pk).eta
    assert stored["calibrated_from"] == 40
    assert 3590 <= stored["in_seconds"] <= 3600  # the simulator's median: the first job's hour
    assert stored["low_seconds"] > stored["in_seconds"]  # the recorded starts all came later than estimated
    assert stored["high_seconds"] >= 2 * stored["in_seconds"]
