"""The serving plugin's benchmark (``strata bench``, named in components/serving/plugin.py) and what only it uses."""
