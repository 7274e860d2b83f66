from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
    label = "dashboard"
    verbose_name = "Strata dashboard"
