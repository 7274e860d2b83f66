"""The ``tuning`` plugin: hyperparameter sweeps (Fluid). A ``tune`` job runs its trials as nested child jobs
inside its own GPUs, water-filled by measured speed; searchers through Optuna, early stopping by ASHA,
Hyperband, successive halving, median stopping or PBT."""

from components.runtime.contract.plugins import Plugin

PLUGIN = Plugin(
    name="tuning",
    version="0.1.0",
    description="Hyperparameter tuning: trials water-filled onto the tune job's GPU shares (Fluid).",
    kinds=("components.tuning.spec:TuneSpec",),
    panels=("components.tuning.panels:TrialCurvesPanel", "components.tuning.panels:ParametersPanel",
            "components.tuning.panels:RungsPanel", "components.tuning.panels:SharesPanel"),
    reports="components.tuning.report:TuningReport",
    job_routes={"trials": "components.tuning.report:trials"},
    benchmarks={"tuning": "benchmarks.tuning.bench:main"},
)
