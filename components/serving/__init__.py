"""The ``serve`` job kind: a trained model answering inference requests over gRPC on a (shared) device.

``spec`` is light (control plane); ``model``, ``endpoint``, ``client`` and ``component`` run on nodes.
"""
