from django.apps import AppConfig


class NotifyConfig(AppConfig):
    name = "strata.notify"
    label = "notify"
    verbose_name = "Notifications"

    def ready(self) -> None:
        from strata.jobs.events import subscribe
        from strata.notify.services import SUBSCRIBED_EVENTS, on_event

        subscribe(on_event, SUBSCRIBED_EVENTS)
