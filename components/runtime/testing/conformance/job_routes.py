"""Conformance suite for job routes (a manifest's ``job_routes``: ``GET /api/v1/jobs/{id}/{name}/``).

Subclass it, point it at the route function, and give the PanelData it should answer (the default: a job with
nothing reported yet)::

    class TestTrials(JobRouteConformance):
        route_path = "my_plugin.report:trials"

        def examples(self):
            return [StaticPanelData(job={"id": "j1", "kind": "sweep", "state": "RUNNING"}), ...]

It checks that the route's module is light, that its ``schema`` (when it declares one) is a JSON Schema of an
object, and that every answer is JSON (no NaN, no objects JSON cannot encode) matching that schema: what the
served OpenAPI schema declares for the route and the API fuzzer checks every answer against.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from components.runtime.contract.collections import schema_problem
from components.runtime.contract.panels import PanelData, StaticPanelData
from components.runtime.contract.registry import import_path
from components.runtime.testing.conformance.kinds import light_import_problem


def schema_errors(schema: dict[str, Any] | None, value: Any) -> list[str]:
    """Where ``value`` breaks the JSON Schema (2020-12) ``schema`` (none when ``schema`` is None)."""
    if schema is None:
        return []
    from jsonschema import Draft202012Validator

    Draft202012Validator.check_schema(schema)
    return [f"{'.'.join(map(str, error.absolute_path)) or '(root)'}: {error.message}"
            for error in Draft202012Validator(schema).iter_errors(value)]


class JobRouteConformance:
    route_path: ClassVar[str] = ""

    def route(self):
        function = import_path(self.route_path)
        assert callable(function), f"{self.route_path} is not callable"
        return function

    def examples(self) -> list[PanelData]:
        """PanelData of jobs to answer for; override to give ones with reports. The default: a job with no reports,
        children or metrics (what the route answers before the job reported anything)."""
        return [StaticPanelData(job={"id": "00000000-0000-4000-8000-000000000001", "kind": "any",
                                     "state": "QUEUED", "spec": {}})]

    def test_it_is_light(self):
        assert light_import_problem(self.route_path.split(":")[0]) is None

    def test_its_schema_is_a_json_schema_of_an_object(self):
        schema = getattr(self.route(), "schema", None)
        assert schema_problem(schema) is None, schema_problem(schema)
        schema_errors(schema, {})  # check_schema raises on a malformed schema

    def test_answers_are_json_matching_its_schema(self):
        function = self.route()
        schema = getattr(function, "schema", None)
        examples = [*self.examples(), StaticPanelData(job={"id": "00000000-0000-4000-8000-000000000002",
                                                           "kind": "any", "state": "QUEUED", "spec": {}})]
        for data in examples:
            answer = function(data)
            encoded = json.loads(json.dumps(answer, allow_nan=False))
            assert isinstance(encoded, dict), f"a job route answers a JSON object, not {type(encoded).__name__}"
            errors = schema_errors(schema, encoded)
            assert not errors, (data.job, errors[:5])
