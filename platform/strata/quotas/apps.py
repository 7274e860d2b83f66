from django.apps import AppConfig


class QuotasConfig(AppConfig):
    name = "strata.quotas"
    label = "quotas"
