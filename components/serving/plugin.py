"""The ``serving`` plugin: the ``serve`` job kind (a trained model behind gRPC), ``strata infer`` and its
benchmark."""

from components.runtime.contract.plugins import Plugin

PLUGIN = Plugin(
    name="serving",
    version="0.1.0",
    requires=("gpushare", "train"),
    description="Serve a trained model over gRPC, on a whole GPU or a share of one.",
    kinds=("components.serving.spec:ServeSpec",),
    panels=("components.serving.panels:ServeEndpointPanel", "components.serving.panels:ServeSloPanel",
            "components.serving.panels:ServeExpertsPanel"),
    commands=("components.serving.commands:InferCommand",),
    job_routes={"replicas": "components.serving.replicas:replicas_route"},
    benchmarks={"serving": "benchmarks.serving.bench:main"},
)
