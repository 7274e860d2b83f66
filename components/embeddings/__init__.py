"""Embedding compression for recommendation models (Saec): a plugin. See docs/components/embeddings.md."""
