from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "strata.scheduling"
    label = "scheduling"

    def ready(self) -> None:
        from strata.scheduling.lost_work import connect

        connect()  # records the work that preempted, shrunk and lost attempts lose (strata.scheduling.lost_work)
