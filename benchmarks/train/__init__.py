"""The train plugin's benchmark (``strata bench``, named in components/train/plugin.py) and what only it uses."""
