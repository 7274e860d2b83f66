"""Bad input never reaches the database or the server: text that cannot be stored (lone surrogates, NUL),
numbers out of range and charsets that are not text encodings are a 4xx naming the field, before anything is
written; the team's listing keeps working afterwards."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata.accounts.models import ApiToken
from strata.api.values import value_problems
from strata.jobs.models import Job

JOBS = "/api/v1/jobs/"


@pytest.fixture
def alice(make_team, make_user, make_token, api):
    team = make_team("alpha")
    user = make_user("alice", team)
    return api(make_token(user, team))


def post_raw(client, path: str, body: str, content_type: str = "application/json"):
    """``body`` as JSON text exactly as given (``\\ud800`` escapes stay escapes on the wire)."""
    return client.generic("POST", path, body.encode("ascii"), content_type=content_type)


# --- A lone surrogate or a NUL: a 400 naming the field, nothing saved ---------------------------------------

@pytest.mark.parametrize("body, field", [
    ('{"kind": "train", "spec": {"workload": "mlp-digits", "options": {"\\ud800": "\\udfff"}}}',
     "spec.options.\\ud800"),
    ('{"kind": "train", "spec": {"workload": "mlp-digits"}, "resources": {"node_labels": {"zone": "\\ud800"}}}',
     "resources.node_labels.zone"),
    ('{"kind": "train", "name": "a\\u0000b", "spec": {"workload": "mlp-digits"}}', "name"),
    ('{"kind": "train", "spec": {"workload": "mlp-digits", "note": "x\\u0000"}}', "spec.note"),
    ('{"kind": "train\\udc80", "spec": {}}', "kind"),
])
def test_unstorable_text_is_a_400_naming_the_field_and_nothing_is_saved(alice, body, field):
    response = post_raw(alice, JOBS, body)
    assert response.status_code == 400, response.content
    assert field in response.json()
    response.content.decode("utf-8")  # the answer itself is valid UTF-8
    assert Job.objects.count() == 0
    assert alice.get(JOBS).status_code == 200


def test_every_bad_field_is_named_at_once(alice):
    body = ('{"kind": "train", "name": "\\ud800", "spec": {"workload": "mlp-digits", "a": "\\u0000"},'
            ' "resources": {"node_labels": {"z": "\\udfff"}}}')
    errors = post_raw(alice, JOBS, body).json()
    assert {"name", "spec.a", "resources.node_labels.z"} <= set(errors)


@pytest.mark.parametrize("body, field", [
    ('{"kind": "train", "spec": {"workload": "mlp-digits", "lr": 1e999}}', "spec.lr"),
    ('{"kind": "train", "spec": {"workload": "mlp-digits", "seed": ' + "9" * 4000 + "}}", "spec.seed"),
    ('{"kind": "train", "priority": -' + "9" * 30 + ', "spec": {"workload": "mlp-digits"}}', "priority"),
])
def test_numbers_out_of_range_are_field_errors(alice, body, field):
    response = post_raw(alice, JOBS, body)
    assert response.status_code == 400 and field in response.json(), response.content


def test_a_number_too_long_to_parse_is_a_400(alice):
    response = post_raw(alice, JOBS, '{"kind": "train", "priority": ' + "1" * 5000 + "}")
    assert response.status_code == 400


def test_the_token_api_refuses_unstorable_names(alice):
    response = post_raw(alice, "/api/v1/tokens/", '{"name": "ci\\ud800"}')
    assert response.status_code == 400 and "name" in response.json()
    assert ApiToken.objects.filter(name__startswith="ci").count() == 0


def test_a_nul_in_a_query_parameter_or_path_is_a_400(alice):
    response = alice.get(JOBS, {"kind": "train\x00"})
    assert response.status_code == 400 and "kind" in response.json()
    assert alice.get("/api/v1/teams/al%00pha/").status_code == 400


def test_a_nul_in_a_header_or_cookie_is_a_400(alice, db):
    response = alice.post(JOBS, {"kind": "train", "spec": {"workload": "mlp-digits"}}, format="json",
                          HTTP_IDEMPOTENCY_KEY="a\x00b")
    assert response.status_code == 400 and "Idempotency-Key" in response.json()["detail"]
    browser = Client()
    browser.cookies["sessionid"] = "abcdefghijk\x00lmnop"
    assert browser.get("/jobs/").status_code == 400
    assert Job.objects.count() == 0


# --- the web editor and form go through the same checks ------------------------------------------------------

@pytest.fixture
def browser(make_team, make_user):
    team = make_team("alpha")
    client = Client()
    client.force_login(make_user("alice", team))
    return client


def validate(client, payload: dict | str):
    body = payload if isinstance(payload, str) else json.dumps(payload)
    return client.post("/jobs/new/validate/", body, content_type="application/json")


def test_editor_refuses_lone_surrogates_in_the_document(browser):
    document = 'kind: train\nspec:\n  workload: mlp-digits\n  options: {"\\ud800": "\\udfff"}\n'
    for submit in (False, True):
        response = validate(browser, {"document": document, "submit": submit})
        assert response.status_code == 200
        data = response.json()
        assert data["valid"] is False and "surrogate" in data["errors"]["document"]
    assert Job.objects.count() == 0


def test_editor_refuses_a_surrogate_in_the_request_itself(browser):
    response = validate(browser, '{"document": "kind: train\\ud800"}')
    assert response.status_code == 400 and "document" in response.json()["errors"]


def test_editor_huge_number_is_a_field_error(browser):
    response = validate(browser, {"document": "kind: train\npriority: " + "9" * 5000 + "\nspec: {workload: mlp-digits}\n"})
    assert response.status_code == 200
    data = response.json()
    assert data["valid"] is False and "out of range" in data["errors"]["document"]
    response = validate(browser, {"document": "kind: train\npriority: " + "9" * 100 + "\nspec: {workload: mlp-digits}\n"})
    assert response.status_code == 200 and response.json()["valid"] is False


def test_web_form_nul_in_a_field_is_a_field_error(browser):
    response = browser.post("/jobs/new/?kind=train", {"name": "a\x00b", "spec.workload": "mlp-digits"})
    assert response.status_code == 200
    assert Job.objects.count() == 0


# --- charsets that are not text encodings ------------------------------------------------------------------

@pytest.mark.parametrize("charset", ["rot13", "hex", "zlib", "base64", "no-such-charset"])
def test_non_text_charsets_are_415_on_the_api(alice, charset):
    response = alice.generic("POST", JOBS, b'{"kind": "train"}', content_type=f"application/json; charset={charset}")
    assert response.status_code == 415 and "charset" in response.json()["detail"]


@pytest.mark.parametrize("charset", ["rot13", "hex", "zlib"])
def test_non_text_charsets_are_415_on_the_anonymous_login_form(db, charset):
    client = Client(enforce_csrf_checks=False)
    response = client.generic("POST", "/login/", b"username=a&password=b",
                              content_type=f"application/x-www-form-urlencoded; charset={charset}")
    assert response.status_code == 415


def test_text_charsets_still_work(alice):
    body = json.dumps({"kind": "train", "spec": {"workload": "mlp-digits", "epochs": 1}}).encode("utf-16")
    response = alice.generic("POST", JOBS, body, content_type="application/json; charset=utf-16")
    assert response.status_code == 201, response.content


# --- the class: arbitrary text through every text field of the write routes ----------------------------------

ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=12)  # surrogates and NUL included


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=ANY_TEXT, key=ANY_TEXT, value=ANY_TEXT, label=ANY_TEXT)
def test_arbitrary_unicode_in_every_job_text_field_is_a_4xx_or_a_listable_job(alice, name, key, value, label):
    body = {"kind": "train", "name": name, "spec": {"workload": "mlp-digits", "epochs": 1, "options": {key: value}},
            "resources": {"gpus": 0.5, "node_labels": {"zone": label}}}
    text = json.dumps(body)  # ensure_ascii: surrogates travel as \\ud800 escapes, as a hostile client sends them
    response = post_raw(alice, JOBS, text)
    assert response.status_code < 500
    if response.status_code == 201:
        assert not value_problems(body)
        listing = alice.get(JOBS)
        assert listing.status_code == 200
        assert response.json()["id"] in {job["id"] for job in listing.json()["results"]}
    else:
        assert response.status_code == 400
        response.content.decode("utf-8")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=ANY_TEXT, team=ANY_TEXT)
def test_arbitrary_unicode_in_token_fields_is_a_4xx_or_a_listable_token(alice, name, team):
    response = post_raw(alice, "/api/v1/tokens/", json.dumps({"name": name, "team": team}))
    assert response.status_code < 500
    assert alice.get("/api/v1/tokens/").status_code == 200


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=ANY_TEXT)
def test_arbitrary_unicode_in_the_editor_is_never_a_500(browser, text):
    document = "kind: train\nname: " + json.dumps(text) + "\nspec: {workload: mlp-digits}\n"
    response = validate(browser, json.dumps({"document": document, "submit": True}))
    assert response.status_code in (200, 201, 400)
    assert browser.get("/jobs/").status_code == 200


WRITE_ROUTES = [  # (method, path, who): every JSON write route of the API
    ("post", JOBS, "user"), ("post", "/api/v1/tokens/", "user"), ("patch", "/api/v1/quotas/alpha/", "admin"),
    ("patch", "/api/v1/pools/default/", "admin"), ("post", "/api/v1/node/register/", "node"),
    ("post", "/api/v1/node/heartbeat/", "node"),
    ("post", "/api/v1/node/attempts/00000000-0000-0000-0000-000000000000/claim/", "node"),
    ("post", "/api/v1/node/attempts/00000000-0000-0000-0000-000000000000/report/", "node"),
    ("post", "/api/v1/node/attempts/00000000-0000-0000-0000-000000000000/finish/", "node"),
]
JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT,
                           lambda children: st.lists(children, max_size=3)
                           | st.dictionaries(ANY_TEXT, children, max_size=3), max_leaves=8)


@pytest.fixture
def callers(alice, make_user, make_token, node_token, api):
    admin = Client()
    admin.force_login(make_user("root", admin=True))
    return {"user": alice, "admin": admin, "node": api(node_token)}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(WRITE_ROUTES), body=st.dictionaries(ANY_TEXT, JSON_VALUES, max_size=4))
def test_any_json_document_on_any_write_route_is_never_a_500(callers, route, body):
    method, path, who = route
    text = json.dumps(body, allow_nan=True)  # NaN and Infinity too: a hostile client sends them
    client = callers[who]
    send = getattr(client, method)
    response = send(path, text, content_type="application/json")
    assert response.status_code < 500, (route, text, response.content)
    response.content.decode("utf-8")
    if value_problems(body):  # non-finite floats included: they travel as NaN and Infinity
        assert response.status_code in (400, 404), (route, text, response.status_code)


def test_a_server_error_under_the_api_is_json(alice, monkeypatch):
    from strata.jobs.api import views

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(views.JobViewSet, "list", broken)
    alice.raise_request_exception = False
    response = alice.get(JOBS)
    assert response.status_code == 500
    assert response["Content-Type"] == "application/json" and "server log" in response.json()["detail"]
    assert "a bug" not in response.content.decode()
