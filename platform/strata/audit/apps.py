from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "strata.audit"
    label = "audit"
    verbose_name = "Audit log"
