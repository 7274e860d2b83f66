"""The serve kind and its panel against the conformance suites shipped with the contracts."""

from components.runtime.testing.conformance.job_routes import JobRouteConformance
from components.runtime.testing.conformance.kinds import KindSpecConformance
from components.runtime.testing.conformance.panels import PanelConformance, StaticData

JOB = "7a1e0000-0000-4000-8000-000000000001"


class TestServeSpec(KindSpecConformance):
    spec_path = "components.serving.spec:ServeSpec"
    valid_examples = ({"model": {"job": JOB}}, {"model": {"job": JOB.upper()}, "port": 0, "max_rows": 16})
    invalid_examples = (({"model": {}, "port": -1, "max_rows": 0}, {"spec.model.job", "spec.port", "spec.max_rows"}),
                        ({"model": {"job": "not-a-uuid"}}, {"spec.model.job"}))


class TestServeEndpointPanel(PanelConformance):
    panel_path = "components.serving.panels:ServeEndpointPanel"

    def data(self):
        return StaticData(job={"id": JOB, "kind": "serve", "state": "RUNNING", "endpoint": "127.0.0.1:50999"})


class TestReplicasRoute(JobRouteConformance):
    """``GET /api/v1/jobs/{id}/replicas/`` answers JSON matching its declared schema."""

    route_path = "components.serving.replicas:replicas_route"

    def examples(self):
        return [StaticData(job={"id": JOB, "kind": "serve", "state": "RUNNING", "endpoint": "127.0.0.1:50999",
                                "spec": {"replicas": 2, "autoscale": {"min": 1, "max": 3}}},
                           children=[{"id": "c1", "kind": "serve", "state": "RUNNING", "endpoint": "10.0.0.2:6"},
                                     {"id": "c2", "kind": "serve", "state": "QUEUED", "endpoint": None}]),
                StaticData(job={"id": JOB, "kind": "serve", "state": "QUEUED", "endpoint": None, "spec": {}})]
