"""What accounts tells the layers above it, without importing them."""

from __future__ import annotations

from django.dispatch import Signal

# team: sent by ``services.team_create`` inside its transaction, for a new team and an existing one alike; the
# quotas app gives the team its quota row where it has none (``QuotasConfig.ready``).
team_created = Signal()
