"""The tuning plugin's benchmark (``strata bench``, named in components/tuning/plugin.py) and what only it uses."""
