"""Billing by actual use (strata.quotas.usage): allocated against used GPU-seconds from real telemetry, measured
device time, budgets and their forecast, the CSV export, the Prometheus counters and team isolation."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from strata.cluster.models import Device
from strata.jobs.models import Attempt
from strata.quotas.models import Quota
from strata.quotas.usage import CSV_COLUMNS, budget_period, forecast, job_uses, team_billing
from strata.telemetry.services import rollups_update

GIB = 2**30
HALF = 150  # seconds at 100 %, then as many at 0 %


@pytest.fixture
def cluster(make_team, make_user, make_token, make_node, api):
    alpha, beta = make_team("alpha"), make_team("beta")
    alice, bob = make_user("alice", alpha), make_user("bob", beta)
    node = make_node("n1", gpus=2)
    return {"alpha": alpha, "beta": beta, "alice": alice, "bob": bob, "node": node,
            "client": api(make_token(alice, alpha)), "bob_client": api(make_token(bob, beta))}


def _running(cluster, submit, run_pass, node_protocol, user="alice", team="alpha", gpus=1.0, seconds=2 * HALF):
    """A job placed, claimed by its node (the real protocol), dispatched ``seconds`` ago."""
    job = submit(cluster[user], cluster[team], gpus=gpus)
    run_pass()
    attempt = Attempt.objects.get(job=job)
    protocol = node_protocol(attempt, node=cluster["node"])
    began = timezone.now() - timedelta(seconds=seconds)
    Attempt.objects.filter(pk=attempt.pk).update(dispatched_at=began, started_at=began)
    attempt.refresh_from_db()
    return job, attempt, protocol, began


def _beat(cluster, protocol, attempts, samples):
    """Heartbeats as a node agent sends them: samples batched with the time each was taken."""
    for first in range(0, len(samples), 40):
        cluster["node"].refresh_from_db()
        answer = protocol.heartbeat(samples=samples[first:first + 40], attempts=[str(a.pk) for a in attempts])
        assert answer.status_code == 200, answer.content


def _half_idle_samples(device_index, began, until, memory=2 * GIB):
    """A sample every 3 s (the heartbeat): 100 % for the first half of [began, until], 0 % for the rest."""
    middle = began + (until - began) / 2
    samples, at = [], began + timedelta(seconds=1.5)
    while at < until:
        busy = at < middle
        samples.append({"index": device_index, "utilization": 100.0 if busy else 0.0,
                        "memory_used": memory if busy else GIB, "time": at.timestamp()})
        at += timedelta(seconds=3)
    return samples


def test_a_job_that_idles_half_its_time_used_half_of_what_it_was_allocated(cluster, submit, run_pass,
                                                                            node_protocol):
    job, attempt, protocol, began = _running(cluster, submit, run_pass, node_protocol)
    index = attempt.allocations.get().device.index
    now = timezone.now()
    _beat(cluster, protocol, [attempt], _half_idle_samples(index, began, now))

    use = job_uses({"id__in": [job.pk]}, until=now)[job.pk]
    assert use.allocated == pytest.approx(2 * HALF, rel=0.01)
    assert use.allocated / use.used == pytest.approx(2.0, rel=0.05)
    assert use.idle == pytest.approx(HALF, rel=0.06) and use.unmeasured < 5
    assert use.source == "telemetry"
    assert 1.2 * GIB < use.memory_used_mean < 1.8 * GIB

    # Over a longer range the minute rollups are read (the same telemetry, summarized): the same answer.
    rollups_update(now=now + timedelta(minutes=2))
    coarse = job_uses({"id__in": [job.pk]}, since=now - timedelta(hours=6), until=now)[job.pk]
    assert coarse.allocated == pytest.approx(use.allocated)
    assert coarse.allocated / coarse.used == pytest.approx(2.0, rel=0.1)

    # The API shows the same numbers, allocated against used.
    answer = cluster["client"].get("/api/v1/usage/alpha/?since=1h")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    [row] = body["jobs"]
    assert row["job"] == str(job.pk) and row["source"] == "telemetry"
    assert row["allocated_gpu_hours"] / row["used_gpu_hours"] == pytest.approx(2.0, rel=0.05)
    assert body["allocated_gpu_hours"] == pytest.approx(row["allocated_gpu_hours"])
    assert body["idle_gpu_hours"] == pytest.approx(HALF / 3600, rel=0.1)


def test_two_jobs_sharing_a_device_split_its_busy_time_and_measured_slices_win(cluster, submit, run_pass,
                                                                              node_protocol):
    from strata.telemetry.models import ReportSeries

    first, a1, protocol, began = _running(cluster, submit, run_pass, node_protocol, gpus=0.5)
    second, a2, _, _ = _running(cluster, submit, run_pass, node_protocol, gpus=0.5)
    Attempt.objects.filter(pk=a2.pk).update(dispatched_at=began, started_at=began)
    device = a1.allocations.get().device
    assert a2.allocations.get().device == device  # both halves on one device
    now = timezone.now()
    samples = [{"index": device.index, "utilization": 80.0, "memory_used": GIB, "time": at}
               for at in [(began + timedelta(seconds=1.5 + 3 * i)).timestamp() for i in range(2 * HALF // 3)]]
    _beat(cluster, protocol, [a1, a2], samples)
    uses = job_uses({"id__in": [first.pk, second.pk]}, until=now)
    for job in (first, second):  # 80 % of the device, shared by two equal shares: 0.4 GPU each
        assert uses[job.pk].allocated == pytest.approx(HALF, rel=0.01)
        assert uses[job.pk].used == pytest.approx(0.4 * 2 * HALF, rel=0.05)

    # A plugin that measured the first attempt's device time (slices naming the attempt and the device): that is
    # what it used, in whole-device seconds.
    ReportSeries.objects.create(plugin="sharing", device=device, attempt=a1, job=first, start=began,
                                end=began + timedelta(seconds=60))
    ReportSeries.objects.create(plugin="sharing", device=device, attempt=a1, job=first,
                                start=began + timedelta(seconds=30), end=began + timedelta(seconds=90))
    measured = job_uses({"id__in": [first.pk]}, until=now)[first.pk]
    assert measured.used == pytest.approx(90.0) and measured.measured == pytest.approx(90.0)
    assert measured.source == "measured"


def test_the_budget_forecast_on_a_constructed_rate(cluster, submit, run_pass, node_protocol):
    now = datetime(2030, 1, 10, 10, 0, tzinfo=UTC)
    assert budget_period(Quota(), now) == (datetime(2030, 1, 1, tzinfo=UTC), datetime(2030, 2, 1, tzinfo=UTC))
    assert budget_period(Quota(budget_period_days=7), now) == (datetime(2030, 1, 10, tzinfo=UTC),
                                                                datetime(2030, 1, 17, tzinfo=UTC))
    end = datetime(2030, 2, 1, tzinfo=UTC)
    # 100 GPU-hours, 40 spent, 2 GPUs busy: 30 hours left.
    outlook = forecast(100 * 3600, 40 * 3600, 2.0, now, end)
    assert outlook["runs_out_at"] == datetime(2030, 1, 11, 16, 0, tzinfo=UTC) and not outlook["exhausted"]
    assert outlook["text"] == "at this rate the budget runs out on 2030-01-11 16:00 UTC"
    assert forecast(100 * 3600, 40 * 3600, 0.01, now, end)["runs_out_at"] is None  # the month ends first
    assert forecast(100 * 3600, 40 * 3600, 0.01, now, end)["text"].startswith("not at this rate")
    assert forecast(100 * 3600, 100 * 3600, 2.0, now, end)["exhausted"]

    # From the team's own history: one GPU held for the last 2 hours, 14 GPU-hours a month.
    Quota.objects.filter(team=cluster["alpha"]).update(budget_gpu_hours=14)
    job, attempt, _, _ = _running(cluster, submit, run_pass, node_protocol)
    Attempt.objects.filter(pk=attempt.pk).update(dispatched_at=now - timedelta(hours=2))
    budget = team_billing(cluster["alpha"], now=now, rate_hours=1)["budget"]
    assert budget["charged_gpu_hours"] == pytest.approx(2.0)
    assert budget["rate_gpu_hours_per_day"] == pytest.approx(24.0)
    assert budget["runs_out_at"] == now + timedelta(hours=12)


def test_budget_fields_are_checked_and_set_by_cluster_admins(cluster, make_user, make_token, api):
    admin = api(make_token(make_user("root", cluster["alpha"], admin=True), cluster["alpha"]))
    bad = admin.patch("/api/v1/quotas/alpha/", {"budget_gpu_hours": -1, "budget_period_days": 0}, format="json")
    assert bad.status_code == 400 and {"budget_gpu_hours", "budget_period_days"} <= set(bad.json())
    assert cluster["client"].patch("/api/v1/quotas/alpha/", {"budget_gpu_hours": 5}, format="json").status_code == 403
    good = admin.patch("/api/v1/quotas/alpha/", {"budget_gpu_hours": 500, "budget_period_days": 30}, format="json")
    assert good.status_code == 200 and (good.json()["budget_gpu_hours"], good.json()["budget_period_days"]) == (500, 30)
    budget = cluster["client"].get("/api/v1/usage/alpha/").json()["budget"]
    assert budget["gpu_hours"] == 500 and budget["period_days"] == 30


def test_the_csv_export_has_one_row_per_job_with_the_columns(cluster, submit, run_pass, node_protocol):
    job, attempt, protocol, began = _running(cluster, submit, run_pass, node_protocol)
    _beat(cluster, protocol, [attempt], _half_idle_samples(attempt.allocations.get().device.index, began,
                                                           timezone.now()))
    answer = cluster["client"].get("/api/v1/usage/alpha/?since=1h&format=csv")
    assert answer.status_code == 200 and answer["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(answer.content.decode())))
    assert rows[0] == CSV_COLUMNS
    [row] = [dict(zip(CSV_COLUMNS, values, strict=True)) for values in rows[1:]]
    assert row["job"] == str(job.pk) and row["team"] == "alpha" and row["source"] == "telemetry"
    assert float(row["allocated_gpu_hours"]) / float(row["used_gpu_hours"]) == pytest.approx(2.0, rel=0.05)
    bad = cluster["client"].get("/api/v1/usage/alpha/?since=yesterday&limit=-1&format=csv")
    assert bad.status_code == 400 and {"since", "limit"} <= set(bad.json())


def test_prometheus_counters_per_team(cluster, submit, run_pass, node_protocol, settings, monkeypatch):
    from strata.quotas import metrics
    from strata.quotas.metrics import billing_families

    monkeypatch.setattr(metrics, "_shown", {})  # what this process showed before (other tests' databases)

    job, attempt, protocol, began = _running(cluster, submit, run_pass, node_protocol)
    now = timezone.now()
    _beat(cluster, protocol, [attempt], _half_idle_samples(attempt.allocations.get().device.index, began, now))
    # Month to date (UTC): all of the job, unless the month began while it ran.
    expected = job_uses({"id__in": [job.pk]}, since=budget_period(None, now)[0], until=now)[job.pk]
    settings.STRATA_METRICS_TOKEN = None
    assert {family.name for family in billing_families(now)} == {"strata_gpu_seconds_allocated",
                                                                 "strata_gpu_seconds_used"}
    settings.STRATA_METRICS_TOKEN = "secret"
    values = {(sample.name, sample.labels.get("team")): sample.value
              for family in billing_families(now) for sample in family.samples if sample.name.endswith("_total")}
    allocated = values[("strata_team_gpu_seconds_allocated_total", "alpha")]
    used = values[("strata_team_gpu_seconds_used_total", "alpha")]
    assert allocated == pytest.approx(expected.allocated) and used == pytest.approx(expected.used)
    if began >= budget_period(None, now)[0]:
        assert allocated == pytest.approx(2 * HALF, rel=0.01) and allocated / used == pytest.approx(2.0, rel=0.05)
    assert values[("strata_team_gpu_seconds_allocated_total", "beta")] == 0.0
    assert values[("strata_gpu_seconds_allocated_total", None)] == pytest.approx(allocated)
    # Through the endpoint, behind the metrics token.
    from django.test import Client

    scraped = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer secret")
    assert scraped.status_code == 200
    assert 'strata_team_gpu_seconds_used_total{team="alpha"}' in scraped.content.decode()


def test_another_teams_usage_never_shows(cluster, submit, run_pass, node_protocol, make_user, make_token, api):
    job, attempt, protocol, began = _running(cluster, submit, run_pass, node_protocol)
    _beat(cluster, protocol, [attempt], _half_idle_samples(attempt.allocations.get().device.index, began,
                                                           timezone.now()))
    bob = cluster["bob_client"]
    assert bob.get("/api/v1/usage/alpha/").status_code == 404
    assert bob.get("/api/v1/usage/alpha/?format=csv").status_code == 404
    assert bob.get("/api/v1/usage/nosuch/").status_code == 404
    own = bob.get("/api/v1/usage/beta/?since=1h").json()
    assert own["jobs"] == [] and own["allocated_gpu_hours"] == 0
    assert [team["team"] for team in bob.get("/api/v1/usage/").json()["results"]] == ["beta"]
    # A viewer of alpha reads it (reads need any role).
    viewer = make_user("vera", cluster["alpha"], role="viewer")
    read = api(make_token(viewer, cluster["alpha"])).get("/api/v1/usage/alpha/?since=1h")
    assert read.status_code == 200 and [row["job"] for row in read.json()["jobs"]] == [str(job.pk)]
    assert Device.objects.count() >= 2


def test_the_usage_page_shows_the_apis_numbers_and_links_the_csv(cluster, submit, run_pass, node_protocol):
    import re

    from django.test import Client

    job, attempt, protocol, began = _running(cluster, submit, run_pass, node_protocol)
    _beat(cluster, protocol, [attempt], _half_idle_samples(attempt.allocations.get().device.index, began,
                                                           timezone.now()))
    Quota.objects.filter(team=cluster["alpha"]).update(budget_gpu_hours=1000)
    browser = Client()
    assert browser.login(username="alice", password="pw-alice")
    page = browser.get("/usage/?team=alpha&range=1h")
    assert page.status_code == 200
    html = page.content.decode()
    api = cluster["client"].get("/api/v1/usage/alpha/?since=1h").json()
    for name in ("allocated", "used", "idle"):
        shown = re.search(rf'data-billing="{name}">([0-9.]+)', html).group(1)
        assert float(shown) == pytest.approx(api[f"{name}_gpu_hours"], abs=0.006)
    assert f'<tr data-billing-job="{job.pk}">' in html
    assert re.search(r'data-billing="forecast"[^>]*>(at this rate|not at this rate)', html)
    link = re.search(r'id="billing-csv" href="([^"]+)"', html).group(1).replace("&amp;", "&")
    exported = browser.get(link)  # the browser's session reads the API's export
    assert exported.status_code == 200 and exported.content.decode().splitlines()[0] == ",".join(CSV_COLUMNS)
    # Another team's page is a 404, as in the API.
    assert browser.get("/usage/?team=beta").status_code == 404


class _ApiAdapter:
    """The CLI's REST client's calls, answered by the Django test client."""

    def __init__(self, api):
        self.api = api

    def request(self, method, path, *, params=None, raw=False, **_kwargs):
        from components.runtime.client.client import ApiError

        response = self.api.get(f"/api/v1/{path}", params or {})
        if response.status_code >= 400:
            raise ApiError(response.status_code, response.content.decode()[:300])
        return response if raw else response.json()

    def get(self, path, **kwargs):
        return self.request("GET", path, **kwargs)


def test_strata_usage_prints_allocated_against_used_and_the_csv(cluster, submit, run_pass, node_protocol,
                                                                monkeypatch, capsys):
    import argparse

    from strata.cli import client_commands
    from strata.cli.main import build_parser
    from strata.quotas import cli

    job, attempt, protocol, began = _running(cluster, submit, run_pass, node_protocol)
    _beat(cluster, protocol, [attempt], _half_idle_samples(attempt.allocations.get().device.index, began,
                                                           timezone.now()))
    Quota.objects.filter(team=cluster["alpha"]).update(budget_gpu_hours=1000)
    monkeypatch.setattr(client_commands, "connect", lambda args: _ApiAdapter(cluster["client"]))
    args = build_parser().parse_args(["usage", "alpha", "--since", "1h"])
    assert cli.run(args) == 0
    out = capsys.readouterr().out
    assert "team alpha" in out and "% used)" in out and str(job.pk) in out and "budget" in out
    assert "the budget runs out" in out or "not at this rate" in out
    assert cli.run(argparse.Namespace(**{**vars(args), "csv": True})) == 0
    assert capsys.readouterr().out.splitlines()[0] == ",".join(CSV_COLUMNS)
    assert cli.run(argparse.Namespace(**{**vars(args), "team": None})) == 0
    assert "team alpha" in capsys.readouterr().out


@pytest.mark.parametrize("query", ["since=99999999999999999999d", "until=not-a-time", "rate_hours=nan",
                                   "limit=1e400", "since=2030-01-02T00:00&until=2030-01-01T00:00"])
def test_a_bad_range_is_a_400_naming_it(cluster, query):
    answer = cluster["client"].get(f"/api/v1/usage/alpha/?{query}")
    assert answer.status_code == 400 and query.split("=")[0] in answer.json(), answer.content


def test_lost_work_shows_in_the_report_the_csv_the_page_and_the_metrics(cluster, submit, run_pass, node_protocol,
                                                                       settings, monkeypatch):
    """What strata.scheduling.lost_work recorded (tests/platform/scheduling/test_lost_work.py records it from
    real preemptions) is summed per team in every view of the usage report."""
    import re

    from django.test import Client

    from strata.quotas import metrics
    from strata.quotas.metrics import lost_work_families
    from strata.scheduling.models import LostWork

    monkeypatch.setattr(metrics, "_shown", {})
    job, attempt, protocol, began = _running(cluster, submit, run_pass, node_protocol)
    _beat(cluster, protocol, [attempt], _half_idle_samples(attempt.allocations.get().device.index, began,
                                                           timezone.now()))
    other, other_attempt, _, _ = _running(cluster, submit, run_pass, node_protocol)
    now = timezone.now()
    LostWork.objects.create(job=job, attempt=attempt, team=cluster["alpha"], cause="preempted", time=now, steps=4,
                            seconds=3600, gpu_seconds=7200, checkpoint=True, checkpoint_step=6)
    LostWork.objects.create(job=other, attempt=other_attempt, team=cluster["alpha"], cause="node_lost", time=now,
                            steps=None, seconds=1800, gpu_seconds=1800)

    body = cluster["client"].get("/api/v1/usage/alpha/?since=1h").json()
    lost = body["lost_work"]
    assert (lost["preemptions"], lost["shrinks"], lost["node_losses"], lost["steps"]) == (1, 0, 1, 4)
    assert lost["gpu_hours"] == pytest.approx(2.5)
    assert [(row["job"], row["gpu_hours"]) for row in lost["jobs"]] == [(str(job.pk), 2.0), (str(other.pk), 0.5)]
    assert cluster["client"].get("/api/v1/usage/alpha/?since=1h&limit=1").json()["lost_work"]["jobs"][0]["job"] \
        == str(job.pk)
    assert cluster["bob_client"].get("/api/v1/usage/beta/?since=1h").json()["lost_work"]["gpu_hours"] == 0

    rows = list(csv.reader(io.StringIO(cluster["client"].get("/api/v1/usage/alpha/?since=1h&format=csv")
                                       .content.decode())))
    by_job = {row["job"]: row for row in (dict(zip(CSV_COLUMNS, values, strict=True)) for values in rows[1:])}
    assert (by_job[str(job.pk)]["preemptions"], by_job[str(job.pk)]["lost_steps"]) == ("1", "4")
    assert float(by_job[str(job.pk)]["lost_gpu_hours"]) == pytest.approx(2.0)
    assert (by_job[str(other.pk)]["node_losses"], by_job[str(other.pk)]["lost_steps"]) == ("1", "0")

    browser = Client()
    assert browser.login(username="alice", password="pw-alice")
    html = browser.get("/usage/?team=alpha&range=1h").content.decode()
    assert re.search(r'data-billing="lost-steps">4<', html)
    assert float(re.search(r'data-billing="lost-gpu-hours">([0-9.]+)<', html).group(1)) == pytest.approx(2.5)
    assert f'<tr data-lost-job="{job.pk}">' in html and "1 preempted, 0 shrunk, 1 lost with their node" in html

    settings.STRATA_METRICS_TOKEN = None
    families = {family.name: family for family in lost_work_families(now + timedelta(seconds=1))}
    assert set(families) == {"strata_gpu_seconds_lost", "strata_attempts_interrupted"}
    settings.STRATA_METRICS_TOKEN = "secret"
    values = {(sample.name, sample.labels.get("cause") or sample.labels.get("team")): sample.value
              for family in lost_work_families(now + timedelta(seconds=1)) for sample in family.samples
              if sample.name.endswith("_total")}
    if began >= budget_period(None, now)[0]:  # this month's counters (unless the month began a moment ago)
        assert values[("strata_gpu_seconds_lost_total", "preempted")] == pytest.approx(7200)
        assert values[("strata_gpu_seconds_lost_total", "node_lost")] == pytest.approx(1800)
        assert values[("strata_attempts_interrupted_total", "shrunk")] == 0
        assert values[("strata_team_gpu_seconds_lost_total", "alpha")] == pytest.approx(9000)
    assert values[("strata_team_gpu_seconds_lost_total", "beta")] == 0
    scraped = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer secret").content.decode()
    assert 'strata_team_gpu_seconds_lost_total{team="alpha"}' in scraped
