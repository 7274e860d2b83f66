"""Jobs and team secrets: ``spec.environment.secrets`` names secrets of the job's own team (checked at submit, a
400 naming the field), the attempt's claim answer carries exactly those values (decrypted at claim time), and the
values are replaced by ``***`` in the log lines and the finish reason the attempt reports before they are
stored, so no event, log line or history record holds one."""

from __future__ import annotations

import json

import pytest
from node_protocol import NodeProtocol

from strata.accounts import team_secrets
from strata.jobs.models import Attempt, JobEvent, LogLine

PREFIX = "/api/v1/"
HF = "hf_alpha-secret-0123456789"
DB = "postgres-password-alpha"


@pytest.fixture
def teams(make_team, make_user, make_token, api):
    alpha, beta = make_team("alpha"), make_team("beta")
    alice, bob = make_user("alice", alpha), make_user("bob", beta)
    team_secrets.secret_set(alpha, "HF_TOKEN", HF, user=alice)
    team_secrets.secret_set(alpha, "DB_PASSWORD", DB, user=alice)
    team_secrets.secret_set(alpha, "UNUSED", "alpha-unused-value", user=alice)
    team_secrets.secret_set(beta, "HF_TOKEN", "hf_beta-other-team-value", user=bob)
    team_secrets.secret_set(beta, "BETA_ONLY", "beta-only-value", user=bob)
    return {"alpha": alpha, "beta": beta, "a": api(make_token(alice, alpha)), "b": api(make_token(bob, beta))}


def _job(client, secrets, **spec):
    body = {"kind": "train", "name": "with-secrets", "resources": {"gpus": 0.25}, "max_attempts": 2,
            "spec": {"command": ["python", "main.py"], "environment": {"secrets": secrets}, **spec}}
    return client.post(f"{PREFIX}jobs/", body, format="json")


def test_a_job_may_name_only_secrets_of_its_own_team(teams):
    accepted = _job(teams["a"], ["HF_TOKEN", "DB_PASSWORD"])
    assert accepted.status_code == 201, accepted.content
    assert accepted.json()["spec"]["environment"]["secrets"] == ["HF_TOKEN", "DB_PASSWORD"]
    for client, names, missing in ((teams["a"], ["HF_TOKEN", "NOPE"], "NOPE"),
                                   (teams["a"], ["BETA_ONLY"], "BETA_ONLY"),  # another team's: like a missing one
                                   (teams["b"], ["DB_PASSWORD"], "DB_PASSWORD")):
        refused = _job(client, names)
        assert refused.status_code == 400 and set(refused.json()) == {"spec.environment.secrets"}, refused.content
        assert missing in refused.json()["spec.environment.secrets"][0]
    for names in ("HF_TOKEN", ["path"], ["PATH"], ["STRATA_NODE_TOKEN"], ["LD_PRELOAD"], [1], ["A"] * 65):
        refused = _job(teams["a"], names)
        assert refused.status_code == 400 and "spec.environment.secrets" in refused.json(), (names, refused.content)
    both = _job(teams["a"], ["HF_TOKEN"], environment={"secrets": ["HF_TOKEN"], "env": {"HF_TOKEN": "x"}})
    assert both.status_code == 400 and "spec.environment.secrets" in both.json()
    # Every bad field at once: a bad secret list does not hide another bad field.
    several = _job(teams["a"], ["path"], epochs=0)
    assert several.status_code == 400 and {"spec.environment.secrets", "spec.epochs"} <= set(several.json())


def test_resubmitting_checks_the_secrets_again(teams):
    job = _job(teams["a"], ["DB_PASSWORD"]).json()
    team_secrets.secret_delete(team_secrets.Secret.objects.get(team=teams["alpha"], name="DB_PASSWORD"))
    again = teams["a"].post(f"{PREFIX}jobs/{job['id']}/resubmit/")
    assert again.status_code == 400 and "DB_PASSWORD" in again.json()["spec.environment.secrets"][0]


def _claim(teams, make_node, node_token, api, run_pass, names):
    node = make_node("n1", gpus=2)
    created = _job(teams["a"], names) if names is not None else teams["a"].post(
        f"{PREFIX}jobs/", {"kind": "train", "name": "plain", "resources": {"gpus": 0.25},
                           "spec": {"command": ["python", "main.py"]}}, format="json")
    assert created.status_code == 201, created.content
    run_pass()
    attempt = Attempt.objects.get(job_id=created.json()["id"])
    protocol = NodeProtocol(api(node_token), attempt, node)
    claimed = protocol.claim()
    assert claimed.status_code == 200, claimed.content
    return protocol, claimed.json()


def test_the_claim_answer_carries_exactly_the_requested_secrets_of_the_jobs_team(teams, make_node, node_token, api,
                                                                                run_pass):
    _, answer = _claim(teams, make_node, node_token, api, run_pass, ["HF_TOKEN", "DB_PASSWORD"])
    assert answer["secrets"] == {"HF_TOKEN": HF, "DB_PASSWORD": DB}  # not beta's HF_TOKEN, not UNUSED


def test_a_job_that_names_no_secrets_gets_an_empty_mapping(teams, make_node, node_token, api, run_pass):
    _, answer = _claim(teams, make_node, node_token, api, run_pass, None)
    assert answer["secrets"] == {}


def test_values_are_read_at_claim_time_and_a_deleted_one_is_an_event_naming_it(teams, make_node, node_token, api,
                                                                               run_pass):
    node = make_node("n1", gpus=2)
    created = _job(teams["a"], ["HF_TOKEN", "DB_PASSWORD"]).json()
    team_secrets.secret_set(teams["alpha"], "HF_TOKEN", "hf_replaced-after-submit")
    team_secrets.secret_delete(team_secrets.Secret.objects.get(team=teams["alpha"], name="DB_PASSWORD"))
    run_pass()
    attempt = Attempt.objects.get(job_id=created["id"])
    answer = NodeProtocol(api(node_token), attempt, node).claim()
    assert answer.json()["secrets"] == {"HF_TOKEN": "hf_replaced-after-submit"}
    event = JobEvent.objects.get(job_id=created["id"], kind="secrets")
    assert "DB_PASSWORD" in event.message and event.data["names"] == ["DB_PASSWORD"]


def test_logs_and_the_finish_reason_are_redacted(teams, make_node, node_token, api, run_pass, settings, tmp_path,
                                                 django_capture_on_commit_callbacks):
    settings.STRATA_HISTORY_LOG = str(tmp_path / "history.jsonl")
    team_secrets.secret_set(teams["alpha"], "PEM", "-----BEGIN KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEF\nabc\n-----END KEY-----")
    team_secrets.secret_set(teams["alpha"], "SHORT", "abc")
    protocol, _ = _claim(teams, make_node, node_token, api, run_pass, ["HF_TOKEN", "PEM", "SHORT"])
    attempt = protocol.attempt
    logs = [{"message": f"token is {HF}!"}, {"message": f"{HF}{HF}"}, {"message": "MIIEvQIBADANBgkqhkiG9w0BAQEF"},
            {"message": "abc stays (too short to redact)"}, {"message": f"other team's {DB} is not this job's"},
            {"message": "UNUSED alpha-unused-value is not asked for"}]
    with django_capture_on_commit_callbacks(execute=True):
        assert protocol.report(logs=logs).status_code == 200
    stored = list(LogLine.objects.filter(job_id=attempt.job_id).order_by("id").values_list("message", flat=True))
    assert stored[:4] == ["token is ***!", "******", "***", "abc stays (too short to redact)"]
    assert DB in stored[4]  # a secret the job did not ask for is not the job's to leak: left as it is
    with django_capture_on_commit_callbacks(execute=True):
        finished = protocol.finish("failed", reason=f"exit code 1: KeyError: '{HF}'")
    assert finished.status_code == 200
    attempt.refresh_from_db()
    assert attempt.exit_reason == "exit code 1: KeyError: '***'"
    events = [f"{e.kind} {e.message} {json.dumps(e.data)}" for e in JobEvent.objects.filter(job_id=attempt.job_id)]
    records = (tmp_path / "history.jsonl").read_text()
    assert '"op":"finish"' in records
    answers = teams["a"].get(f"{PREFIX}jobs/{attempt.job_id}/").content.decode() + teams["a"].get(
        f"{PREFIX}jobs/{attempt.job_id}/logs/").content.decode() + teams["a"].get(
        f"{PREFIX}jobs/{attempt.job_id}/events/").content.decode()
    for text in (*events, records, answers, *stored):
        assert HF not in text and "MIIEvQIBADANBgkqhkiG9w0BAQEF" not in text
