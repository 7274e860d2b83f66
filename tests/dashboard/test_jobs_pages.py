"""The jobs pages of the web UI: list, submit (form and editor), detail, live updates, cancel and resubmit."""

from __future__ import annotations

import html as html_module
import io
import json
import re

import pytest
from django.test import Client

from strata.jobs import services
from strata.jobs.models import Attempt, Job, JobState, LogLine, MetricPoint


@pytest.fixture
def world(make_team, make_user, submit):
    alpha = make_team("alpha")
    beta = make_team("beta")
    alice = make_user("alice", alpha)
    bob = make_user("bob", beta)
    client = Client()
    client.force_login(alice)
    return {
        "alpha": alpha, "beta": beta, "alice": alice, "bob": bob, "client": client,
        "job": submit(alice, alpha, name="alpha-job"),
        "foreign": submit(bob, beta, name="beta-secret-job"),
    }


def row_ids(html: str) -> list[str]:
    return re.findall(r'<tr data-job-id="([0-9a-f-]{36})"', html)


def embedded(html: str, script_id: str):
    match = re.search(rf'<script type="application/json" id="{re.escape(script_id)}">(.*?)</script>', html, re.S)
    assert match, f"no <script id={script_id}>"
    return json.loads(match.group(1))


def train_post(**overrides) -> dict:
    data = {"kind": "train", "name": "from-the-form", "team": "alpha", "spec.workload": "mlp-digits",
            "spec.epochs": "2", "spec.batch_size": "32", "spec.optimizer": "adam", "priority": "0",
            "max_attempts": "3", "time_limit": "10m", "resources.gpus": "", "resources.gpu_memory": "",
            "resources.workers": ""}
    data.update(overrides)
    return {key: value for key, value in data.items() if value is not None}


# --- access ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("url", ["/jobs/", "/jobs/new/"])
def test_anonymous_visitors_are_sent_to_log_in(db, url):
    response = Client().get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_anonymous_detail_is_sent_to_log_in(world):
    response = Client().get(f"/jobs/{world['job'].pk}/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_polled_endpoints_answer_401_rather_than_a_login_page(world):
    anonymous = Client()
    assert anonymous.get("/jobs/rows/").status_code == 401
    assert anonymous.get(f"/jobs/{world['job'].pk}/live/").status_code == 401


# --- list --------------------------------------------------------------------------------------------------

def test_list_shows_only_the_viewers_teams(world):
    response = world["client"].get("/jobs/")
    assert response.status_code == 200
    html = response.content.decode()
    assert row_ids(html) == [str(world["job"].pk)]
    assert "alpha-job" in html
    assert "beta-secret-job" not in html and str(world["foreign"].pk) not in html
    assert 'id="live-status"' in html and 'class="filters"' in html
    assert f'<span class="badge" data-state="{world["job"].state}">{world["job"].state}</span>' in html


def test_list_filters_by_state_kind_owner_and_team(world, make_user, make_team, submit):
    alpha, alice = world["alpha"], world["alice"]
    gamma = make_team("gamma")
    from strata.accounts.services import membership_set

    membership_set(alice, gamma, "member")
    carol = make_user("carol", alpha)
    cancelled = services.job_cancel(submit(alice, alpha, name="cancelled-one"))
    carols = submit(carol, alpha, name="carols-job")
    gammas = submit(alice, gamma, name="gamma-job")
    client = world["client"]

    def ids(query):
        response = client.get("/jobs/?" + query)
        assert response.status_code == 200
        return set(row_ids(response.content.decode()))

    assert ids("") == {str(j.pk) for j in (world["job"], cancelled, carols, gammas)}
    assert ids("state=CANCELLED") == {str(cancelled.pk)}
    assert ids("state=queued,cancelled") == {str(j.pk) for j in (world["job"], cancelled, carols, gammas)}
    assert ids("owner=carol") == {str(carols.pk)}
    assert ids("team=gamma") == {str(gammas.pk)}
    assert ids("team=beta") == set()  # a foreign team filters to nothing, it does not widen the scope
    assert ids("kind=train&owner=alice&team=alpha") == {str(world["job"].pk), str(cancelled.pk)}
    assert ids("kind=serve") == set()


def test_rows_endpoint_returns_the_tbody_with_the_same_filters(world, submit):
    other = services.job_cancel(submit(world["alice"], world["alpha"], name="other"))
    response = world["client"].get("/jobs/rows/?state=CANCELLED")
    assert response.status_code == 200
    html = response.content.decode()
    assert html.strip().startswith('<tbody id="jobs-body"') and html.strip().endswith("</tbody>")
    assert row_ids(html) == [str(other.pk)]
    assert 'data-total="1"' in html
    assert "beta-secret-job" not in world["client"].get("/jobs/rows/").content.decode()


def test_rows_carry_the_state_counts_and_range_for_the_live_page(world, submit):
    services.job_cancel(submit(world["alice"], world["alpha"], name="other"))
    html = world["client"].get("/jobs/rows/?state=QUEUED").content.decode()
    counts = json.loads(html_module.unescape(re.search(r'data-counts="([^"]*)"', html).group(1)))
    assert counts["QUEUED"] == 1 and counts["CANCELLED"] == 1 and counts["RUNNING"] == 0
    assert 'data-range="1–1 of 1 job"' in html
    page = world["client"].get("/jobs/").content.decode()
    assert 'data-count-state="CANCELLED"' in page and "state=CANCELLED" in page


def test_list_is_paginated(world):
    Job.objects.bulk_create([
        Job(team=world["alpha"], owner=world["alice"], kind="train", name=f"bulk-{i}", spec={}, resources={"gpus": 1})
        for i in range(60)
    ])
    first = world["client"].get("/jobs/").content.decode()
    second = world["client"].get("/jobs/?page=2").content.decode()
    assert len(row_ids(first)) == 50
    assert len(row_ids(second)) == 11
    assert not set(row_ids(first)) & set(row_ids(second))
    assert 'rel="next"' in first and "page=2" in first


def test_names_are_escaped(world, submit):
    submit(world["alice"], world["alpha"], name="<script>alert(1)</script>")
    html = world["client"].get("/jobs/").content.decode()
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


# --- submit through the form -------------------------------------------------------------------------------

def test_new_job_page_has_the_form_editor_and_snippets(world):
    response = world["client"].get("/jobs/new/?kind=train")
    assert response.status_code == 200
    html = response.content.decode()
    for marker in ('id="submit-form"', 'id="submit-job"', 'id="spec-editor"', 'id="validate-spec"',
                   'id="submit-editor"', 'id="editor-errors"', 'id="cli-snippet"', 'id="curl-snippet"',
                   'name="csrfmiddlewaretoken"'):
        assert marker in html, marker
    assert "strata submit job.yaml --wait" in html
    assert "http://testserver/api/v1/jobs/" in html
    assert "Authorization: Bearer $STRATA_TOKEN" in html and "Idempotency-Key: " in html
    assert '<option value="alpha" selected>' in html  # the only team is chosen already
    assert "beta" not in re.search(r'<select id="field-team".*?</select>', html, re.S).group(0)


def test_unknown_kind_is_a_404(world):
    assert world["client"].get("/jobs/new/?kind=nope").status_code == 404


def test_public_url_names_the_configured_host(world, monkeypatch, settings):
    monkeypatch.setenv("STRATA_PUBLIC_URL", "https://strata.example.org")
    settings.STRATA_PUBLIC_URL = "https://strata.example.org"
    html = world["client"].get("/jobs/new/").content.decode()
    assert "https://strata.example.org/api/v1/jobs/" in html


def test_a_valid_form_creates_the_job_and_redirects_to_it(world):
    before = Job.objects.count()
    response = world["client"].post("/jobs/new/?kind=train", train_post(**{
        "resources.gpus": "0.5", "resources.gpu_memory": "2GiB", "priority": "5", "spec.lr": "0.01"}))
    assert response.status_code == 302
    assert Job.objects.count() == before + 1
    job = Job.objects.get(name="from-the-form")
    assert response["Location"] == f"/jobs/{job.pk}/"
    assert job.kind == "train" and job.team == world["alpha"] and job.owner == world["alice"]
    assert job.priority == 5 and job.time_limit == 600
    assert job.resources == {"gpus": 0.5, "gpu_memory": 2 * 2**30, "workers": 1}
    # Normalized by the kind's validator: defaults filled in exactly as for the API.
    assert job.spec["workload"] == "mlp-digits" and job.spec["epochs"] == 2 and job.spec["batch_size"] == 32
    assert job.spec["lr"] == 0.01 and job.spec["seed"] == 0 and job.spec["hidden"] == 128
    page = world["client"].get(response["Location"]).content.decode()
    assert "Submitted from-the-form" in page


def test_empty_inputs_take_the_defaults(world):
    response = world["client"].post("/jobs/new/?kind=train", {"kind": "train", "spec.workload": "mlp-digits"})
    assert response.status_code == 302
    job = Job.objects.get(pk=response["Location"].split("/")[2])
    assert job.name == "train-job" and job.team == world["alpha"]  # the only team
    assert job.resources == {"gpus": 1.0, "gpu_memory": None, "workers": 1}
    assert job.time_limit == 3600 and job.max_attempts == 3
    assert job.spec["epochs"] == 3 and job.spec["optimizer"] == "adam"


@pytest.mark.parametrize("field, value, message", [
    ("spec.epochs", "0", "must be >= 1"),
    ("spec.epochs", "abc", "must be an integer"),
    ("spec.epochs", "1.5", "must be an integer"),
    ("spec.lr", "nan", "must be a number"),
    ("resources.gpus", "-1", "must be between 0 and 64"),
    ("resources.gpu_memory", "lots", "invalid size"),
    ("resources.workers", "0", "must be an integer between 1 and 256"),
    ("time_limit", "forever", "invalid duration"),
    ("priority", "500", "less than or equal to 100"),
    ("spec.options", "{not json", "invalid JSON"),
    ("spec.workload", "", "give a workload"),
])
def test_a_bad_value_is_shown_next_to_its_field_and_nothing_is_created(world, field, value, message):
    before = Job.objects.count()
    response = world["client"].post("/jobs/new/?kind=train", train_post(**{field: value}))
    assert response.status_code == 200
    html = response.content.decode()
    error = re.search(rf'<p class="field-error" data-field="{re.escape(field)}">(.*?)</p>', html, re.S)
    assert error, f"no error shown for {field}"
    assert message in html_module.unescape(error.group(1))
    assert re.search(rf'class="field [^"]*has-error[^"]*" data-field="{re.escape(field)}"', html)
    assert Job.objects.count() == before
    # The other values the user typed are kept.
    assert 'value="from-the-form"' in html


def test_every_bad_field_is_reported_at_once(world):
    response = world["client"].post("/jobs/new/?kind=train", train_post(**{
        "spec.epochs": "0", "resources.gpus": "-1", "team": "beta", "time_limit": "forever", "priority": "x",
        "spec.options": "{bad"}))
    html = response.content.decode()
    for field in ("spec.epochs", "resources.gpus", "team", "time_limit", "priority", "spec.options"):
        assert f'<p class="field-error" data-field="{field}">' in html, field
    data = validate(world["client"], "kind: train\nbogus: 1\nspec: {workload: mlp-digits, epochs: 0}\n").json()
    assert set(data["errors"]) == {"bogus", "spec.epochs"}


def test_a_team_that_is_not_mine_is_refused(world):
    before = Job.objects.count()
    response = world["client"].post("/jobs/new/?kind=train", train_post(team="beta"))
    assert response.status_code == 200
    assert re.search(r'data-field="team">unknown team', response.content.decode())
    assert Job.objects.count() == before and not Job.objects.filter(team=world["beta"], name="from-the-form")


def test_a_user_of_several_teams_must_choose(world, make_team):
    from strata.accounts.services import membership_set

    membership_set(world["alice"], make_team("gamma"), "member")
    response = world["client"].post("/jobs/new/?kind=train", train_post(team=""))
    assert 'data-field="team">required: you belong to several teams' in response.content.decode()
    page = world["client"].get("/jobs/new/").content.decode()
    assert "— choose a team —" in page


def test_a_job_that_can_never_fit_the_quota_is_refused_on_resources(world):
    from strata.quotas.models import Quota

    Quota.objects.filter(team=world["alpha"]).update(max_gpus=1)
    before = Job.objects.count()
    response = world["client"].post("/jobs/new/?kind=train", train_post(**{"resources.gpus": "2"}))
    assert response.status_code == 200
    assert re.search(r'data-field="resources">can never run under the team', response.content.decode())
    assert Job.objects.count() == before


def test_posting_one_page_twice_makes_one_job(world):
    data = train_post(nonce="0123456789abcdef0123456789abcdef")
    first = world["client"].post("/jobs/new/?kind=train", data)
    second = world["client"].post("/jobs/new/?kind=train", data)
    assert first["Location"] == second["Location"]
    assert Job.objects.filter(name="from-the-form").count() == 1
    # A changed document from the same page is a new job, not an idempotency conflict.
    third = world["client"].post("/jobs/new/?kind=train", {**data, "spec.epochs": "4"})
    assert third.status_code == 302 and third["Location"] != first["Location"]


# --- the editor's validate endpoint ------------------------------------------------------------------------

def validate(client, document, **extra):
    return client.post("/jobs/new/validate/", {"document": document, **extra}, content_type="application/json")


def test_validate_reports_bad_yaml_on_document_with_its_line(world):
    response = validate(world["client"], "kind: train\nspec: [unclosed\n")
    assert response.status_code == 200
    data = response.json()
    assert data["valid"] is False
    assert "line 3" in data["errors"]["document"] and "invalid YAML" in data["errors"]["document"]
    assert data["location"]["line"] == 3


@pytest.mark.parametrize("document, message", [
    ("", "empty"),
    ("- just\n- a list\n", "mapping"),
    ('{"kind": "train",', "invalid JSON"),
    ("base: &a [1, 2]\nkind: *a\n", "aliases"),
    ("kind: train\nname: 2024-01-01\n", "date"),
    ("kind: train\nspec:\n  lr: .nan\n", "NaN"),
    ("1: train\n", "keys must be strings"),
    (["kind", "train"], "must be YAML or JSON text"),
])
def test_validate_refuses_what_a_json_body_could_not_hold(world, document, message):
    data = validate(world["client"], document).json()
    assert data["valid"] is False and message in data["errors"]["document"]


def test_validate_reports_the_serializers_field_errors(world):
    data = validate(world["client"], "kind: train\nbogus: 1\nspec:\n  workload: mlp-digits\n  wat: 2\n").json()
    assert data["valid"] is False
    assert data["errors"]["bogus"] == "unknown or read-only field"
    data = validate(world["client"], "kind: train\nspec:\n  workload: mlp-digits\n  epochs: -3\n  wat: 2\n").json()
    assert data["errors"]["spec.epochs"] == "must be >= 1"
    assert data["errors"]["spec.wat"].startswith("unknown field")
    data = validate(world["client"], "kind: nope\n").json()
    assert "unknown kind" in data["errors"]["kind"]
    data = validate(world["client"], "kind: train\nteam: beta\nspec: {workload: mlp-digits}\n").json()
    assert data["errors"]["team"] == "unknown team 'beta'"


def test_validate_returns_the_normalized_job_yaml_and_curl(world):
    data = validate(world["client"], open("examples/jobs/digits.yaml").read()).json()
    assert data["valid"] is True and data["errors"] == {}
    assert data["normalized"]["spec"]["epochs"] == 5 and data["normalized"]["time_limit"] == 600
    assert data["normalized"]["team"] == "alpha"
    assert "time_limit: 10m" in data["yaml"] and "workload: mlp-digits" in data["yaml"]
    assert "/api/v1/jobs/" in data["curl"] and "Idempotency-Key" in data["curl"]
    assert "strata submit job.yaml --wait" in data["cli"]
    assert Job.objects.filter(name="digits-mlp").count() == 0  # validating creates nothing


def test_validate_accepts_json_documents_and_form_fields(world):
    data = validate(world["client"], json.dumps({"kind": "train", "spec": {"workload": "tiny-gpt"}})).json()
    assert data["valid"] is True and data["normalized"]["spec"]["hidden"] == 64
    form = world["client"].post("/jobs/new/validate/", train_post(**{"spec.epochs": "0"})).json()
    assert form["valid"] is False and form["errors"] == {"spec.epochs": "must be >= 1"}
    assert "epochs: 0" in form["yaml"]  # the document as given, so the snippet follows the form


def test_the_generated_yaml_submits_the_same_job(world):
    first = validate(world["client"], "kind: train\nname: x\nresources: {gpu_memory: 512MiB}\n"
                                      "spec: {workload: mlp-digits, epochs: 2}\n").json()
    assert "gpu_memory: 512MiB" in first["yaml"]
    again = validate(world["client"], first["yaml"]).json()
    assert again["valid"] is True and again["normalized"] == first["normalized"]
    assert again["normalized"]["resources"] == {"gpus": 0.0, "gpu_memory": 512 * 2**20, "workers": 1}


def test_the_editor_submits_with_submit_true(world):
    response = validate(world["client"], "kind: train\nname: from-editor\nspec: {workload: mlp-digits}\n",
                        submit=True, nonce="ab" * 16)
    assert response.status_code == 201
    job = Job.objects.get(name="from-editor")
    assert response.json()["redirect"] == f"/jobs/{job.pk}/"
    response = validate(world["client"], "kind: train\nname: from-editor\nspec: {workload: mlp-digits}\n",
                        submit=True, nonce="ab" * 16)
    assert response.json()["job_id"] == str(job.pk)  # the same page's retry: the same job
    bad = validate(world["client"], "kind: train\nspec: {workload: mlp-digits, epochs: 0}\n", submit=True)
    assert bad.status_code == 200 and bad.json()["errors"] == {"spec.epochs": "must be >= 1"}


# --- detail --------------------------------------------------------------------------------------------------

def test_a_foreign_or_missing_job_is_a_404_everywhere(world):
    client, foreign = world["client"], world["foreign"]
    for url in (f"/jobs/{foreign.pk}/", f"/jobs/{foreign.pk}/live/", "/jobs/00000000-0000-0000-0000-000000000000/"):
        assert client.get(url).status_code == 404, url
    for url in (f"/jobs/{foreign.pk}/cancel/", f"/jobs/{foreign.pk}/resubmit/"):
        assert client.post(url).status_code == 404, url
    foreign.refresh_from_db()
    assert foreign.state != JobState.CANCELLED
    assert Job.objects.filter(team=world["beta"]).count() == 1


def test_detail_shows_state_facts_and_spec(world):
    job = world["job"]
    html = world["client"].get(f"/jobs/{job.pk}/").content.decode()
    assert f'id="job-state" class="badge large" data-state="{job.state}"' in html
    assert 'id="job-reason"' in html and "admitted under quota" in html
    assert "workload: mlp-digits" in re.search(r'<pre id="job-spec".*?</pre>', html, re.S).group(0)
    assert 'id="cancel-job"' in html and 'id="resubmit-job"' in html
    assert 'id="attempts"' in html and 'id="artifacts"' in html and 'id="events"' in html
    assert "PENDING: submitted" in html  # the events list
    assert "/assets/plotly.min.js" in html
    live = embedded(html, "job-live-config")
    assert live["url"] == f"/jobs/{job.pk}/live/" and live["terminal"] is False


def test_charts_embed_the_metric_points(world):
    job = world["job"]
    for step in range(1, 6):
        MetricPoint.objects.create(job=job, name="loss", step=step, value=1 / step)
        MetricPoint.objects.create(job=job, name="test_loss", step=step, value=2 / step)
        MetricPoint.objects.create(job=job, name="test_accuracy", step=step, value=step / 10)
        MetricPoint.objects.create(job=job, name="samples_per_s", step=step, value=100 * step)
    MetricPoint.objects.create(job=job, name="loss", step=6, value=float("inf"))  # SQLite stores NaN as NULL
    html = world["client"].get(f"/jobs/{job.pk}/").content.decode()
    loss = embedded(html, "fig-loss")
    traces = {trace["name"]: trace for trace in loss["data"]}
    assert set(traces) == {"loss", "test_loss"}
    assert traces["loss"]["x"] == [1, 2, 3, 4, 5, 6] and traces["loss"]["y"][:2] == [1.0, 0.5]
    assert traces["loss"]["y"][-1] is None  # a gap, never invalid JSON
    assert 'id="chart-loss" class="chart" data-figure="fig-loss"' in html
    assert [t["name"] for t in embedded(html, "fig-accuracy")["data"]] == ["test_accuracy"]
    assert embedded(html, "fig-throughput")["data"][0]["y"] == [100, 200, 300, 400, 500]
    assert 'id="chart-other"' not in html  # only when a metric fits no other chart
    MetricPoint.objects.create(job=job, name="grad_norm", step=1, value=3.0)
    MetricPoint.objects.create(job=job, name="grad_norm", step=2, value=2.0)
    assert embedded(world["client"].get(f"/jobs/{job.pk}/").content.decode(), "fig-other")["data"][0]["name"] == "grad_norm"


def test_long_series_are_downsampled(world):
    job = world["job"]
    MetricPoint.objects.bulk_create([MetricPoint(job=job, name="loss", step=i, value=i) for i in range(5001)])
    trace = embedded(world["client"].get(f"/jobs/{job.pk}/").content.decode(), "fig-loss")["data"][0]
    assert 1000 < len(trace["x"]) <= 2002
    assert trace["x"][0] == 0 and trace["x"][-1] == 5000 and trace["x"] == sorted(trace["x"])


def test_logs_show_the_last_lines(world):
    job = world["job"]
    LogLine.objects.bulk_create([LogLine(job=job, message=f"line-{i:05d}") for i in range(2100)])
    LogLine.objects.create(job=job, message="<b>bold</b>")
    html = world["client"].get(f"/jobs/{job.pk}/").content.decode()
    logs = re.search(r'<pre id="logs".*?</pre>', html, re.S).group(0)
    assert "line-02099" in logs and "line-00101" in logs and "line-00100" not in logs
    assert "&lt;b&gt;bold&lt;/b&gt;" in logs
    assert "last 2000 of 2101 lines" in html


def test_live_returns_what_is_new_after_the_cursors(world):
    job, client = world["job"], world["client"]
    LogLine.objects.create(job=job, message="old line")
    MetricPoint.objects.create(job=job, name="loss", step=1, value=0.9)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    cursors = embedded(html, "job-live-config")["cursors"]
    LogLine.objects.create(job=job, message="new line")
    MetricPoint.objects.create(job=job, name="loss", step=2, value=0.7)
    MetricPoint.objects.create(job=job, name="accuracy", step=2, value=0.6)
    services.job_event(job.pk, "note", "something happened")
    query = f"events_after={cursors['events']}&logs_after={cursors['logs']}&metrics_after={cursors['metrics']}"
    data = client.get(f"/jobs/{job.pk}/live/?{query}").json()
    assert data["state"] == job.state and data["terminal"] is False
    assert [line["text"].split("  ", 1)[1] for line in data["logs"]] == ["new line"]
    assert data["metrics"] == {"loss": {"x": [2], "y": [0.7], "chart": "loss", "text": "0.7"},
                               "accuracy": {"x": [2], "y": [0.6], "chart": "accuracy", "text": "0.6"}}
    assert [event["message"] for event in data["events"]] == ["something happened"]
    assert data["cursors"]["logs"] > cursors["logs"] and data["cursors"]["metrics"] > cursors["metrics"]
    assert "No attempts yet" in data["attempts_html"] and "No artifacts yet" in data["artifacts_html"]
    assert "panels" not in data
    again = client.get(f"/jobs/{job.pk}/live/?events_after={data['cursors']['events']}"
                       f"&logs_after={data['cursors']['logs']}&metrics_after={data['cursors']['metrics']}").json()
    assert again["logs"] == [] and again["metrics"] == {} and again["events"] == []
    assert client.get(f"/jobs/{job.pk}/live/?logs_after=x").status_code == 400


def test_attempts_and_artifacts(world, make_node, run_pass):
    job, client = world["job"], world["client"]
    node = make_node("n1", gpus=2)
    run_pass()
    attempt = Attempt.objects.get(job=job)
    services.attempt_claim(attempt.pk, attempt.fencing_token, node)
    artifact = services.artifact_store(attempt, "model.pt", io.BytesIO(b"weights"))
    services.artifact_store(attempt, "ckpt", io.BytesIO(b"state"), kind="checkpoint")
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    attempts = re.search(r'<table id="attempts">.*?</table>', html, re.S).group(0)
    assert "n1:gpu0 (1, virtual)" in attempts and 'data-outcome="running"' in attempts
    artifacts = re.search(r'<ul id="artifacts".*?</ul>', html, re.S).group(0)
    url = f"/api/v1/jobs/{job.pk}/artifacts/{artifact.pk}/download/"
    assert f'href="{url}"' in artifacts and "model.pt" in artifacts and "ckpt" not in artifacts
    download = client.get(url)  # the API's download works with the browser session
    assert download.status_code == 200 and b"".join(download.streaming_content) == b"weights"
    services.attempt_finish(attempt.pk, attempt.fencing_token, node, "succeeded")
    data = client.get(f"/jobs/{job.pk}/live/").json()
    assert data["state"] == "SUCCEEDED" and data["terminal"] is True
    assert data["attempts_html"].count(">succeeded<") == 1
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="cancel-job"' not in html and 'id="resubmit-job"' in html
    assert embedded(html, "job-live-config")["terminal"] is True


def test_cancel(world):
    job, client = world["job"], world["client"]
    response = client.post(f"/jobs/{job.pk}/cancel/")
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED and job.reason == "cancelled by alice"
    assert client.get(f"/jobs/{job.pk}/cancel/").status_code == 405
    assert client.post(f"/jobs/{job.pk}/cancel/").status_code == 302  # cancelling again is harmless


def test_resubmit_makes_a_new_job_and_goes_to_it(world):
    job, client = world["job"], world["client"]
    services.job_cancel(job)
    response = client.post(f"/jobs/{job.pk}/resubmit/")
    new_job = Job.objects.exclude(pk__in=[job.pk, world["foreign"].pk]).get()
    assert response.status_code == 302 and response["Location"] == f"/jobs/{new_job.pk}/"
    assert new_job.spec == job.spec and new_job.resources == job.resources and new_job.team == job.team
    assert new_job.owner == world["alice"] and new_job.state == JobState.QUEUED


def test_posts_need_the_csrf_token(world):
    client = Client(enforce_csrf_checks=True)
    client.force_login(world["alice"])
    job = world["job"]
    assert client.post(f"/jobs/{job.pk}/cancel/").status_code == 403
    assert client.post(f"/jobs/{job.pk}/resubmit/").status_code == 403
    assert client.post("/jobs/new/?kind=train", train_post()).status_code == 403
    assert client.post("/jobs/new/validate/", {"document": "kind: train"}, content_type="application/json").status_code == 403
    job.refresh_from_db()
    assert job.state != JobState.CANCELLED and Job.objects.count() == 2
    # With the token from the page, the same POST works.
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    assert client.post(f"/jobs/{job.pk}/cancel/", {"csrfmiddlewaretoken": token}).status_code == 302


def test_web_submits_share_the_api_submit_throttle(world, monkeypatch):
    from django.core.cache import cache

    from strata.api.throttles import SubmitThrottle

    cache.clear()
    monkeypatch.setattr(SubmitThrottle, "THROTTLE_RATES", {**SubmitThrottle.THROTTLE_RATES, "submit": "2/min"})
    try:
        client = world["client"]
        for name in ("one", "two"):
            assert client.post("/jobs/new/?kind=train", train_post(name=name)).status_code == 302
        response = client.post("/jobs/new/?kind=train", train_post(name="three"))
        assert response.status_code == 200
        assert "too many submits" in response.content.decode()
        assert not Job.objects.filter(name="three").exists()
    finally:
        cache.clear()
