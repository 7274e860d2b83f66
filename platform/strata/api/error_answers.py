"""The API's error answers as the schema states them (``Error``, ``ValidationError``) and
:func:`error_response`, which a view names for a code particular to it. Apart from :mod:`strata.api.schema`
(which imports the apps' serializers and services to type job bodies), so that any app's views can use it
without importing the layers above them."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse

# --- error answers --------------------------------------------------------------------------------------

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "An error that is not about one field: what went wrong, in words.",
    "properties": {"detail": {"type": "string"}},
    "required": ["detail"],
}
VALIDATION_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": (
        "A request that was refused as invalid: one key per bad field, named by its dotted path "
        "(`spec.epochs`, `resources.gpus`, `Idempotency-Key`, a query parameter), each with a list of messages "
        "(a nested object or list for a nested field, as in `{\"reports\": {\"primes\": {\"disks\": [...]}}}`); "
        "`non_field_errors` for the body as a whole; `detail` alone for a request that could not be read "
        "(malformed JSON, a bad Content-Length, text that cannot be stored)."
    ),
    "properties": {
        "detail": {"type": "string"},
        "non_field_errors": {"type": "array", "items": {"type": "string"}},
    },
    "additionalProperties": {"anyOf": [{"type": "array", "items": {}}, {"type": "object"}, {"type": "string"}]},
    "example": {"spec.epochs": ["must be >= 1"], "resources.gpus": ["must be between 0 and 64"]},
}
ERROR_REF = {"$ref": "#/components/schemas/Error"}
VALIDATION_ERROR_REF = {"$ref": "#/components/schemas/ValidationError"}

ERROR_DESCRIPTIONS = {
    400: "Invalid request: one key per bad field (see ValidationError).",
    401: "No valid credentials: the bearer token is missing, malformed, unknown, expired or revoked.",
    403: "Not allowed: a node token on a user route (or a user on a node route), not a cluster admin, or a "
         "session request without its CSRF token.",
    404: "No such object, or one of another team (never told apart), or no such page of a list.",
    409: "Conflict with the object's current state.",
    413: "The request body is larger than the limit (STRATA_MAX_BODY_BYTES, 1 MiB by default).",
    415: "Unsupported Content-Type (send application/json), or a charset that is not a text encoding.",
    422: "Idempotency-Key was already used with a different request body.",
    429: "Too many requests: throttled; retry after Retry-After seconds.",
}
RETRY_AFTER = {"Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait before retrying."}}


def error_response(code: int, description: str | None = None) -> OpenApiResponse:
    """An error answer for ``extend_schema(responses={...})``, for a code particular to a view."""
    return OpenApiResponse(VALIDATION_ERROR_REF if code == 400 else ERROR_REF,
                           description=description or ERROR_DESCRIPTIONS[code])
