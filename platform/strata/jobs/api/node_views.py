"""The node protocol's calls about one attempt: the node's worker claims, reports and finishes it; the attempt's
own processes (with their attempt credential) read its files, renew their credential, meet their peers and
manage their child jobs. Served under ``/api/v1/node/attempts/<id>/``; the node's own calls (register,
heartbeat, renew, drain, leave) are :mod:`strata.cluster.api.views`."""

from __future__ import annotations

import io
import re

from django.db import transaction
from django.http import FileResponse, Http404, HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from components.runtime.contract.distributed import RENDEZVOUS_SUFFIX
from strata.accounts import attempt_credentials, team_secrets
from strata.api.error_answers import error_response
from strata.api.permissions import IsNodeOrOwnAttempt
from strata.cluster.api.views import UNKNOWN_NODE, NodeAPIView, node_from
from strata.jobs import selectors as job_selectors
from strata.jobs import services as job_services
from strata.jobs.api import node_serializers as s
from strata.jobs.api.serializers import CredentialRequestMixin, CredentialSerializer
from strata.jobs.models import Artifact
from strata.jobs.storage import download_link, get_storage

ARTIFACT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")
TOKEN_REFRESH_S = 2.0  # how often an attempt re-reads its job's token digests (a revocation's delay)


NO_FILE = error_response(404, "Unknown node, or no such file.")
STALE_ATTEMPT = error_response(409, "Wrong fencing token, another node's attempt, or an attempt that already "
                                    "ended (StaleAttempt): stop it.")
ATTEMPT_QUERY = [OpenApiParameter("node", OpenApiTypes.UUID, required=True, description="The node's id."),
                 OpenApiParameter("token", str, required=True, description="The attempt's fencing token.")]
ARTIFACT_KIND = OpenApiParameter("kind", str, enum=list(Artifact.Kind.values), default=Artifact.Kind.ARTIFACT)


class AttemptAPIView(APIView):
    """A route of one attempt that its own processes call too, with their attempt credential
    (:mod:`strata.accounts.attempt_credentials`), as well as the node's worker with the node token."""

    permission_classes = [IsNodeOrOwnAttempt]


def claim_workers(allocations) -> list[dict]:
    """The claim's ``allocations``: each worker's GPU shares, ``{"rank", "node", "device"}``. CPUs reserved on
    the node's CPU device ride along with a worker's GPU entry (``cpus``, ``memory``); a worker that holds no GPU
    is one entry with ``device: None``, so its node still knows which ranks it runs (and starts them on the CPU)."""
    workers: list[dict] = []
    cpus: dict[tuple, tuple[float, int]] = {}
    for a in allocations:
        if a.device.cpu:
            cpus[(a.rank, str(a.device.node_id))] = (a.share, a.memory)
        else:
            workers.append({"rank": a.rank, "node": str(a.device.node_id),
                            "device": {"kind": a.device.kind, "index": a.device.index, "memory": a.memory,
                                       "share": a.share}})
    for (rank, node), (share, memory) in cpus.items():
        entry = next((w for w in workers if w["rank"] == rank and w["node"] == node), None)
        if entry is None:
            entry = {"rank": rank, "node": node, "device": None}
            workers.append(entry)
        entry.update(cpus=share, memory=memory)
    workers.sort(key=lambda w: w["rank"])
    return workers


class AttemptClaimView(NodeAPIView):
    @extend_schema(request=s.AttemptCallSerializer,
                   responses={200: s.ClaimAnswerSerializer, 404: UNKNOWN_NODE, 409: STALE_ATTEMPT})
    def post(self, request, attempt_id):
        serializer = s.AttemptCallSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        node = node_from(serializer.validated_data)
        # The claim and its answer go together: the answer is built and encoded before the claim commits, so
        # a job that cannot be sent to the node is never left RUNNING with no process.
        with transaction.atomic():
            attempt = job_services.attempt_claim(attempt_id, serializer.validated_data["token"], node)
            job = attempt.job
            workers = claim_workers(attempt.allocations.select_related("device").order_by("rank", "device__index"))
            secrets, unavailable = team_secrets.secrets_for_job(job)
            if unavailable:
                job_services.job_event(job.pk, "secrets", "secrets not available (deleted, or unreadable with the "
                                       f"secret key): {', '.join(unavailable)}", attempt=attempt, names=unavailable)
            answer = {
                "attempt": str(attempt.id), "number": attempt.number, "job": str(job.id), "job_name": job.name,
                "kind": job.kind, "spec": job.spec, "resources": job.resources, "time_limit": job.time_limit,
                "world_size": int(job.resources.get("workers", 1)), "allocations": workers,
                "priority": job.priority,
                "stop": job_services.attempt_stop_requested(attempt),
                # The team's project, when the job runs one: the node fetches it once per digest (code/ below).
                "code": job_selectors.code_summary(job.code),
                # The values of the team's secrets the spec names (environment.secrets), decrypted now, for the
                # attempt's environment only: {NAME: value}, {} when it names none. No other answer carries them.
                "secrets": secrets,
                # What the attempt's processes authenticate with (never the node token): its own routes only.
                "credential": attempt_credentials.mint(attempt.id, node.id),
                # The team's id: a sandboxed attempt runs as that team's own uid on the node.
                "team": job.team_id,
                # Whether it reads what a team's code wrote (a source job's artifacts): then it runs as that code
                # does, in its own sandboxed processes (components.runtime.contract.project.runs_user_code).
                "reads_user_output": job_selectors.reads_user_output(job),
            }
            body = JSONRenderer().render(answer)
        return HttpResponse(body, content_type="application/json")


class AttemptRenewView(AttemptAPIView):
    """A fresh attempt credential for a live attempt (its processes renew theirs before it expires; an expired
    one is refused with a 401, an ended attempt with a 409)."""

    @extend_schema(request=s.AttemptCallSerializer,
                   responses={200: s.AttemptCredentialSerializer, 404: UNKNOWN_NODE, 409: STALE_ATTEMPT})
    def post(self, request, attempt_id):
        serializer = s.AttemptCallSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        node = node_from(serializer.validated_data)
        attempt = job_services.attempt_for_node(attempt_id, serializer.validated_data["token"], node)
        return Response(attempt_credentials.mint(attempt.id, node.id))


class AttemptReportView(AttemptAPIView):
    @extend_schema(request=s.ReportSerializer,
                   responses={200: s.StopAnswerSerializer, 404: UNKNOWN_NODE, 409: STALE_ATTEMPT})
    def post(self, request, attempt_id):
        serializer = s.ReportSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        attempt = job_services.attempt_for_node(attempt_id, data["token"], node_from(data))
        job_services.attempt_report(attempt, logs=data["logs"], metrics=data["metrics"], endpoint=data.get("endpoint"),
                                    reports=data["reports"])
        return Response({"stop": job_services.attempt_stop_requested(attempt)})


class AttemptFinishView(NodeAPIView):
    @extend_schema(request=s.FinishSerializer,
                   responses={200: s.FinishAnswerSerializer, 404: UNKNOWN_NODE, 409: STALE_ATTEMPT})
    def post(self, request, attempt_id):
        serializer = s.FinishSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        job = job_services.attempt_finish(attempt_id, data["token"], node_from(data), data["outcome"], data["reason"])
        return Response({"job_state": job.state})


def attempt_from_query(request, attempt_id):
    node_id, token = request.query_params.get("node"), request.query_params.get("token")
    if not node_id or not token:
        raise serializers.ValidationError({"node": ["node and token query parameters are required"]})
    try:
        node = node_from({"node": node_id})
    except Exception as error:
        raise Http404("unknown node") from error
    return job_services.attempt_for_node(attempt_id, token, node)


class AttemptArtifactView(AttemptAPIView):
    """PUT the raw bytes of an artifact (or, with ?kind=checkpoint, the job's checkpoint)."""

    @extend_schema(request={"application/octet-stream": bytes}, parameters=[*ATTEMPT_QUERY, ARTIFACT_KIND],
                   responses={201: s.StoredArtifactSerializer, 404: UNKNOWN_NODE, 409: STALE_ATTEMPT,
                              413: error_response(413, "Larger than STRATA_MAX_UPLOAD_BYTES.")})
    def put(self, request, attempt_id, name):
        if not ARTIFACT_NAME.match(name) or ".." in name:
            raise serializers.ValidationError({"name": ["letters, digits, '.', '_' and '-' only"]})
        kind = request.query_params.get("kind", Artifact.Kind.ARTIFACT)
        if kind not in Artifact.Kind.values:
            raise serializers.ValidationError({"kind": [f"one of {', '.join(Artifact.Kind.values)}"]})
        attempt = attempt_from_query(request, attempt_id)
        try:
            # DRF gives no stream for an empty body: that is an empty file, not a missing one.
            artifact = job_services.artifact_store(attempt, name, request.stream or io.BytesIO(), kind)
        except ValueError as error:
            return Response({"detail": str(error)}, status=413)
        return Response({"id": str(artifact.id), "size": artifact.size, "sha256": artifact.sha256}, status=201)


DIRECT_LINK = OpenApiParameter("link", bool, description="Answer where to read the bytes (a presigned URL with the "
                                                         "object's size and SHA-256) instead of the bytes; `url` "
                                                         "is null where they come through this route.")


def bytes_or_link(request, key: str, size: int, sha256: str | None, content_type: str = "application/octet-stream"):
    """The stored object's bytes, or with ``?link=1`` where to read them (a presigned URL where transfers are
    direct: strata.jobs.transfers)."""
    if request.query_params.get("link") in ("1", "true"):
        return Response(download_link(key, size, sha256))
    response = FileResponse(get_storage().open(key), content_type=content_type)
    response["Content-Length"] = str(size)
    return response


class AttemptSourceView(AttemptAPIView):
    """GET artifact ``name`` of a job the attempt's spec reads from (its kind's ``KindSpec.sources()``)."""

    @extend_schema(parameters=[*ATTEMPT_QUERY, DIRECT_LINK],
                   responses={(200, "application/octet-stream"): OpenApiTypes.BINARY, 404: NO_FILE,
                              409: STALE_ATTEMPT})
    def get(self, request, attempt_id, name):
        attempt = attempt_from_query(request, attempt_id)
        artifact = job_selectors.source_artifact(attempt.job, name)
        if artifact is None:
            raise Http404("the source job has no such artifact")
        return bytes_or_link(request, artifact.storage_key, artifact.size, artifact.sha256)


class AttemptCodeView(NodeAPIView):
    """GET the job's code bundle (its canonical gzip'd tar), 404 when the job runs no bundle. The node checks
    the bytes against the digest the claim named before it unpacks them."""

    @extend_schema(parameters=[*ATTEMPT_QUERY, DIRECT_LINK],
                   responses={(200, "application/gzip"): OpenApiTypes.BINARY, 404: NO_FILE, 409: STALE_ATTEMPT})
    def get(self, request, attempt_id):
        attempt = attempt_from_query(request, attempt_id)
        bundle = attempt.job.code
        if bundle is None:
            raise Http404("the job runs no code bundle")
        # The node checks the bundle against its digest (over the canonical tar) as it unpacks it.
        return bytes_or_link(request, bundle.storage_key, bundle.size, None, "application/gzip")


class AttemptCheckpointView(AttemptAPIView):
    """GET the job's latest checkpoint (from any earlier attempt), 404 when it has none."""

    @extend_schema(parameters=[*ATTEMPT_QUERY, DIRECT_LINK],
                   responses={(200, "application/octet-stream"): OpenApiTypes.BINARY, 404: NO_FILE,
                              409: STALE_ATTEMPT})
    def get(self, request, attempt_id):
        attempt = attempt_from_query(request, attempt_id)
        checkpoint = job_services.latest_checkpoint(attempt.job)
        if checkpoint is None:
            raise Http404("no checkpoint")
        return bytes_or_link(request, checkpoint.storage_key, checkpoint.size, checkpoint.sha256)


class AttemptTokensView(AttemptAPIView):
    """GET the SHA-256 digests of the job's working access tokens (its kind's ``accepts_tokens``), which the
    attempt checks its callers against; it refreshes them every ``refresh_s`` seconds."""

    @extend_schema(parameters=ATTEMPT_QUERY, responses={200: OpenApiTypes.OBJECT, 409: STALE_ATTEMPT})
    def get(self, request, attempt_id):
        attempt = attempt_from_query(request, attempt_id)
        return Response({"digests": job_services.job_token_digests(attempt.job),
                         "refresh_s": TOKEN_REFRESH_S})


class RendezvousPublishSerializer(s.AttemptCallSerializer):
    port = serializers.IntegerField(min_value=1, max_value=65535, help_text="The port rank 0's store listens on.")
    suffix = serializers.RegexField(RENDEZVOUS_SUFFIX, max_length=200, required=False, allow_blank=True, default="",
                                    help_text="Appended to host:port as given, e.g. /p2p/<peer id> for a libp2p "
                                              "listener.")


class AttemptRendezvousView(AttemptAPIView):
    """Where the ranks of a multi-worker attempt meet. Rank 0's node POSTs the port its store listens on; the
    address is the one that node registered. Every rank GETs it (``address`` is null until published)."""

    @extend_schema(parameters=ATTEMPT_QUERY, responses={200: OpenApiTypes.OBJECT, 409: STALE_ATTEMPT})
    def get(self, request, attempt_id):
        attempt = attempt_from_query(request, attempt_id)
        return Response(job_services.attempt_rendezvous(attempt))

    @extend_schema(request=RendezvousPublishSerializer,
                   responses={200: OpenApiTypes.OBJECT, 404: UNKNOWN_NODE, 409: STALE_ATTEMPT})
    def post(self, request, attempt_id):
        serializer = RendezvousPublishSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        node = node_from(data)
        attempt = job_services.attempt_for_node(attempt_id, data["token"], node)
        address = job_services.attempt_rendezvous_publish(attempt, node, data["port"],
                                                         data.get("suffix") or "")
        return Response({**job_services.attempt_rendezvous(attempt), "address": address})


class CredentialRequestSerializer(s.AttemptCallSerializer, CredentialRequestMixin):
    pass


class AttemptCredentialView(AttemptAPIView):
    """A job credential for one of the attempt's ranks: a short-lived statement, signed with the job's key, that
    this rank may act as ``subject`` (an identity it holds, such as its peer key) in the job. The job's workers
    check each other's with ``components.runtime.shared.credentials.verify`` and the ``public_key`` in the answer."""

    @extend_schema(request=CredentialRequestSerializer,
                   responses={200: CredentialSerializer, 404: UNKNOWN_NODE, 409: STALE_ATTEMPT})
    def post(self, request, attempt_id):
        serializer = CredentialRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        node = node_from(data)
        attempt = job_services.attempt_for_node(attempt_id, data["token"], node)
        return Response(job_services.attempt_credential(attempt, node, data["subject"]))


# --- child jobs: a running job submits, lists and cancels jobs of its team ---------------------------------

class ChildSubmitSerializer(s.AttemptCallSerializer):
    job = serializers.DictField(help_text="The child job, as POST /api/v1/jobs/ takes it (without team).")
    idempotency_key = serializers.CharField(max_length=200, required=False, allow_null=True, default=None)
    nested = serializers.BooleanField(required=False, default=False, help_text=(
        "Run it inside this attempt's own allocation (a sweep's trial within its sweep's GPUs): admitted "
        "without the team's quota, placed only on the devices this attempt holds."))
    checkpoint_from = serializers.UUIDField(required=False, allow_null=True, default=None, help_text=(
        "Another child of this job: the new child starts from a copy of its latest checkpoint (a 400 when it "
        "has none yet)."))


class ChildHoldSerializer(s.AttemptCallSerializer):
    reason = serializers.CharField(max_length=300, required=False, default="")


class ChildResizeSerializer(s.AttemptCallSerializer):
    resources = serializers.JSONField(help_text="The child's new resources, as POST /api/v1/jobs/ takes them.")
    reason = serializers.CharField(max_length=300, required=False, default="")


def _child_summary(job) -> dict:
    return {"id": str(job.pk), "name": job.name, "kind": job.kind, "state": job.state, "reason": job.reason,
            "parent": str(job.parent_id), "nested": job.nested, "held": job.held, "resources": job.resources,
            "failures": job.failures, "endpoint": job_selectors.serving_endpoint(job)}


class AttemptChildrenView(AttemptAPIView):
    """A running attempt's child jobs: GET lists them (``?node=&token=``), POST submits one."""

    @extend_schema(parameters=ATTEMPT_QUERY, responses={200: OpenApiTypes.OBJECT, 409: STALE_ATTEMPT})
    def get(self, request, attempt_id):
        attempt = attempt_from_query(request, attempt_id)
        children = job_services.children_of(attempt.job).prefetch_related("attempts")
        return Response([_child_summary(job) for job in children])

    @extend_schema(request=ChildSubmitSerializer, responses={201: OpenApiTypes.OBJECT, 200: OpenApiTypes.OBJECT,
                                                             409: STALE_ATTEMPT})
    def post(self, request, attempt_id):
        from strata.jobs.api.serializers import JobSubmitSerializer

        call = ChildSubmitSerializer(data=request.data)
        call.is_valid(raise_exception=True)
        data = call.validated_data
        attempt = job_services.attempt_for_node(attempt_id, data["token"], node_from(data))
        body = dict(data["job"])
        if "team" in body:
            raise serializers.ValidationError({"job": {"team": ["a child job runs in its parent's team"]}})
        submit = JobSubmitSerializer(data=body)
        if not submit.is_valid():
            raise serializers.ValidationError({"job": submit.errors})
        donor = None
        if data["checkpoint_from"] is not None:
            donor = job_services.children_of(attempt.job).filter(pk=data["checkpoint_from"]).first()
            if donor is None:
                raise serializers.ValidationError({"checkpoint_from": ["not a child job of this job"]})
        job, created = job_services.child_submit(attempt, dict(submit.validated_data), data["idempotency_key"],
                                                 nested=data["nested"], checkpoint_from=donor)
        return Response(_child_summary(job), status=201 if created else 200)


def _child(request, attempt_id, child_id, serializer=s.AttemptCallSerializer):
    """(attempt, child, validated call) for a call about one child of a running attempt's job; 404 for a job
    that is not its child."""
    call = serializer(data=request.data)
    call.is_valid(raise_exception=True)
    attempt = job_services.attempt_for_node(attempt_id, call.validated_data["token"], node_from(call.validated_data))
    child = job_services.children_of(attempt.job).filter(pk=child_id).first()
    if child is None:
        raise Http404("no such child job")
    return attempt, child, call.validated_data


class AttemptChildCancelView(AttemptAPIView):
    """Cancel a child job; ``reason`` (optional) is what its page shows, e.g. why its parent stopped it."""

    @extend_schema(request=ChildHoldSerializer, responses={200: OpenApiTypes.OBJECT, 404: NO_FILE,
                                                           409: STALE_ATTEMPT})
    def post(self, request, attempt_id, child_id):
        attempt, child, data = _child(request, attempt_id, child_id, ChildHoldSerializer)
        reason = data["reason"] or f"cancelled by its parent {attempt.job_id}"
        return Response(_child_summary(job_services.job_cancel(child, reason)))


class _ChildHoldView(AttemptAPIView):
    """Hold a child job (it is never placed until released; a running one stops at a checkpoint first), or
    release it."""

    hold: bool = True

    @extend_schema(request=ChildHoldSerializer, responses={200: OpenApiTypes.OBJECT, 404: NO_FILE,
                                                           409: STALE_ATTEMPT})
    def post(self, request, attempt_id, child_id):
        attempt, child, data = _child(request, attempt_id, child_id, ChildHoldSerializer)
        if self.hold:
            return Response(_child_summary(job_services.job_hold(child, data["reason"] or
                                                                 f"by its parent {attempt.job_id}")))
        return Response(_child_summary(job_services.job_release(child, data["reason"] or
                                                                f"released by its parent {attempt.job_id}")))


class AttemptChildHoldView(_ChildHoldView):
    hold = True


class AttemptChildReleaseView(_ChildHoldView):
    hold = False


class AttemptChildResizeView(AttemptAPIView):
    """Give a child new resources: a running child stops at a checkpoint and is placed again with them."""

    @extend_schema(request=ChildResizeSerializer, responses={200: OpenApiTypes.OBJECT, 404: NO_FILE,
                                                             409: STALE_ATTEMPT})
    def post(self, request, attempt_id, child_id):
        from strata.jobs.api.serializers import normalize_resources

        attempt, child, data = _child(request, attempt_id, child_id, ChildResizeSerializer)
        resources = normalize_resources(data["resources"])
        reason = data["reason"] or f"resized by its parent {attempt.job_id}"
        return Response(_child_summary(job_services.job_resize(child, resources, reason)))


class AttemptChildMetricsView(AttemptAPIView):
    """A child's metric points after a cursor (``?node=&token=&after=<point id>&limit=``), oldest first, so a
    parent can watch its children learn (a sweep's trial scheduler reads them)."""

    @extend_schema(parameters=[*ATTEMPT_QUERY,
                               OpenApiParameter("after", int, description="Return points after this id."),
                               OpenApiParameter("limit", int, description="At most this many (1-5000).")],
                   responses={200: OpenApiTypes.OBJECT, 404: NO_FILE, 409: STALE_ATTEMPT})
    def get(self, request, attempt_id, child_id):
        attempt = attempt_from_query(request, attempt_id)
        child = job_services.children_of(attempt.job).filter(pk=child_id).first()
        if child is None:
            raise Http404("no such child job")
        try:
            after = int(request.query_params.get("after") or 0)
            limit = min(max(int(request.query_params.get("limit") or 1000), 1), 5000)
        except ValueError:
            raise serializers.ValidationError({"after": ["after and limit must be integers"]}) from None
        return Response(_child_points(child, after, limit))


def _child_points(child, after: int, limit: int) -> dict:
    """One child's summary with its metric points after cursor ``after`` (at most ``limit``), oldest first."""
    from strata.jobs.models import MetricPoint

    points = list(MetricPoint.objects.filter(job=child, pk__gt=after).order_by("pk")[:limit])
    return {**_child_summary(child),
            "points": [{"id": p.pk, "name": p.name, "step": p.step, "value": p.value, "time": p.time.timestamp(),
                        "attempt": str(p.attempt_id) if p.attempt_id else None} for p in points],
            "cursor": points[-1].pk if points else after}


class AttemptChildrenMetricsView(AttemptAPIView):
    """Many children's metric points in one call: ``{node, token, after: {child id: cursor}, limit}`` answers
    ``{"children": {child id: <what the one-child route answers>}}``, so a parent watching many children (a
    sweep's trials) asks once per tick. A job that is not its child is left out of the answer."""

    @extend_schema(request=s.ChildrenMetricsSerializer, responses={200: OpenApiTypes.OBJECT, 409: STALE_ATTEMPT})
    def post(self, request, attempt_id):
        call = s.ChildrenMetricsSerializer(data=request.data)
        call.is_valid(raise_exception=True)
        data = call.validated_data
        attempt = job_services.attempt_for_node(attempt_id, data["token"], node_from(data))
        cursors = {str(key): value for key, value in data["after"].items()}
        children = job_services.children_of(attempt.job).filter(pk__in=list(cursors))
        return Response({"children": {str(child.pk): _child_points(child, cursors[str(child.pk)], data["limit"])
                                      for child in children}})
