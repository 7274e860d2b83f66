"""Thin REST adapters over jobs.services and jobs.selectors."""

from __future__ import annotations

import io
import json
import logging
import tempfile
import uuid

from django.contrib.auth.models import AnonymousUser
from django.http import FileResponse, Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import authentication, mixins, parsers, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.generics import get_object_or_404
from rest_framework.permissions import BasePermission
from rest_framework.response import Response
from rest_framework.views import APIView

from strata.accounts import roles
from strata.accounts.authentication import bearer_value
from strata.accounts.models import Team
from strata.accounts.selectors import visible_team_ids
from strata.api.error_answers import error_response
from strata.api.permissions import IsUser
from strata.api.throttles import SubmitThrottle
from strata.cluster.api.views import NodeAPIView
from strata.jobs import data as data_sets
from strata.jobs import participants, services, transfers
from strata.jobs.api import log_views
from strata.jobs.api.node_serializers import StoredArtifactSerializer
from strata.jobs.api.node_views import (
    ARTIFACT_NAME,
    ATTEMPT_QUERY,
    DIRECT_LINK,
    NO_FILE,
    STALE_ATTEMPT,
    AttemptAPIView,
    attempt_from_query,
    bytes_or_link,
)
from strata.jobs.api.serializers import (
    ArtifactSerializer,
    CodeBundleDetailSerializer,
    CodeBundleSerializer,
    DataSetDetailSerializer,
    DataSetSerializer,
    DataUploadCreateSerializer,
    DataUploadPartsAnswerSerializer,
    DataUploadPartsSerializer,
    DataUploadSerializer,
    JobEventSerializer,
    JobListSerializer,
    JobSerializer,
    JobSubmitSerializer,
    JobTokenCreatedSerializer,
    JobTokenCreateSerializer,
    JobTokenSerializer,
    LogLineSerializer,
    MetricPointSerializer,
    ParticipantHeartbeatAnswerSerializer,
    ParticipantHeartbeatSerializer,
    ParticipantJoinedSerializer,
    ParticipantJoinSerializer,
    ParticipantLeftSerializer,
    ParticipantSerializer,
)
from strata.jobs.code import CodeRejected, code_delete, code_store
from strata.jobs.models import Artifact, CodeBundle, DataSet, DataUpload
from strata.jobs.selectors import (
    JOB_FILTERS,
    JobFilterInvalid,
    SubmitTeamError,
    jobs_filtered,
    jobs_visible,
    jobs_with_attempts,
    require_submitter,
    submit_team,
)
from strata.jobs.storage import get_storage
from strata.telemetry.metrics import SUBMIT_SECONDS

MAX_STREAM_ITEMS = 1000

log = logging.getLogger(__name__)


def _after(request) -> int:
    try:
        return max(0, int(request.query_params.get("after", 0)))
    except ValueError:
        raise serializers.ValidationError({"after": ["must be an integer id"]}) from None


LIST_FILTERS = [
    OpenApiParameter("state", str, description="Comma-separated job states, e.g. RUNNING,QUEUED (unknown: 400)."),
    OpenApiParameter("kind", str, description="Only jobs of this kind."),
    OpenApiParameter("team", str, description="Only jobs of this team (slug)."),
    OpenApiParameter("owner", str, description="Only jobs of this user (username)."),
]


@extend_schema_view(list=extend_schema(parameters=LIST_FILTERS))
class JobViewSet(mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Submit, list, inspect and cancel jobs of the caller's teams."""

    permission_classes = [IsUser]
    lookup_value_regex = "[0-9a-f-]{36}"

    def get_queryset(self):
        queryset = jobs_visible(visible_team_ids(self.request))
        try:
            queryset = jobs_filtered(queryset, {name: self.request.query_params.get(name) for name in JOB_FILTERS})
        except JobFilterInvalid as error:
            raise serializers.ValidationError({error.field: [error.message]}) from None
        if self.action == "retrieve":
            queryset = jobs_with_attempts(queryset)
        return queryset

    def get_serializer_class(self):
        if self.action == "create":
            return JobSubmitSerializer
        if self.action == "list":
            return JobListSerializer
        return JobSerializer

    def get_throttles(self):
        return [SubmitThrottle()] if self.action == "create" else super().get_throttles()

    @extend_schema(
        request=JobSubmitSerializer,
        responses={201: OpenApiResponse(JobSerializer, description="The new job."),
                   200: OpenApiResponse(JobSerializer, description="A replay: the job first submitted with this "
                                                               "Idempotency-Key and the same body."),
                   422: error_response(422)},
        parameters=[OpenApiParameter("Idempotency-Key", {"type": "string", "minLength": 1, "maxLength": 200},
                                     OpenApiParameter.HEADER, required=False,
                                     description="Submit at most once: a retry with the same key and body "
                                                 "returns the same job (200).")],
    )
    @SUBMIT_SECONDS.time()  # strata_job_submit_seconds (strata.telemetry.metrics)
    def create(self, request, *args, **kwargs):
        require_submitter(request, request.data.get("team") if isinstance(request.data, dict) else None)
        serializer = JobSubmitSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        team = self._submit_team(data.pop("team", None))
        key = request.headers.get("Idempotency-Key")
        if key is not None and not 1 <= len(key) <= 200:
            raise serializers.ValidationError({"Idempotency-Key": ["must be 1 to 200 characters"]})
        job, created = services.job_submit(user=request.user, team=team, data=data, idempotency_key=key)
        job = jobs_with_attempts(jobs_visible([team.pk])).get(pk=job.pk)
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    def _submit_team(self, slug: str | None) -> Team:
        try:
            return submit_team(self.request, slug)
        except SubmitTeamError as error:
            raise serializers.ValidationError({"team": [str(error)]}) from None

    def _managed(self, action: str):
        """The job the URL names (another team's: a 404) if the caller may change it: its owner with the member
        role, anyone with team-admin (strata.accounts.roles); else a JSON 403 naming the role needed."""
        job = self.get_object()
        roles.require_manage(self.request, job.team, job.owner_id, f"{action}: it is {job.owner.username}'s job"
                             if job.owner_id != self.request.user.pk else action)
        return job

    @extend_schema(request=None, responses=JobSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        job = self._managed("cancel it")
        job = services.job_cancel(job, reason=f"cancelled by {request.user.username}", request=request)
        return Response(JobSerializer(jobs_with_attempts(self.get_queryset()).get(pk=job.pk)).data)

    @extend_schema(request=None, responses={201: JobSerializer})
    @action(detail=True, methods=["post"])
    def resubmit(self, request, pk=None):
        new_job = services.job_resubmit(self._managed("resubmit it"), user=request.user, request=request)
        return Response(JobSerializer(jobs_with_attempts(self.get_queryset()).get(pk=new_job.pk)).data,
                        status=status.HTTP_201_CREATED)

    @extend_schema(responses=JobEventSerializer(many=True),
                   parameters=[OpenApiParameter("after", int, description="Only ids greater than this")])
    @action(detail=True, methods=["get"], pagination_class=None)  # a plain list, not paginated
    def events(self, request, pk=None):
        job = self.get_object()
        items = job.events.filter(id__gt=_after(request)).order_by("id")[:MAX_STREAM_ITEMS]
        return Response(JobEventSerializer(items, many=True).data)

    @extend_schema(responses=LogLineSerializer(many=True),
                   parameters=[OpenApiParameter("after", int, description="Only ids greater than this"),
                               *log_views.FILTERS])
    @action(detail=True, methods=["get"], pagination_class=None)  # a plain list, not paginated
    def logs(self, request, pk=None):
        # Filtered (q, grep, since, until, rank): each line also says where it matched (strata.jobs.log_search).
        return log_views.job_logs(request, self.get_object(), after=_after(request), limit=MAX_STREAM_ITEMS,
                                  plain=LogLineSerializer)

    @extend_schema(responses=MetricPointSerializer(many=True),
                   parameters=[OpenApiParameter("name", str), OpenApiParameter("after", int)])
    @action(detail=True, methods=["get"], pagination_class=None)  # a plain list, not paginated
    def metrics(self, request, pk=None):
        job = self.get_object()
        items = job.metric_points.filter(id__gt=_after(request))
        if name := request.query_params.get("name"):
            items = items.filter(name=name)
        return Response(MetricPointSerializer(items.order_by("id")[:10 * MAX_STREAM_ITEMS], many=True).data)

    @extend_schema(methods=["GET"], request=None, responses=JobTokenSerializer(many=True))
    @extend_schema(methods=["POST"], request=JobTokenCreateSerializer,
                   responses={201: JobTokenCreatedSerializer, 400: error_response(400)})
    @action(detail=True, methods=["get", "post"], pagination_class=None)
    def tokens(self, request, pk=None):
        """The job's access tokens (GET), or a new one (POST; the raw token is in the answer, once). Callers of
        the job's services present one (an RPC endpoint takes it as ``authorization: Bearer``)."""
        job = self.get_object()
        if request.method == "GET":
            return Response(JobTokenSerializer(job.tokens.select_related("created_by"), many=True).data)
        job = self._managed("create its access tokens")
        serializer = JobTokenCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        token, raw = services.job_token_create(job, user=request.user, **serializer.validated_data)
        answer = JobTokenCreatedSerializer(token).data
        answer["token"] = raw
        return Response(answer, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: JobTokenSerializer, 404: error_response(404)})
    @action(detail=True, methods=["delete"], url_path=r"tokens/(?P<token_id>[0-9a-f-]{36})")
    def revoke_token(self, request, pk=None, token_id=None):
        """Revoke one of the job's access tokens (idempotent): the job's attempts stop accepting it within a
        few seconds."""
        job = self._managed("revoke its access tokens")
        token = get_object_or_404(job.tokens, pk=token_id)
        return Response(JobTokenSerializer(services.job_token_revoke(token, user=request.user)).data)

    @extend_schema(responses=ParticipantSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None)  # a plain list, not paginated
    def participants(self, request, pk=None):
        """The machines outside the cluster that joined the job (its kind's ``accepts_participants``), oldest
        first, ended ones included."""
        return Response(ParticipantSerializer(participants.job_participants(self.get_object()), many=True).data)

    @extend_schema(request=None, responses={200: ParticipantSerializer, 404: error_response(404)})
    @action(detail=True, methods=["delete"], url_path=r"participants/(?P<participant_id>[0-9a-f-]{36})")
    def evict_participant(self, request, pk=None, participant_id=None):
        """Evict a participant (idempotent): its next heartbeat answers stop, and its GPUs stop counting against
        the team's quota at once."""
        job = self._managed("evict its participants")
        participant = get_object_or_404(job.participants, pk=participant_id)
        participant = participants.participant_evict(participant, request.user.username)
        return Response(ParticipantSerializer(participants.participant_entry(participant)).data)

    @extend_schema(responses=ArtifactSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None)  # a plain list, not paginated
    def artifacts(self, request, pk=None):
        job = self.get_object()
        return Response(ArtifactSerializer(job.artifacts.filter(kind=Artifact.Kind.ARTIFACT), many=True).data)

    @extend_schema(responses={(200, "application/octet-stream"): bytes})
    @action(detail=True, methods=["get"], url_path=r"artifacts/(?P<artifact_id>[0-9a-f-]{36})/download")
    def download(self, request, pk=None, artifact_id=None):
        job = self.get_object()
        # get_object_or_404 answers 404 for an id the route lets through that is no UUID ("000...0"), too.
        artifact = get_object_or_404(job.artifacts, pk=artifact_id, kind=Artifact.Kind.ARTIFACT)
        # Always bytes, whatever the name says (never text/html or JSON guessed from "x.html" or "x.json").
        redirect = transfers.download_redirect(artifact.storage_key, artifact.size)
        if redirect is not None:
            return redirect
        return FileResponse(get_storage().open(artifact.storage_key), as_attachment=True, filename=artifact.name,
                            content_type="application/octet-stream")


class JobRouteView(APIView):
    """``GET /api/v1/jobs/{id}/{route}/``: a plugin's read-only view of a job (its manifest's ``job_routes``,
    e.g. a sweep's ``trials``), computed from the viewer's PanelData of the job. Another team's job, or a route
    no plugin serves, is a 404."""

    permission_classes = [IsUser]

    @extend_schema(operation_id="jobs_plugin_route",
                   parameters=[OpenApiParameter("route", str, OpenApiParameter.PATH,
                                                description="A plugin's job route (strata plugins lists them).")],
                   responses={200: OpenApiTypes.OBJECT, 404: error_response(404, "No such job, or no such route."),
                              500: error_response(500, "The plugin's route failed.")})
    def get(self, request, pk, route):
        from components.runtime.contract import registry
        from strata.jobs.panel_data import DatabasePanelData

        function = registry.job_routes().get(route)
        if function is None:
            raise Http404(f"no job route {route!r}: strata plugins lists the routes plugins add")
        team_ids = visible_team_ids(request)
        job = get_object_or_404(jobs_with_attempts(jobs_visible(team_ids)), pk=pk)
        data = DatabasePanelData(team_ids, job, JobSerializer(job).data)
        try:
            answer = function(data)
            body = json.loads(json.dumps(answer, allow_nan=False, default=str))
        except Exception:
            log.exception("job route %s failed for job %s", route, pk)
            return Response({"detail": f"the {route} route of its plugin failed; the server log has the details"},
                            status=500)
        return Response(body)


# --- participants: machines outside the cluster join a running job (strata.jobs.participants) ---------------
# These routes take no API token: joining is authenticated by one of the job's access tokens, heartbeats and
# leaving by the participant's own secret, both as ``Authorization: Bearer <value>``. A missing or invalid one is
# a JSON 401 that never repeats it.


class ParticipantBearerAuthentication(authentication.BaseAuthentication):
    """The bearer value of the participant routes, which is no API token: one of the job's access tokens (to join)
    or the participant's secret (afterwards). It only reads the header (``request.auth`` is the raw value); the
    view's service checks what it is."""

    keyword = "Bearer"

    def authenticate(self, request):
        raw = bearer_value(request, self.keyword)
        return None if raw is None else (AnonymousUser(), raw)

    def authenticate_header(self, request):
        return self.keyword


class HasBearer(BasePermission):
    message = ("Send 'Authorization: Bearer <value>': one of the job's access tokens to join, the participant's "
               "secret afterwards.")

    def has_permission(self, request, view):
        return isinstance(request.auth, str)


class ParticipantAPIView(APIView):
    authentication_classes = [ParticipantBearerAuthentication]
    permission_classes = [HasBearer]


def _payload(job) -> dict:
    """What the job's kind hands a joining participant (``KindSpec.participant_payload``), from the job's
    PanelData, as JSON. Raises what the kind raised."""
    from components.runtime.contract.registry import get_kind
    from strata.jobs.panel_data import DatabasePanelData

    job = jobs_with_attempts(jobs_visible([job.team_id])).get(pk=job.pk)
    data = DatabasePanelData([job.team_id], job, JobSerializer(job).data)
    answer = get_kind(job.kind).participant_payload(job.spec, data)
    return json.loads(json.dumps(answer if answer is not None else {}, allow_nan=False, default=str))


class ParticipantJoinView(ParticipantAPIView):
    """Join a RUNNING job whose kind takes participants (``KindSpec.accepts_participants``) with one of the job's
    access tokens (``Authorization: Bearer <job token>``). The answer carries the participant's secret (once),
    what the kind hands a joining participant, and how often to heartbeat."""

    @extend_schema(operation_id="participants_join", request=ParticipantJoinSerializer,
                   responses={201: ParticipantJoinedSerializer,
                              409: error_response(409, "The job is not running, or the team's quota has no room "
                                                       "for the participant's GPUs."),
                              500: error_response(500, "The job's kind failed to say what a participant needs.")})
    def post(self, request):
        from strata.jobs.credentials import job_public_key

        participants.job_token_working(request.auth)
        fields = participants.join_fields(request.data)
        job, _token = participants.participant_authorize(request.auth, fields["job"])
        try:
            payload = _payload(job)
        except Exception:
            log.exception("participant_payload of kind %s failed for job %s", job.kind, job.pk)
            return Response({"detail": f"the {job.kind} kind could not say what a participant needs; the server log "
                                       "has the details"}, status=500)
        participant, secret = participants.participant_join(request.auth, fields["job"], name=fields["name"],
                                                            gpus=fields["gpus"], info=fields["info"])
        lease_s = participants.lease().total_seconds()
        return Response({
            "id": str(participant.pk), "name": participant.name, "gpus": participant.gpus, "secret": secret,
            "job": {"id": str(job.pk), "kind": job.kind, "spec": job.spec, "state": job.state},
            "payload": payload, "public_key": job_public_key(job.pk),
            "heartbeat_s": participants.heartbeat_seconds(), "lease_s": lease_s,
        }, status=status.HTTP_201_CREATED)


class ParticipantHeartbeatView(ParticipantAPIView):
    """A participant's heartbeat (``Authorization: Bearer <its secret>``): keeps it in, records its metrics and
    info, and answers run or stop, with a job credential for ``subject`` when asked."""

    @extend_schema(operation_id="participants_heartbeat", request=ParticipantHeartbeatSerializer,
                   responses={200: ParticipantHeartbeatAnswerSerializer, 404: error_response(404, "No such participant.")})
    def post(self, request, participant_id):
        participant = participants.participant_for_secret(participant_id, request.auth)
        fields = participants.heartbeat_fields(request.data)
        return Response(participants.participant_heartbeat(participant, **fields))


class ParticipantLeaveView(ParticipantAPIView):
    """The participant leaves (``Authorization: Bearer <its secret>``; idempotent)."""

    @extend_schema(operation_id="participants_leave", request=None,
                   responses={200: ParticipantLeftSerializer, 404: error_response(404, "No such participant.")})
    def post(self, request, participant_id):
        participant = participants.participant_leave(participants.participant_for_secret(participant_id, request.auth))
        return Response({"id": str(participant.pk), "state": participant.state, "reason": participant.reason})


# -- code bundles: /api/v1/code/ ---------------------------------------------------------------------------------
class RawArchiveParser(parsers.BaseParser):
    """The request body as it is: a tar, tar.gz or zip archive."""

    media_type = "*/*"

    def parse(self, stream, media_type=None, parser_context=None):
        return stream


TEAM_PARAMETER = OpenApiParameter("team", str, description="The team (slug); default: the token's team or your "
                                                          "only team.")


class CodeBundleViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin,
                        viewsets.GenericViewSet):
    """Upload a project directory as a code bundle, list a team's bundles, inspect, download or delete one."""

    permission_classes = [IsUser]
    lookup_field = "digest"
    lookup_value_regex = "[0-9a-f]{12,64}"

    def get_queryset(self):
        queryset = CodeBundle.objects.filter(team_id__in=visible_team_ids(self.request)).select_related("team", "owner")
        if team := self.request.query_params.get("team"):
            queryset = queryset.filter(team__slug=team)
        return queryset

    def get_serializer_class(self):
        return CodeBundleDetailSerializer if self.action == "retrieve" else CodeBundleSerializer

    def get_object(self):
        prefix = str(self.kwargs["digest"]).lower().removeprefix("sha256:")
        found = list(self.get_queryset().filter(digest__startswith=prefix)[:2])
        if len(found) != 1:
            raise Http404("no such code bundle" if not found else "the prefix names more than one bundle")
        return found[0]

    def get_parsers(self):
        if getattr(self, "action", None) == "create" or self.request is None or self.request.method == "POST":
            return [parsers.MultiPartParser(), RawArchiveParser()]
        return super().get_parsers()

    @extend_schema(
        parameters=[TEAM_PARAMETER],
        request={"application/gzip": OpenApiTypes.BINARY, "application/zip": OpenApiTypes.BINARY,
                 "application/x-tar": OpenApiTypes.BINARY, "application/octet-stream": OpenApiTypes.BINARY,
                 "multipart/form-data": {"type": "object", "properties": {"file": {"type": "string",
                                                                                    "format": "binary"}}}},
        responses={201: OpenApiResponse(CodeBundleSerializer, description="A new bundle."),
                   200: OpenApiResponse(CodeBundleSerializer, description="The team already had these contents."),
                   400: error_response(400, "Not an acceptable archive: the message names the problem (a path "
                                            "that leaves the tree, a link, a device, over the size limit with the "
                                            "largest files)."),
                   413: error_response(413, "Larger than STRATA_MAX_CODE_BYTES.")},
    )
    def create(self, request, *args, **kwargs):
        """Upload a tar, tar.gz or zip of a project directory (the raw body, or a multipart field ``file``).
        ``strata submit --code DIR`` packs the directory (honouring .gitignore and .strataignore) and uploads it."""
        require_submitter(request, request.query_params.get("team") or request.POST.get("team") or None)
        try:
            team = submit_team(request, request.query_params.get("team") or request.POST.get("team") or None)
        except SubmitTeamError as error:
            raise serializers.ValidationError({"team": [str(error)]}) from None
        upload = request.FILES.get("file") if request.content_type.startswith("multipart/") else None
        if request.content_type.startswith("multipart/") and upload is None:
            raise serializers.ValidationError({"file": ["required: the archive to upload"]})
        with tempfile.TemporaryFile() as spooled:
            source = upload if upload is not None else (request.stream or io.BytesIO())
            for chunk in iter(lambda: source.read(1 << 20), b""):
                spooled.write(chunk)
            if spooled.tell() == 0:
                raise serializers.ValidationError({"file": ["the archive is empty"]})
            spooled.seek(0)
            try:
                bundle, created = code_store(team=team, user=request.user, source=spooled)
            except CodeRejected as error:
                raise serializers.ValidationError({"file": [str(error)]}) from None
        return Response(CodeBundleSerializer(bundle).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(responses={204: None, 409: error_response(409, "Jobs still use the bundle.")})
    def destroy(self, request, *args, **kwargs):
        bundle = self.get_object()
        roles.require_manage(request, bundle.team, bundle.owner_id, "delete this code bundle")
        try:
            code_delete(bundle)
        except CodeRejected as error:
            return Response({"detail": str(error)}, status=status.HTTP_409_CONFLICT)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses={(200, "application/gzip"): OpenApiTypes.BINARY})
    @action(detail=True, methods=["get"])
    def download(self, request, *args, **kwargs):
        """The bundle as a gzip'd tar (``tar xzf`` unpacks it)."""
        bundle = self.get_object()
        redirect = transfers.download_redirect(bundle.storage_key, bundle.size)
        if redirect is not None:
            return redirect
        response = FileResponse(get_storage().open(bundle.storage_key), content_type="application/gzip",
                                as_attachment=True, filename=f"code-{bundle.digest[:12]}.tar.gz")
        response["Content-Length"] = str(bundle.size)
        return response


# -- data sets: /api/v1/data/ and their chunked uploads, /api/v1/uploads/ (strata.jobs.data) ----------------------
def _rejected(error: data_sets.DataRejected) -> Response:
    """A JSON answer naming each field (``{"field": ["message"]}``; a 409's ``detail`` as DRF words it)."""
    if set(error.errors) == {"detail"}:
        return Response({"detail": error.errors["detail"]}, status=error.status)
    if error.status != 400:  # the Error schema: one ``detail`` naming each field
        return Response({"detail": "; ".join(f"{field}: {message}" for field, message in error.errors.items())},
                        status=error.status)
    return Response({field: [message] for field, message in error.errors.items()}, status=error.status)


class TeamScopedViewSet(viewsets.GenericViewSet):
    """The caller's teams' objects, optionally ``?team=slug``; another team's is a 404."""

    permission_classes = [IsUser]
    model = DataSet

    def get_queryset(self):
        queryset = self.model.objects.filter(team_id__in=visible_team_ids(self.request)).select_related("team",
                                                                                                        "owner")
        if team := self.request.query_params.get("team"):
            queryset = queryset.filter(team__slug=team)
        return queryset


@extend_schema_view(list=extend_schema(parameters=[TEAM_PARAMETER]),
                    retrieve=extend_schema(parameters=[TEAM_PARAMETER]))
class DataSetViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    """The teams' uploaded data sets (``strata data upload`` makes one; jobs mount them with
    ``spec.data.mount``): list, inspect (with the file list) or delete one no unfinished job mounts."""

    lookup_field = "name"
    lookup_value_regex = "[a-z0-9][a-z0-9._-]{0,63}"

    def get_serializer_class(self):
        return DataSetDetailSerializer if self.action == "retrieve" else DataSetSerializer

    def get_object(self):
        found = list(self.get_queryset().filter(name=self.kwargs["name"])[:2])
        if len(found) != 1:
            raise Http404("no such data set" if not found else "several of your teams have a data set of this "
                                                                "name: add ?team=slug")
        return found[0]

    @extend_schema(parameters=[TEAM_PARAMETER],
                   responses={204: None, 409: error_response(409, "Unfinished jobs mount the data set.")})
    def destroy(self, request, *args, **kwargs):
        data_set = self.get_object()
        roles.require_manage(request, data_set.team, data_set.owner_id, "delete this data set")
        try:
            data_sets.data_delete(data_set)
        except data_sets.DataRejected as error:
            return _rejected(error)
        return Response(status=status.HTTP_204_NO_CONTENT)


class DataUploadViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    """Chunked, resumable uploads of data sets: open one (``POST``), send its chunks in any order, each with its
    SHA-256 (``PUT .../chunks/{n}/``), see which arrived (``GET``: a client resumes by sending only the missing
    ones), then ``complete`` it: the chunks are assembled, the whole SHA-256 verified and the data set created."""

    model = DataUpload
    serializer_class = DataUploadSerializer
    lookup_value_regex = "[0-9a-f-]{36}"

    def get_object(self):
        try:
            pk = uuid.UUID(str(self.kwargs["pk"]))
        except ValueError:
            raise Http404("no such upload") from None
        return get_object_or_404(self.get_queryset(), pk=pk)

    def _managed(self, action: str):
        """The upload (another team's: a 404) if the caller may write it: its owner (member) or a team-admin."""
        upload = self.get_object()
        roles.require_manage(self.request, upload.team, upload.owner_id, action)
        return upload

    def get_parsers(self):
        if self.request is not None and self.request.method == "PUT":
            return [RawArchiveParser()]  # the raw body: one chunk
        return super().get_parsers()

    @extend_schema(request=DataUploadCreateSerializer,
                   responses={201: OpenApiResponse(DataUploadSerializer, description="A new upload."),
                              200: OpenApiResponse(DataUploadSerializer, description="The team's open upload of the "
                                                   "same name and contents: send its missing chunks."),
                              409: error_response(409, "The team already has a data set of this name, or as many "
                                                       "open uploads as STRATA_MAX_OPEN_UPLOADS allows (named).")})
    def create(self, request, *args, **kwargs):
        body = request.data if isinstance(request.data, dict) else None
        require_submitter(request, (body or {}).get("team") or request.query_params.get("team") or None)
        try:
            fields = data_sets.upload_fields(body)
        except data_sets.DataRejected as error:
            return _rejected(error)
        try:
            team = submit_team(request, body.get("team") or request.query_params.get("team") or None)
        except SubmitTeamError as error:
            raise serializers.ValidationError({"team": [str(error)]}) from None
        try:
            upload, created = data_sets.upload_open(team=team, user=request.user, fields=fields)
        except data_sets.DataRejected as error:
            return _rejected(error)
        return Response(DataUploadSerializer(upload).data,
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(parameters=[TEAM_PARAMETER])
    def retrieve(self, request, *args, **kwargs):
        upload = self.get_object()
        if upload.store_upload:
            try:
                upload = data_sets.direct_sync(upload)
            except data_sets.DataRejected as error:
                return _rejected(error)
        return Response(DataUploadSerializer(upload).data)

    @extend_schema(responses={204: None})
    def destroy(self, request, *args, **kwargs):
        """Abandon the upload: its chunks are dropped."""
        data_sets.upload_abort(self._managed("abandon this upload"))
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request={"application/octet-stream": OpenApiTypes.BINARY},
                   parameters=[OpenApiParameter("Content-SHA256", {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                                                OpenApiParameter.HEADER, required=True,
                                                description="The SHA-256 of the chunk (hex)."),
                               OpenApiParameter("index", int, OpenApiParameter.PATH,
                                                description="The chunk's index, from 0.")],
                   responses={200: DataUploadSerializer,
                              400: error_response(400, "A bad chunk (its length or SHA-256), named: nothing of it "
                                                       "is kept."),
                              404: error_response(404, "No such upload (another team's, abandoned or expired)."),
                              410: error_response(410, "The upload expired (not completed within "
                                                       "STRATA_UPLOAD_EXPIRY_HOURS): its chunks were dropped.")})
    @action(detail=True, methods=["put"], url_path=r"chunks/(?P<index>[0-9]{1,9})")
    def chunk(self, request, pk=None, index=None):
        """Store one chunk: its bytes are the body, its SHA-256 the ``Content-SHA256`` header."""
        upload = self._managed("send chunks of this upload")
        source = request.stream or io.BytesIO()
        try:
            upload = data_sets.chunk_store(upload, int(index), source, request.headers.get("Content-SHA256"))
        except data_sets.DataRejected as error:
            return _rejected(error)
        return Response(DataUploadSerializer(upload).data)

    @extend_schema(request=DataUploadPartsSerializer,
                   responses={200: DataUploadPartsAnswerSerializer,
                              400: error_response(400, "A bad entry (its index or MD5), named."),
                              409: error_response(409, "The upload goes through the control plane: PUT its chunks "
                                                       "to .../chunks/{index}/."),
                              410: error_response(410, "The upload expired or is gone from the store.")})
    @action(detail=True, methods=["post"])
    def parts(self, request, pk=None):
        """A direct upload (``direct: true``): a presigned PUT URL per chunk asked for, each signed with the
        chunk's ``Content-MD5`` (send the chunk with that header; the store refuses other bytes), and the chunks
        the store already holds (``upload.missing``: a client resumes with those)."""
        upload = self._managed("send chunks of this upload")
        body = request.data if isinstance(request.data, dict) else None
        if body is None:
            raise serializers.ValidationError({"non_field_errors": ["the body must be a JSON object"]})
        try:
            answer = data_sets.direct_parts(upload, body.get("parts", []))
        except data_sets.DataRejected as error:
            return _rejected(error)
        return Response({**answer, "upload": DataUploadSerializer(answer["upload"]).data})

    @extend_schema(request=None,
                   responses={201: DataSetDetailSerializer,
                              400: error_response(400, "The whole does not match its SHA-256, or a directory's "
                                                       "archive is refused (named): the upload is dropped."),
                              409: error_response(409, "Chunks are missing, or the name was taken meanwhile."),
                              410: error_response(410, "The upload expired (not completed within "
                                                       "STRATA_UPLOAD_EXPIRY_HOURS): its chunks were dropped.")})
    @action(detail=True, methods=["post"])
    def complete(self, request, pk=None):
        """Assemble the chunks, verify the whole and create the data set."""
        try:
            data_set = data_sets.upload_complete(self._managed("complete this upload"))
        except data_sets.DataRejected as error:
            return _rejected(error)
        return Response(DataSetDetailSerializer(data_set).data, status=status.HTTP_201_CREATED)


# -- direct transfers (strata.jobs.transfers): an attempt's uploads ------------------------------------------------
def _transfer_body(request) -> dict:
    """The request's JSON object (a list, a string or a number is a 400, never a 500)."""
    if not isinstance(request.data, dict):
        raise serializers.ValidationError({"non_field_errors": ["the body must be a JSON object"]})
    return request.data


def _transfer_rejected(error: transfers.TransferRejected) -> Response:
    return Response({field: [message] for field, message in error.errors.items()}, status=error.status)


class AttemptUploadStartView(AttemptAPIView):
    """Begin an upload of an artifact or checkpoint (``strata.jobs.transfers``): with an object store, a ticket
    for a direct multipart upload; else ``direct: false`` (PUT the bytes to ``artifacts/NAME/``)."""

    @extend_schema(request=OpenApiTypes.OBJECT, parameters=ATTEMPT_QUERY,
                   responses={200: OpenApiTypes.OBJECT, 409: STALE_ATTEMPT,
                              413: error_response(413, "Larger than the store allows.")})
    def post(self, request, attempt_id):
        name = str(_transfer_body(request).get("name") or "")
        if not ARTIFACT_NAME.match(name) or ".." in name:
            raise serializers.ValidationError({"name": ["letters, digits, '.', '_' and '-' only"]})
        attempt = attempt_from_query(request, attempt_id)
        try:
            return Response(transfers.upload_start(attempt, name, _transfer_body(request).get("kind", Artifact.Kind.ARTIFACT),
                                                   _transfer_body(request).get("size"), _transfer_body(request).get("sha256")))
        except transfers.TransferRejected as error:
            return _transfer_rejected(error)


class AttemptUploadPartsView(AttemptAPIView):
    """Presigned PUT URLs for parts of a direct upload (each signed with its Content-MD5), and the parts the
    store holds already (to resume)."""

    @extend_schema(request=OpenApiTypes.OBJECT, parameters=ATTEMPT_QUERY,
                   responses={200: OpenApiTypes.OBJECT, 409: STALE_ATTEMPT})
    def post(self, request, attempt_id):
        attempt = attempt_from_query(request, attempt_id)
        try:
            return Response(transfers.upload_parts(attempt, _transfer_body(request).get("upload", ""),
                                                   _transfer_body(request).get("parts", [])))
        except transfers.TransferRejected as error:
            return _transfer_rejected(error)


class AttemptUploadCompleteView(AttemptAPIView):
    """Join a direct upload's parts and record the artifact: a 400 names the parts still missing."""

    @extend_schema(request=OpenApiTypes.OBJECT, parameters=ATTEMPT_QUERY,
                   responses={201: StoredArtifactSerializer, 409: STALE_ATTEMPT})
    def post(self, request, attempt_id):
        attempt = attempt_from_query(request, attempt_id)
        try:
            artifact = transfers.upload_complete(attempt, _transfer_body(request).get("upload", ""))
        except transfers.TransferRejected as error:
            return _transfer_rejected(error)
        return Response({"id": str(artifact.id), "size": artifact.size, "sha256": artifact.sha256}, status=201)


class AttemptUploadAbortView(AttemptAPIView):
    """Drop a direct upload and its parts."""

    @extend_schema(request=OpenApiTypes.OBJECT, parameters=ATTEMPT_QUERY,
                   responses={204: None, 409: STALE_ATTEMPT})
    def post(self, request, attempt_id):
        attempt = attempt_from_query(request, attempt_id)
        try:
            transfers.upload_abort(attempt, _transfer_body(request).get("upload", ""))
        except transfers.TransferRejected as error:
            return _transfer_rejected(error)
        return Response(status=204)


class AttemptDataView(NodeAPIView):
    """GET a data set the attempt's job mounts (``spec.data.mount``), by digest: its stored bytes (a gzip'd tar,
    or the file). 404 unless the job mounts it and it is of the job's team. The node checks the bytes against
    the digest before it unpacks them."""

    @extend_schema(parameters=[*ATTEMPT_QUERY, DIRECT_LINK],
                   responses={(200, "application/octet-stream"): OpenApiTypes.BINARY, 404: NO_FILE,
                              409: STALE_ATTEMPT})
    def get(self, request, attempt_id, digest):
        attempt = attempt_from_query(request, attempt_id)
        data_set = data_sets.data_for_attempt(attempt.job, str(digest).lower())
        if data_set is None:
            raise Http404("the job mounts no such data set")
        # The node checks the bytes against the data set's digest as it unpacks them.
        return bytes_or_link(request, data_set.storage_key, data_set.size, None)
