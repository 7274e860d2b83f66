"""What every side shares: units, statistics, tokens and credentials, code bundles, a team's project and
environment, the worker-service protocol and the broker configuration.
"""
