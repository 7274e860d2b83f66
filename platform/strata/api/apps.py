from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "strata.api"
    label = "api"
