"""The web UI: server-rendered pages with plotly charts, served by the control plane."""
