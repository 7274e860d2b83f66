"""The control plane's own benchmarks (``strata bench control-plane``, ``dashboard``, ``storage``; the soak test) and
the harness they share with the tests (network-namespace hosts, SeaweedFS, package index, history checker)."""
