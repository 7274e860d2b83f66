"""Clients of the control plane: the REST client, the attempt's remote context, a volunteer participant's
context, and direct transfers.
"""
