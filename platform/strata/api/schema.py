"""What the served OpenAPI schema (``/api/v1/schema/``, drf-spectacular, OpenAPI 3.0.3) says beyond what
drf-spectacular finds by itself, so that a client generator or a fuzzer can build every request from it and
check every answer against it:

- the job submit body is one schema per registered kind (``oneOf`` with a ``discriminator`` on ``kind``),
  each with ``kind`` fixed to that kind and ``spec`` typed by the kind's own ``KindSpec.json_schema()``
  (converted from JSON Schema 2020-12 to OpenAPI 3.0), with typed ``resources`` and ``time_limit``;
- jobs in replies have typed ``resources``; a quota's ``max_gpu_memory`` is bytes in replies and bytes or a
  size string in requests;
- the plugins' routes, served by generic URL patterns (``/api/v1/jobs/{id}/{route}/``, ``/api/v1/{collection}/``
  and ``/api/v1/{collection}/{name}/``), are described one path per registered job route and one path pair per
  registered collection (:func:`add_plugin_routes`, from the registry), typed by what each plugin declares: a
  job route's answer (its function's ``schema``), a collection's body (``Collection.schema``);
- bearer tokens are a security scheme (``bearerAuth``);
- every operation declares the error answers the API gives (:func:`add_error_responses`, a postprocessing
  hook): 400 with field errors, 401, 403, 404, 413, 415, 429 where they apply, each with a JSON error schema
  (``Error``: ``{"detail": "..."}``; ``ValidationError``: one key per bad field). Codes particular to a view
  (409 for a stale attempt or session, 422 for an idempotency conflict) are declared on the view with
  :func:`strata.api.error_answers.error_response`.

SPECTACULAR_SETTINGS (settings.py) names this module's hooks; naming it there also imports this module before
any view is inspected, which registers the extensions below.
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from drf_spectacular.extensions import (
    OpenApiAuthenticationExtension,
    OpenApiSerializerExtension,
    OpenApiSerializerFieldExtension,
)
from drf_spectacular.hooks import postprocess_schema_enums
from drf_spectacular.plumbing import ResolvedComponent
from drf_spectacular.settings import spectacular_settings
from rest_framework.permissions import AllowAny

from components.runtime.contract.registry import kinds
from strata.api.error_answers import (
    ERROR_DESCRIPTIONS,
    ERROR_REF,
    ERROR_SCHEMA,
    RETRY_AFTER,
    VALIDATION_ERROR_REF,
    VALIDATION_ERROR_SCHEMA,
)


def _error_response_object(code: int) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "description": ERROR_DESCRIPTIONS[code],
        "content": {"application/json": {"schema": VALIDATION_ERROR_REF if code == 400 else ERROR_REF}},
    }
    if code == 429:
        answer["headers"] = dict(RETRY_AFTER)
    return answer


def operation_error_codes(operation: dict[str, Any], view) -> set[int]:
    """The error codes ``operation`` (served by ``view``, as drf-spectacular instantiated it) can answer."""
    codes = {400}  # every request: a bad Content-Length, text that cannot be stored in the path or query
    if view is None or not all(isinstance(p, AllowAny) for p in view.get_permissions()):
        codes |= {401, 403}
    parameters = operation.get("parameters", [])
    if any(p.get("in") == "path" for p in parameters) or any(
            p.get("in") == "query" and p.get("name") == "page" for p in parameters):
        codes.add(404)
    if operation.get("requestBody"):
        # 413: BodySizeLimitMiddleware; 415: a media type no parser reads, or a charset that is not a text
        # encoding (RequestTextMiddleware, for any body, uploads included).
        codes |= {413, 415}
    if view is not None and view.get_throttles():
        codes.add(429)
    return codes


def _views_by_operation(generator, request) -> dict[tuple[str, str], Any]:
    """(path, method) -> the view instance drf-spectacular inspected for it (action and request set)."""
    views = {}
    for path, _regex, method, callback in generator.endpoints or []:
        view = generator.create_view(callback, method)
        path = generator.coerce_path(path, method, view)
        view.request = spectacular_settings.GET_MOCK_REQUEST(method, path, view, request)
        views[path, method.lower()] = view
    return views


def register_extensions(endpoints):
    """Preprocessing hook, run before any view is inspected. It changes nothing: being named in
    SPECTACULAR_SETTINGS makes drf-spectacular import this module first, which registers its extensions."""
    return endpoints


def postprocess_enums(result, generator, request, public):
    """drf-spectacular's enum hook (a named component per choice set of the serializers), kept away from the
    components written here: a kind's spec schema and ``kind: {enum: [<kind>]}`` of each submit variant stay
    as they are written (the hook would turn every ``enum`` there into a shared component)."""
    schemas = result.get("components", {}).get("schemas", {})
    own = {name: schemas.pop(name) for name in list(schemas) if name in OWN_COMPONENTS}
    result = postprocess_schema_enums(result, generator, request=request, public=public)
    result.setdefault("components", {}).setdefault("schemas", {}).update(own)
    return result


def add_error_responses(result, generator, request, public):
    """Postprocessing hook: the Error and ValidationError components, and on every operation the error
    answers it can give (codes a view already declares keep the view's description)."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas.setdefault("Error", ERROR_SCHEMA)
    schemas.setdefault("ValidationError", VALIDATION_ERROR_SCHEMA)
    views = _views_by_operation(generator, request)
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            if method not in {"get", "put", "post", "patch", "delete"}:
                continue
            responses = operation.setdefault("responses", {})
            for code in sorted(operation_error_codes(operation, views.get((path, method)))):
                responses.setdefault(str(code), _error_response_object(code))
            if "429" in responses:
                responses["429"].setdefault("headers", dict(RETRY_AFTER))
    return result


# --- JSON Schema 2020-12 (KindSpec.json_schema) -> OpenAPI 3.0 schema objects ----------------------------

OPENAPI30_KEYWORDS = {
    "title", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum", "maxLength", "minLength",
    "pattern", "maxItems", "minItems", "uniqueItems", "maxProperties", "minProperties", "required", "enum",
    "type", "allOf", "oneOf", "anyOf", "not", "items", "properties", "additionalProperties", "description",
    "format", "default", "nullable", "discriminator", "readOnly", "writeOnly", "example", "deprecated",
}


def openapi30(schema: Any) -> Any:
    """A JSON Schema (2020-12, as ``KindSpec.json_schema`` gives it) as an OpenAPI 3.0 schema object.

    ``type: [T, "null"]`` becomes ``type: T, nullable: true``; ``type: "null"`` alone becomes a nullable
    type whose only value is null; ``const`` an ``enum`` of one; numeric ``exclusiveMinimum``/``Maximum``
    the 3.0 boolean form; ``examples`` the first ``example``. Keywords OpenAPI 3.0 does not have
    (``$schema``, ``if``/``then``/``else``, ``patternProperties``, ...) are left out, so the result may
    accept more than the original; the server validates with the kind's own ``validate`` either way."""
    if schema is True:
        return {}
    if schema is False:
        return {"not": {}}
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "properties":
            out[key] = {name: openapi30(sub) for name, sub in value.items()}
        elif key == "additionalProperties":
            out[key] = value if isinstance(value, bool) else openapi30(value)
        elif key in ("items", "not"):
            out[key] = openapi30(value)
        elif key in ("oneOf", "anyOf"):
            out[key] = [openapi30(sub) for sub in value]
        elif key == "allOf":
            parts = [part for part in (openapi30(sub) for sub in value) if part != {}]
            if parts:
                out[key] = parts
        elif key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "examples":
            if value:
                out["example"] = value[0]
        elif key == "type":
            continue  # below
        elif key in OPENAPI30_KEYWORDS or key.startswith("x-"):
            out[key] = value
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        nullable = "null" in types
        types = [t for t in types if t != "null"]
        if not types:  # null only
            out.update({"type": "string", "nullable": True, "enum": [None]})
        elif len(types) == 1:
            out["type"] = types[0]
            if nullable:
                out["nullable"] = True
        else:
            alternatives = [{"type": t, **({"nullable": True} if nullable else {})} for t in types]
            if "anyOf" in out:
                out["allOf"] = [*out.get("allOf", []), {"anyOf": alternatives}]
            else:
                out["anyOf"] = alternatives
    if out.get("nullable") and "enum" in out and None not in out["enum"]:
        del out["nullable"]  # the enum does not allow null, so neither does the schema
    return out


def kind_component_prefix(kind: str) -> str:
    """``hello`` -> ``Hello``, ``my-kind`` -> ``MyKind``: a component name prefix for a job kind."""
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[^A-Za-z0-9]+", kind) if part) or "Kind"


def kind_spec_schema(kind: str) -> dict[str, Any]:
    """The OpenAPI 3.0 schema of ``kind``'s spec (from ``KindSpec.json_schema``)."""
    spec = kinds()[kind]
    schema = openapi30(spec.json_schema())
    schema.setdefault("type", "object")
    schema["title"] = f"{kind} spec"
    if spec.description and "description" not in schema:
        schema["description"] = spec.description
    return schema


# --- job bodies -----------------------------------------------------------------------------------------

SIZE_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?\s*([kKmMgGtT][iI]?[bB]?|[bB])?\s*$"
# A size of at least one byte: a non-zero digit before the point (so "0", "0.0GiB" are not generated).
POSITIVE_SIZE_PATTERN = r"^\s*[0-9]*[1-9][0-9]*(\.[0-9]+)?\s*([kKmMgGtT][iI]?[bB]?|[bB])?\s*$"
DURATION_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?\s*([sShHdD]|[mM]|[mM][iI][nN])?\s*$"


def resources_request_schema() -> dict[str, Any]:
    """The ``resources`` of a submit body (``normalize_resources`` in jobs/api/serializers.py checks it)."""
    from strata.jobs.api.serializers import MAX_CPUS, MAX_GPU_MEMORY, MAX_MEMORY, MIN_CPUS

    memory_bytes = {"type": "integer", "minimum": 1, "maximum": MAX_GPU_MEMORY, "nullable": True}
    host_bytes = {**memory_bytes, "maximum": MAX_MEMORY}
    return {
        "type": "object",
        "additionalProperties": False,
        "description": "What each worker needs. Default: one whole GPU, one worker.",
        "properties": {
            "gpus": {"type": "number", "minimum": 0, "maximum": 64,
                     "description": "GPUs per worker: a fraction up to 1 shares a device; above 1, a whole number "
                                    "of devices on one node. 0 together with gpu_memory: a slice sized by "
                                    "memory; 0 alone: no GPU, the job runs on a node's CPUs (see cpus). Default "
                                    "1, or 0 when gpu_memory is given."},
            "gpu_memory": {
                "oneOf": [memory_bytes, {"type": "string", "pattern": POSITIVE_SIZE_PATTERN, "maxLength": 64}],
                "description": "GPU memory per worker: bytes, or a size such as \"4GiB\" or \"512MB\"; null: "
                               "not sized by memory.",
                "example": "4GiB",
            },
            "cpus": {"type": "number", "minimum": MIN_CPUS, "maximum": MAX_CPUS, "nullable": True,
                     "description": "CPUs per worker, reserved on its node (fractions allowed). Default 1 for a job "
                                    "with gpus 0; a GPU job reserves none unless it states them."},
            "memory": {
                "oneOf": [host_bytes, {"type": "string", "pattern": POSITIVE_SIZE_PATTERN, "maxLength": 64}],
                "description": "Host memory per worker, reserved with its CPUs: bytes or a size such as \"2GiB\"; "
                               "null: none reserved.",
                "example": "2GiB",
            },
            "workers": {"type": "integer", "minimum": 1, "maximum": 256, "default": 1,
                        "description": "Workers (ranks), placed all or nothing, possibly across nodes."},
            "node_labels": {"type": "object", "additionalProperties": {"type": "string"},
                            "description": "Run only on nodes with all of these labels.",
                            "example": {"zone": "a"}},
            "elastic": ELASTIC_SCHEMA,
        },
    }


ELASTIC_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "minProperties": 1,
    "description": "The job may be shrunk rather than preempted when a higher-priority job needs room: it stops at "
                   "a checkpoint and restarts at once at the smaller size (docs/architecture.md, Shrink instead of "
                   "preempt).",
    "properties": {
        "min_share": {"type": "number", "minimum": 0.001, "maximum": 64,
                      "description": "The fewest GPUs per worker it may keep (at most gpus; whole above 1)."},
        "min_workers": {"type": "integer", "minimum": 1, "maximum": 256,
                        "description": "The fewest workers it may keep (at most workers)."},
    },
    "example": {"min_share": 0.25},
}


RESOURCES_RESPONSE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "The normalized resource request: per worker.",
    "properties": {
        "gpus": {"type": "number"},
        "gpu_memory": {"type": "integer", "nullable": True, "description": "Bytes; null: not sized by memory."},
        "workers": {"type": "integer"},
        "cpus": {"type": "number", "description": "CPUs reserved per worker; absent: none (a GPU job that "
                                                  "states none)."},
        "memory": {"type": "integer", "nullable": True, "description": "Host memory reserved per worker, bytes; "
                                                                       "null: none."},
        "node_labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "elastic": ELASTIC_SCHEMA,
    },
    "required": ["gpus", "workers"],
}


def time_limit_request_schema() -> dict[str, Any]:
    maximum = settings.STRATA_MAX_TIME_LIMIT_SECONDS
    return {
        "oneOf": [
            {"type": "integer", "minimum": 1, "maximum": maximum},
            {"type": "string", "pattern": DURATION_PATTERN, "maxLength": 64},
        ],
        "description": f"Seconds, or a duration such as \"90s\", \"15m\", \"2h\", \"1d\"; at most {maximum} s. "
                       "Default 1 h.",
        "example": "30m",
    }


# Components written here by hand (the per-kind submit bodies and specs); the enum hook leaves them alone.
OWN_COMPONENTS: set[str] = set()


def _component(auto_schema, name: str, schema: dict[str, Any]) -> dict[str, str]:
    """Register ``schema`` as component ``name`` (once per generation) and return its ``$ref``."""
    OWN_COMPONENTS.add(name)
    component = ResolvedComponent(name=name, type=ResolvedComponent.SCHEMA, schema=schema,
                                  object=f"strata.api.schema:{name}")
    auto_schema.registry.register_on_missing(component)
    return component.ref


class JobSubmitSchema(OpenApiSerializerExtension):
    """The submit body: one schema per registered kind, chosen by ``kind`` (a discriminator)."""

    target_class = "strata.jobs.api.serializers.JobSubmitSerializer"

    def map_serializer(self, auto_schema, direction):
        base = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        if direction != "request":
            return base
        resources = _component(auto_schema, "ResourcesRequest", resources_request_schema())
        mapping = {}
        for kind, spec in sorted(kinds().items()):
            prefix = kind_component_prefix(kind)
            properties = dict(base.get("properties", {}))
            properties["kind"] = {"type": "string", "enum": [kind], "description": spec.description or kind}
            properties["time_limit"] = time_limit_request_schema()
            properties["resources"] = resources
            properties["spec"] = _component(auto_schema, f"{prefix}Spec", kind_spec_schema(kind))
            variant = {
                "type": "object",
                "title": f"a {kind} job",
                "properties": properties,
                "required": sorted({"kind", *base.get("required", [])}),
                "additionalProperties": False,
            }
            mapping[kind] = _component(auto_schema, f"{prefix}JobSubmitRequest", variant)["$ref"]
        return {
            "oneOf": [{"$ref": ref} for ref in mapping.values()],
            "discriminator": {"propertyName": "kind", "mapping": mapping},
            "required": ["kind"],
            "description": "A job to submit. `kind` is one of the registered kinds and chooses the schema of "
                           "`spec`. Unknown or read-only fields are refused (400).",
        }


class JobSchema(OpenApiSerializerExtension):
    """Jobs in replies (detail and list): typed ``resources``; ``spec`` is the kind's normalized spec."""

    target_class = "strata.jobs.api.serializers.JobSerializer"
    match_subclasses = True

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        properties = schema.get("properties", {})
        if "resources" in properties:
            properties["resources"] = {**RESOURCES_RESPONSE_SCHEMA, "readOnly": True}
        if "spec" in properties:
            properties["spec"] = {"type": "object", "additionalProperties": {}, "readOnly": True,
                                  "description": "The normalized spec of the job's kind: every field of the "
                                                 "kind's spec schema, defaults filled in."}
        if "time_limit" in properties:
            properties["time_limit"] = {**properties["time_limit"], "description": "Seconds."}
        return schema


class ByteSizeFieldSchema(OpenApiSerializerFieldExtension):
    """A quota's ``max_gpu_memory``: bytes in replies; bytes or a size string in requests; null: unlimited."""

    target_class = "strata.quotas.api.serializers.ByteSizeField"

    def map_serializer_field(self, auto_schema, direction):
        from strata.quotas.services import QUOTA_FIELDS

        if direction == "response":
            return {"type": "integer", "minimum": 0, "nullable": True, "description": "Bytes; null: unlimited."}
        _, _, minimum, maximum = QUOTA_FIELDS["max_gpu_memory"]
        bounds = {"minimum": minimum, **({"maximum": maximum} if maximum is not None else {})}
        return {
            "oneOf": [{"type": "integer", **bounds, "nullable": True},
                      {"type": "string", "pattern": SIZE_PATTERN, "maxLength": 64}],
            "description": "Bytes, or a size such as \"64GiB\"; null: unlimited.",
        }


class ParticipantBearerScheme(OpenApiAuthenticationExtension):
    target_class = "strata.jobs.api.views.ParticipantBearerAuthentication"
    name = "participantAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer",
                "description": "The participant routes: one of the job's access tokens (`sj_...`) to join, the "
                               "participant's secret (`sp_...`, from the join's answer) afterwards."}


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "strata.accounts.authentication.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer",
                "description": "An API token (`st_...`): a user token for a team, or a node token on "
                               "/api/v1/node/ routes."}


# --- the plugins' routes: one path per registered job route, one path pair per registered collection -----

JOB_ROUTE_PATH = "/api/v1/jobs/{id}/{route}/"
COLLECTION_PATH = "/api/v1/{collection}/"
COLLECTION_ITEM_PATH = "/api/v1/{collection}/{name}/"

RECORD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "One record as the collection shows it: its body, with what the API adds (and any live facts "
                   "the collection's present() adds).",
    "properties": {
        "name": {"type": "string"},
        "team": {"type": "string", "nullable": True, "description": "The team's slug; null for a built-in."},
        "builtin": {"type": "boolean"},
        "created_at": {"type": "string", "format": "date-time"},
        "created_by": {"type": "string", "nullable": True},
    },
    "required": ["name", "team", "builtin"],
    "additionalProperties": {},
}


def _first_paragraph(text: str | None) -> str:
    return " ".join((text or "").strip().split("\n\n")[0].split())


def _plugin_schema(schema: dict[str, Any] | None, title: str) -> dict[str, Any]:
    """A plugin's JSON Schema (a job route's answer, a collection's body) as an OpenAPI 3.0 schema object."""
    if not schema:
        return {"type": "object", "additionalProperties": {}, "title": title}
    converted = openapi30(schema)
    converted.setdefault("type", "object")
    converted.setdefault("title", title)
    return converted


def _specialize(operation: dict[str, Any], operation_id: str, dropped: str, description: str) -> dict[str, Any]:
    """A copy of a generic operation for one plugin's route: its own id, no ``dropped`` path parameter."""
    import copy

    own = copy.deepcopy(operation)
    own["operationId"] = operation_id
    own["parameters"] = [p for p in own.get("parameters", []) if not (p.get("in") == "path" and p["name"] == dropped)]
    if description:
        own["description"] = description
    return own


def _json_response(operation: dict[str, Any], code: str, ref: dict[str, Any]) -> None:
    answer = operation.setdefault("responses", {}).setdefault(code, {"description": ""})
    answer["content"] = {"application/json": {"schema": ref}}


def add_plugin_routes(result, generator, request, public):
    """Postprocessing hook (after the error answers): the generic plugin paths (``/api/v1/jobs/{id}/{route}/``,
    ``/api/v1/{collection}/`` and ``/api/v1/{collection}/{name}/``, which still answer for every plugin)
    are replaced by one path per route the registry holds, each typed by what its plugin declares: a job
    route's answer (``function.schema``), a collection's body (``Collection.schema``) and its records."""
    from components.runtime.contract import registry

    paths = result.get("paths", {})
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    route_template = paths.pop(JOB_ROUTE_PATH, None)
    if route_template and "get" in route_template:
        for route, function in sorted(registry.job_routes().items()):
            prefix = kind_component_prefix(route)
            name = f"{prefix}JobRoute"
            schemas[name] = _plugin_schema(getattr(function, "schema", None), f"the {route} of a job")
            operation = _specialize(route_template["get"], f"jobs_route_{route.replace('-', '_')}", "route",
                                    _first_paragraph(function.__doc__))
            operation["responses"].pop("500", None)  # a failing route is a bug, never an answer to declare
            _json_response(operation, "200", {"$ref": f"#/components/schemas/{name}"})
            paths[f"/api/v1/jobs/{{id}}/{route}/"] = {"get": operation}
    listing, item = paths.pop(COLLECTION_PATH, None), paths.pop(COLLECTION_ITEM_PATH, None)
    if not listing or not item:
        return result
    schemas.setdefault("CollectionRecord", RECORD_SCHEMA)
    record_ref = {"$ref": "#/components/schemas/CollectionRecord"}
    for collection_name, collection in sorted(registry.collections().items()):
        prefix = kind_component_prefix(collection_name)
        body = _plugin_schema(collection.schema, f"a {collection_name} record")
        body.setdefault("properties", {})["team"] = {
            "type": "string", "description": "The team to register it for (a slug); default: the token's team."}
        schemas[f"{prefix}RecordRequest"] = body
        schemas[f"{prefix}List"] = {
            "type": "object",
            "properties": {"collection": {"type": "string", "enum": [collection_name]}, "title": {"type": "string"},
                           "results": {"type": "array", "items": record_ref},
                           "summary": {"type": "object", "additionalProperties": {}}},
            "required": ["collection", "title", "results"],
        }
        operation_id = f"collection_{collection_name.replace('-', '_')}"
        description = _first_paragraph(collection.description) or _first_paragraph(type(collection).__doc__)
        own: dict[str, Any] = {}
        for method, operation in listing.items():
            own[method] = _specialize(operation, f"{operation_id}_{'list' if method == 'get' else 'create'}",
                                      "collection", description)
        if "get" in own:
            _json_response(own["get"], "200", {"$ref": f"#/components/schemas/{prefix}List"})
        if "post" in own:
            own["post"]["requestBody"] = {"content": {"application/json": {
                "schema": {"$ref": f"#/components/schemas/{prefix}RecordRequest"}}}, "required": True}
            _json_response(own["post"], "201", record_ref)
        paths[f"/api/v1/{collection_name}/"] = own
        own_item: dict[str, Any] = {}
        for method, operation in item.items():
            own_item[method] = _specialize(operation, f"{operation_id}_{'read' if method == 'get' else method}",
                                           "collection", description)
        if "get" in own_item:
            _json_response(own_item["get"], "200", record_ref)
        paths[f"/api/v1/{collection_name}/{{name}}/"] = own_item
    return result
