"""The ``train`` job kind: PyTorch training of built-in workloads or user code, step by step.

``spec`` is light (control plane); ``workloads``, ``loop`` and ``component`` import torch and run on nodes.
"""
