"""The decentral plugin's benchmark (``strata bench``, named in components/decentral/plugin.py) and what only it uses."""
