"""``GET /api/v1/compare/?jobs=<id>,<id>,...``: several jobs of the caller's teams side by side
(``strata.jobs.compare``): metric series, final metrics, resources and the spec diff; ``?parent=<id>`` instead
compares a job's first children. A read: any role of the team may compare its jobs. Fewer than two or more than
twenty jobs, or a value that is no job id, is a 400 on ``jobs`` (or ``parent``); a job that does not exist or is
another team's is a 404 naming it."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import APIView

from strata.accounts.selectors import visible_team_ids
from strata.api.error_answers import error_response
from strata.api.permissions import IsUser
from strata.jobs.compare import MAX_JOBS, CompareInvalid, CompareNotFound, compare_jobs, requested_ids

JOBS = OpenApiParameter("jobs", str,
                        description=f"Comma-separated job ids, 2 to {MAX_JOBS} (the parameter may also repeat).")
PARENT = OpenApiParameter("parent", str, description=f"Instead of jobs: this job's first {MAX_JOBS} children "
                                                      "(oldest first), e.g. a sweep's trials.")


class CompareView(APIView):
    """Compare jobs: each job's metric series (thinned), final metrics, state, attempts, duration, GPUs and the
    GPU- and CPU-seconds billed, and the paths of kind, spec, resources and limits whose values differ."""

    permission_classes = [IsUser]
    usage = None
    """job ids -> {job id: {"gpu_seconds", "cpu_seconds"}}, given by the URL map
    (``CompareView.as_view(usage=strata.quotas.selectors.job_usage)``); None leaves them null."""

    @extend_schema(operation_id="compare_jobs", parameters=[JOBS, PARENT],
                   responses={200: OpenApiTypes.OBJECT, 400: error_response(400),
                              404: error_response(404, "A job that does not exist or is another team's.")})
    def get(self, request):
        team_ids = visible_team_ids(request)
        try:
            job_ids = requested_ids(team_ids, request.query_params.getlist("jobs"), request.query_params.get("parent"))
            answer = compare_jobs(team_ids, job_ids, usage=self.usage)
        except CompareInvalid as error:
            raise serializers.ValidationError({error.field: [error.message]}) from None
        except CompareNotFound as error:
            raise NotFound(str(error)) from None
        return Response(answer)
