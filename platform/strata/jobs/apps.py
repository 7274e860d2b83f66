from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "strata.jobs"
    label = "jobs"
