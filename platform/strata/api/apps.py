from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "strata.api"
    label = "api"

    def ready(self) -> None:
        # Strata's production checks (`strata check --deploy`, `manage.py check --deploy`).
        from strata import checks  # noqa: F401 - registers them
