# Placeholder until the usage and quota pages land (being written now).
from django.http import HttpResponse
from django.urls import path

urlpatterns = [path("usage/", lambda r: HttpResponse("usage"), name="usage"),
               path("manage/quotas/", lambda r: HttpResponse("quotas"), name="quota-editor")]
