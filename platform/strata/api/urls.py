from django.urls import path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from strata.accounts.api.views import SecretViewSet, TeamViewSet, TokenViewSet
from strata.audit.api import AuditExportView, AuditLogView
from strata.cluster.api import renewal
from strata.cluster.api import views as cluster
from strata.jobs.api import node_views as attempts
from strata.jobs.api import parent_run_views as parent_run
from strata.jobs.api.compare_views import CompareView
from strata.jobs.api.log_views import LogSearchView
from strata.jobs.api.records import CollectionItemView, CollectionView
from strata.jobs.api.views import (
    AttemptDataView,
    AttemptUploadAbortView,
    AttemptUploadCompleteView,
    AttemptUploadPartsView,
    AttemptUploadStartView,
    CodeBundleViewSet,
    DataSetViewSet,
    DataUploadViewSet,
    JobRouteView,
    JobViewSet,
    ParticipantHeartbeatView,
    ParticipantJoinView,
    ParticipantLeaveView,
)
from strata.notify.api.views import EmailSubscriptionViewSet, WebhookViewSet
from strata.quotas.api.members import TeamMembersView, TeamMemberView
from strata.quotas.api.usage import TeamUsageView, UsageListView
from strata.quotas.api.views import QuotaViewSet
from strata.quotas.roots import record_context
from strata.quotas.selectors import job_usage
from strata.scheduling.api import EtaCalibrationView, WhatIfView
from strata.tracking.api import TrackingView

router = DefaultRouter()
router.register("jobs", JobViewSet, basename="job")
router.register("nodes", cluster.NodeViewSet, basename="node")
router.register("devices", cluster.DeviceViewSet, basename="device")
router.register("pools", cluster.PoolViewSet, basename="pool")
router.register("teams", TeamViewSet, basename="team")
router.register("quotas", QuotaViewSet, basename="quota")
router.register("tokens", TokenViewSet, basename="token")
router.register("secrets", SecretViewSet, basename="secret")
router.register("webhooks", WebhookViewSet, basename="webhook")
router.register("email-subscriptions", EmailSubscriptionViewSet, basename="email-subscription")
router.register("code", CodeBundleViewSet, basename="code")
router.register("data", DataSetViewSet, basename="data")
router.register("uploads", DataUploadViewSet, basename="upload")

ATTEMPT = "node/attempts/<uuid:attempt_id>"
urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("redoc/", SpectacularRedocView.as_view(url_name="schema"), name="redoc"),
    path("node/register/", cluster.RegisterView.as_view(), name="node-register"),
    path("node/heartbeat/", cluster.HeartbeatView.as_view(), name="node-heartbeat"),
    path("node/renew/", renewal.RenewView.as_view(), name="node-renew"),
    path("node/drain/", cluster.DrainView.as_view(), name="node-drain"),
    path("node/leave/", cluster.LeaveView.as_view(), name="node-leave"),
    path(f"{ATTEMPT}/claim/", attempts.AttemptClaimView.as_view(), name="attempt-claim"),
    path(f"{ATTEMPT}/report/", attempts.AttemptReportView.as_view(), name="attempt-report"),
    path(f"{ATTEMPT}/renew/", attempts.AttemptRenewView.as_view(), name="attempt-renew"),
    path(f"{ATTEMPT}/finish/", attempts.AttemptFinishView.as_view(), name="attempt-finish"),
    path(f"{ATTEMPT}/artifacts/<str:name>/", attempts.AttemptArtifactView.as_view(), name="attempt-artifact"),
    path(f"{ATTEMPT}/uploads/", AttemptUploadStartView.as_view(), name="attempt-upload-start"),
    path(f"{ATTEMPT}/uploads/parts/", AttemptUploadPartsView.as_view(), name="attempt-upload-parts"),
    path(f"{ATTEMPT}/uploads/complete/", AttemptUploadCompleteView.as_view(), name="attempt-upload-complete"),
    path(f"{ATTEMPT}/uploads/abort/", AttemptUploadAbortView.as_view(), name="attempt-upload-abort"),
    path(f"{ATTEMPT}/sources/<str:name>/", attempts.AttemptSourceView.as_view(), name="attempt-source"),
    path(f"{ATTEMPT}/checkpoint/", attempts.AttemptCheckpointView.as_view(), name="attempt-checkpoint"),
    path(f"{ATTEMPT}/code/", attempts.AttemptCodeView.as_view(), name="attempt-code"),
    path(f"{ATTEMPT}/data/<str:digest>/", AttemptDataView.as_view(), name="attempt-data"),
    path(f"{ATTEMPT}/tokens/", attempts.AttemptTokensView.as_view(), name="attempt-tokens"),
    path(f"{ATTEMPT}/rendezvous/", attempts.AttemptRendezvousView.as_view(), name="attempt-rendezvous"),
    path(f"{ATTEMPT}/children/", attempts.AttemptChildrenView.as_view(), name="attempt-children"),
    path(f"{ATTEMPT}/children/<uuid:child_id>/cancel/", attempts.AttemptChildCancelView.as_view(),
         name="attempt-child-cancel"),
    path(f"{ATTEMPT}/children/<uuid:child_id>/hold/", attempts.AttemptChildHoldView.as_view(),
         name="attempt-child-hold"),
    path(f"{ATTEMPT}/children/<uuid:child_id>/release/", attempts.AttemptChildReleaseView.as_view(),
         name="attempt-child-release"),
    path(f"{ATTEMPT}/children/<uuid:child_id>/resize/", attempts.AttemptChildResizeView.as_view(),
         name="attempt-child-resize"),
    path(f"{ATTEMPT}/children/batch/", parent_run.AttemptChildrenBatchView.as_view(), name="attempt-children-batch"),
    path(f"{ATTEMPT}/children/<uuid:child_id>/files/<str:name>/", parent_run.AttemptChildFileView.as_view(),
         name="attempt-child-file"),
    path(f"{ATTEMPT}/children/<uuid:child_id>/checkpoint/", parent_run.AttemptChildCheckpointView.as_view(),
         name="attempt-child-checkpoint"),
    path(f"{ATTEMPT}/children/metrics/", attempts.AttemptChildrenMetricsView.as_view(),
         name="attempt-children-metrics"),
    path(f"{ATTEMPT}/children/<uuid:child_id>/metrics/", attempts.AttemptChildMetricsView.as_view(),
         name="attempt-child-metrics"),
    path(f"{ATTEMPT}/credential/", attempts.AttemptCredentialView.as_view(), name="attempt-credential"),
    # Participants (machines outside the cluster) authenticate with a job token or their own secret, no API token.
    path("participants/", ParticipantJoinView.as_view(), name="participant-join"),
    path("participants/<uuid:participant_id>/heartbeat/", ParticipantHeartbeatView.as_view(),
         name="participant-heartbeat"),
    path("participants/<uuid:participant_id>/leave/", ParticipantLeaveView.as_view(), name="participant-leave"),
    # A team's members, roles and per-user limits (strata.accounts.roles: reads any role, changes team-admin).
    path("teams/<slug:slug>/members/", TeamMembersView.as_view(), name="team-members"),
    path("teams/<slug:slug>/members/<str:username>/", TeamMemberView.as_view(), name="team-member"),
    # The jobs' GPU- and CPU-seconds are the quota's count (strata.quotas.selectors), handed to the jobs layer.
    path("compare/", CompareView.as_view(usage=job_usage), name="compare"),
    path("logs/search/", LogSearchView.as_view(), name="logs-search"),
    # The team's MLflow tracking server (strata.tracking: team-admins).
    path("tracking/", TrackingView.as_view(), name="tracking"),
    # The audit log (strata.audit: team-admins their teams' entries, cluster admins all).
    path("audit/", AuditLogView.as_view(), name="audit"),
    path("audit/export.csv", AuditExportView.as_view(), name="audit-export"),
    # Allocated against used GPU-hours, budgets and their forecast (strata.quotas.usage; reads: any role).
    path("usage/", UsageListView.as_view(), name="usage-list"),
    path("usage/<slug:team>/", TeamUsageView.as_view(), name="usage-team"),
    # How well the start-time estimates held (strata.scheduling.eta: cluster admins).
    path("eta/calibration/", EtaCalibrationView.as_view(), name="eta-calibration"),
    # Replay history under a proposed quota or cluster (strata.scheduling.whatif: cluster admins); before the router.
    path("quotas/what-if/", WhatIfView.as_view(), name="quota-what-if"),
    *router.urls,
    # After the router: the core's own job actions match first; a plugin's job route cannot shadow them.
    path("jobs/<uuid:pk>/<slug:route>/", JobRouteView.as_view(), name="job-route"),
    # Last: the plugins' collections (/api/v1/datasets/ ...); the core's resources above always match first.
    # A record is checked against the team's data roots (strata.quotas.roots) through the collections seam.
    path("<slug:collection>/", CollectionView.as_view(record_context=record_context), name="collection"),
    path("<slug:collection>/<str:name>/", CollectionItemView.as_view(), name="collection-item"),
]
