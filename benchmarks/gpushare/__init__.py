"""The gpushare plugin's benchmark (``strata bench``, named in components/gpushare/plugin.py) and what only it uses."""
