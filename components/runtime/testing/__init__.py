"""Test support for plugins: the conformance suites (``components.runtime.testing.conformance``).
"""
