from django.apps import AppConfig


class QuotasConfig(AppConfig):
    name = "strata.quotas"
    label = "quotas"

    def ready(self):
        from strata.accounts.models import Team
        from strata.accounts.signals import team_created
        from strata.quotas.metrics import register

        register()  # stored bytes in /metrics
        team_created.connect(_quota_for_team, sender=Team, dispatch_uid="quotas-team-created")


def _quota_for_team(team, **_) -> None:
    """Every team has its quota row (all limits unlimited until an admin sets them)."""
    from strata.quotas.models import Quota

    Quota.objects.get_or_create(team=team)
