from django.apps import AppConfig


class QuotasConfig(AppConfig):
    name = "strata.quotas"
    label = "quotas"

    def ready(self):
        from strata.quotas.metrics import register

        register()  # stored bytes in /metrics
