"""Conformance suite for job kinds (:class:`components.runtime.contract.spec.KindSpec`).

Subclass :class:`KindSpecConformance` in a test module (its name must start with ``Test``)::

    class TestPrimesSpec(KindSpecConformance):
        spec_path = "strata_primes.spec:PrimesSpec"
        valid_examples = ({"limit": 1000},)
        invalid_examples = (({"limit": 1}, {"spec.limit"}),)

It checks that the schema is a valid JSON Schema (draft 2020-12), that ``validate`` is idempotent and returns
what the schema accepts, that schema and ``validate`` agree on instances generated from the schema (``validate``
accepts them or names the bad ``spec.<field>``; what it returns satisfies the schema), that errors name every
bad field, and that the spec module imports nothing heavy (the control plane imports it).
"""

from __future__ import annotations

import os
import random
import string
import subprocess
import sys
import uuid
from typing import Any, ClassVar

import pytest

from components.runtime.contract.registry import import_path
from components.runtime.contract.spec import KindSpec, SpecError

HEAVY = ("torch", "grpc", "hivemind")


def light_import_problem(module: str, heavy: tuple[str, ...] = HEAVY) -> str | None:
    """Import ``module`` in a fresh interpreter; the heavy top-level packages it pulled in, or None."""
    code = (f"import sys, {module}\n"
            f"print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in {set(heavy)!r})))")
    # The child sees what this interpreter sees (a plugin on a path added at run time, too).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    if result.returncode != 0:
        return f"importing {module} failed: {result.stderr.strip().splitlines()[-1:]}"
    loaded = result.stdout.strip()
    return f"{module} imports {loaded}" if loaded else None


class SchemaInstances:
    """Seeded generator of instances of a JSON Schema: every type, enum, const, bounds, required and optional
    properties, ``oneOf``/``anyOf`` branches, nullable types. Enough to probe a spec validator, not a full
    JSON Schema sampler (no ``$ref``, ``pattern`` only through the given examples)."""

    def __init__(self, schema: dict[str, Any], seed: int = 0):
        self.schema = schema
        self.rng = random.Random(seed)

    def many(self, count: int) -> list[Any]:
        return [self.instance(self.schema, depth=0) for _ in range(count)]

    def instance(self, schema: dict[str, Any], depth: int) -> Any:
        rng = self.rng
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return rng.choice(schema["enum"])
        for key in ("oneOf", "anyOf"):
            if key in schema:
                branch = {k: v for k, v in schema.items() if k != key}
                branch.update(rng.choice(schema[key]))
                return self.instance(branch, depth)
        kind = schema.get("type", "object" if "properties" in schema else "string")
        if isinstance(kind, list):
            kind = rng.choice(kind)
        if kind == "null":
            return None
        if kind == "boolean":
            return rng.random() < 0.5
        if kind in ("integer", "number"):
            low = schema.get("minimum", schema.get("exclusiveMinimum", -1000))
            high = schema.get("maximum", schema.get("exclusiveMaximum", low + 1000))
            if "default" in schema and isinstance(schema["default"], int | float) and rng.random() < 0.3:
                return schema["default"]
            if kind == "integer":
                low, high = int(low) + ("exclusiveMinimum" in schema), int(high) - ("exclusiveMaximum" in schema)
                pick = rng.choice([low, high, rng.randint(low, max(low, min(high, low + 1000)))])
                return pick
            value = rng.uniform(float(low), float(high))
            return value if value != schema.get("exclusiveMinimum") else float(high)
        if kind == "string":
            if schema.get("format") == "uuid":
                return str(uuid.UUID(int=rng.getrandbits(128)))
            length = rng.randint(schema.get("minLength", 1), max(schema.get("minLength", 1),
                                                                 min(schema.get("maxLength", 12), 12)))
            return "".join(rng.choice(string.ascii_lowercase) for _ in range(length))
        if kind == "array":
            items = schema.get("items", {})
            count = rng.randint(schema.get("minItems", 0), max(schema.get("minItems", 0), min(schema.get("maxItems", 3), 3)))
            return [self.instance(items, depth + 1) for _ in range(count)] if depth < 4 else []
        # object
        properties = schema.get("properties", {})
        required = set(schema.get("required", []))
        found: dict[str, Any] = {}
        for name, sub in properties.items():
            if name in required or (depth < 4 and rng.random() < 0.5):
                found[name] = self.instance(sub, depth + 1)
        return found


class KindSpecConformance:
    """The KindSpec contract, as pytest tests. Set :attr:`spec_path` (``"module:Class"``)."""

    spec_path: ClassVar[str] = ""
    valid_examples: ClassVar[tuple[dict[str, Any], ...]] = ()  # specs validate must accept
    invalid_examples: ClassVar[tuple[tuple[Any, set[str]], ...]] = ()  # (spec, the error keys it must name)
    generated: ClassVar[int] = 200  # instances generated from the schema
    seed: ClassVar[int] = 7

    def spec(self) -> KindSpec:
        spec_class = import_path(self.spec_path)
        assert isinstance(spec_class, type) and issubclass(spec_class, KindSpec), f"{self.spec_path} is no KindSpec"
        return spec_class()

    def validator(self):
        import jsonschema

        schema = self.spec().json_schema()
        return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())

    # -- the contract -------------------------------------------------------------------------------------
    def test_the_kind_names_itself_and_its_component(self):
        spec = self.spec()
        assert isinstance(spec.kind, str) and spec.kind
        module, _, attribute = spec.component.partition(":")
        assert module and attribute, f"component must be 'module:Class', got {spec.component!r}"
        assert isinstance(spec.description, str)

    def test_products_and_sources_are_well_formed(self):
        """``products`` names artifacts (plain file names); ``sources`` of every valid example gives
        ``SourceRef``s whose ``kind`` is a kind name or None (any kind that lists the artifact in its products)."""
        from components.runtime.contract.spec import SourceRef

        spec = self.spec()
        assert isinstance(spec.products, tuple)
        for name in spec.products:
            assert isinstance(name, str) and name and "/" not in name and name not in (".", ".."), name
        for example in self.valid_examples:
            for ref in spec.sources(spec.validate(dict(example))):
                assert isinstance(ref, SourceRef), ref
                assert ref.kind is None or (isinstance(ref.kind, str) and ref.kind), ref
                assert isinstance(ref.artifact, str) and ref.artifact and "/" not in ref.artifact, ref
                assert ref.field.startswith("spec."), ref

    def test_the_elastic_default_is_well_formed(self):
        """``elastic`` is None or ``{"min_share": GPUs > 0, "min_workers": int >= 1}`` (either or both)."""
        elastic = self.spec().elastic
        if elastic is None:
            return
        assert isinstance(elastic, dict) and elastic and set(elastic) <= {"min_share", "min_workers"}, elastic
        if "min_share" in elastic:
            share = elastic["min_share"]
            assert isinstance(share, int | float) and not isinstance(share, bool) and share > 0, elastic
        if "min_workers" in elastic:
            assert isinstance(elastic["min_workers"], int) and elastic["min_workers"] >= 1, elastic

    def test_the_schema_is_a_valid_json_schema(self):
        import jsonschema

        schema = self.spec().json_schema()
        assert isinstance(schema, dict) and schema.get("type") == "object"
        jsonschema.Draft202012Validator.check_schema(schema)

    def test_valid_examples_are_accepted_idempotently_and_satisfy_the_schema(self):
        assert self.valid_examples, "give at least one valid example"
        spec, validator = self.spec(), self.validator()
        for example in self.valid_examples:
            normalized = spec.validate(dict(example))
            assert spec.validate(dict(normalized)) == normalized, f"validate is not idempotent on {example}"
            errors = [error.message for error in validator.iter_errors(normalized)]
            assert not errors, f"the schema refuses what validate returned for {example}: {errors}"

    def test_invalid_examples_name_every_bad_field(self):
        spec = self.spec()
        for example, fields in self.invalid_examples:
            with pytest.raises(SpecError) as caught:
                spec.validate(example)
            assert set(fields) <= set(caught.value.errors), (example, caught.value.errors)

    def test_a_spec_that_is_not_an_object_is_refused(self):
        for value in ([], "spec", 3, None):
            with pytest.raises(SpecError) as caught:
                self.spec().validate(value)
            assert caught.value.errors, value

    def test_schema_and_validate_agree_on_generated_instances(self):
        spec, validator = self.spec(), self.validator()
        accepted = 0
        for instance in SchemaInstances(spec.json_schema(), self.seed).many(self.generated):
            try:
                normalized = spec.validate(instance)
            except SpecError as error:
                assert error.errors and all(key == "spec" or key.startswith("spec.") for key in error.errors), \
                    f"errors must name spec.<field>: {error.errors}"
                continue
            accepted += 1
            errors = [error.message for error in validator.iter_errors(normalized)]
            assert not errors, f"validate returned {normalized} for {instance}, which the schema refuses: {errors}"
            assert spec.validate(dict(normalized)) == normalized
        assert accepted or not self.generated or self.valid_examples, "no generated instance was accepted"

    def test_the_spec_module_is_light(self):
        problem = light_import_problem(self.spec_path.partition(":")[0])
        assert problem is None, problem
