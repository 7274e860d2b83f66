from django.contrib import admin
from django.http import JsonResponse
from django.shortcuts import redirect
from django.urls import include, path


def health(request):
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("", lambda request: redirect("/api/v1/docs/")),
    path("healthz", health),
    path("admin/", admin.site.urls),
    path("api/v1/", include("strata.api.urls")),
    path("api-auth/", include("rest_framework.urls")),
]
