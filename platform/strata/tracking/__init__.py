"""The MLflow bridge: a team's tracking server, and each job mirrored to an MLflow run (docs/architecture.md,
*MLflow bridge*)."""
