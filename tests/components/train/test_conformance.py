"""The train kind and its panel against the conformance suites shipped with the contracts."""

from components.runtime.testing.conformance.kinds import KindSpecConformance
from components.runtime.testing.conformance.panels import PanelConformance, StaticData


class TestTrainSpec(KindSpecConformance):
    spec_path = "components.train.spec:TrainSpec"
    valid_examples = ({"workload": "mlp-digits"}, {"workload": "tiny-gpt", "epochs": 2, "batch_size": 8},
                      {"entrypoint": "components.train.examples:fit_line", "options": {"a": 1}})
    invalid_examples = (({"workload": "bake-bread", "epochs": 0}, {"spec.workload", "spec.epochs"}),
                        ({"workload": "mlp-digits", "entrypoint": "a.b:c"}, {"spec.entrypoint"}),
                        ({"workload": "mlp-digits", "colour": "red"}, {"spec.colour"}))


class TestTrainSummaryPanel(PanelConformance):
    panel_path = "components.train.panels:TrainSummaryPanel"

    def data(self):
        return StaticData(job={"state": "RUNNING", "spec": {"workload": "mlp-digits", "epochs": 3}, "attempts": [{}]},
                          metrics={"loss": [(10, 2.0, 0.0), (20, float("nan"), 1.0)], "accuracy": [(10, 0.4, 0.0)]})
