from django.contrib import admin
from django.contrib.auth.views import LoginView
from django.http import JsonResponse
from django.urls import include, path

from strata.accounts.forms import GuardedAuthenticationForm
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
    # DRF's login page with the login guard's form (its messages: too many failures, password login off).
    path("api-auth/login/", LoginView.as_view(template_name="rest_framework/login.html",
                                              authentication_form=GuardedAuthenticationForm)),
    path("api-auth/", include("rest_framework.urls")),
    path("oidc/", include("strata.accounts.oidc")),  # single sign-on: authenticate/, callback/
    path("", include("dashboard.urls")),
]
