"""The node: the agent, the worker and an attempt's child process, devices, the sandbox, the node's metrics,
a rank's process group and command jobs.
"""
