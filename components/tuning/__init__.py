"""Hyperparameter tuning (Fluid): a ``tune`` job runs a sweep of trials as child jobs, water-filling its GPUs
among them. The control plane imports only this package's light modules (the spec); the searchers (Optuna) and
the engine are imported where the tune job runs."""
