"""The plugin contract: the manifest and its seam table, the registry, and what plugins implement (kinds,
components and sessions, panels, scheduler policies, node services, collections, data providers, strategies,
lifecycle events) and the attempt's context.
"""
