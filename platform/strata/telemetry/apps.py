from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    name = "strata.telemetry"
    label = "telemetry"
