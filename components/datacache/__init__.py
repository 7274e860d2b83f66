"""The ``datacache`` plugin: cached preprocessing (PerFect) -- a node-local cache of preprocessed samples shared
by every job on the node, and PerFect's training on reused cached epochs followed by fine-tuning on fresh data."""
