"""The tune kind against the KindSpec conformance suite shipped with the contracts."""

from components.runtime.testing.conformance.kinds import KindSpecConformance

TRAINABLE = {"kind": "train", "spec": {"workload": "mlp-digits", "lr": "{{lr}}"}}
SPACE = {"lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1}}


class TestTuneSpec(KindSpecConformance):
    spec_path = "components.tuning.spec:TuneSpec"
    valid_examples = (
        {"space": SPACE, "trainable": TRAINABLE},
        {"space": {**SPACE, "opt": {"type": "choice", "values": ["adam", "sgd"]}}, "trials": 8,
         "trainable": {"kind": "train", "spec": {"workload": "mlp-digits", "lr": "{{lr}}", "optimizer": "{{opt}}"}},
         "searcher": {"name": "tpe"}, "scheduler": {"name": "sh", "options": {"reduction_factor": 2}}},
        {"space": {"w": {"type": "int", "low": 1, "high": 4}}, "searcher": "grid", "scheduler": "median",
         "trainable": {"spec": {"workload": "mlp-digits", "hidden": "{{w}}"}}},
    )
    invalid_examples = (
        ({"space": {"lr": {"type": "uniform", "low": 1, "high": 0}}, "trainable": TRAINABLE, "mode": "up",
          "trials": 0}, {"spec.space.lr.high", "spec.mode", "spec.trials"}),
        ({"space": SPACE, "trainable": {"kind": "train", "spec": {"workload": "bake", "lr": "{{lr}}"}},
          "scheduler": {"name": "asha", "options": {"grace_period": 0}}},
         {"spec.trainable.spec.workload", "spec.scheduler.options.grace_period"}),
        ({"space": SPACE, "trainable": {"kind": "train", "spec": {"workload": "mlp-digits", "lr": "{{rate}}"}},
          "colour": "red"}, {"spec.trainable.spec", "spec.colour"}),
        ({"space": SPACE, "trainable": {"kind": "tune", "spec": {}}}, {"spec.trainable.kind"}),
    )
