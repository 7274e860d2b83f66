from django.contrib import admin
from django.http import JsonResponse
from django.urls import include, path


def health(request):
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("healthz", health),
    path("admin/", admin.site.urls),
    path("api/v1/", include("strata.api.urls")),
    path("api-auth/", include("rest_framework.urls")),
    path("", include("dashboard.urls")),
]
