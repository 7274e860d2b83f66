from django.apps import AppConfig


class TrackingConfig(AppConfig):
    name = "strata.tracking"
    label = "tracking"
    verbose_name = "MLflow tracking"
