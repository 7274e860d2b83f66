"""Node-facing endpoints of the cluster itself (node tokens only: register, heartbeat, drain, leave; the lean
lease renewal is :mod:`strata.cluster.api.renewal`) and the read-only node, device and pool listings for users.
The node protocol's calls about one attempt are :mod:`strata.jobs.api.node_views`."""

from __future__ import annotations

from django.conf import settings
from django.db.models import Prefetch
from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from strata.api.error_answers import error_response
from strata.api.permissions import IsClusterAdmin, IsNode, IsUser
from strata.cluster import services
from strata.cluster.api import serializers as s
from strata.cluster.models import Node, gpu_devices


class NodeViewSet(viewsets.ReadOnlyModelViewSet):
    """Nodes of the cluster and their devices (cluster-wide, no team data)."""

    permission_classes = [IsUser]
    serializer_class = s.NodeSerializer
    queryset = Node.objects.prefetch_related(Prefetch("devices", gpu_devices().select_related("node")))


class DeviceViewSet(viewsets.ReadOnlyModelViewSet):
    """The GPUs (CUDA or virtual) of the nodes; a node's CPUs are its ``cpus`` and ``memory``."""

    permission_classes = [IsUser]
    serializer_class = s.DeviceSerializer
    queryset = gpu_devices().select_related("node")


class PoolViewSet(viewsets.ViewSet):
    """Device pools (node label ``pool``; unlabelled nodes are in ``default``) and their GPU-sharing policy.
    Anyone may list them; only cluster admins may change a policy."""

    lookup_field = "name"
    lookup_value_regex = r"[^/]+"  # a bad name is a 400 from the service, after the permission check

    def get_permissions(self):
        return [IsClusterAdmin()] if self.action == "partial_update" else [IsUser()]

    @extend_schema(responses=s.PoolSerializer(many=True))
    def list(self, request):
        return Response(s.PoolSerializer(services.pools_list(), many=True).data)

    @extend_schema(request=s.PoolSerializer, responses=s.PoolSerializer)
    def partial_update(self, request, name=None):
        serializer = s.PoolSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            services.pool_policy_set(name, serializer.validated_data["sharing_policy"])
        except services.PoolInvalid as error:
            raise serializers.ValidationError({field: [message] for field, message in error.errors.items()}) from None
        pool = next(pool for pool in services.pools_list() if pool["name"] == name)
        return Response(s.PoolSerializer(pool).data)


def node_from(data) -> Node:
    node = Node.objects.filter(pk=data["node"]).first()
    if node is None:
        raise Http404("unknown node")
    return node


UNKNOWN_NODE = error_response(404, "Unknown node.")
STALE_SESSION = "The node's session was replaced by a newer registration: register again."


class NodeAPIView(APIView):
    permission_classes = [IsNode]


class RegisterView(NodeAPIView):
    @extend_schema(request=s.RegisterSerializer, responses=s.RegisterAnswerSerializer)
    def post(self, request):
        serializer = s.RegisterSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        node = services.node_register(**serializer.validated_data)
        return Response({
            "node": str(node.id), "session": str(node.session), "queue": node.queue,
            "broker_url": settings.STRATA_NODE_BROKER_URL, "broker_prefix": settings.STRATA_BROKER_PREFIX,
            "heartbeat_seconds": settings.STRATA_HEARTBEAT_SECONDS,
            "lease_seconds": settings.STRATA_NODE_LEASE_SECONDS,
        })


class HeartbeatView(NodeAPIView):
    @extend_schema(request=s.HeartbeatSerializer, responses={200: s.HeartbeatAnswerSerializer, 404: UNKNOWN_NODE,
                                                             409: error_response(409, STALE_SESSION)})
    def post(self, request):
        serializer = s.HeartbeatSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        answer = services.node_heartbeat(node_from(data), str(data["session"]), data["samples"],
                                         [str(a) for a in data["attempts"]], data["reports"])
        return Response(answer)


class DrainView(NodeAPIView):
    """The node stops taking work (DRAINING): nothing new is placed on it, its attempts run on, and its
    heartbeats keep its lease; it leaves (POST node/leave/) when they are done. A new registration makes it UP."""

    @extend_schema(request=s.NodeSessionSerializer, responses={200: s.DrainAnswerSerializer, 404: UNKNOWN_NODE,
                                                               409: error_response(409, STALE_SESSION)})
    def post(self, request):
        serializer = s.NodeSessionSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        return Response(services.node_drain(node_from(data), str(data["session"])))


class LeaveView(NodeAPIView):
    """The node goes away on purpose: DOWN at once, its remaining attempts ended as for a lost node (requeued
    without counting a failure, unless their kind's failure policy says otherwise)."""

    @extend_schema(request=s.NodeSessionSerializer, responses={200: s.LeaveAnswerSerializer, 404: UNKNOWN_NODE,
                                                               409: error_response(409, STALE_SESSION)})
    def post(self, request):
        serializer = s.NodeSessionSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        return Response(services.node_leave(node_from(data), str(data["session"])))
