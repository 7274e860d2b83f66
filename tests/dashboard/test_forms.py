"""The submit form is generated from a kind's JSON Schema, and its inputs become the same document the API takes."""

from __future__ import annotations

import re
from typing import ClassVar

import pytest
from django.http import QueryDict
from django.test import Client

from components.runtime.contract import registry
from components.runtime.contract.spec import Checker, KindSpec
from components.train.spec import OPTIMIZERS, WORKLOADS, TrainSpec
from dashboard import forms


@pytest.fixture
def page(make_team, make_user):
    team = make_team("alpha")
    make_user("alice", team)
    client = Client()
    client.login(username="alice", password="pw-alice")
    return client.get("/jobs/new/?kind=train").content.decode()


def control(html: str, name: str) -> str:
    """The opening tag (or the whole <select>/<textarea>) of the control named ``name``."""
    pattern = (rf'<select[^>]*name="{re.escape(name)}"[^>]*>.*?</select>'
               rf'|<textarea[^>]*name="{re.escape(name)}"[^>]*>'
               rf'|<input[^>]*name="{re.escape(name)}"[^>]*>')
    match = re.search(pattern, html, re.S)
    assert match, f"no control named {name}"
    return match.group(0)


def test_every_schema_property_has_a_control(page):
    properties = TrainSpec().json_schema()["properties"]
    assert properties
    for name in properties:
        control(page, f"spec.{name}")


def test_controls_follow_the_schema_types(page):
    workload = control(page, "spec.workload")
    assert workload.startswith("<select")
    options = re.findall(r'<option value="([^"]*)"', workload)
    assert options == ["", *WORKLOADS]  # null allowed: an empty "—" choice first
    assert '<option value="mlp-digits" selected>' in workload  # required by the first alternative
    optimizer = control(page, "spec.optimizer")
    assert re.findall(r'<option value="([^"]*)"', optimizer) == list(OPTIMIZERS)  # not nullable: no empty choice
    assert '<option value="adam" selected>' in optimizer
    epochs = control(page, "spec.epochs")
    assert 'type="number"' in epochs and 'min="1"' in epochs and 'max="100000"' in epochs and 'step="1"' in epochs
    assert 'value="50"' in control(page, "spec.checkpoint_every")  # the schema's default
    # No default in the schema (it depends on the workload: 64, or 1,024 for the DLRMs): empty, filled in at submit.
    assert 'value=""' in control(page, "spec.batch_size")
    lr = control(page, "spec.lr")
    assert 'type="number"' in lr and 'step="any"' in lr
    assert 'type="text"' in control(page, "spec.entrypoint")
    assert control(page, "spec.options").startswith("<textarea")
    # The description is the help text.
    assert "Report metrics every this many steps." in page


def test_common_fields_are_there(page):
    for name in ("name", "team", "priority", "max_attempts", "time_limit", "resources.gpus",
                 "resources.gpu_memory", "resources.workers"):
        control(page, name)
    assert control(page, "team").startswith("<select")


class DemoSpec(KindSpec):
    kind: ClassVar[str] = "demo"
    component: ClassVar[str] = "demo.component:Demo"
    description: ClassVar[str] = "A kind with every type of field."

    def validate(self, spec):
        check = Checker(spec)
        check.unknown({"flag", "tags", "ratio", "mode"})
        check.boolean("flag", True)
        check.number("ratio", 0.5, minimum=0, maximum=1)
        check.string("mode", "a", choices=["a", "b"])
        check.raise_if_errors()
        return {"flag": spec.get("flag", True), "tags": spec.get("tags", []), "ratio": spec.get("ratio", 0.5),
                "mode": spec.get("mode", "a")}

    def json_schema(self):
        return {"type": "object", "properties": {
            "flag": {"type": "boolean", "default": True, "description": "A switch."},
            "tags": {"type": "array", "items": {"type": "string"}},
            "ratio": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.5},
            "mode": {"type": "string", "enum": ["a", "b"], "default": "a"},
        }}


@pytest.fixture
def two_kinds(monkeypatch):
    kinds = {"train": TrainSpec(), "demo": DemoSpec()}
    monkeypatch.setattr(registry, "kinds", lambda: kinds)
    return kinds


def test_spec_fields_cover_every_type():
    fields = {field.name: field for field in forms.spec_fields(DemoSpec().json_schema())}
    assert fields["spec.flag"].control == "checkbox" and fields["spec.flag"].checked is True
    assert fields["spec.tags"].control == "json"
    assert fields["spec.ratio"].control == "number" and fields["spec.ratio"].step == "any"
    assert fields["spec.mode"].control == "select" and fields["spec.mode"].choices == [("a", "a"), ("b", "b")]


def test_kind_tabs_appear_when_several_kinds_are_registered(make_team, make_user, two_kinds):
    make_user("alice", make_team("alpha"))
    client = Client()
    client.login(username="alice", password="pw-alice")
    html = client.get("/jobs/new/?kind=demo").content.decode()
    assert 'id="kind-tabs"' in html
    assert 'href="?kind=train"' in html and 'href="?kind=demo" data-kind="demo" title="A kind with every type of field." class="active"' in html
    assert 'type="checkbox" id="field-spec-flag" name="spec.flag" checked' in html
    # An unchecked box is false; the document goes through the demo kind's own validator.
    response = client.post("/jobs/new/validate/", {"kind": "demo", "spec.mode": "b", "spec.tags": '["x"]'})
    assert response.json()["normalized"]["spec"] == {"flag": False, "tags": ["x"], "ratio": 0.5, "mode": "b"}


def test_document_from_post_leaves_out_empty_inputs_and_converts_numbers():
    post = QueryDict(mutable=True)
    post.update({"name": " run ", "spec.workload": "mlp-digits", "spec.epochs": "4", "spec.lr": "0.5",
                 "spec.seed": "", "spec.batch_size": "abc", "resources.gpus": "0.25", "resources.workers": "",
                 "spec.options": '{"a": 1}', "spec.hidden": "inf", "time_limit": "90s", "unrelated": "x"})
    document, errors = forms.document_from_post("train", post)
    assert errors == {}
    assert document == {
        "kind": "train", "name": "run", "time_limit": "90s", "resources": {"gpus": 0.25},
        "spec": {"workload": "mlp-digits", "epochs": 4, "lr": 0.5, "batch_size": "abc", "hidden": "inf",
                 "options": {"a": 1}},
    }


def test_bad_json_in_an_object_field_is_a_form_error():
    document, errors = forms.document_from_post("train", QueryDict("spec.options=%7Bnope"))
    assert "options" not in document.get("spec", {})
    assert errors["spec.options"].startswith("invalid JSON")


@pytest.mark.parametrize("text, line", [("kind: train\n  bad: indent\n", 2), ('{\n "kind": \n}', 3)])
def test_parse_document_reports_the_line(text, line):
    with pytest.raises(forms.DocumentError) as caught:
        forms.parse_document(text)
    assert caught.value.line == line and f"line {line}" in str(caught.value)


def test_parse_document_reads_yaml_and_json():
    assert forms.parse_document("kind: train\nspec: {epochs: 2}\n") == {"kind": "train", "spec": {"epochs": 2}}
    assert forms.parse_document('{"kind": "train"}') == {"kind": "train"}
    with pytest.raises(forms.DocumentError, match="nested more than"):
        forms.parse_document("a: " + "[" * 40 + "]" * 40)


def test_the_generated_document_uses_readable_units():
    submission = forms.Submission(document={}, errors={}, data={
        "name": "n", "kind": "train", "priority": 0, "max_attempts": 3, "time_limit": 5400,
        "resources": {"gpus": 0.0, "gpu_memory": 3 * 2**30, "workers": 2},
        "spec": {"workload": "mlp-digits", "entrypoint": None, "options": {}, "epochs": 1}})
    submission.team = type("Team", (), {"slug": "alpha"})()
    document = forms.submit_document(submission)
    assert document == {"name": "n", "kind": "train", "team": "alpha", "time_limit": "90m",
                        "resources": {"gpus": 0, "gpu_memory": "3GiB", "workers": 2},
                        "spec": {"workload": "mlp-digits", "epochs": 1}}
    assert forms.format_duration(45) == "45s" and forms.format_duration(7200) == "2h"
    assert forms.format_bytes(500 * 10**6) == "500MB" and forms.format_bytes(1234) == 1234


def test_curl_snippet_is_a_pasteable_command():
    snippet = forms.curl_snippet({"kind": "train", "name": "it's"}, "http://head:8000/")
    assert snippet.startswith("curl -sS -X POST 'http://head:8000/api/v1/jobs/'")
    assert '-H "Authorization: Bearer $STRATA_TOKEN"' in snippet and "Idempotency-Key: web-" in snippet
    assert "<<'JSON'\n" in snippet and snippet.endswith("\nJSON\n") and '"name": "it\'s"' in snippet
