# Placeholder until the cluster page lands (being written now).
from django.http import HttpResponse
from django.urls import path

urlpatterns = [path("cluster/", lambda r: HttpResponse("cluster"), name="cluster")]
