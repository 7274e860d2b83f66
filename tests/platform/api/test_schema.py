"""The served OpenAPI schema (/api/v1/schema/) describes the API: it is valid OpenAPI 3, the submit body is typed
per registered kind, every operation declares the errors it can answer, and real answers of the main routes
(successes and errors) validate against what the schema declares for them."""

from __future__ import annotations

import copy
import io
import re
from typing import ClassVar

import pytest
from jsonschema import Draft4Validator
from node_protocol import NodeProtocol

from components.runtime.contract.plugins import Plugin
from components.runtime.contract.registry import kinds
from components.train.spec import TrainSpec
from strata.api.schema import kind_component_prefix, openapi30

SCHEMA_URL = "/api/v1/schema/?format=json"


@pytest.fixture
def schema(client, db):
    response = client.get(SCHEMA_URL)
    assert response.status_code == 200
    return response.json()


def test_the_schema_is_valid_openapi_3(schema):
    from drf_spectacular.validation import validate_schema

    assert schema["openapi"].startswith("3.0")
    validate_schema(schema)  # the OpenAPI 3.0 meta-schema; raises on any violation


def test_the_schema_generates_without_warnings_or_errors(db):
    from drf_spectacular.drainage import GENERATOR_STATS
    from drf_spectacular.generators import SchemaGenerator

    GENERATOR_STATS.reset()
    SchemaGenerator().get_schema(request=None, public=True)
    assert not GENERATOR_STATS._warn_cache and not GENERATOR_STATS._error_cache, (
        GENERATOR_STATS._warn_cache, GENERATOR_STATS._error_cache)


# --- the submit body --------------------------------------------------------------------------------------

def _component(schema, ref_or_schema):
    ref = ref_or_schema["$ref"]
    assert ref.startswith("#/components/schemas/")
    return schema["components"]["schemas"][ref.rsplit("/", 1)[1]]


def _submit_body(schema):
    body = schema["paths"]["/api/v1/jobs/"]["post"]["requestBody"]
    assert body["required"] is True
    assert set(body["content"]) == {"application/json"}
    return _component(schema, body["content"]["application/json"]["schema"])


def test_the_submit_body_is_one_schema_per_registered_kind(schema):
    body = _submit_body(schema)
    registered = set(kinds())
    assert body["discriminator"]["propertyName"] == "kind"
    assert set(body["discriminator"]["mapping"]) == registered
    variants = {}
    for ref in body["oneOf"]:
        variant = _component(schema, ref)
        (kind,) = variant["properties"]["kind"]["enum"]  # each variant: kind fixed to one registered kind
        assert variant["properties"]["kind"]["type"] == "string"
        assert body["discriminator"]["mapping"][kind] == ref["$ref"]
        assert "kind" in variant["required"] and variant["additionalProperties"] is False
        variants[kind] = variant
    assert set(variants) == registered
    for kind, variant in variants.items():
        spec = _component(schema, variant["properties"]["spec"])
        expected = openapi30(kinds()[kind].json_schema())
        assert spec["properties"] == expected["properties"], kind
        assert spec["type"] == "object" and spec.get("additionalProperties") is False
        assert variant["properties"]["spec"]["$ref"].endswith(f"/{kind_component_prefix(kind)}Spec")


def test_the_submit_body_types_resources_and_time_limit(schema, settings):
    for ref in _submit_body(schema)["oneOf"]:
        properties = _component(schema, ref)["properties"]
        resources = _component(schema, properties["resources"])
        fields = resources["properties"]
        assert resources["type"] == "object" and resources["additionalProperties"] is False
        assert fields["gpus"] == {**fields["gpus"], "type": "number", "minimum": 0, "maximum": 64}
        assert [alternative["type"] for alternative in fields["gpu_memory"]["oneOf"]] == ["integer", "string"]
        assert fields["workers"] == {**fields["workers"], "type": "integer", "minimum": 1, "maximum": 256}
        assert fields["node_labels"]["additionalProperties"] == {"type": "string"}
        limit = properties["time_limit"]["oneOf"]
        assert limit[0] == {"type": "integer", "minimum": 1, "maximum": settings.STRATA_MAX_TIME_LIMIT_SECONDS}
        assert limit[1]["type"] == "string" and "pattern" in limit[1]
        assert properties["priority"] == {**properties["priority"], "minimum": -100, "maximum": 100}
        assert properties["max_attempts"] == {**properties["max_attempts"], "minimum": 1, "maximum": 20}


@pytest.mark.parametrize("value, valid", [
    (3600, True), ("90s", True), ("15m", True), ("2h", True), ("1d", True), ("1.5h", True), ("30 min", True),
    (0, False), ("soon", False), ("-5m", False), (True, False), (None, False)])
def test_the_time_limit_schema_agrees_with_the_server(schema, value, valid, alice_client):
    ref = _submit_body(schema)["oneOf"][0]
    assert _validator(schema, _component(schema, ref)["properties"]["time_limit"]).is_valid(value) is valid
    response = alice_client.post("/api/v1/jobs/", {"kind": "train", "spec": {"workload": "mlp-digits"},
                                                   "time_limit": value}, format="json")
    assert (response.status_code == 201) is valid, response.json()


@pytest.mark.parametrize("resources, valid", [
    ({"gpus": 0.5}, True), ({"gpus": 2, "workers": 2}, True), ({"gpu_memory": "2GiB"}, True),
    ({"gpus": 0.25, "gpu_memory": 2**30, "node_labels": {"zone": "a"}}, True),
    ({"gpus": 0.5, "gpu_memory": None}, True),
    ({"gpus": 65}, False), ({"gpus": -1}, False), ({"gpus": "1"}, False), ({"workers": 0}, False),
    ({"workers": 1.5}, False), ({"gpu_memory": "lots"}, False), ({"gpu_memory": 0}, False),
    ({"node_labels": {"zone": ["a"]}}, False), ({"cores": 4}, False),
    ({"gpus": 0}, True), ({"gpus": 0, "cpus": 0.5, "memory": "1GiB"}, True), ({"gpus": 0.5, "cpus": 2}, True),
    ({"gpus": 0, "cpus": 0}, False), ({"gpus": 0, "cpus": "2"}, False), ({"gpus": 0, "memory": "lots"}, False)])
def test_the_resources_schema_agrees_with_the_server(schema, resources, valid, alice_client, make_node):
    make_node("n1", gpus=4, cpus=8, host_memory=32 * 2**30)
    ref = _submit_body(schema)["oneOf"][0]
    assert _validator(schema, _component(schema, ref)["properties"]["resources"]).is_valid(resources) is valid
    response = alice_client.post("/api/v1/jobs/", {"kind": "train", "spec": {"workload": "mlp-digits"},
                                                   "resources": resources}, format="json")
    assert (response.status_code == 201) is valid, response.json()


def test_every_kinds_spec_schema_accepts_what_its_validate_returns(schema):
    examples = {"train": [{"workload": "mlp-digits"}, {"entrypoint": "pkg.mod:main", "options": {"a": 1}}],
                "serve": [{"model": {"job": "3f0c5b8e-9a51-4c55-9c1e-0f1b2f0d9a11"}}]}
    for kind, spec in kinds().items():
        validator = _validator(schema, {"$ref": f"#/components/schemas/{kind_component_prefix(kind)}Spec"})
        for example in examples.get(kind, []):
            assert validator.is_valid(example), (kind, example)
            assert validator.is_valid(spec.validate(example)), (kind, spec.validate(example))
    train = _validator(schema, {"$ref": "#/components/schemas/TrainSpec"})
    assert not train.is_valid({"workload": "mlp-digits", "entrypoint": "pkg.mod:main"})  # one or the other
    assert not train.is_valid({"workload": "mlp-digits", "epochs": 0})
    assert not train.is_valid({"workload": "mlp-digits", "unknown": 1})


def test_openapi30_converts_json_schema_2020_keywords():
    converted = openapi30({
        "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
        "properties": {"a": {"type": ["integer", "null"], "exclusiveMinimum": 0}, "b": {"type": "null"},
                       "c": {"const": "x"}, "d": {"type": ["integer", "string"]}},
        "allOf": [{"if": {"required": ["a"]}, "then": {"required": ["c"]}}]})
    assert converted == {"type": "object", "properties": {
        "a": {"type": "integer", "nullable": True, "minimum": 0, "exclusiveMinimum": True},
        "b": {"type": "string", "nullable": True, "enum": [None]},
        "c": {"enum": ["x"]},
        "d": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}}


# --- the plugins' routes -----------------------------------------------------------------------------------

def test_every_registered_plugin_route_has_its_own_typed_path(schema):
    from components.runtime.contract.registry import collections, job_routes

    paths = schema["paths"]
    assert "/api/v1/jobs/{id}/{route}/" not in paths and "/api/v1/{collection}/" not in paths
    assert "/api/v1/{collection}/{name}/" not in paths
    assert job_routes() and collections()
    for route, function in job_routes().items():
        operation = paths[f"/api/v1/jobs/{{id}}/{route}/"]["get"]
        assert [p["name"] for p in operation["parameters"] if p["in"] == "path"] == ["id"], route
        assert "500" not in operation["responses"] and {"401", "403", "404"} <= set(operation["responses"])
        answer = _component(schema, operation["responses"]["200"]["content"]["application/json"]["schema"])
        declared = getattr(function, "schema", None)
        assert declared is not None, f"job route {route} declares no schema of its answer"
        assert answer["properties"] == openapi30(declared)["properties"], route
    for name, collection in collections().items():
        listing, item = paths[f"/api/v1/{name}/"], paths[f"/api/v1/{name}/{{name}}/"]
        assert set(listing) == {"get", "post"} and set(item) == {"get", "delete"}
        body = _component(schema, listing["post"]["requestBody"]["content"]["application/json"]["schema"])
        assert collection.schema is not None, f"collection {name} declares no body schema"
        assert body["properties"] == {**openapi30(collection.schema)["properties"], "team": body["properties"]["team"]}
        assert body["additionalProperties"] is False and set(body["required"]) == set(collection.schema["required"])
        listed = _component(schema, listing["get"]["responses"]["200"]["content"]["application/json"]["schema"])
        assert listed["properties"]["collection"]["enum"] == [name]
        for operation in (listing["post"]["responses"]["201"], item["get"]["responses"]["200"]):
            assert operation["content"]["application/json"]["schema"]["$ref"].endswith("/CollectionRecord")
        assert "409" in listing["post"]["responses"] and "404" in item["delete"]["responses"]
    ids = [operation["operationId"] for operations in paths.values() for operation in operations.values()]
    assert len(ids) == len(set(ids))


def test_answers_of_the_plugin_routes_validate(schema, world):
    from components.runtime.contract.registry import collections, job_routes

    alice, job, foreign = world["alice"], world["job"], world["foreign"]
    for route in job_routes():
        check_answer(schema, "get", f"/api/v1/jobs/{job.pk}/{route}/", alice.get(f"/api/v1/jobs/{job.pk}/{route}/"),
                     200)
        url = f"/api/v1/jobs/{foreign.pk}/{route}/"
        check_answer(schema, "get", url, alice.get(url), 404)
    for name, collection in collections().items():
        url = f"/api/v1/{name}/"
        (example, *_) = collection.schema["examples"]
        check_answer(schema, "post", url, alice.post(url, example, format="json"), 201)
        check_answer(schema, "post", url, alice.post(url, example, format="json"), 409)
        check_answer(schema, "post", url, alice.post(url, {**example, "name": "Bad Name!"}, format="json"), 400)
        check_answer(schema, "post", url, alice.post(url, [example], format="json"), 400)
        check_answer(schema, "get", url, alice.get(url), 200)
        item = f"{url}{example['name']}/"
        check_answer(schema, "get", item, alice.get(item), 200)
        for builtin in collection.builtins()[:1]:
            check_answer(schema, "get", f"{url}{builtin['name']}/", alice.get(f"{url}{builtin['name']}/"), 200)
            check_answer(schema, "delete", f"{url}{builtin['name']}/", alice.delete(f"{url}{builtin['name']}/"), 400)
        check_answer(schema, "delete", item, alice.delete(item), 204)
        check_answer(schema, "get", item, alice.get(item), 404)


# --- error answers ----------------------------------------------------------------------------------------

def test_every_operation_declares_its_error_answers(schema):
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            codes = set(operation["responses"])
            where = f"{method.upper()} {path}"
            assert {"400", "401", "403"} <= codes, where
            if "{" in path:
                assert "404" in codes, where
            if "requestBody" in operation:
                assert {"413", "415"} <= codes, where
            for code, answer in operation["responses"].items():
                if code.startswith(("4", "5")):
                    assert answer["content"]["application/json"]["schema"]["$ref"] in (
                        "#/components/schemas/Error", "#/components/schemas/ValidationError"), (where, code)
    jobs = schema["paths"]["/api/v1/jobs/"]["post"]["responses"]
    assert {"200", "201", "422", "429"} <= set(jobs) and "Retry-After" in jobs["429"]["headers"]
    for path in ("/api/v1/node/heartbeat/", "/api/v1/node/attempts/{attempt_id}/claim/",
                 "/api/v1/node/attempts/{attempt_id}/report/", "/api/v1/node/attempts/{attempt_id}/finish/"):
        assert "409" in schema["paths"][path]["post"]["responses"], path
    assert schema["components"]["securitySchemes"]["bearerAuth"] == {
        **schema["components"]["securitySchemes"]["bearerAuth"], "type": "http", "scheme": "bearer"}


def test_replies_that_were_mistyped_are_typed(schema):
    components = schema["components"]["schemas"]
    assert components["Quota"]["properties"]["max_gpu_memory"]["type"] == "integer"
    assert components["Quota"]["properties"]["max_gpu_memory"]["nullable"] is True
    assert components["Token"]["properties"]["team"]["nullable"] is True
    assert components["Job"]["properties"]["resources"]["properties"]["gpu_memory"]["nullable"] is True


# --- real answers against the schema ------------------------------------------------------------------------

def _to_json_schema(node):
    """An OpenAPI 3.0 schema object as a JSON Schema (draft 4, which has 3.0's boolean exclusiveMinimum):
    ``nullable`` becomes a ``null`` type."""
    if isinstance(node, list):
        return [_to_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _to_json_schema(value) for key, value in node.items()
           if key not in ("nullable", "discriminator", "readOnly", "writeOnly", "example")}
    if "properties" in node:
        out["properties"] = {name: _to_json_schema(sub) for name, sub in node["properties"].items()}
    if node.get("nullable"):
        if "type" in out:
            out["type"] = [out["type"], "null"]
            if "enum" in out and None not in out["enum"]:
                out["enum"] = [*out["enum"], None]
        else:
            out = {"anyOf": [out, {"type": "null"}]}
    return out


def _validator(schema, subschema) -> Draft4Validator:
    root = {**_to_json_schema(subschema), "components": _to_json_schema(copy.deepcopy(schema["components"]))}
    return Draft4Validator(root)


def _operation(schema, method: str, url: str):
    """The operation serving ``url``: of the templates that match, the one with the most literal segments (as the
    URL router does, /jobs/{id}/events/ before a plugin's /jobs/{id}/{route}/)."""
    path = url.split("?")[0]
    found = [(template, operations[method]) for template, operations in schema["paths"].items()
             if re.fullmatch(re.sub(r"\\{\w+\\}", "[^/]+", re.escape(template)), path) and method in operations]
    if not found:
        raise AssertionError(f"no operation in the schema for {method.upper()} {url}")
    return min(found, key=lambda item: item[0].count("{"))


def check_answer(schema, method: str, url: str, response, status: int | None = None):
    """``response`` (to ``method url``) has a status the operation declares, and its JSON body validates
    against the schema declared for that status."""
    template, operation = _operation(schema, method, url)
    code = str(response.status_code)
    where = f"{method.upper()} {url} -> {code}"
    if status is not None:
        assert response.status_code == status, (where, getattr(response, "content", b"")[:500])
    assert code in operation["responses"], f"{where}: undeclared (declared {sorted(operation['responses'])})"
    content = operation["responses"][code].get("content")
    if not content:
        assert not response.content, where
        return
    media = response["Content-Type"].split(";")[0]
    assert media in content, f"{where}: {media} not in {sorted(content)}"
    if media != "application/json":
        return
    errors = sorted(_validator(schema, content[media]["schema"]).iter_errors(response.json()), key=str)
    assert not errors, f"{where}: {[f'{list(e.absolute_path)}: {e.message}' for e in errors[:5]]}"


@pytest.fixture
def world(make_team, make_user, make_token, make_node, submit, node_token, run_pass, api):
    from strata.jobs.models import Attempt
    from strata.jobs.services import artifact_store, attempt_claim, attempt_report

    # Alpha's data root holds the collections' schema examples (/data/...): registering one gets a 201.
    team, other = make_team("alpha", data_roots=["/data"]), make_team("beta")
    alice = make_user("alice", team)
    admin = make_user("root", team, admin=True)
    node = make_node("n1", gpus=2)
    job = submit(alice, team, gpus=0.5, memory=2**30)
    foreign = submit(make_user("bob", other), other)
    run_pass()
    attempt = Attempt.objects.get(job=job)
    attempt_claim(attempt.pk, attempt.fencing_token, node)
    attempt_report(attempt, logs=[{"message": "epoch 1"}], metrics=[{"name": "loss", "step": 1, "value": 0.5}])
    artifact = artifact_store(attempt, "model.pt", io.BytesIO(b"weights"))
    return {"team": team, "alice": api(make_token(alice, team)), "admin": api(make_token(admin, team)),
            "admin_user": admin, "node_client": api(node_token), "node": node, "job": job, "foreign": foreign,
            "attempt": attempt, "artifact": artifact}


@pytest.fixture
def alice_client(make_team, make_user, make_token, api):
    team = make_team("alpha")
    return api(make_token(make_user("alice", team), team))


def test_answers_of_the_user_routes_validate(schema, world, client):
    alice, job = world["alice"], world["job"]
    for url in ["/api/v1/jobs/", f"/api/v1/jobs/{job.pk}/", f"/api/v1/jobs/{job.pk}/events/",
                f"/api/v1/jobs/{job.pk}/logs/", f"/api/v1/jobs/{job.pk}/metrics/", f"/api/v1/jobs/{job.pk}/artifacts/",
                f"/api/v1/jobs/{job.pk}/artifacts/{world['artifact'].pk}/download/", f"/api/v1/jobs/{job.pk}/trials/",
                "/api/v1/tokens/", "/api/v1/teams/", "/api/v1/teams/alpha/", "/api/v1/quotas/",
                "/api/v1/quotas/alpha/", "/api/v1/quotas/alpha/usage/", "/api/v1/nodes/",
                f"/api/v1/nodes/{world['node'].pk}/", "/api/v1/devices/", "/api/v1/pools/"]:
        check_answer(schema, "get", url, alice.get(url), 200)
    body = {"kind": "train", "spec": {"workload": "mlp-digits"}, "resources": {"gpus": 0.25, "gpu_memory": "1GiB"},
            "time_limit": "10m"}
    check_answer(schema, "post", "/api/v1/jobs/", alice.post("/api/v1/jobs/", body, format="json",
                                                           HTTP_IDEMPOTENCY_KEY="k1"), 201)
    check_answer(schema, "post", "/api/v1/jobs/", alice.post("/api/v1/jobs/", body, format="json",
                                                           HTTP_IDEMPOTENCY_KEY="k1"), 200)
    check_answer(schema, "post", "/api/v1/jobs/", alice.post("/api/v1/jobs/", {**body, "priority": 5}, format="json",
                                                           HTTP_IDEMPOTENCY_KEY="k1"), 422)
    check_answer(schema, "post", "/api/v1/jobs/", alice.post(
        "/api/v1/jobs/", {"kind": "train", "spec": {"epochs": 0}, "resources": {"gpus": 99}, "state": "RUNNING"},
        format="json"), 400)
    url = f"/api/v1/jobs/{job.pk}/resubmit/"
    check_answer(schema, "post", url, alice.post(url), 201)
    url = f"/api/v1/jobs/{job.pk}/cancel/"
    check_answer(schema, "post", url, alice.post(url), 200)
    created = alice.post("/api/v1/tokens/", {"name": "ci", "ttl_days": 1}, format="json")
    check_answer(schema, "post", "/api/v1/tokens/", created, 201)
    url = f"/api/v1/tokens/{created.json()['id']}/"
    check_answer(schema, "delete", url, alice.delete(url), 204)
    # A cluster admin's session lists node tokens too: their team is null.
    client.force_login(world["admin_user"])
    listed = client.get("/api/v1/tokens/")
    check_answer(schema, "get", "/api/v1/tokens/", listed, 200)
    assert None in [token["team"] for token in listed.json()["results"]]


def test_answers_of_the_admin_routes_validate(schema, world):
    admin = world["admin"]
    url = "/api/v1/quotas/alpha/"
    answer = admin.patch(url, {"max_gpu_memory": "64GiB", "max_gpus": None}, format="json")
    check_answer(schema, "patch", url, answer, 200)
    assert answer.json()["max_gpu_memory"] == 64 * 2**30
    check_answer(schema, "patch", url, admin.patch(url, {"max_gpu_memory": "lots"}, format="json"), 400)
    check_answer(schema, "patch", url, world["alice"].patch(url, {"max_gpus": 1}, format="json"), 403)
    url = "/api/v1/pools/default/"
    check_answer(schema, "patch", url, admin.patch(url, {"sharing_policy": "pack"}, format="json"), 200)


def test_answers_of_the_node_routes_validate(schema, world):
    node, agent, attempt = world["node"], world["node_client"], world["attempt"]
    register = {"name": "n2", "devices": [{"index": 0, "kind": "virtual", "memory_total": 2**30}]}
    check_answer(schema, "post", "/api/v1/node/register/", agent.post("/api/v1/node/register/", register,
                                                                     format="json"), 200)
    protocol = NodeProtocol(agent, attempt, node)
    url = protocol.url
    beat = "/api/v1/node/heartbeat/"
    check_answer(schema, "post", beat, protocol.heartbeat(attempts=[str(attempt.pk)]), 200)
    check_answer(schema, "post", beat, protocol.heartbeat(session="3f0c5b8e-9a51-4c55-9c1e-0f1b2f0d9a11",
                                                          attempts=[str(attempt.pk)]), 409)
    # The fixture's node claimed this attempt already: a second claim is a 409 (each node claims once); the claim
    # answer itself is checked on the other job's attempt.
    check_answer(schema, "post", url("claim"), protocol.claim(), 409)
    from strata.jobs.models import Attempt

    fresh = protocol.of(Attempt.objects.get(job=world["foreign"]), node)
    check_answer(schema, "post", fresh.url("claim"), fresh.claim(), 200)
    check_answer(schema, "post", url("report"), protocol.report(logs=[{"message": "x"}]), 200)
    check_answer(schema, "put", url("artifacts/out.txt"), protocol.put("artifacts/out.txt", b"bytes"), 201)
    check_answer(schema, "get", url("checkpoint"), protocol.get("checkpoint"), 404)
    check_answer(schema, "post", url("finish"), protocol.finish("succeeded"), 200)
    check_answer(schema, "post", url("report"), protocol.report(), 409)


class ParticipantsSpec(TrainSpec):
    """A throwaway kind that takes participants (the participant routes' answers are checked with it)."""

    kind: ClassVar[str] = "schema-swarm"
    accepts_tokens: ClassVar[bool] = True
    accepts_participants: ClassVar[bool] = True

    def participant_payload(self, spec, data):
        return {"peers": ["/ip4/10.0.0.1/tcp/4000"]}


PARTICIPANTS = Plugin(name="schema-swarm", kinds=(f"{__name__}:ParticipantsSpec",))


def test_answers_of_the_participant_routes_validate(schema, world, api, install_plugins, run_pass):
    from strata.jobs.models import Attempt
    from strata.jobs.services import attempt_claim, job_submit, job_token_create

    install_plugins(f"{__name__}:PARTICIPANTS")
    user = world["job"].owner
    job, _ = job_submit(user=user, team=world["team"], data={
        "kind": "schema-swarm", "name": "swarm", "spec": {"workload": "mlp-digits"}, "priority": 0,
        "resources": {"gpus": 0.25, "gpu_memory": None, "workers": 1}, "max_attempts": 1, "time_limit": 600})
    run_pass()
    attempt = Attempt.objects.get(job=job)
    attempt_claim(attempt.pk, attempt.fencing_token, world["node"])
    _, raw = job_token_create(job, user=user)
    url = "/api/v1/participants/"
    joined = api(raw).post(url, {"job": str(job.pk), "name": "box", "gpus": 0.25}, format="json")
    check_answer(schema, "post", url, joined, 201)
    check_answer(schema, "post", url, api(raw).post(url, {"job": "x", "gpus": -1}, format="json"), 400)
    check_answer(schema, "post", url, api("sj_wrong").post(url, {"job": str(job.pk)}, format="json"), 401)
    check_answer(schema, "post", url, api().post(url, {"job": str(job.pk)}, format="json"), 401)
    from strata.quotas.models import Quota

    Quota.objects.filter(team=world["team"]).update(max_gpus=2)
    check_answer(schema, "post", url, api(raw).post(url, {"job": str(job.pk), "gpus": 2}, format="json"), 409)
    body = joined.json()
    beat = f"{url}{body['id']}/heartbeat/"
    secret = api(body["secret"])
    check_answer(schema, "post", beat, secret.post(beat, {"metrics": {"loss": 1.5}, "subject": "p2p:QmBox"},
                                                   format="json"), 200)
    check_answer(schema, "post", beat, secret.post(beat, {"metrics": {"loss": "x"}}, format="json"), 400)
    check_answer(schema, "post", beat, api("sp_wrong").post(beat, {}, format="json"), 401)
    unknown = f"{url}00000000-0000-4000-8000-000000000000/heartbeat/"
    check_answer(schema, "post", unknown, secret.post(unknown, {}, format="json"), 404)
    listed = f"/api/v1/jobs/{job.pk}/participants/"
    check_answer(schema, "get", listed, world["alice"].get(listed), 200)
    check_answer(schema, "delete", f"{listed}{body['id']}/", world["alice"].delete(f"{listed}{body['id']}/"), 200)
    check_answer(schema, "post", beat, secret.post(beat, {}, format="json"), 200)  # stop, without a credential
    leave = f"{url}{body['id']}/leave/"
    check_answer(schema, "post", leave, secret.post(leave), 200)
    protocol = NodeProtocol(world["node_client"], attempt, world["node"])
    node_url, call = protocol.url("credential"), {"subject": "p2p:QmRank0"}
    check_answer(schema, "post", node_url, protocol.post("credential", call), 200)
    check_answer(schema, "post", node_url, protocol.post("credential", call, token="x"), 409)


def test_error_answers_validate(schema, world, api, settings):
    alice, foreign = world["alice"], world["foreign"]
    check_answer(schema, "get", "/api/v1/jobs/", api("st_not-a-token").get("/api/v1/jobs/"), 401)
    check_answer(schema, "get", "/api/v1/jobs/", api().get("/api/v1/jobs/"), 401)
    check_answer(schema, "get", "/api/v1/jobs/", world["node_client"].get("/api/v1/jobs/"), 403)
    check_answer(schema, "post", "/api/v1/node/heartbeat/", alice.post("/api/v1/node/heartbeat/", {}, format="json"), 403)
    check_answer(schema, "get", f"/api/v1/jobs/{foreign.pk}/", alice.get(f"/api/v1/jobs/{foreign.pk}/"), 404)
    check_answer(schema, "get", "/api/v1/jobs/?page=99", alice.get("/api/v1/jobs/?page=99"), 404)
    check_answer(schema, "get", "/api/v1/jobs/?state=SLEEPING", alice.get("/api/v1/jobs/?state=SLEEPING"), 400)
    check_answer(schema, "post", "/api/v1/jobs/", alice.post("/api/v1/jobs/", "kind=train", content_type="text/plain"),
                 415)
    check_answer(schema, "post", "/api/v1/jobs/", alice.post("/api/v1/jobs/", "{not json",
                                                           content_type="application/json"), 400)
    settings.STRATA_MAX_BODY_BYTES = 1024
    check_answer(schema, "post", "/api/v1/jobs/", alice.post(
        "/api/v1/jobs/", {"kind": "train", "name": "x" * 2000}, format="json"), 413)


@pytest.mark.parametrize("url", ["/api/v1/jobs/not-a-job-id/", "/api/v1/node/attempts/x/claim/", "/api/v1/nope/"])
def test_a_url_that_matches_no_route_is_a_json_404_under_the_api(url, world):
    response = world["alice"].get(url)
    assert response.status_code == 404 and response["Content-Type"] == "application/json"
    assert response.json() == {"detail": "Not found."}


def test_outside_the_api_a_missing_page_is_still_html(client, db):
    response = client.get("/no-such-page/")
    assert response.status_code == 404 and response["Content-Type"].startswith("text/html")
