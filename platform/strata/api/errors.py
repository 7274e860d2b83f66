"""Map domain exceptions to HTTP answers, so views stay thin."""

from __future__ import annotations

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from strata.cluster.services import StaleSession
from strata.jobs.services import IdempotencyConflict, StaleAttempt, SubmitRejected
from strata.jobs.states import InvalidTransition


def exception_handler(exc, context):
    if isinstance(exc, IdempotencyConflict):
        return Response({"detail": "Idempotency-Key was already used with a different request body."},
                        status=status.HTTP_422_UNPROCESSABLE_ENTITY)
    if isinstance(exc, SubmitRejected):
        return Response({exc.field: [exc.message]}, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, StaleAttempt | StaleSession | InvalidTransition):
        return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
    return drf_exception_handler(exc, context)
