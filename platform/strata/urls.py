from django.contrib import admin
from django.http import JsonResponse
from django.urls import include, path

from strata.api.metrics import metrics, readyz


def health(request):
    return JsonResponse({"status": "ok"})


# JSON error answers under /api/ (strata.api.errors), Django's pages elsewhere.
handler400 = "strata.api.errors.bad_request"
handler403 = "strata.api.errors.permission_denied"
handler404 = "strata.api.errors.page_not_found"
handler500 = "strata.api.errors.server_error"

urlpatterns = [
    path("healthz", health),
    path("readyz", readyz),  # readiness: database, migrations, broker (strata.api.metrics)
    path("metrics", metrics),  # Prometheus (docs/operations/metrics.md)
    path("admin/", admin.site.urls),
    path("api/v1/", include("strata.api.urls")),
    path("api-auth/", include("rest_framework.urls")),
    path("", include("dashboard.urls")),
]
