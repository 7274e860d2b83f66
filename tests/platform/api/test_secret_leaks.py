"""Secrets never leak: API tokens, job access tokens, node tokens, participant secrets, fencing tokens, job
credentials, passwords, team secrets and the secret key never appear in the log (every logger, at DEBUG), in job
events or log lines, in the operation history, in the login counters, in the secrets table, or in any answer except
the one that hands the secret to its holder (and, for fencing tokens, job credentials and team secrets, the node's
own protocol answers: a team secret only in the claim of an attempt of a job that asks for it).

The flows that handle secrets are driven through the API and the dashboard as a user and a node would: token
create, use and revoke, failed authentication with wrong, malformed and NUL-carrying tokens, failed logins
(a password typed into the user-name box too), a submit whose spec carries something secret-looking, node claims,
reports and credentials, the 409 of a stale fencing token, a participant joining, heartbeating and leaving, team
secrets set, replaced, listed, read and deleted (API and page), and a job that asks for one and prints it in its
logs and its finish reason.
"""

from __future__ import annotations

import json
import logging

import pytest
from django.test import Client
from node_protocol import NodeProtocol

from strata.accounts.models import LoginThrottle, Secret
from strata.jobs.models import Attempt, Job, JobEvent, LogLine

PREFIX = "/api/v1/"


class Everything(logging.Handler):
    """Every record of every logger, formatted with its traceback (the console formatter's view and more)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        text = f"{record.name} {record.levelname} {record.getMessage()} {record.args!r}"
        if record.exc_info:
            text += logging.Formatter().formatException(record.exc_info)
        self.lines.append(text)


@pytest.fixture
def everything(caplog):
    caplog.set_level(logging.DEBUG)
    handler = Everything()
    loggers = [logging.getLogger()] + [logging.getLogger(name) for name in list(logging.Logger.manager.loggerDict)]
    hooked = [logger for logger in loggers if logger is logging.getLogger() or not logger.propagate]
    for logger in hooked:
        logger.addHandler(handler)
    yield handler
    for logger in hooked:
        logger.removeHandler(handler)


class Seen:
    """What a flow's answers said: ``holder`` answers (where a secret is handed to whoever holds it) apart."""

    def __init__(self):
        self.answers: list[tuple[str, str]] = []
        self.holder: list[tuple[str, str]] = []

    def __call__(self, label: str, response, *, holder: bool = False):
        body = b"".join(response.streaming_content) if hasattr(response, "streaming_content") else response.content
        text = body.decode(errors="replace") + " " + json.dumps(sorted((k, v) for k, v in response.items()))
        (self.holder if holder else self.answers).append((label, text))
        return response


def test_no_secret_reaches_logs_events_or_answers(everything, make_team, make_user, make_token, make_node,
                                                   node_token, run_pass, api, settings, tmp_path, login_clock):
    settings.STRATA_HISTORY_LOG = str(tmp_path / "history.jsonl")
    seen = Seen()
    alpha, beta = make_team("alpha", max_gpus=16.0), make_team("beta")
    alice, bob = make_user("alice", alpha, "team-admin"), make_user("bob", beta)
    node = make_node("n1", gpus=4)
    raw = make_token(alice, alpha)
    a, b, agent = api(raw), api(make_token(bob, beta)), api(node_token)

    # --- API tokens: create (the raw value is in that answer only), use, list, revoke, use again ------------
    child = seen("token create", a.post(f"{PREFIX}tokens/", {"name": "ci"}, format="json"), holder=True).json()
    child_raw = child["token"]
    seen("child use", api(child_raw).get(f"{PREFIX}jobs/"))
    seen("token list", a.get(f"{PREFIX}tokens/"))
    seen("token read", a.get(f"{PREFIX}tokens/{child['id']}/"))
    assert seen("token revoke", a.delete(f"{PREFIX}tokens/{child['id']}/")).status_code == 204
    assert seen("revoked use", api(child_raw).get(f"{PREFIX}jobs/")).status_code == 401
    wrong = raw[:-6] + "ZZZZZZ"
    for value in (wrong, "st_" + "q" * 60, f"{raw} {raw}"):
        assert seen("wrong token", Client().get(f"{PREFIX}jobs/", HTTP_AUTHORIZATION=f"Bearer {value}")) \
            .status_code == 401
    nul = Client().get(f"{PREFIX}jobs/", HTTP_AUTHORIZATION=f"Bearer {raw[:-2]}\x00x")
    assert seen("NUL token", nul).status_code == 400
    assert seen("token as a node", api(raw).post(f"{PREFIX}node/heartbeat/", {}, format="json")).status_code == 403

    # --- logins: a wrong password, and a password typed into the user-name box --------------------------
    password, typo = "pw-alice", "hunter2-correct-horse"
    browser = Client()
    for username, given in (("alice", typo), (typo, typo), ("alice", "")):
        # The form types the user name back into its box, to the browser that typed it: a holder answer.
        seen("login", browser.post("/login/", {"username": username, "password": given}), holder=username == typo)
        login_clock.advance(60)
    seen("api-auth login", Client().post("/api-auth/login/", {"username": "alice", "password": typo}))
    login_clock.advance(60)
    assert seen("login ok", browser.post("/login/", {"username": "alice", "password": password})).status_code == 302

    # --- a submit carrying something secret-looking, and a job that runs on the node --------------------------
    spec_secret = "AKIA-spec-secret-0123456789"
    refused = a.post(f"{PREFIX}jobs/", {"kind": "train", "spec": {"workload": "mlp-digits",
                                                                  "env": {"AWS_SECRET_ACCESS_KEY": spec_secret}}},
                     format="json")
    assert seen("submit with env", refused).status_code == 400
    submitted = a.post(f"{PREFIX}jobs/", {"kind": "decentralized-train", "name": "swarm", "max_attempts": 1,
                                          "resources": {"gpus": 0.25, "workers": 2},
                                          "spec": {"model": "tiny", "steps": 10}}, format="json")
    assert seen("submit", submitted).status_code == 201, submitted.content
    job = Job.objects.get(pk=submitted.json()["id"])
    run_pass()
    attempt = Attempt.objects.get(job=job)
    fence = attempt.fencing_token
    protocol = NodeProtocol(agent, attempt, node)
    assert seen("claim", protocol.claim(), holder=True).status_code == 200
    report = {"logs": [{"message": "step 1"}], "metrics": [{"name": "loss", "step": 1, "value": 0.5}]}
    seen("report", protocol.report(**report), holder=True)
    credential = protocol.post("credential", {"subject": "p2p:QmRank0"})
    assert seen("credential", credential, holder=True).status_code == 200
    node_credential = credential.json()["credential"]
    # Stale fencing tokens: a made-up one, the right one from the wrong node, a cut-off one.
    other = make_node("n2", gpus=1)
    stale = fence[:-4] + ("beef" if not fence.endswith("beef") else "f00d")  # never the right one by chance
    for label, wrong in (("stale claim", {"token": stale}), ("wrong node", {"node": other}),
                         ("short token", {"token": fence[:8]})):
        answer = protocol.report(**wrong, logs=[{"message": "zombie"}])
        assert seen(label, answer).status_code == 409, (label, answer.content)
    upload = protocol.put("artifacts/x.bin", b"x", token=stale)
    assert seen("stale upload", upload).status_code == 409
    assert seen("node 400", agent.post(protocol.url("report"), {"token": fence}, format="json")) \
        .status_code == 400

    # --- team secrets: set, replace, list, read, delete; a job that asks for one gets it in its claim only ------
    team_secret = "ghp_team-secret-value-0123456789"
    assert seen("secret set", a.post(f"{PREFIX}secrets/", {"name": "GH_TOKEN", "value": "first-" + team_secret},
                                     format="json")).status_code == 201
    assert seen("secret replace", a.post(f"{PREFIX}secrets/", {"name": "GH_TOKEN", "value": team_secret},
                                         format="json")).status_code == 200
    assert seen("secret bad", a.post(f"{PREFIX}secrets/", {"name": "PATH", "value": team_secret},
                                     format="json")).status_code == 400
    assert seen("secret throwaway", a.post(f"{PREFIX}secrets/", {"name": "GONE", "value": "gone-" + team_secret},
                                           format="json")).status_code == 201
    seen("secret list", a.get(f"{PREFIX}secrets/"))
    seen("secret read", a.get(f"{PREFIX}secrets/GH_TOKEN/"))
    seen("foreign secret read", b.get(f"{PREFIX}secrets/GH_TOKEN/"))
    assert seen("secret delete", a.delete(f"{PREFIX}secrets/GONE/")).status_code == 204
    seen("secrets page", browser.get("/team/secrets/"))
    seen("secrets page set", browser.post("/team/secrets/", {"team": "alpha", "action": "set", "name": "lower",
                                                             "value": team_secret}))
    using = a.post(f"{PREFIX}jobs/", {"kind": "train", "name": "uses-a-secret", "max_attempts": 1,
                                     "resources": {"gpus": 0.25},
                                     "spec": {"command": ["true"], "environment": {"secrets": ["GH_TOKEN"]}}},
                   format="json")
    assert seen("submit with a secret", using).status_code == 201, using.content
    run_pass()
    secret_attempt = Attempt.objects.get(job_id=using.json()["id"])
    secret_node = protocol.of(secret_attempt, node)
    claimed = secret_node.claim()
    assert seen("claim with a secret", claimed, holder=True).json()["secrets"] == {"GH_TOKEN": team_secret}
    leaked = {"logs": [{"message": f"GH_TOKEN={team_secret}"}, {"message": team_secret}]}
    seen("report of a secret", secret_node.report(**leaked), holder=True)
    seen("finish of a secret", secret_node.finish("failed", reason=f"bad token {team_secret}"), holder=True)
    for path in ("", "events/", "logs/"):
        seen(f"job with a secret {path}", a.get(f"{PREFIX}jobs/{secret_attempt.job_id}/{path}"))
    seen("job page with a secret", browser.get(f"/jobs/{secret_attempt.job_id}/"))

    # --- job access tokens and a participant ----------------------------------------------------------------
    issued = a.post(f"{PREFIX}jobs/{job.pk}/tokens/", {"name": "volunteers"}, format="json")
    assert seen("job token create", issued, holder=True).status_code == 201
    job_raw = issued.json()["token"]
    seen("job tokens", a.get(f"{PREFIX}jobs/{job.pk}/tokens/"))
    joined = api(job_raw).post(f"{PREFIX}participants/", {"job": str(job.pk), "name": "lab", "gpus": 0.5},
                               format="json")
    assert seen("join", joined, holder=True).status_code == 201, joined.content
    participant, secret = joined.json()["id"], joined.json()["secret"]
    beat = api(secret).post(f"{PREFIX}participants/{participant}/heartbeat/", {"subject": "p2p:QmLab"}, format="json")
    assert seen("heartbeat", beat, holder=True).status_code == 200
    participant_credential = beat.json()["credential"]["credential"]
    for label, value in (("join with a wrong token", job_raw[:-3] + "xyz"), ("join with a user token", raw)):
        answer = api(value).post(f"{PREFIX}participants/", {"job": str(job.pk)}, format="json")
        assert seen(label, answer).status_code == 401
    answer = api(secret[:-3] + "xyz").post(f"{PREFIX}participants/{participant}/heartbeat/", {}, format="json")
    assert seen("heartbeat with a wrong secret", answer).status_code in {401, 404}
    seen("participants", a.get(f"{PREFIX}jobs/{job.pk}/participants/"))
    assert seen("leave", api(secret).post(f"{PREFIX}participants/{participant}/leave/")).status_code == 200
    token_id = issued.json()["id"]
    assert seen("job token revoke", a.delete(f"{PREFIX}jobs/{job.pk}/tokens/{token_id}/")).status_code == 200
    assert seen("revoked job token", api(job_raw).post(f"{PREFIX}participants/", {"job": str(job.pk)},
                                                         format="json")).status_code == 401

    # --- everything the job's viewers see: the API and the dashboard, the owner and another team ----------
    for label, client in (("owner", a), ("foreign", b)):
        for path in ("", "events/", "logs/", "metrics/", "artifacts/", "participants/", "tokens/"):
            seen(f"{label} job {path}", client.get(f"{PREFIX}jobs/{job.pk}/{path}"))
        seen(f"{label} job list", client.get(f"{PREFIX}jobs/"))
        seen(f"{label} nodes", client.get(f"{PREFIX}nodes/"))
    seen("detail page", browser.get(f"/jobs/{job.pk}/"))
    seen("live", browser.get(f"/jobs/{job.pk}/live/?panels=1"))
    seen("cluster page", browser.get("/cluster/"))
    seen("resubmit", a.post(f"{PREFIX}jobs/{job.pk}/resubmit/"))
    seen("cancel", a.post(f"{PREFIX}jobs/{job.pk}/cancel/"))
    assert seen("finish after cancel", protocol.finish("failed"), holder=True).status_code in {200, 409}

    # --- where secrets must never be ----------------------------------------------------------------------
    secrets = {"user token": raw, "child token": child_raw, "node token": node_token, "job token": job_raw,
               "participant secret": secret, "fencing token": fence, "node credential": node_credential,
               "participant credential": participant_credential, "password": password, "typed password": typo,
               "spec secret": spec_secret, "secret key": settings.SECRET_KEY, "team secret": team_secret}
    # Parts that are secret on their own: the random half of each token.
    secrets.update({f"{name} (secret part)": value.rsplit("_", 1)[-1] for name, value in list(secrets.items())
                    if value.startswith(("st_", "sj_", "sp_")) and len(value.rsplit("_", 1)[-1]) >= 16})
    stores = {
        "log": everything.lines,
        "job events": [f"{e.kind} {e.message} {json.dumps(e.data)}" for e in JobEvent.objects.all()],
        "log lines": list(LogLine.objects.values_list("message", flat=True)),
        "login counters": [json.dumps(row, default=str) for row in LoginThrottle.objects.values()],
        "history": (tmp_path / "history.jsonl").read_text().splitlines(),
        "secret rows": [json.dumps(row, default=str) for row in Secret.objects.values()],
        "answers": [f"{label}: {text}" for label, text in seen.answers],
    }
    assert everything.lines and stores["job events"] and stores["history"] and stores["login counters"]
    found = [(name, store, line[:200]) for store, lines in stores.items() for line in lines
             for name, value in secrets.items() if value in line]
    assert not found, found[:5]
    # Holder answers hand out only their own secret: never a password, the key, or another holder's secret.
    for label, text in seen.holder:
        for name in ("password", "secret key", "user token", "node token"):
            assert secrets[name] not in text, (label, name)
