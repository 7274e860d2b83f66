"""The datacache plugin's benchmark (``strata bench``, named in components/datacache/plugin.py) and what only it uses."""
