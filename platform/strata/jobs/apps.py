from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "strata.jobs"
    label = "jobs"

    def ready(self):
        # The cluster's node protocol asks about the attempts on its nodes through signals (strata.cluster.signals).
        from strata.jobs import node_work

        node_work.connect()
        # SQLite: the log search index's triggers survive a later migration that rebuilds jobs_logline.
        from django.db.models.signals import post_migrate

        from strata.jobs.log_search import ensure_sqlite_triggers

        post_migrate.connect(ensure_sqlite_triggers, sender=self, dispatch_uid="strata.jobs.log_search")
