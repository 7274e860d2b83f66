"""The embeddings plugin's benchmark (``strata bench``, named in components/embeddings/plugin.py) and what only it uses."""
