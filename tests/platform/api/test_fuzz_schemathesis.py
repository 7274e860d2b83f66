"""Schemathesis against a real ``strata server``, driven by the schema it serves at /api/v1/schema/.

Every operation is called with generated requests, valid ones and invalid ones (``--mode all``: the coverage
phase's boundary and negative cases, then random fuzzing, then stateful sequences), and every answer is
checked: no 5xx, a status code the schema declares for the operation, the declared content type, a body that
validates against the declared schema. Three runs, each with a real token:

- ``user``: a team member's user token, on every operation but ``DELETE /tokens/{id}/`` (which could revoke
  the token in use; tests/platform/api/test_schema.py covers it), every plugin's job routes and collections
  included (the schema has one typed path per registered route); admin-only and node routes answer it 403
  (those with a few fuzzed examples each and no coverage phase: the ``admin`` and ``node`` runs cover them in
  full);
- ``admin``: a cluster admin's user token, on the admin routes (``/quotas/``, ``/pools/``);
- ``node``: a node token, on ``/api/v1/node/``.

Path, query and body values are drawn, part of the time, from the seeded objects (a job of the team, a job of
another team, a RUNNING job of every registered kind, a SUCCEEDED train job they read, an artifact, the node,
its session, a running attempt and its fencing token, a record of the team in every plugin collection and the
collection's built-ins), so requests get past the 404s to the code behind them (a plugin's job route answers for
a job of its own kind); the rest of the time they are generated.

Any failure fails the test; schemathesis prints each with a cURL command that reproduces it, and the run has a
fixed seed (STRATA_FUZZ_SEED), so a rerun finds it again.

The server runs in a process of its own, with a home of its own (a temporary directory) and a database of
its own: with STRATA_DATABASE_URL pointing at PostgreSQL (CI), a fresh database ``strata_fuzz_<random>``
on that server, dropped afterwards; otherwise SQLite in the temporary home. The broker is the filesystem
broker in that home, and scheduling passes run inline (STRATA_SCHEDULE_INLINE), so fuzzed submissions go
through admission and placement on the registered node (two virtual GPUs).

Bounded: STRATA_FUZZ_MAX_EXAMPLES examples per operation and phase (default 15; 10 for the user run), each
run killed (and failed) after STRATA_FUZZ_MAX_SECONDS (default 420 s: the user run alone takes 200 to 240 s on a
2-core CI machine busy with the suite's other worker, and a loaded machine runs it slower still).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import requests
from e2e_support import e2e_env, strata_command
from support import free_port, kill_group, wait_for

pytestmark = pytest.mark.e2e

MAX_EXAMPLES = int(os.environ.get("STRATA_FUZZ_MAX_EXAMPLES", "15"))
# The user run (55 operations, most of the three runs' time, a third of it job submissions that each run a
# scheduling pass) draws 10 per operation and phase unless STRATA_FUZZ_MAX_EXAMPLES says otherwise; its coverage
# phase (the boundary and negative cases) is whole either way.
USER_MAX_EXAMPLES = int(os.environ.get("STRATA_FUZZ_MAX_EXAMPLES", "10"))
MAX_SECONDS = int(os.environ.get("STRATA_FUZZ_MAX_SECONDS", "420"))
SEED = int(os.environ.get("STRATA_FUZZ_SEED", "20240601"))
# Every check of schemathesis but the two that test the schema's strictness rather than the API's answers:
# positive_data_acceptance (a valid-looking job is still refused when it names a job or team that does not
# exist) and negative_data_rejection (DRF's paginator ignores a bad page_size instead of refusing it).
CHECKS = ",".join([
    "not_a_server_error", "status_code_conformance", "content_type_conformance", "response_schema_conformance",
    "response_headers_conformance", "ignored_auth", "unsupported_method", "allow_header_conformance",
    "missing_required_header", "use_after_free", "ensure_resource_availability",
])

# The user run also calls the node routes and the admin-only writes (PATCH and PUT of /quotas/ and /pools/), only
# to be refused (403) on every one: the node and admin runs fuzz them with their own tokens (every phase,
# MAX_EXAMPLES); here a few fuzzed examples per operation and the stateful phase check the refusals, without the
# coverage phase's hundreds of boundary cases. (path regex, methods excluded) of each group.
USER_REFUSED_ROUTES = [("^/api/v1/node/", None), ("^/api/v1/(quotas|pools)/", "GET")]
USER_REFUSED_EXAMPLES = min(USER_MAX_EXAMPLES, 5)

# run -> (token in the seeded credentials, schemathesis filter options)
RUNS = {
    "user": ("token", ["--exclude-operation-id", "tokens_destroy"]),
    "admin": ("admin_token", ["--include-path-regex", "^/api/v1/(quotas|pools)/"]),
    "node": ("node_token", ["--include-path-regex", "^/api/v1/node/"]),
}

# The spec of the seeded job of each registered kind (``SOURCE``: the id of a SUCCEEDED dlrm-ctr train job with a
# model.pt); a kind not named here is submitted with an empty spec (and seeding fails if the kind refuses it).
KIND_SPECS = {
    "train": {"workload": "mlp-digits", "epochs": 1},
    "serve": {"model": {"job": "SOURCE"}},
    "compress-embeddings": {"source": {"job": "SOURCE"}},
    "tune": {"space": {"lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1}},
             "trainable": {"kind": "train", "spec": {"workload": "mlp-digits", "lr": "{{lr}}"}}},
}

# Run in the server's environment (its own home and database) before it starts: users, teams, a node with
# two virtual GPUs, jobs (one running with logs, metrics and an artifact, one of another team), tokens.
SEED_DATA = r"""
import io, json, os, sys
KIND_SPECS = json.loads(sys.argv[1])
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "strata.settings")
django.setup()
from django.core.management import call_command
call_command("migrate", interactive=False, verbosity=0)
from strata.accounts import services as accounts
from strata.accounts.models import ApiToken, Membership
from strata.cluster.services import node_register
from strata.jobs import services as jobs
from strata.jobs.api.serializers import JobSubmitSerializer
from strata.scheduling.services import schedule_pass

admin = accounts.user_create("fuzz-admin", "pw-fuzz-admin-123", admin=True)
alice = accounts.user_create("alice", "pw-alice-12345678")
team = accounts.team_create("fuzz")
accounts.membership_set(admin, team, Membership.Role.TEAM_ADMIN)
accounts.membership_set(alice, team)
# The team's data root holds the collections' examples (/data/...), so registrations get past the path check.
from strata.quotas.models import Quota
Quota.objects.update_or_create(team=team, defaults={"data_roots": ["/data"]})
other = accounts.team_create("other")
bob = accounts.user_create("bob", "pw-bob-12345678")
accounts.membership_set(bob, other)
_, token = accounts.token_create(alice, team=team, name="fuzz", ttl_days=1)
_, admin_token = accounts.token_create(admin, team=team, name="fuzz admin", ttl_days=1)
_, node_token = accounts.token_create(admin, kind=ApiToken.Kind.NODE, name="fuzz node", ttl_days=1)
node = node_register(name="fuzz-node", labels={"zone": "a"}, devices=[
    {"index": i, "kind": "virtual", "name": f"virtual GPU {i}", "memory_total": 8 * 2**30} for i in range(2)])

def submit(user, team, **body):
    serializer = JobSubmitSerializer(data={"kind": "train", "spec": {"workload": "mlp-digits", "epochs": 1}, **body})
    serializer.is_valid(raise_exception=True)
    data = dict(serializer.validated_data)
    data.pop("team", None)
    return jobs.job_submit(user=user, team=team, data=data)[0]

def run(job, outcome=None, artifacts=()):
    # Place, claim (RUNNING) and, with an outcome, finish the job's attempt.
    schedule_pass(dispatch=False)
    attempt = job.attempts.get()
    jobs.attempt_claim(attempt.id, attempt.fencing_token, node)
    for name in artifacts:
        jobs.artifact_store(attempt, name, io.BytesIO(b"weights"))
    if outcome:
        jobs.attempt_finish(attempt.id, attempt.fencing_token, node, outcome)
    return attempt

job = submit(alice, team, name="fuzz-running", resources={"gpus": 0.5, "gpu_memory": "1GiB"})
foreign = submit(bob, other, name="other-team")
schedule_pass(dispatch=False)
attempt = job.attempts.get()
jobs.attempt_claim(attempt.id, attempt.fencing_token, node)
jobs.attempt_report(attempt, logs=[{"level": "info", "message": "epoch 1"}],
                    metrics=[{"name": "loss", "step": 1, "value": 0.5}])
artifact = jobs.artifact_store(attempt, "model.pt", io.BytesIO(b"weights"))

# A job of every registered kind, RUNNING, on a SUCCEEDED train job (the source the kinds that read another job's
# model name), so that every plugin's job route has a job of its own kind behind it; and a record of the team in
# every collection (its schema's first example).
from components.runtime.contract.registry import collections, kinds
from strata.jobs.models import PluginRecord

SMALL = {"gpus": 0.1, "gpu_memory": "256MiB"}
source = submit(alice, team, name="fuzz-source", spec={"workload": "dlrm-ctr", "epochs": 1}, resources=SMALL)
run(source, "succeeded", ["model.pt"])
SPECS = KIND_SPECS
kind_jobs = {}
for kind in sorted(kinds()):
    spec = json.loads(json.dumps(SPECS.get(kind, {})).replace("SOURCE", str(source.id)))
    kind_jobs[kind] = submit(alice, team, kind=kind, name=f"fuzz-{kind}", spec=spec, resources=SMALL)
schedule_pass(dispatch=False)  # one pass places them all
for kind_job in kind_jobs.values():
    placed = kind_job.attempts.get()
    jobs.attempt_claim(placed.id, placed.fencing_token, node)
records = {}
for name, collection in sorted(collections().items()):
    record = collection.validate(dict((collection.schema or {}).get("examples", [{}])[0]))
    records[name] = [record["name"], *(item["name"] for item in collection.builtins())]
    PluginRecord.objects.create(collection=name, team=team, name=record.pop("name"), body=record, created_by=alice)
print(json.dumps({"token": token, "admin_token": admin_token, "node_token": node_token,
                  "jobs": [str(job.id), str(foreign.id), str(source.id), *(str(j.id) for j in kind_jobs.values())],
                  "collections": records, "artifact": str(artifact.id), "node": str(node.id),
                  "session": str(node.session), "devices": list(node.devices.values_list("id", flat=True)),
                  "attempt": str(attempt.id), "fencing_token": attempt.fencing_token}))
"""


def schemathesis_config(seeded: dict, run: str) -> str:
    """schemathesis-RUN.toml: where path, query and body values come from the seeded objects part of the time
    (and, for the user run, fewer cases on the routes it is refused on)."""
    dictionaries = {
        "jobs": seeded["jobs"], "artifacts": [seeded["artifact"]], "teams": ["fuzz", "other"],
        "nodes": [seeded["node"]], "devices": seeded["devices"], "sessions": [seeded["session"]],
        "attempts": [seeded["attempt"]], "fencing": [seeded["fencing_token"]], "pools": ["default", "a-pool"],
        **{f"records-{name}": names for name, names in seeded["collections"].items()},
    }
    operations = [
        (r"^/api/v1/jobs/\{id\}/", {"path.id": "jobs", "path.artifact_id": "artifacts"}),
        (r"^/api/v1/(quotas/\{team\}|teams/\{slug\})/", {"path.team": "teams", "path.slug": "teams"}),
        (r"^/api/v1/nodes/\{id\}/", {"path.id": "nodes"}),
        (r"^/api/v1/devices/\{id\}/", {"path.id": "devices"}),
        (r"^/api/v1/pools/\{name\}/", {"path.name": "pools"}),
        ("^/api/v1/node/", {"path.attempt_id": "attempts", "query.node": "nodes", "query.token": "fencing",
                            "body.node": "nodes", "body.session": "sessions", "body.token": "fencing"}),
        # Each plugin collection: its seeded record and built-ins, the seeded teams.
        *((f"^/api/v1/{name}/", {"path.name": f"records-{name}", "query.team": "teams", "body.team": "teams"})
          for name in seeded["collections"]),
    ]
    lines = []
    for name, values in dictionaries.items():
        lines += [f"[dictionaries.{name}]", f"values = {json.dumps(values)}", ""]
    for regex, parameters in operations:
        bindings = ", ".join(f'"{key}" = {{ dictionary = "{dictionary}", probability = 0.6 }}'
                             for key, dictionary in parameters.items())
        lines += ["[[operations]]", f"include-path-regex = {json.dumps(regex)}", f"parameters = {{ {bindings} }}", ""]
    for regex, excluded in USER_REFUSED_ROUTES if run == "user" else ():
        lines += ["[[operations]]", f"include-path-regex = {json.dumps(regex)}",
                  *([f"exclude-method = {json.dumps(excluded)}"] if excluded else []),
                  f"generation = {{ max-examples = {USER_REFUSED_EXAMPLES} }}",
                  "phases = { coverage = { enabled = false } }", ""]
    return "\n".join(lines)


def _postgres_database():
    """(server URL, drop) for a fresh PostgreSQL database next to STRATA_DATABASE_URL's, or (None, None)."""
    url = os.environ.get("STRATA_DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        return None, None
    import psycopg

    name = f"strata_fuzz_{secrets.token_hex(6)}"
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(url)
    fuzz_url = urlunsplit(parts._replace(path=f"/{name}"))

    def drop():
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return fuzz_url, drop


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    """A seeded ``strata server``; yields (url, seeded objects and tokens, home)."""
    home = tmp_path_factory.mktemp("strata-fuzz-home")
    database_url, drop_database = _postgres_database()
    # Submissions are throttled (600/min) in production; here the submit logic must run, not the throttle.
    extra = {"STRATA_HOME": str(home), "STRATA_SCHEDULE_INLINE": "1", "STRATA_THROTTLE_SUBMIT": "100000/min"}
    if database_url:
        extra["STRATA_DATABASE_URL"] = database_url
    env = e2e_env(**extra)
    process = None
    try:
        seeded = subprocess.run([sys.executable, "-c", SEED_DATA, json.dumps(KIND_SPECS)], env=env, capture_output=True, text=True,
                                timeout=180, stdin=subprocess.DEVNULL, cwd=home)
        assert seeded.returncode == 0, f"seeding failed:\n{seeded.stdout}\n{seeded.stderr}"
        credentials = json.loads(seeded.stdout.strip().splitlines()[-1])
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log = (home / "server.out").open("ab")
        process = subprocess.Popen([*strata_command(), "server", "--port", str(port), "--threads", "4"], env=env,
                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=home,
                                   start_new_session=True)

        def healthy():
            if process.poll() is not None:
                raise AssertionError(f"strata server exited with {process.returncode}:\n"
                                     f"{(home / 'server.out').read_text(errors='replace')[-3000:]}")
            try:
                return requests.get(f"{url}/healthz", timeout=1).ok
            except requests.RequestException:
                return False

        wait_for(healthy, 90, message="strata server to answer /healthz")
        for run in RUNS:
            (home / f"schemathesis-{run}.toml").write_text(schemathesis_config(credentials, run))
        yield url, credentials, home
    finally:
        if process is not None:
            kill_group(process)
        if drop_database is not None:
            drop_database()


@pytest.mark.timeout(MAX_SECONDS + 180)  # the run's own bound, and the server's start and seeding
@pytest.mark.parametrize("run", list(RUNS))
def test_schemathesis_finds_no_server_error_and_no_schema_violation(fuzz_server, run):
    url, seeded, home = fuzz_server
    token_key, filters = RUNS[run]
    token = seeded[token_key]
    log_start = (home / "server.out").stat().st_size
    st = Path(sys.executable).with_name("st")
    assert st.exists(), f"schemathesis is not installed next to {sys.executable}: pip install -e '.[dev]'"
    command = [
        str(st), "--config-file", str(home / f"schemathesis-{run}.toml"),
        "run", f"{url}/api/v1/schema/", "--header", f"Authorization: Bearer {token}",
        "--checks", CHECKS, *filters,
        "--mode", "all", "--max-examples", str(USER_MAX_EXAMPLES if run == "user" else MAX_EXAMPLES), "--seed", str(SEED),
        "--workers", "1", "--request-timeout", "30", "--generation-database", "none",
        "--suppress-health-check", "all", "--no-color", "--output-truncate", "false",
        "--report", "junit", "--report-dir", str(home / f"schemathesis-{run}"),
    ]
    started = time.monotonic()
    try:
        finished = subprocess.run(command, env=e2e_env(), capture_output=True, text=True, timeout=MAX_SECONDS,
                                  stdin=subprocess.DEVNULL, cwd=home)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"schemathesis ({run}) ran past {MAX_SECONDS} s:\n{(error.stdout or b'')[-5000:]!r}")
    elapsed = time.monotonic() - started
    output = finished.stdout + finished.stderr
    server_log = (home / "server.out").read_text(errors="replace")[log_start:]
    assert finished.returncode == 0, (
        f"schemathesis ({run}) failed, exit {finished.returncode} after {elapsed:.0f} s. Each failure below has a "
        f"cURL command that reproduces it; STRATA_FUZZ_SEED={SEED} reruns the same cases.\n{output[-20000:]}\n"
        f"--- server log ---\n{server_log[-5000:]}")
    assert "Traceback" not in server_log, f"the server logged an error during the {run} run:\n{server_log[-5000:]}"
    assert "Tested:" in output, output[-3000:]
    # The run was not hollow: its token still works.
    assert requests.get(f"{url}/api/v1/teams/", headers={"Authorization": f"Bearer {token}"},
                        timeout=10).status_code == (403 if run == "node" else 200)
    print(f"schemathesis ({run}): {elapsed:.0f} s\n{output[-2500:]}")
