from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "strata.jobs"
    label = "jobs"

    def ready(self):
        # The cluster's node protocol asks about the attempts on its nodes through signals (strata.cluster.signals).
        from strata.jobs import node_work

        node_work.connect()
