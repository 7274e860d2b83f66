"""The straggler plugin's benchmark (``strata bench``, named in components/straggler/plugin.py) and what only it uses."""
