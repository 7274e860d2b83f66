def test_submit_places_job_on_a_node(make_team, make_user, make_token, make_node, api, job_body,
                                     django_capture_on_commit_callbacks):
    team = make_team("alpha")
    user = make_user("alice", team)
    make_node("n1", gpus=1)
    client = api(make_token(user, team))
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/api/v1/jobs/", job_body(), format="json")
    assert response.status_code == 201, response.content
    job = client.get(f"/api/v1/jobs/{response.json()['id']}/").json()
    assert job["state"] == "SCHEDULED"
    assert job["attempts"][0]["allocations"][0]["share"] == 1.0
