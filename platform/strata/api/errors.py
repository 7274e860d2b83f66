"""Map domain exceptions to HTTP answers, so views stay thin."""

from __future__ import annotations

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from strata.cluster.services import StaleSession
from strata.jobs.participants import (
    ParticipantConflict,
    ParticipantDenied,
    ParticipantInvalid,
    ParticipantUnknown,
)
from strata.jobs.services import IdempotencyConflict, StaleAttempt, SubmitRejected
from strata.jobs.states import InvalidTransition
from strata.jobs.storage import StorageUnavailable
from strata.quotas.services import StorageQuotaExceeded


def exception_handler(exc, context):
    if isinstance(exc, ParticipantDenied):
        return Response({"detail": str(exc)}, status=status.HTTP_401_UNAUTHORIZED,
                        headers={"WWW-Authenticate": "Bearer"})
    if isinstance(exc, ParticipantUnknown):
        return Response({"detail": str(exc)}, status=status.HTTP_404_NOT_FOUND)
    if isinstance(exc, ParticipantConflict):
        return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
    if isinstance(exc, ParticipantInvalid):
        return Response({field: [message] for field, message in exc.errors.items()},
                        status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, IdempotencyConflict):
        return Response({"detail": "Idempotency-Key was already used with a different request body."},
                        status=status.HTTP_422_UNPROCESSABLE_ENTITY)
    if isinstance(exc, SubmitRejected):
        return Response({exc.field: [exc.message]}, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, StaleAttempt | StaleSession | InvalidTransition):
        return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
    if isinstance(exc, StorageQuotaExceeded):  # the team's max_storage_bytes: what it is, what is stored
        return Response({"detail": str(exc), "limit": "max_storage_bytes", "max_storage_bytes": exc.limit,
                         "stored_bytes": exc.used, "requested_bytes": exc.requested},
                        status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    if isinstance(exc, StorageUnavailable):  # the object store is down or refuses: try again later
        return Response({"detail": f"artifact storage is unavailable ({exc}); try again"},
                        status=status.HTTP_503_SERVICE_UNAVAILABLE, headers={"Retry-After": "10"})
    return _capped(drf_exception_handler(exc, context))


MAX_FIELD_ERRORS = 100  # a body with 10,000 bad or unknown fields is answered with the first ones, not 400 KB


def _capped(response):
    """A 400 naming at most MAX_FIELD_ERRORS fields, then how many more there were."""
    data = getattr(response, "data", None)
    if response is None or response.status_code != 400 or not isinstance(data, dict) \
            or len(data) <= MAX_FIELD_ERRORS:
        return response
    kept = dict(list(data.items())[:MAX_FIELD_ERRORS])
    more = [f"and {len(data) - MAX_FIELD_ERRORS} more fields with errors"]
    kept["non_field_errors"] = [*kept.get("non_field_errors", []), *more]
    response.data = kept
    return response


# --- Django's own error answers (before or outside DRF): JSON under /api/, the usual pages elsewhere ---------
# A URL that matches no route (a job id with other characters, ``/api/v1/node/attempts/x/claim/``), or a
# request Django itself refuses (a disallowed Host, too many form fields) never reaches DRF's exception
# handler; without these, API clients would get an HTML page where the schema promises JSON.

API_PREFIX = "/api/"


def _api_error(request, status_code: int, detail: str, fallback, exception):
    from django.http import JsonResponse

    if request.path.startswith(API_PREFIX):
        return JsonResponse({"detail": detail}, status=status_code)
    return fallback(request, exception)


def bad_request(request, exception):
    from django.views import defaults

    return _api_error(request, 400, "Bad request.", defaults.bad_request, exception)


def permission_denied(request, exception):
    from django.views import defaults

    return _api_error(request, 403, "You do not have permission to perform this action.", defaults.permission_denied,
                      exception)


def page_not_found(request, exception):
    from django.views import defaults

    return _api_error(request, 404, "Not found.", defaults.page_not_found, exception)


def server_error(request):
    """A bug's answer: JSON under /api/ too (the traceback goes to the server log, never to the client)."""
    from django.http import JsonResponse
    from django.views import defaults

    if request.path.startswith(API_PREFIX):
        return JsonResponse({"detail": "Internal server error; the server log has the details."}, status=500)
    return defaults.server_error(request)
