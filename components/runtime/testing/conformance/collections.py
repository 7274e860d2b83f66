"""Conformance suite for collections (:mod:`components.runtime.contract.collections`).

Subclass it, point it at your collection, and give bodies it accepts and some it refuses::

    class TestDatasets(CollectionConformance):
        collection_path = "my_plugin.datasets:Datasets"
        good = ({"name": "pets", "source": {"path": "/data/pets"}, "format": "image-folder"},)
        bad = ({"name": "Not A Name!", "format": "nope"},)
        path_fields = ("source.path",)  # the record's fields that name paths on the nodes

It checks that the collection is light, that ``validate`` returns a JSON record with a valid ``name`` and is
idempotent (a record validates to itself), that a refusal is a ``SpecError`` naming fields, that built-ins are
named, JSON and unique, that ``present`` answers JSON from a static PanelData, and that the collection's
``schema`` (when it declares one) is a JSON Schema of an object that every good body, every record ``validate``
returns and each of its ``examples`` match (the examples are bodies ``validate`` accepts).

It also checks ``access_problems`` against :class:`~components.runtime.contract.collections.StaticRecordContext`: a team
granted every path may register every good record; a team granted none has each of the record's
``path_fields`` refused, under that field, with the context's one-line reason; the collection asks the context
about exactly those paths and changes nothing in the record. A collection that names no paths leaves
``path_fields`` empty, and then refuses nothing. What ``resolve`` makes of a record the context accepts keeps its
name and is JSON.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pytest

from components.runtime.contract.collections import (
    Collection,
    StaticRecordContext,
    name_problem,
    schema_problem,
)
from components.runtime.contract.registry import import_path
from components.runtime.contract.spec import SpecError
from components.runtime.testing.conformance.job_routes import schema_errors
from components.runtime.testing.conformance.kinds import light_import_problem
from components.runtime.testing.conformance.panels import StaticPanelData


class CollectionConformance:
    collection_path: ClassVar[str] = ""
    good: ClassVar[tuple[dict[str, Any], ...]] = ()
    bad: ClassVar[tuple[Any, ...]] = ()
    path_fields: ClassVar[tuple[str, ...]] = ()
    """The fields of a record that name paths on the nodes, dotted as its errors name them (``source.path``)."""

    def collection(self) -> Collection:
        value = import_path(self.collection_path)
        assert isinstance(value, type) and issubclass(value, Collection), f"{self.collection_path}: no Collection"
        return value()

    def test_it_is_light(self):
        assert light_import_problem(self.collection_path.split(":")[0]) is None

    def test_good_bodies_give_named_json_records_and_validation_is_idempotent(self):
        assert self.good, "give at least one body the collection accepts"
        collection = self.collection()
        for body in self.good:
            record = collection.validate(dict(body))
            assert name_problem(record.get("name")) is None, record
            assert json.loads(json.dumps(record, allow_nan=False)) == record
            assert collection.validate(dict(record)) == record

    def test_bad_bodies_are_refused_naming_fields(self):
        collection = self.collection()
        for body in (*self.bad, None, [], "x"):
            with pytest.raises(SpecError) as refused:
                collection.validate(body)
            assert refused.value.errors and all(isinstance(m, str) and m for m in refused.value.errors.values())

    def test_builtins_are_named_json_and_unique(self):
        builtins = self.collection().builtins()
        names = [item.get("name") for item in builtins]
        assert all(name_problem(name) is None for name in names), names
        assert len(set(names)) == len(names)
        json.dumps(builtins, allow_nan=False)

    def test_summary_answers_json_or_none(self):
        summary = self.collection().summary(StaticPanelData())
        assert summary is None or isinstance(summary, dict)
        json.dumps(summary, allow_nan=False)

    def test_present_answers_json(self):
        collection = self.collection()
        items = [*collection.builtins(), *(collection.validate(dict(body)) for body in self.good)]
        for item in items:
            shown = collection.present(dict(item), StaticPanelData())
            assert isinstance(shown, dict) and shown.get("name") == item["name"]
            json.dumps(shown, allow_nan=False)

    def test_its_schema_describes_the_bodies_it_accepts(self):
        collection = self.collection()
        schema = collection.schema
        assert schema_problem(schema) is None, schema_problem(schema)
        if schema is None:
            return
        examples = schema.get("examples", [])
        for body in (*self.good, *examples):
            assert not schema_errors(schema, body), (body, schema_errors(schema, body))
            record = collection.validate(dict(body))
            assert not schema_errors(schema, record), (record, schema_errors(schema, record))

    def test_access_problems_ask_the_context_about_each_path_and_name_its_field(self):
        collection = self.collection()
        for body in self.good:
            record = collection.validate(dict(body))
            paths = {field: value for field in self.path_fields if (value := _at(record, field)) is not None}
            assert all(isinstance(path, str) for path in paths.values()), paths
            granted = StaticRecordContext(data_roots=("/",))
            assert collection.access_problems(json.loads(json.dumps(record)), granted) == {}
            refused = StaticRecordContext(data_roots=())
            seen = json.loads(json.dumps(record))
            problems = collection.access_problems(seen, refused)
            assert seen == record, "access_problems must not change the record"
            assert isinstance(problems, dict) and set(problems) == set(paths), (problems, paths)
            assert sorted(refused.asked) == sorted(paths.values()), (refused.asked, paths)
            for field, path in paths.items():
                message = problems[field]
                assert isinstance(message, str) and message and "\n" not in message, message
                assert StaticRecordContext(data_roots=()).path_problem(path) in message

    def test_a_path_under_the_platforms_own_state_is_refused_even_inside_a_granted_root(self):
        collection = self.collection()
        for body in self.good:
            record = collection.validate(dict(body))
            for field in self.path_fields:
                path = _at(record, field)
                if path is None:
                    continue
                context = StaticRecordContext(data_roots=("/",), forbidden=(path,))
                assert field in collection.access_problems(dict(record), context), (field, path)

    def test_resolve_keeps_the_name_and_answers_json(self):
        collection = self.collection()
        for body in self.good:
            record = collection.validate(dict(body))
            context = StaticRecordContext(data_roots=("/",))
            if collection.access_problems(json.loads(json.dumps(record)), context):
                continue  # a record this context refuses is never resolved
            resolved = collection.resolve(json.loads(json.dumps(record)), context)
            assert isinstance(resolved, dict) and resolved.get("name") == record["name"], resolved
            json.dumps(resolved, allow_nan=False)


def _at(record: dict[str, Any], field: str) -> Any:
    """The value at a dotted field of a record (``source.path``), or None."""
    value: Any = record
    for part in field.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value
