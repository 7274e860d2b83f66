from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "strata.scheduling"
    label = "scheduling"
