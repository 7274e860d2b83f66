# Placeholder until the jobs pages land (being written now).
from django.http import HttpResponse
from django.urls import path

urlpatterns = [path("jobs/", lambda r: HttpResponse("jobs"), name="jobs"),
               path("jobs/new/", lambda r: HttpResponse("new"), name="job-new")]
