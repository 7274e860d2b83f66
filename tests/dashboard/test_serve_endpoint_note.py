"""The job page of a serve job says, in its endpoint panel, that the endpoint is loopback-only and unauthenticated."""

from __future__ import annotations

import io

from django.test import Client
from node_protocol import NodeProtocol

from strata.jobs.models import Attempt

NOTE = ("It listens on the node's loopback interface only and has no authentication (auth: none), so only "
        "processes on that node can call it.")


def test_the_serve_job_page_says_the_endpoint_is_loopback_only_and_unauthenticated(
        make_team, make_user, make_token, make_node, node_token, api, submit, run_pass):
    from strata.jobs.services import artifact_store

    team = make_team("alpha")
    user = make_user("alice", team)
    node = make_node("n1", gpus=1)
    agent, client = api(node_token), api(make_token(user, team))

    def node_call(attempt, verb, **body):
        response = NodeProtocol(agent, attempt, node).post(verb, body)
        assert response.status_code == 200, response.content
        return response

    source = submit(user, team, gpus=0.5)  # a train job that finished with a model.pt
    run_pass()
    attempt = Attempt.objects.get(job=source, ended_at__isnull=True)
    node_call(attempt, "claim")
    artifact_store(attempt, "model.pt", io.BytesIO(b"weights"))
    node_call(attempt, "finish", outcome="succeeded")

    response = client.post("/api/v1/jobs/", {"kind": "serve", "name": "serve-it", "resources": {"gpus": 0.25},
                                             "spec": {"model": {"job": str(source.pk)}, "auth": "none"}},
                           format="json")
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]
    browser = Client()
    browser.force_login(user)
    page = browser.get(f"/jobs/{job_id}/").content.decode()
    assert 'data-panel="serve-endpoint"' not in page  # no endpoint yet, nothing to say

    run_pass()
    attempt = Attempt.objects.get(job_id=job_id, ended_at__isnull=True)
    node_call(attempt, "claim")
    node_call(attempt, "report", endpoint="127.0.0.1:50999")
    page = browser.get(f"/jobs/{job_id}/").content.decode()
    assert 'id="job-endpoint">127.0.0.1:50999' in page
    panels = {panel["slug"]: panel for panel in browser.get(f"/jobs/{job_id}/live/?panels=1").json()["panels"]}
    assert panels["serve-endpoint"]["text"] == (f"gRPC Predict on 127.0.0.1:50999: strata infer {job_id} "
                                                f"--input rows.json. {NOTE}")


def test_a_token_serve_job_page_says_calls_need_a_deployment_token():
    from components.runtime.contract.panels import StaticPanelData
    from components.serving.panels import ServeEndpointPanel

    data = StaticPanelData(job={"id": "j1", "endpoint": "10.0.0.7:50999", "spec": {"auth": "token"}})
    text = ServeEndpointPanel().render(data)["text"]
    assert "deployment tokens" in text and "strata job-token create j1" in text
