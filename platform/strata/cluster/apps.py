from django.apps import AppConfig


class ClusterConfig(AppConfig):
    name = "strata.cluster"
    label = "cluster"
