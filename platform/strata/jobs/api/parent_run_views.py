"""The routes of child jobs that their parent's attempt runs itself (:mod:`strata.jobs.parent_run`): one batched
call per tick (submits, starts, metric points, log lines, ends, and the states of the children named), and the
children's files (checkpoints and artifacts) written and read by the parent. Served under
``/api/v1/node/attempts/<id>/children/``."""

from __future__ import annotations

import io
import uuid

from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from strata.cluster.api.views import node_from
from strata.jobs import parent_run
from strata.jobs import services as job_services
from strata.jobs.api import node_serializers as s
from strata.jobs.api.node_views import (
    ARTIFACT_KIND,
    ARTIFACT_NAME,
    ATTEMPT_QUERY,
    NO_FILE,
    STALE_ATTEMPT,
    AttemptAPIView,
    ChildSubmitSerializer,
    _child_summary,
    attempt_from_query,
    bytes_or_link,
)
from strata.jobs.models import Artifact

MAX_ITEMS = 1000  # children a call may name in each part


class ChildEndSerializer(serializers.Serializer):
    state = serializers.ChoiceField(choices=sorted(parent_run.END_STATES), help_text=(
        "SUCCEEDED, FAILED or CANCELLED; QUEUED: paused at a checkpoint, run again later."))
    reason = serializers.CharField(max_length=500, required=False, default="", allow_blank=True)


class BatchSubmitSerializer(serializers.Serializer):
    job = serializers.DictField(help_text="The child job, as POST /api/v1/jobs/ takes it (without team).")
    idempotency_key = serializers.CharField(max_length=200, required=False, allow_null=True, default=None)
    start = serializers.BooleanField(required=False, default=False, help_text="Start running it now.")


def _ids(value: dict | list, field: str) -> None:
    if len(value) > MAX_ITEMS:
        raise serializers.ValidationError({field: [f"at most {MAX_ITEMS} children a call"]})
    for key in value:
        try:
            uuid.UUID(str(key))
        except ValueError:
            raise serializers.ValidationError({field: [f"not a job id: {str(key)[:40]}"]}) from None


class ChildrenBatchSerializer(s.AttemptCallSerializer):
    submit = BatchSubmitSerializer(many=True, required=False, default=list, max_length=MAX_ITEMS, help_text=(
        "New children, each nested and run by this attempt itself (never placed by the scheduler)."))
    start = serializers.ListField(child=serializers.UUIDField(), required=False, default=list,
                                  max_length=MAX_ITEMS, help_text="Children this attempt starts running now.")
    metrics = serializers.DictField(child=s.MetricItemSerializer(many=True, max_length=20000), required=False,
                                    default=dict, help_text="Child id -> metric points it reported.")
    logs = serializers.DictField(child=s.LogItemSerializer(many=True, max_length=5000), required=False,
                                 default=dict, help_text="Child id -> log lines.")
    end = serializers.DictField(child=ChildEndSerializer(), required=False, default=dict,
                                help_text="Child id -> how it ended (or QUEUED: paused).")
    watch = serializers.ListField(child=serializers.UUIDField(), required=False, default=list,
                                  max_length=MAX_ITEMS, help_text="More children whose state to answer.")

    def validate(self, attrs):
        for field in ("metrics", "logs", "end"):
            _ids(attrs[field], field)
        return attrs


class AttemptChildrenBatchView(AttemptAPIView):
    """One round trip of a parent that runs its children itself: ``{node, token, submit: [{job,
    idempotency_key, start}], start: [id], metrics: {id: [point]}, logs: {id: [line]}, end: {id: {state, reason}},
    watch: [id]}`` answers ``{"submitted": [summary], "started": [id], "ended": [id], "states": {id: {state,
    reason}}}``: the state of every child the call named, so a cancellation through the API is learnt in the
    same call. Reports about a child that is no longer running are dropped."""

    @extend_schema(request=ChildrenBatchSerializer, responses={200: OpenApiTypes.OBJECT, 409: STALE_ATTEMPT})
    def post(self, request, attempt_id):
        from strata.jobs.api.serializers import JobSubmitSerializer

        call = ChildrenBatchSerializer(data=request.data)
        call.is_valid(raise_exception=True)
        data = call.validated_data
        attempt = job_services.attempt_for_node(attempt_id, data["token"], node_from(data))
        submits = []
        for index, item in enumerate(data["submit"]):
            body = dict(item["job"])
            if "team" in body:
                raise serializers.ValidationError({"submit": {index: {"team": ["a child job runs in its parent's "
                                                                               "team"]}}})
            checked = JobSubmitSerializer(data=body)
            if not checked.is_valid():
                raise serializers.ValidationError({"submit": {index: checked.errors}})
            submits.append((dict(checked.validated_data), item["idempotency_key"], item["start"]))
        submitted, start_ids = [], [str(i) for i in data["start"]]
        for body, key, run_now in submits:
            job, _created = job_services.child_submit(attempt, body, key, nested=True, by_parent=True)
            submitted.append(job)
            if run_now:
                start_ids.append(str(job.pk))
        answer = parent_run.batch(attempt, submitted=submitted, start_ids=start_ids,
                                  ends={str(k): dict(v) for k, v in data["end"].items()},
                                  metrics={str(k): [dict(p) for p in v] for k, v in data["metrics"].items()},
                                  logs={str(k): [dict(line) for line in v] for k, v in data["logs"].items()},
                                  watch=[str(i) for i in data["watch"]])
        answer["submitted"] = [_child_summary(job) for job in answer["submitted"]]
        return Response(answer)


def store(attempt, child, name: str, source, kind: str = Artifact.Kind.ARTIFACT) -> Artifact:
    """Store a file of ``child`` (its checkpoint, or an artifact such as ``model.pt``) that its parent wrote."""
    from django.conf import settings
    from django.utils import timezone

    from strata.jobs.storage import get_storage

    key = f"{child.pk}/{kind}/{name}"
    replaced = Artifact.objects.filter(job_id=child.pk, kind=kind, name=name).values_list("size", flat=True)
    job_services.storage_admission(child.team_id, None, replaces=replaced.first() or 0)
    size, sha = get_storage().save(key, source, settings.STRATA_MAX_UPLOAD_BYTES)
    artifact, _ = Artifact.objects.update_or_create(
        job_id=child.pk, kind=kind, name=name,
        defaults={"attempt": None, "size": size, "sha256": sha, "storage_key": key, "created_at": timezone.now()})
    if kind == Artifact.Kind.ARTIFACT:
        job_services.job_event(child.pk, "artifact", f"artifact {name} stored by its parent's attempt "
                                                     f"{attempt.number} ({size} bytes)")
    return artifact


def _own_child(attempt, child_id):
    child = job_services.children_of(attempt.job).filter(pk=child_id).first()
    if child is None:
        raise Http404("no such child job")
    return child


class AttemptChildFileView(AttemptAPIView):
    """PUT the raw bytes of an artifact of a child this attempt runs itself (``?kind=checkpoint``: its
    checkpoint)."""

    @extend_schema(request={"application/octet-stream": bytes}, parameters=[*ATTEMPT_QUERY, ARTIFACT_KIND],
                   responses={201: s.StoredArtifactSerializer, 404: NO_FILE, 409: STALE_ATTEMPT})
    def put(self, request, attempt_id, child_id, name):
        if not ARTIFACT_NAME.match(name) or ".." in name:
            raise serializers.ValidationError({"name": ["letters, digits, '.', '_' and '-' only"]})
        kind = request.query_params.get("kind", Artifact.Kind.ARTIFACT)
        if kind not in Artifact.Kind.values:
            raise serializers.ValidationError({"kind": [f"one of {', '.join(Artifact.Kind.values)}"]})
        attempt = attempt_from_query(request, attempt_id)
        child = _own_child(attempt, child_id)
        if not parent_run.runs_by_parent(child):
            raise serializers.ValidationError({"child": ["not a child this attempt runs itself"]})
        try:
            artifact = store(attempt, child, name, request.stream or io.BytesIO(), kind)
        except ValueError as error:
            return Response({"detail": str(error)}, status=413)
        return Response({"id": str(artifact.id), "size": artifact.size, "sha256": artifact.sha256}, status=201)


class AttemptChildCheckpointView(AttemptAPIView):
    """GET the latest checkpoint of a child of this attempt's job, 404 when it has none."""

    @extend_schema(parameters=ATTEMPT_QUERY, responses={(200, "application/octet-stream"): OpenApiTypes.BINARY,
                                                         404: NO_FILE, 409: STALE_ATTEMPT})
    def get(self, request, attempt_id, child_id):
        attempt = attempt_from_query(request, attempt_id)
        checkpoint = job_services.latest_checkpoint(_own_child(attempt, child_id))
        if checkpoint is None:
            raise Http404("the child has no checkpoint")
        return bytes_or_link(request, checkpoint.storage_key, checkpoint.size, checkpoint.sha256)


__all__ = ["AttemptChildCheckpointView", "AttemptChildFileView", "AttemptChildrenBatchView",
           "ChildSubmitSerializer"]
